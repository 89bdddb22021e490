"""The batched torch CartPole against Gymnasium's CartPole-v1, step for step from the same states
under the same actions; batched against one env at a time; autoreset, truncation, resets, the
state round trip, (on a GPU) a step with no host synchronisation; and the runner on it
(``env.impl = "torch"``): a short run, resume, config errors, and learning as Gymnasium's."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from trimtab.rl.agent.dqn import DQNAgent
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import ConfigError, apply_overrides, from_dict, load_toml
from trimtab.rl.envs.adapters import TorchCartPoleAdapter
from trimtab.rl.envs.cartpole import (
    MAX_EPISODE_STEPS,
    THETA_THRESHOLD,
    X_THRESHOLD,
    BatchedCartPole,
    cartpole_dynamics,
)
from trimtab.rl.train import TrainingInterrupted, train

N_ENVS, N_STEPS = 16, 400


def _time_limit(env: gym.Env) -> gym.wrappers.TimeLimit:
    while not isinstance(env, gym.wrappers.TimeLimit):
        env = env.env
    return env


def _actions(state: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Push toward the pole's lean half the time, at random otherwise: episodes then end by
    the pole falling, by the cart leaving the track, and by the 500-step limit."""
    lean = (state[:, 2] + 0.5 * state[:, 3] > 0).long()
    random = torch.as_tensor(rng.integers(0, 2, len(state)))
    return torch.where(torch.as_tensor(rng.random(len(state)) < 0.5), random, lean)


def _start(env: BatchedCartPole, rng: np.random.Generator) -> None:
    """Episodes already 350 to 499 steps under way, so that truncation at step 500 happens
    within the test's steps."""
    state = env.state_dict()
    state["elapsed"] = torch.as_tensor(rng.integers(350, MAX_EPISODE_STEPS, env.n_envs))
    env.load_state_dict(state)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_gymnasium_step_for_step(dtype, seed):
    env = BatchedCartPole(N_ENVS, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed)
    _start(env, rng)
    gyms = [gym.make("CartPole-v1") for _ in range(N_ENVS)]
    for i, g in enumerate(gyms):
        g.reset(seed=seed * 100 + i)
    ends = np.zeros(2, dtype=int)
    for _ in range(N_STEPS):
        before, elapsed, action = env.state.clone(), env.elapsed.clone(), _actions(env.state, rng)
        # Gymnasium steps from the torch env's state and step count (its TimeLimit's counter)
        expected = []
        for i, g in enumerate(gyms):
            g.unwrapped.state = before[i].double().numpy().copy()
            g.unwrapped.steps_beyond_terminated = None
            _time_limit(g)._elapsed_steps = int(elapsed[i])
            obs, r, term, trunc, _ = g.step(int(action[i]))
            expected.append((g.unwrapped.state.copy(), obs, r, term, trunc))
        want_state, want_obs, want_r, want_term, want_trunc = map(np.stack, zip(*expected))
        reached, fell = cartpole_dynamics(before, action)
        result = env.step(action)
        done = (result.terminated | result.truncated).numpy()

        if dtype == torch.float64:  # torch's and numpy's sin/cos may differ in the last bit
            np.testing.assert_allclose(reached.numpy(), want_state, rtol=0, atol=1e-12)
            np.testing.assert_array_equal(result.terminated.numpy(), want_term)
        else:  # float32 arithmetic against float64 from the same (float32) state
            torch.testing.assert_close(reached, torch.as_tensor(want_state).float())
            # the flags agree wherever the state is not within float32 rounding of a threshold
            margin = np.minimum(np.abs(np.abs(want_state[:, 0]) - X_THRESHOLD),
                                np.abs(np.abs(want_state[:, 2]) - THETA_THRESHOLD))  # fmt: skip
            clear = margin > 1e-5
            np.testing.assert_array_equal(result.terminated.numpy()[clear], want_term[clear])
        np.testing.assert_array_equal(result.truncated.numpy(), want_trunc)
        np.testing.assert_array_equal(result.reward.numpy(), want_r.astype(np.float32))
        # the true last observation is the state reached, also where the episode ended
        assert torch.equal(result.final_obs, reached.float())
        assert torch.equal(result.terminated, fell)
        np.testing.assert_allclose(result.final_obs.numpy(), want_obs, rtol=2e-6, atol=1e-6)
        # same-step autoreset: a fresh state where an episode ended, the state reached elsewhere
        assert torch.equal(env.state[~done], reached[~done])
        fresh = env.state[done]
        assert bool(((fresh >= -0.05) & (fresh < 0.05)).all())
        assert torch.equal(result.obs, env.state.float())
        assert torch.equal(env.elapsed, torch.where(torch.as_tensor(done), 0, elapsed + 1))
        ends += [int(want_term.sum()), int((want_trunc & ~want_term).sum())]
    # the test saw every kind of step: episodes falling and episodes cut at 500 steps
    assert ends[0] >= 10 and ends[1] >= 5, ends


