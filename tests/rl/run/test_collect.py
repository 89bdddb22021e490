"""Collection (act -> env step -> check -> store): the replay's direct n_step = 1 rows, ε on a
device clock, the episode statistics; on a CUDA device, the captured collection gives the eager
one's numbers and makes no host synchronisation, and a whole run with it equals one without."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rl_helpers import tiny

from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.dqn import AgentConfig, DQNAgent
from trimtab.rl.agent.learner import build_learner
from trimtab.rl.agent.replay import ReplayBuffer
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import apply_overrides, from_dict, load_toml
from trimtab.rl.envs.registry import make_adapter
from trimtab.rl.run.collect import Collector

EXAMPLE = Path(__file__).parents[3] / "examples" / "cartpole.toml"
gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_one_step_rows_are_the_windows_rows_in_ring_order():
    """n_step = 1 writes each env's step in env order at the ring position, wrapping, with
    G = r and discount = γ (0 after a termination), and the new rows at the top priority."""
    g = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(10, 3, 2, n_step=1, gamma=0.97, prioritized=True)
    rows = []
    for _ in range(4):  # 4 x 4 envs into 10 rows: wraps
        obs, nxt = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
        act, rew = torch.randint(0, 3, (4, 2), generator=g), torch.randn(4, generator=g)
        term, trunc = torch.rand(4, generator=g) < 0.4, torch.rand(4, generator=g) < 0.3
        buf.add(obs, act, rew, nxt, term, trunc)
        rows += [(obs[i], act[i], rew[i], nxt[i], 0.0 if term[i] else 0.97) for i in range(4)]
    assert int(buf.size) == 10 and int(buf._ptr) == 16 % 10
    for k, (obs, act, rew, nxt, disc) in enumerate(rows[-10:]):
        r = (6 + k) % 10  # the last 10 rows written, oldest first, from position 16 % 10
        assert torch.equal(buf.obs[r], obs) and torch.equal(buf.action[r], act)
        assert torch.equal(buf.next_obs[r], nxt) and buf.reward[r] == rew
        assert buf.discount[r] == torch.tensor(disc, dtype=torch.float32)
    assert torch.equal(buf.priority[:10], torch.ones(10))  # max priority 1 at insertion


def test_one_step_rows_equal_the_n_step_path_with_n_1():
    """The direct path stores what the windows' general path computes with n = 1."""
    g = torch.Generator().manual_seed(1)
    direct, general = ReplayBuffer(64, 3, 1, n_step=1), ReplayBuffer(64, 3, 1, n_step=1)
    for _ in range(17):  # 85 rows into 64: wraps
        obs, act = torch.randn(5, 3, generator=g), torch.randint(0, 2, (5, 1), generator=g)
        rew, nxt = torch.randn(5, generator=g), torch.randn(5, 3, generator=g)
        term, trunc = torch.rand(5, generator=g) < 0.3, torch.rand(5, generator=g) < 0.3
        direct.add(obs, act, rew, nxt, term, trunc)
        if general._win is None:
            general._allocate_windows(5)
        general._add_windows(obs, act, rew, nxt, term, trunc)
    for key in ("obs", "action", "reward", "next_obs", "discount"):
        assert torch.equal(getattr(direct, key), getattr(general, key)), key
    assert int(direct._ptr) == int(general._ptr) and int(direct.size) == int(general.size)


def test_epsilon_and_actions_on_a_device_clock_equal_the_host_clock():
    cfg = AgentConfig(hidden=8, depth=1, n_atoms=5, eps_decay_steps=1000, eps_end=0.1)
    a, b = DQNAgent(3, [2, 3], cfg), DQNAgent(3, [2, 3], cfg)
    for step in (0, 1, 333, 999, 1000, 5000):
        assert float(a.epsilon(torch.tensor(step))) == a.epsilon(step), step
    obs = torch.randn(64, 3, generator=torch.Generator().manual_seed(2))
    for step in (0, 400, 900, 2000):
        assert torch.equal(a.act(obs, step), b.act(obs, torch.tensor(step))), step


def _cartpole_cfg(*overrides: str) -> TrainConfig:
    sets = ['env.impl="torch"', "gym.learning_starts=100", "run.progress=false", *overrides]
    return from_dict(TrainConfig, apply_overrides(load_toml(EXAMPLE), sets))


def _collector(cfg: TrainConfig, device: str, capture: bool, seed: int = 3):
    dev = torch.device(device)
    adapter = make_adapter(cfg, dev)
    with Lifecycle():
        learner = build_learner(cfg, adapter.obs_dim, adapter.branch_sizes, dev)
    replay = learner.agent.make_replay(adapter.reward_parts)
    c = Collector(learner.agent, adapter, learner, replay, cfg.env.reward_scale, capture=capture)
    c.start(adapter.open_fold(0, seed), 0)
    return c


