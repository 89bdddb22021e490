"""Trading envs: shapes, hand-worked rewards and costs, autoreset, determinism, gymnasium."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from trimtab.rl.backtest.execution import Costs
from trimtab.rl.envs.trading import BatchedTradingEnv, TradingGymEnv, evaluate, portfolio_log_return

T, A, F = 60, 3, 2


def fold(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(T, A, F, generator=g, dtype=torch.float64)
    rets = 0.02 * torch.randn(T, A, generator=g, dtype=torch.float64)
    return feats, rets


def test_step_shapes_and_observation_layout() -> None:
    feats, rets = fold()
    env = BatchedTradingEnv(feats, rets, n_envs=5, window_len=10, seed=1)
    obs = env.reset(starts=[0, 1, 2, 3, 4])
    assert obs.shape == (5, A * F + A) and obs.dtype == torch.float32 and env.obs_dim == A * F + A
    torch.testing.assert_close(obs[2, : A * F], feats[2].flatten().float())
    assert torch.all(obs[:, A * F :] == 0)  # flat at the start
    res = env.step(torch.full((5, A), 2))
    assert res.reward.shape == (5,) and res.terminated.dtype == torch.bool
    assert res.truncated.shape == (5,) and not res.truncated.any() and not res.terminated.any()
    torch.testing.assert_close(res.obs[:, A * F :], torch.ones(5, A))  # now long everywhere
    torch.testing.assert_close(res.obs[3, : A * F], feats[4].flatten().float())


def test_hand_worked_reward_and_cost() -> None:
    """Two assets, 10 bps. Day 1: asset 0 +10%, asset 1 -50%. Day 2: asset 0 +20%."""
    feats = torch.zeros(4, 2, 1, dtype=torch.float64)
    rets = torch.log(
        torch.tensor([[1.0, 1.0], [1.1, 0.5], [1.2, 1.0], [1.0, 1.0]], dtype=torch.float64)
    )
    env = BatchedTradingEnv(feats, rets, 1, 3, costs=10.0, dtype=torch.float64)
    env.reset(starts=[0])
    # flat -> long asset 0 (w = 1/2): log(1 + 0.5 * 0.1) - 0.001 * 0.5
    r1 = env.step(torch.tensor([[2, 1]])).reward.item()
    assert r1 == pytest.approx(math.log(1.05) - 0.0005, abs=1e-15)
    # long -> short asset 0 (|dw| = 1): log(1 - 0.5 * 0.2) - 0.001 * 1
    r2 = env.step(torch.tensor([[0, 1]])).reward.item()
    assert r2 == pytest.approx(math.log(0.9) - 0.001, abs=1e-15)
    # holding costs nothing
    r3 = env.step(torch.tensor([[0, 1]]))
    assert r3.reward.item() == pytest.approx(0.0, abs=1e-15) and bool(r3.truncated)


def test_log_argument_stays_positive_under_extreme_returns() -> None:
    r = torch.full((1, 4), -0.99999, dtype=torch.float64)
    out = portfolio_log_return(torch.ones(1, 4), torch.zeros(1, 4), r, cost=1e-4)
    assert torch.isfinite(out).all() and out.item() < -10


def test_autoreset_same_step_keeps_final_observation() -> None:
    feats, rets = fold()
    env = BatchedTradingEnv(feats, rets, n_envs=4, window_len=3, seed=2)
    starts = torch.tensor([0, 5, 10, 56])
    env.reset(starts=starts)
    total = torch.zeros(4)
    for k in range(3):
        res = env.step(torch.full((4, A), 2))
        total += res.reward
        assert bool(res.truncated.all()) == (k == 2)
    assert not res.terminated.any()
    torch.testing.assert_close(res.final_obs[:, : A * F], feats[starts + 3].flatten(1).float())
    assert torch.all(res.final_obs[:, A * F :] == 1) and torch.all(res.obs[:, A * F :] == 0)
    new_start = env.start.clone()
    torch.testing.assert_close(res.obs[:, : A * F], feats[new_start].flatten(1).float())
    assert torch.all(new_start <= T - 1 - 3)
    torch.testing.assert_close(res.episode_return, total)
    res = env.step(torch.ones(4, A, dtype=torch.long))  # the next episode runs from its start
    assert torch.all(env.t == new_start + 1) and torch.all(env.episode_return == res.reward)


def test_determinism_by_seed() -> None:
    feats, rets = fold()

    def rollout(seed: int) -> torch.Tensor:
        env = BatchedTradingEnv(feats, rets, n_envs=8, window_len=5, seed=seed)
        g = torch.Generator().manual_seed(0)
        out = [env.reset()]
        for _ in range(12):  # crosses two autoresets
            out.append(env.step(torch.randint(0, 3, (8, A), generator=g)).obs)
        return torch.stack(out)

    torch.testing.assert_close(rollout(3), rollout(3), rtol=0, atol=0)
    assert not torch.equal(rollout(3), rollout(4))


def test_batch_matches_sequential_evaluation() -> None:
    feats, rets = fold()
    n, window = 6, 15
    starts = torch.tensor([0, 3, 17, 30, 44, T - 1 - window])
    actions = torch.randint(0, 3, (window, n, A), generator=torch.Generator().manual_seed(1))
    env = BatchedTradingEnv(feats, rets, n, window, costs=5.0, dtype=torch.float64)
    env.reset(starts=starts)
    rewards = torch.stack([env.step(actions[k]).reward for k in range(window)])
    for i in range(n):
        s = int(starts[i])
        ev = evaluate(feats, rets, actions[:, i], costs=5.0, start=s, end=s + window)
        np.testing.assert_allclose(rewards[:, i].numpy(), ev.log_returns, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(ev.asset_log_returns, rets[s + 1 : s + window + 1].numpy())


def test_evaluate_with_a_policy_and_the_always_long_baseline() -> None:
    feats, rets = fold()
    seen = []

    def policy(obs: torch.Tensor) -> torch.Tensor:
        seen.append(obs[0, A * F :].clone())
        return torch.full((1, A), 2)

    ev = evaluate(feats, rets, policy, costs=3.0, start=10)
    assert ev.log_returns.shape == (T - 1 - 10,) and ev.weights.shape == (T - 11, A)
    assert torch.all(seen[0] == 0) and torch.all(seen[1] == 1)  # the position is observed
    np.testing.assert_allclose(ev.turnover, np.r_[1.0, np.zeros(T - 12)])
    # always long: the equal-weight book rebalanced daily, the entry's 3 bp paid once
    book = np.log1p(np.expm1(ev.asset_log_returns).mean(1)) - 3e-4 * ev.turnover
    np.testing.assert_allclose(ev.log_returns, book, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"levels": (-2.0, 0.0, 2.0)}, "level"),
        ({"window_len": T}, "window_len"),
        ({"window_len": 0}, "window_len"),
        ({"n_envs": 0}, "n_envs"),
        ({"costs": -1.0}, "per unit of turnover"),
        ({"features": torch.full((T, A, F), float("nan"))}, "finite"),
        ({"returns": torch.zeros(T, A + 1)}, "log_returns"),
    ],
)
def test_invalid_arguments(kwargs: dict, message: str) -> None:
    feats, rets = fold()
    args = {"features": feats, "returns": rets, "n_envs": 2, "window_len": 5, **kwargs}
    with pytest.raises(ValueError, match=message):
        BatchedTradingEnv(**args)


def test_gymnasium_check_env_and_seeded_reset() -> None:
    feats, rets = fold()
    env = TradingGymEnv(feats.numpy(), rets.numpy(), window_len=7, costs=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)  # no rendering to check
    assert env.action_space.nvec.tolist() == [3] * A
    o1, i1 = env.reset(seed=11)
    o2, i2 = env.reset(seed=11)
    assert i1 == i2 and np.array_equal(o1, o2) and o1.dtype == np.float32
    obs, info = env.reset(options={"start": 4})
    assert info["start"] == 4 and env.observation_space.contains(obs)
    for k in range(7):
        obs, reward, terminated, truncated, info = env.step(np.array([2, 1, 0]))
        assert isinstance(reward, float) and not terminated and truncated == (k == 6)
        assert info["day"] == 4 + k
    np.testing.assert_allclose(obs[: A * F], feats[11].flatten().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(obs[A * F :], [1.0, 0.0, -1.0])


@pytest.mark.gpu
# the eager step, and the kernel (trimtab.kernels.market: impl=None on CUDA)
@pytest.mark.parametrize("impl", ["torch", None])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_step_makes_no_host_sync_on_cuda(dtype: torch.dtype, impl: str | None) -> None:
    feats, rets = fold()
    costs = Costs(commission_bps=1.0, borrow_pct=0.5, cash_pct=2.0)
    env = BatchedTradingEnv(feats, rets, n_envs=64, window_len=5, costs=costs, device="cuda",
                            dtype=dtype, reward_parts=True, impl=impl)  # fmt: skip
    assert (env._launch is None) == (impl == "torch")
    action = torch.randint(0, 3, (64, A), device="cuda")
    env.step(action)  # warm-up (compiles the kernel)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(12):
            env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_ruin_ends_the_episode_with_a_finite_reward() -> None:
    """A bad tick (x1000, one day) against a short position: the portfolio loses everything
    (a simple return of about -500), not more; the episode terminates and the env resets."""
    from trimtab.rl.envs.trading import RUIN_EQUITY

    feats = torch.zeros(6, 2, 1, dtype=torch.float64)
    prices = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1000.0, 1.0], [1.0, 1.0], [1.0, 1.0],
                           [1.0, 1.0]], dtype=torch.float64)  # fmt: skip
    rets = torch.log(prices / prices.roll(1, 0))
    rets[0] = 0.0
    env = BatchedTradingEnv(feats, rets, 2, 4, costs=0.0, dtype=torch.float32, seed=3)
    env.reset(starts=[0, 0])
    env.step(torch.tensor([[0, 1], [2, 1]]))  # env 0 short asset 0, env 1 long
    res = env.step(torch.tensor([[0, 1], [2, 1]]))  # through the x1000 day
    assert torch.isfinite(res.reward).all()
    assert res.reward[0].item() == pytest.approx(math.log(RUIN_EQUITY), rel=1e-6)
    assert res.terminated.tolist() == [True, False] and not res.truncated.any()
    assert res.episode_return[0].item() == pytest.approx(math.log(RUIN_EQUITY), rel=1e-6)
    assert torch.all(res.obs[0, 2:] == 0)  # reset: flat again
    assert res.reward[1].item() == pytest.approx(math.log(1 + 0.5 * 999), rel=1e-6)
    # evaluation: nothing is traded after the ruin day
    ev = evaluate(feats, rets, torch.tensor([[0, 1]] * 5), start=0, costs=0.0)
    assert ev.ruin == 1 and np.isfinite(ev.log_returns).all()
    assert np.all(ev.log_returns[2:] == 0) and np.all(ev.weights[2:] == 0)