def test_batched_equals_one_env_at_a_time():
    rng = np.random.default_rng(7)
    batched = BatchedCartPole(N_ENVS, seed=3)
    _start(batched, rng)
    singles = [BatchedCartPole(1, seed=100 + i) for i in range(N_ENVS)]
    for _ in range(N_STEPS):
        # each single env steps from the batched env's row (its own generator draws its resets)
        full = batched.state_dict()
        for i, s in enumerate(singles):
            row = {k: v[i : i + 1] for k, v in full.items() if k != "generator"}
            s.load_state_dict({**row, "generator": s.generator.get_state()})
        action = _actions(batched.state, rng)
        result = batched.step(action)
        rows = [s.step(action[i : i + 1]) for i, s in enumerate(singles)]
        for name in ("reward", "terminated", "truncated", "final_obs", "episode_return"):
            got = torch.cat([getattr(r, name) for r in rows])
            assert torch.equal(getattr(result, name), got), name
        done = result.terminated | result.truncated
        kept = torch.cat([s.state for s in singles])[~done]
        assert torch.equal(batched.state[~done], kept)
    # and the pure dynamics, row by row
    state = batched.state.clone()
    action = _actions(state, rng)
    whole = cartpole_dynamics(state, action)
    for i in range(N_ENVS):
        one = cartpole_dynamics(state[i : i + 1], action[i : i + 1])
        assert torch.equal(whole[0][i : i + 1], one[0]) and torch.equal(whole[1][i], one[1][0])


def test_episode_returns_count_the_steps_of_the_episode_that_ended():
    env = BatchedCartPole(64, seed=5)
    rng = np.random.default_rng(5)
    length = torch.zeros(64)
    seen = 0
    for _ in range(MAX_EPISODE_STEPS + 50):
        result = env.step(_actions(env.state, rng))
        length += 1
        done = result.terminated | result.truncated
        assert torch.equal(result.episode_return[done], length[done])
        seen += int(done.sum())
        length[done] = 0
        assert torch.equal(env.episode_return, length)
    assert seen >= 64


def test_reset_is_seeded_and_uniform_in_the_gymnasium_range():
    a, b = BatchedCartPole(20_000, seed=11), BatchedCartPole(20_000, seed=11)
    obs = a.reset()
    assert obs.dtype == torch.float32 and obs.shape == (20_000, 4)
    assert torch.equal(obs, b.reset())
    assert not torch.equal(obs, a.reset())  # the generator moved on
    assert torch.equal(a.reset(seed=4), b.reset(seed=4))
    assert bool((obs >= -0.05).all() and (obs <= 0.05).all())
    # U(-0.05, 0.05): mean 0 (s.e. 2e-4 over 20k), both ends reached, variance 0.1^2 / 12
    assert obs.mean(0).abs().max() < 1e-3
    assert obs.min() < -0.0499 and obs.max() > 0.0499
    torch.testing.assert_close(obs.double().var(0), torch.full((4,), 0.01 / 12).double(),
                               rtol=0.05, atol=0)  # fmt: skip