def test_episode_statistics_sum_the_returns_of_the_episodes_that_ended():
    c = _collector(_cartpole_cfg("env.n_envs=8"), "cpu", capture=False)
    env = c.adapter.env
    returns, steps = [], 0
    for _ in range(60):
        before = env.episode_return.clone()
        c.step(steps)
        steps += 8
        ended = env.elapsed == 0  # an episode ended this step and its env was reset
        returns += (before + 1)[ended].tolist()
    total, count = c.episodes().tolist()
    assert count == len(returns) > 8 and total == pytest.approx(sum(returns))
    assert int(c.replay.size) == 60 * 8 and torch.equal(c.obs, env.state.float())
    c.clear()
    assert c.episodes().tolist() == [0.0, 0.0]


def test_capture_is_refused_without_a_cuda_device_or_device_envs():
    cfg = _cartpole_cfg()
    with pytest.raises(ValueError, match="capture=True needs a CUDA device"):
        _collector(cfg, "cpu", capture=True)


# --- on a CUDA device -------------------------------------------------------------------------
@pytest.mark.parametrize("env", ["cartpole", "market"])
@pytest.mark.parametrize("mode", ["adaptive", "off"])
def test_captured_collection_equals_eager_and_makes_no_host_sync(env, mode, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if env == "cartpole":
        cfg = _cartpole_cfg("env.n_envs=64", f'run.stability="{mode}"', 'run.device="cuda"')
    else:
        cfg = tiny(tmp_path, device="cuda", stability=mode)
    runs = {}
    for capture in (False, True):
        torch.manual_seed(0)
        c = _collector(cfg, "cuda", capture)
        steps = 0
        params = list(c.agent.online.parameters())
        for k in range(40):  # 3 warm-up steps, a capture, 36 replays
            if k == 10:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            c.step(steps)
            steps += c.n_envs
            with torch.no_grad():  # learning in between, in place: a replay acts on it
                torch._foreach_mul_(params, 0.97)
                torch._foreach_add_(params, 0.01 * (k % 3 - 1))
        torch.cuda.set_sync_debug_mode("default")
        assert (c.graph is not None) == capture
        # the replay's rows (not its scratch row, which takes the rows no transition leaves
        # for, duplicates written in any order)
        rows = {f"replay.{k}": getattr(c.replay, k)[: c.replay.capacity]
                for k in ("obs", "action", "reward", "next_obs", "discount")}  # fmt: skip
        runs[capture] = {
            "obs": c.obs, "episodes": c.episodes(), "size": c.replay.size, **rows,
            "agent_gen": c.agent.generator.get_state(),
            "env_gen": c.adapter.env.generator.get_state(),
            "sentinel": c.learner.stability.sentinel.fired(),
        }  # fmt: skip
    for key, eager in runs[False].items():
        assert torch.equal(runs[True][key].cpu(), eager.cpu()), key


@pytest.mark.parametrize("env", ["cartpole", "market"])
def test_a_run_captures_its_collection_once_per_fold_and_keeps_its_plan(env, tmp_path, monkeypatch):
    """A whole run on CUDA (learn step captured too): one capture per fold, the plan's counts.
    (Two CUDA runs are not compared number for number: the C51 projection's scatter_add_ adds
    in any order on a GPU; the captured collection's own parity is the test above.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from trimtab.rl.run.runner import train

    collectors = []  # one a fold: start() opens its fold
    start = Collector.start
    monkeypatch.setattr(Collector, "start", lambda c, *a: collectors.append(c) or start(c, *a))
    if env == "cartpole":
        cfg = _cartpole_cfg("gym.total_steps=2000", "gym.eval_episodes=4", 'run.device="cuda"',
                            f'run.out="{tmp_path}"')  # fmt: skip
        summary = train(cfg)
        captures = [c.captured.captures for c in collectors]
        assert (summary["env_steps"], summary["updates"], captures) == (2000, 191, [1])
        assert summary["eval"]["episodes"] == 4 and summary["train_return_last100"] > 8
    else:
        cfg = tiny(tmp_path, steps_per_fold=20, device="cuda")
        summary = train(replace(cfg, walkforward=replace(cfg.walkforward, folds=2)))
        captures = [c.captured.captures for c in collectors]
        assert summary["updates"] == 40 and captures == [1, 1] and not summary["halted"]


# --- defaults on a GPU --------------------------------------------------------------------------
def test_a_cuda_device_scales_the_unset_env_count_and_batch_size():
    from trimtab.rl.config import DEVICE_PROFILES, EnvConfig, RunConfig

    n_envs, batch = (
        DEVICE_PROFILES["cuda"]["env.n_envs"],
        DEVICE_PROFILES["cuda"]["agent.batch_size"],
    )
    cpu = TrainConfig()
    assert (cpu.env.n_envs, cpu.agent.batch_size) == tuple(DEVICE_PROFILES["cpu"].values())
    assert (n_envs, batch) != (cpu.env.n_envs, cpu.agent.batch_size)
    # a Gymnasium env stepped on the device takes the CUDA profile; the profile resolves inside
    # the config: Python and the CLI's tables give the same run
    torch_env = {"run": {"device": "cuda"}, "env": {"name": "gym:CartPole-v1", "impl": "torch"}}
    cuda = from_dict(TrainConfig, torch_env)
    assert (cuda.env.n_envs, cuda.agent.batch_size) == (n_envs, batch)
    gym_env = EnvConfig(name="gym:CartPole-v1", impl="torch")
    assert TrainConfig(run=RunConfig(device="cuda:1"), env=gym_env) == from_dict(
        TrainConfig, {**torch_env, "run": {"device": "cuda:1"}}
    )
    # the market keeps the CPU profile on CUDA (more envs and larger batches score lower there)
    market = from_dict(TrainConfig, {"run": {"device": "cuda"}})
    assert (market.env.n_envs, market.agent.batch_size) == (cpu.env.n_envs, cpu.agent.batch_size)
    # a value set explicitly is kept, even where it equals the CPU profile's
    given = from_dict(TrainConfig, {**torch_env, "env": {**torch_env["env"], "n_envs": 16},
                                    "agent": {"batch_size": 32}})  # fmt: skip
    assert (given.env.n_envs, given.agent.batch_size) == (16, 32)
    assert TrainConfig(run=RunConfig(device="cuda"), env=EnvConfig(n_envs=16)).env.n_envs == 16
    # Gymnasium's own envs step on the host: more copies gain nothing, the count is the CPU's
    host = from_dict(TrainConfig, {"run": {"device": "cuda"}, "env": {"name": "gym:CartPole-v1"}})
    assert host.env.n_envs == cpu.env.n_envs and host.agent.batch_size == batch


@pytest.mark.parametrize("mode", ["adaptive", "off"])
def test_captured_evaluation_equals_eager(mode, tmp_path, monkeypatch):
    """A fold's greedy evaluation with its day captured (run.cuda_graph auto on CUDA) gives the
    eager evaluation's numbers exactly: the fold's row and its daily curves."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from trimtab.rl.agent import graphed

    captures = []
    original = graphed.CapturedStep._capture
    monkeypatch.setattr(graphed.CapturedStep, "_capture",
                        lambda self, b: (captures.append(1), original(self, b)))  # fmt: skip
    cfg = tiny(tmp_path, device="cuda", stability=mode)
    adapter = make_adapter(cfg, torch.device("cuda"))
    with Lifecycle():
        learner = build_learner(cfg, adapter.obs_dim, adapter.branch_sizes, torch.device("cuda"))
    adapter.open_fold(0, seed=1)
    rows = {}
    for graph in ("off", "auto"):
        adapter.cfg = replace(cfg, run=replace(cfg.run, cuda_graph=graph))
        row, curves = adapter.evaluate(learner.agent, 0)
        rows[graph] = (row, curves)
    (row_e, curves_e), (row_c, curves_c) = rows["off"], rows["auto"]
    assert captures == [1]  # the eager run captured nothing, the other once
    assert row_c == row_e
    for key, value in curves_e.items():
        assert (curves_c[key] == value).all(), key


def test_the_env_check_sees_the_reward_in_training_units(monkeypatch):
    """The sentinel's env.reward threshold is a multiple of the targets' bound, which is in
    training units (rewards x env.reward_scale): the check sees the scaled reward that replay
    stores, not the env's. Checking the env's reward fired at x0.001 on the market as soon as a
    day's move passed the scaled bound x 1000."""
    c = _collector(_cartpole_cfg("env.n_envs=4", "env.reward_scale=0.001"), "cpu", capture=False)
    seen = []
    see_env = c.learner.see_env
    monkeypatch.setattr(c.learner, "see_env",
                        lambda obs, reward, final: (seen.append(reward.clone()),
                                                    see_env(obs, reward, final)))  # fmt: skip
    c.step(0)
    assert len(seen) == 1 and torch.equal(seen[0], torch.full((4,), 0.001))  # CartPole's +1
    assert torch.equal(c.replay.reward[:4].reshape(-1)[:4], seen[0])
