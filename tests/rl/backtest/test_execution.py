"""Fills and costs (trimtab.rl.backtest.execution) as the env charges them: each execution
against a hand computation, same_close vs next_open differing exactly by the fill, financing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trimtab.rl.backtest.execution import Costs, Fills, fill_returns, step_log_return
from trimtab.rl.envs.trading import BatchedTradingEnv, evaluate

# two bars after bar 0, one asset: close 100 -> 110 -> 99, opens 104 and 108
OPEN = np.array([[100.0], [104.0], [108.0]])
CLOSE = np.array([[100.0], [110.0], [99.0]])
LOGR = np.vstack([[0.0], np.diff(np.log(CLOSE), axis=0)])


def _run(execution: str, actions: list[int], costs: Costs | float = 0.0) -> np.ndarray:
    fills = fill_returns(LOGR, OPEN, CLOSE, execution)
    feats = np.zeros((3, 1, 1))
    ev = evaluate(feats, fills, np.array(actions).reshape(-1, 1), costs=costs, start=0, end=2)
    return ev.log_returns


def test_fill_returns_split_the_bar_at_the_open():
    f = fill_returns(LOGR, OPEN, CLOSE, "next_open")
    np.testing.assert_allclose(f.pre[1:, 0], np.log([104 / 100, 108 / 110]))
    np.testing.assert_allclose(f.post[1:, 0], np.log([110 / 104, 99 / 108]))
    np.testing.assert_allclose(f.log_returns, LOGR)
    assert fill_returns(LOGR, OPEN, CLOSE, "same_close").pre.sum() == 0
    assert fill_returns(LOGR, OPEN, CLOSE, "next_close").post.sum() == 0


def test_each_execution_against_a_hand_computation():
    # long on both decisions (action 2 = level +1), no costs
    same = _run("same_close", [2, 2])
    np.testing.assert_allclose(same, np.log([110 / 100, 99 / 110]))
    nxt = _run("next_open", [2, 2])
    # decision 0: flat overnight (0 -> 104 missed), long from the open 104 to the close 110
    np.testing.assert_allclose(nxt, [math.log(110 / 104), math.log(99 / 110)])
    late = _run("next_close", [2, 2])
    np.testing.assert_allclose(late, [0.0, math.log(99 / 110)])


def test_same_close_and_next_open_differ_exactly_by_the_fill():
    # flat -> long -> short: the old position earns the overnight part under next_open
    for actions in ([2, 0], [0, 2], [1, 2]):
        levels = np.array([-1.0, 0.0, 1.0])[actions]
        prev = np.concatenate([[0.0], levels[:-1]])
        same, nxt = _run("same_close", actions), _run("next_open", actions)
        gap = np.log(OPEN[1:, 0] / CLOSE[:-1, 0])
        intra = np.log(CLOSE[1:, 0] / OPEN[1:, 0])
        np.testing.assert_allclose(same, np.log1p(levels * np.expm1(LOGR[1:, 0])))
        want = np.log1p(prev * np.expm1(gap)) + np.log1p(levels * np.expm1(intra))
        np.testing.assert_allclose(nxt, want)


def test_turnover_pays_commission_and_half_spread():
    costs = Costs(commission_bps=2.0, half_spread_bps=3.0)
    free, paid = _run("next_open", [2, 0]), _run("next_open", [2, 0], costs)
    np.testing.assert_allclose(free - paid, [5e-4 * 1.0, 5e-4 * 2.0])  # enter 1, flip 2


def test_flat_earns_the_cash_rate_and_a_short_pays_borrow():
    costs = Costs(cash_pct=2.52, borrow_pct=5.04, periods_per_year=252)
    zero = torch.zeros(1, 1)
    flat = step_log_return(zero, zero, zero, zero, costs, True)
    assert float(flat) == pytest.approx(math.log1p(1e-4))
    short = -torch.ones(1, 1)
    # short over the night: cash 1 + 1 (proceeds) earns 2 x 1e-4, the borrow fee 2e-4
    held = step_log_return(short, short, zero, zero, costs, True)
    assert float(held) == pytest.approx(math.log1p(2e-4 - 2e-4), abs=1e-12)


def test_env_rewards_use_the_fills():
    fills = fill_returns(LOGR, OPEN, CLOSE, "next_open")
    env = BatchedTradingEnv(np.zeros((3, 1, 1)), fills, 1, 2, costs=0.0, dtype=torch.float64)
    env.reset(starts=[0])
    r = env.step(torch.tensor([[2]])).reward
    assert float(r[0]) == pytest.approx(math.log(110 / 104))


def test_bad_execution_and_costs_are_refused():
    with pytest.raises(ValueError, match="execution"):
        fill_returns(LOGR, OPEN, CLOSE, "at_vwap")
    with pytest.raises(ValueError, match="borrow_pct"):
        Costs(borrow_pct=float("nan"))
    with pytest.raises(ValueError, match="execution"):
        Fills(LOGR, LOGR, "whenever")


@pytest.mark.parametrize("overnight_old", [True, False])
def test_reward_parts_by_hand_and_their_sum(overnight_old):
    """Each asset's part of a step: the log of its own old weight's overnight growth and of its
    new weight's, its own turnover's cost, its share of the cash rate and its own borrow; the
    parts sum to the portfolio's net log return to first order, a bad tick's part is finite
    (floored as the portfolio's), and an env with reward_parts returns them beside its
    unchanged reward."""
    from trimtab.rl.backtest.execution import RUIN_EQUITY, step_reward_parts

    costs = Costs(commission_bps=2.0, half_spread_bps=3.0, borrow_pct=0.5, cash_pct=2.0)
    new, old = torch.tensor([[1.0, -1.0, 0.0]]), torch.tensor([[0.0, 1.0, -1.0]])
    pre = torch.tensor([[0.01, -0.02, 0.005]], dtype=torch.float64)
    post = torch.tensor([[0.003, 0.004, -0.01]], dtype=torch.float64)
    parts = step_reward_parts(new, old, pre, post, costs, overnight_old)
    # asset 1, long to short: the long earns the night, the short the day, 2/3 of turnover
    v = (1 / 3) if overnight_old else (-1 / 3)  # the weight held over the night
    by_hand = math.log1p((1 / 3) * -0.02) + math.log1p((-1 / 3) * 0.004)
    by_hand += math.log1p(costs.cash_per_bar * (1 / 3 - v) - costs.borrow_per_bar * max(-v, 0))
    by_hand -= costs.per_turnover * (2 / 3)
    assert float(parts[0, 1]) == pytest.approx(by_hand, abs=1e-8)  # float32 weights
    total = step_log_return(new, old, pre, post, costs, overnight_old)
    assert float(parts.sum()) == pytest.approx(float(total), abs=2e-5)
    tick = step_reward_parts(new, old, pre, torch.tensor([[1e28, 0.0, 0.0]]), costs, False)
    assert torch.isfinite(tick).all() and float(tick[0, 0]) < 70  # log(1 + 1e28 / 3)
    short = step_reward_parts(-new, old, pre, torch.tensor([[1e28, 0.0, 0.0]]), costs, False)
    assert math.isfinite(float(short[0, 0]))
    assert float(short[0, 0]) <= math.log(RUIN_EQUITY) + 0.01  # floored: the short is ruined

    fills = fill_returns(LOGR, OPEN, CLOSE, "next_open")
    env = BatchedTradingEnv(np.zeros((3, 1, 1)), fills, 1, 2, costs=costs, reward_parts=True)
    plain = BatchedTradingEnv(np.zeros((3, 1, 1)), fills, 1, 2, costs=costs)
    env.reset(starts=[0])
    plain.reset(starts=[0])
    a, b = env.step(torch.tensor([[2]])), plain.step(torch.tensor([[2]]))
    assert torch.equal(a.reward, b.reward) and b.parts is None
    assert a.parts.shape == (1, 1)
    torch.testing.assert_close(a.parts[0, 0], a.reward[0])  # one asset: its part is the whole