def test_state_dict_round_trip_continues_exactly():
    rng = np.random.default_rng(2)
    env = BatchedCartPole(32, seed=9, dtype=torch.float32)
    for _ in range(40):
        env.step(_actions(env.state, rng))
    saved = env.state_dict()
    actions = [torch.as_tensor(rng.integers(0, 2, 32)) for _ in range(60)]
    first = [env.step(a) for a in actions]
    other = BatchedCartPole(32, seed=1234, dtype=torch.float32)
    other.load_state_dict(saved)
    again = [other.step(a) for a in actions]
    assert sum(int((r.terminated | r.truncated).sum()) for r in first) > 0  # resets were drawn
    for r1, r2 in zip(first, again, strict=True):
        for x, y in zip(r1, r2, strict=True):
            assert (x is None and y is None) or torch.equal(x, y)  # parts: a market's only
    saved["state"] = saved["state"][:8]
    with pytest.raises(ValueError, match="holds 8 envs, this env 32"):
        other.load_state_dict(saved)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_envs": 0}, "n_envs >= 1"),
        ({"n_envs": 2, "max_episode_steps": 0}, "max_episode_steps >= 1"),
        ({"n_envs": 2, "dtype": torch.float16}, "dtype must be"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchedCartPole(**kwargs)


@pytest.mark.gpu
# the eager step, and the kernel (trimtab.kernels.cartpole: impl=None on CUDA)
@pytest.mark.parametrize("impl", ["torch", None])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_step_makes_no_host_sync_on_cuda(dtype, impl):
    env = BatchedCartPole(4096, "cuda", dtype=dtype, max_episode_steps=50, impl=impl)
    assert (env._launch is None) == (impl == "torch")
    action = torch.zeros(4096, dtype=torch.long, device="cuda")
    env.step(action)  # warm-up (compiles the kernel)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(60):  # past the time limit: every env resets at least once
            result = env.step(action)
            action = (result.obs[:, 2] > 0).long()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert result.obs.device.type == "cuda"


# --- the runner on it: env.impl = "torch" ---------------------------------------------------------
EXAMPLE = Path(__file__).parents[3] / "examples" / "cartpole.toml"
SHORT = ["gym.total_steps=400", "gym.learning_starts=200", "gym.eval_episodes=3",
         "run.log_every=5", "run.progress=false"]  # fmt: skip
TORCH = 'env.impl="torch"'


def _config(out: Path, *overrides: str) -> TrainConfig:
    data = apply_overrides(load_toml(EXAMPLE), [*SHORT, f'run.out="{out}"', *overrides])
    return from_dict(TrainConfig, data)


def test_a_short_run_on_the_torch_env_trains_and_evaluates(tmp_path, monkeypatch):
    made = []
    make_replay = DQNAgent.make_replay
    monkeypatch.setattr(
        DQNAgent, "make_replay", lambda a, *p: made.append(make_replay(a, *p)) or made[-1]
    )
    summary = train(_config(tmp_path / "torch", TORCH))
    # the same plan as Gymnasium's envs: 400 env steps over 4 envs, an update every 10
    assert summary["env_steps"] == 400 and summary["updates"] == 21
    assert summary["env"] == "gym:CartPole-v1" and summary["env_impl"] == "torch"
    ev = summary["eval"]
    assert ev["episodes"] == 3 and 8 <= ev["min_return"] <= ev["max_return"] <= 500
    assert 8 <= summary["train_return_last100"] <= 500
    for name in ("summary.json", "sentinel.json", "report.html", "checkpoints/fold_0.pt"):
        assert (tmp_path / "torch" / name).is_file(), name
    # the loop's time, and of it the fold's greedy evaluation and its end-of-fold checkpoint
    t = summary["timings"]
    assert t["evaluate_s"] >= 0 and t["checkpoint_s"] >= 0  # rounded to 0.01 s
    assert t["evaluate_s"] + t["checkpoint_s"] <= t["loop_s"]
    # every stored successor is the true next state, also where an episode ended (Euler step)
    replay = made[0]
    n = len(replay)
    obs, next_obs, discount = replay.obs[:n], replay.next_obs[:n], replay.discount[:n]
    torch.testing.assert_close(next_obs[:, 0], obs[:, 0] + 0.02 * obs[:, 1], atol=1e-5, rtol=0)
    fell = (next_obs[:, 2].abs() > THETA_THRESHOLD) | (next_obs[:, 0].abs() > X_THRESHOLD)
    assert torch.equal(discount == 0, fell) and int(fell.sum()) > 10


@pytest.mark.gpu
def test_a_captured_greedy_evaluation_gives_the_eager_returns(tmp_path, monkeypatch):
    from trimtab.lifecycle import Lifecycle
    from trimtab.rl.agent.learner import build_learner

    replays = []
    real = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda g: replays.append(1) or real(g))
    device, rows, counts = torch.device("cuda"), {}, {}
    for graph in ("off", "on"):
        cfg = _config(tmp_path / graph, TORCH, 'run.device="cuda"', f'run.cuda_graph="{graph}"',
                      "gym.eval_episodes=64")  # fmt: skip
        adapter = TorchCartPoleAdapter(cfg, device)
        torch.manual_seed(0)
        with Lifecycle():
            learner = build_learner(cfg, adapter.obs_dim, adapter.branch_sizes, device)
        replays.clear()
        rows[graph], _ = adapter.evaluate(learner.agent, 0)
        counts[graph] = len(replays)
    assert rows["on"] == rows["off"]
    assert rows["on"]["min_return"] < rows["on"]["max_return"]  # episodes of several lengths
    # eager: no graph; captured: one eager step, then a replay for each of the others
    assert counts == {"off": 0, "on": MAX_EPISODE_STEPS - 1}


def test_an_interrupted_torch_env_run_resumes_exactly(tmp_path):
    full = train(_config(tmp_path / "a", TORCH, "run.checkpoint_every=5"))
    cfg_b = _config(tmp_path / "b", TORCH, "run.checkpoint_every=5")
    with pytest.raises(TrainingInterrupted):
        train(cfg_b, stop_after=12)  # last checkpoint: step 10, mid-run
    resumed = train(cfg_b, resume=True)
    for key in ("eval", "train_return_last100", "env_steps", "updates"):
        assert full[key] == resumed[key], key
    assert (tmp_path / "a/metrics.csv").read_text() == (tmp_path / "b/metrics.csv").read_text()


def test_the_training_returns_kept_are_the_last_100_in_env_order():
    cfg = _config(Path("unused"), TORCH, "env.n_envs=256")
    adapter = TorchCartPoleAdapter(cfg, torch.device("cpu"))
    rng = np.random.default_rng(0)
    kept: deque[float] = deque(maxlen=100)
    for p in (0.02, 0.3, 0.9, 0.0, 0.5):  # under, over and far over 100 episodes in one step
        returns = torch.as_tensor(rng.integers(1, 500, 256)).double()
        done = torch.as_tensor(rng.random(256) < p)
        adapter._remember(returns, done)
        kept.extend(returns[done].tolist())
        assert sorted(adapter._finished()) == sorted(kept)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (['env.name="gym:Acrobot-v1"', TORCH], r"impl='torch' runs \['gym:CartPole-v1'\] only"),
        (['env.name="market"', TORCH, "gym.total_steps=500000", "gym.learning_starts=10000",
          "gym.eval_episodes=100"], r"not name='market'"),
        (['env.impl="jax"'], r"env.impl: must be one of \['gymnasium', 'torch'\]"),
        ([TORCH, "env.episode_days=10"], r"env.episode_days = 10: does nothing in a Gymnasium"),
    ],
)  # fmt: skip
def test_config_errors_of_the_torch_env(tmp_path, overrides, error):
    with pytest.raises(ConfigError, match=error):
        _config(tmp_path / "run", *overrides)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["gymnasium", "torch"])
def test_both_implementations_learn_cartpole_from_the_same_seed(tmp_path, impl):
    """4000 env steps, an update every 2 and a short ε schedule: an untrained greedy policy
    holds the pole ~10 steps; both envs take it past 100 (measured: 200-260, seeds 1 and 2)."""
    cfg = _config(tmp_path / impl, f'env.impl="{impl}"', 'run.stability="off"',
                  "gym.total_steps=4000", "gym.learning_starts=500", "gym.train_every=2",
                  "gym.eval_episodes=20", "agent.eps_decay_steps=5000", "agent.lr=1e-3",
                  "agent.target_update_period=100")  # fmt: skip
    summary = train(cfg)
    assert summary["eval"]["mean_return"] >= 100, summary["eval"]
