"""Baselines: hand-worked levels, no look-ahead, random turnover, the oracle, and their P&L
through the env's formula (fills, financing, ruin)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trimtab.rl.backtest import baselines as bl
from trimtab.rl.backtest.execution import Costs, Fills, fill_returns
from trimtab.rl.envs.trading import evaluate

U = 2.0**-6  # returns in multiples of a power of two: the sums below are exact
# bars 0..6 of 2 assets; row 0 = 0
R = U * np.array([[0, 0], [1, -2], [-3, 1], [2, 0], [0, 1], [1, -1], [-2, 3]], np.float64)


def test_buy_and_hold_and_flat_use_the_levels_extremes_and_nearest_zero() -> None:
    np.testing.assert_array_equal(bl.buy_and_hold(R, start=1), np.ones((5, 2)))
    levels = (-1.0, -0.25, 0.5)
    np.testing.assert_array_equal(bl.buy_and_hold(R, start=2, end=4, levels=levels), 0.5)
    np.testing.assert_array_equal(bl.flat(R, start=1, levels=levels), np.full((5, 2), -0.25))
    assert bl.flat(R, start=6).shape == (0, 2)


def test_momentum_hand_worked() -> None:
    # k = 2 at decision bar t: r_{t-1} + r_t, bars 1..5
    want = [[1, -1],  # r0 + r1 = (1, -2)
            [-1, -1],  # r1 + r2 = (-2, -1)
            [-1, 1],  # (-1, 1)
            [1, 1],  # (2, 1)
            [1, 0]]  # (1, 0): flat  # fmt: skip
    np.testing.assert_array_equal(bl.momentum(R, 2, start=1), want)
    # k longer than the history: what there is (bars 0..t)
    np.testing.assert_array_equal(bl.momentum(R, 10, start=1, end=3), [[1, -1], [-1, -1]])


def test_reversal_hand_worked() -> None:
    want = [[-1, 1], [1, -1], [-1, 0], [0, -1], [-1, 1]]  # against r_t, bars 1..5
    np.testing.assert_array_equal(bl.reversal(R, start=1), want)
    np.testing.assert_array_equal(bl.reversal(R, start=1, levels=(0.0, 1.0))[0], [0, 1])


def test_ma_crossover_hand_worked_with_look_back_before_start() -> None:
    ln2 = math.log(2.0)
    r = np.array([[0.0], [ln2], [ln2], [-ln2], [-ln2], [ln2]])  # close 1, 2, 4, 2, 1, 2
    # t=0: MA2 = MA3 = 1; t=1: both 1.5 (only two closes); t=2: 3 vs 7/3; t=3: 3 vs 8/3;
    # t=4: 1.5 vs 7/3
    np.testing.assert_array_equal(bl.ma_crossover(r, 2, 3, start=0), [[0], [0], [1], [1], [-1]])
    np.testing.assert_array_equal(bl.ma_crossover(r, 2, 3, start=2), [[1], [1], [-1]])
    # fast 1, slow 2: P_t above the mean of P_{t-1}, P_t exactly when r_t > 0
    np.testing.assert_array_equal(bl.ma_crossover(R, 1, 2, start=1), np.sign(R[1:6]))


STRATEGIES = {
    "buy_and_hold": lambda r, s, e: bl.buy_and_hold(r, start=s, end=e),
    "flat": lambda r, s, e: bl.flat(r, start=s, end=e),
    "momentum": lambda r, s, e: bl.momentum(r, 5, start=s, end=e),
    "reversal": lambda r, s, e: bl.reversal(r, start=s, end=e),
    "ma_crossover": lambda r, s, e: bl.ma_crossover(r, 3, 8, start=s, end=e),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_no_look_ahead(name: str) -> None:
    rng = np.random.default_rng(0)
    r = rng.normal(0, 0.01, (60, 3))
    r[0] = 0
    start, end = 20, 59
    levels = STRATEGIES[name](r, start, end)
    assert levels.shape == (end - start, 3)
    for i in (0, 7, 25, end - start - 1):
        future = r.copy()
        future[start + i + 1 :] = rng.normal(0, 0.05, future[start + i + 1 :].shape)
        np.testing.assert_array_equal(
            STRATEGIES[name](future, start, end)[: i + 1], levels[: i + 1]
        )


@pytest.mark.parametrize(
    ("target", "levels"),
    [(0.1, (-1, 0, 1)), (0.4, (-1, 0, 1)), (0.05, (0, 1)), (0.3, (-1, -0.5, 0, 0.5, 1))],
)
def test_random_levels_match_the_turnover_target(target: float, levels: tuple) -> None:
    n_bars, n_assets = 40, 2
    x = bl.random_levels(target, 4000, 1, levels, n_bars, n_assets)
    assert x.shape == (4000, n_bars, n_assets) and set(np.unique(x)) <= set(map(float, levels))
    w = x / n_assets
    measured = np.abs(np.diff(w, axis=1, prepend=0.0)).sum(2).mean()
    assert measured == pytest.approx(target, rel=0.03)
    np.testing.assert_array_equal(x, bl.random_levels(target, 4000, 1, levels, n_bars, n_assets))


def test_random_levels_below_the_entry_cost_never_redraw() -> None:
    x = bl.random_levels(0.0, 50, 2, (-1, 0, 1), 30, 3)
    assert (x == x[:, :1]).all()  # the first draw is held: p clipped to 0


def test_oracle_hand_worked_with_costs() -> None:
    c = 0.001
    edge = np.array([0.0005, 0.002, 0.0015, -0.0005, -0.003, 0.0])[:, None]
    # 0: +0.0005 < cost to enter: stay flat; 1: 0.002 - 0.001 > 0: long; 2: hold;
    # 3: -0.0005 against the long, but flattening costs 0.001: hold; 4: short gains
    # 0.003 - 0.002 (two units of turnover); 5: no edge: hold the short
    want = [[0], [1], [1], [1], [-1], [-1]]
    np.testing.assert_array_equal(bl.oracle_levels(edge, (-1, 0, 1), c), want)
    # no cost: the sign of the edge, a zero edge keeps the position (the smaller trade)
    e2 = np.array([[0.0005, 0.0], [0.0, -0.001], [-0.0001, 0.0]])
    want = [[1, 0], [1, -1], [-1, -1]]
    np.testing.assert_array_equal(bl.oracle_levels(e2, (-1, 0, 1), 0.0), want)


def test_simulate_constant_long_same_close_is_the_rebalanced_equal_weight_book() -> None:
    rng = np.random.default_rng(2)
    r = rng.normal(0, 0.02, (30, 3))
    r[0] = 0
    start, end = 5, 29
    fills = Fills.same_close(r).slice(start + 1, end + 1)
    sim = bl.simulate(bl.buy_and_hold(r, start=start, end=end), fills, Costs())
    want = np.log1p(np.expm1(r[start + 1 : end + 1]).mean(1))
    np.testing.assert_allclose(sim.log_returns[0], want, rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(sim.weights[0], 1 / 3)
    assert sim.turnover[0, 0] == pytest.approx(1.0) and (sim.turnover[0, 1:] == 0).all()
    assert sim.ruin.tolist() == [-1]


def test_next_open_differs_from_same_close_by_the_fill() -> None:
    rng = np.random.default_rng(3)
    t_len = 6
    r = rng.normal(0, 0.02, (t_len, 1))
    r[0] = 0
    close = 100 * np.exp(np.cumsum(r, axis=0))
    open_ = close * np.exp(rng.normal(0, 0.01, close.shape))  # open_ / close sets the intraday
    nxt = fill_returns(r, open_, close, "next_open").slice(1, t_len)
    same = fill_returns(r, open_, close, "same_close").slice(1, t_len)
    levels = np.array([[1.0], [1.0], [-1.0], [0.0], [0.0]])
    g, i = nxt.pre[:, 0], nxt.post[:, 0]  # overnight and intraday of bars 1..5
    got_next = bl.simulate(levels, nxt, Costs()).log_returns[0]
    got_same = bl.simulate(levels, same, Costs()).log_returns[0]
    # next_open: the old weights earn the overnight part, the new ones the intraday part
    want_next = [i[0],  # entering: the overnight move before the first fill is missed
                 g[1] + i[1],  # held long: the whole bar
                 g[2] + math.log1p(-math.expm1(i[2])),  # long overnight, short from the open
                 math.log1p(-math.expm1(g[3])),  # short overnight, flat from the open
                 0.0]  # fmt: skip
    np.testing.assert_allclose(got_next, want_next, rtol=1e-12, atol=1e-16)
    rr = r[1:, 0]
    want_same = [rr[0], rr[1], math.log1p(-math.expm1(rr[2])), 0.0, 0.0]
    np.testing.assert_allclose(got_same, want_same, rtol=1e-12, atol=1e-16)


def test_financing_flat_earns_cash_and_a_short_pays_borrow() -> None:
    zero = np.zeros((4, 1))
    fills = Fills.same_close(zero)
    cash = Costs(cash_pct=5.0, periods_per_year=252)
    flat = bl.simulate(np.zeros((4, 1)), fills, cash).log_returns[0]
    np.testing.assert_allclose(flat, math.log1p(0.05 / 252), rtol=1e-14)
    borrow = Costs(borrow_pct=3.0, periods_per_year=252)
    short = bl.simulate(-np.ones((4, 1)), fills, borrow).log_returns[0]
    np.testing.assert_allclose(short, math.log1p(-0.03 / 252), rtol=1e-14)
    # a short keeps its proceeds in cash: 2 units earn the cash rate, 1 pays the borrow fee
    both = Costs(borrow_pct=3.0, cash_pct=5.0, periods_per_year=52)
    short = bl.simulate(-np.ones((4, 1)), fills, both).log_returns[0]
    np.testing.assert_allclose(short, math.log1p((2 * 0.05 - 0.03) / 52), rtol=1e-14)


def test_simulate_is_the_envs_evaluation_with_costs_fills_and_ruin() -> None:
    rng = np.random.default_rng(4)
    t_len, n_assets = 40, 1
    r = rng.normal(0, 0.02, (t_len, n_assets))
    r[0] = 0
    r[25] = math.log(3.0)  # +200% in a bar: a short loses more than everything
    close = 100 * np.exp(np.cumsum(r, axis=0))
    open_ = close * np.exp(rng.normal(0, 0.005, close.shape))
    fills = fill_returns(r, open_, close, "next_open")
    costs = Costs(2.0, 3.0, 1.0, 4.0, 252.0)
    levels = (-1.0, 0.0, 1.0)
    start, end = 10, 35
    actions = rng.integers(0, 3, (end - start, n_assets))
    actions[24 - start] = 0  # short through bar 25
    feats = torch.zeros(t_len, n_assets, 1, dtype=torch.float64)
    ev = evaluate(feats, fills, actions, levels=levels, costs=costs, start=start, end=end)
    lv = np.asarray(levels)[actions]
    sim = bl.simulate(lv, fills.slice(start + 1, end + 1), costs)
    assert ev.ruin == 24 - start and sim.ruin.tolist() == [24 - start]
    np.testing.assert_allclose(sim.log_returns[0], ev.log_returns, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(sim.weights[0], ev.weights, atol=0)
    np.testing.assert_allclose(sim.turnover[0], ev.turnover, atol=1e-15)
    assert (sim.log_returns[0, 24 - start + 1 :] == 0).all()


def test_simulate_batches_agree_with_one_at_a_time() -> None:
    rng = np.random.default_rng(5)
    r = rng.normal(0, 0.02, (21, 2))
    r[0] = 0
    fills = Fills.same_close(r).slice(1, 21)
    books = bl.random_levels(0.3, 6, 0, (-1, 0, 1), 20, 2)
    costs = Costs(5.0, 0.0, 1.0, 2.0)
    sim = bl.simulate(books, fills, costs)
    assert sim.log_returns.shape == (6, 20) and sim.weights.shape == (6, 20, 2)
    for n in range(6):
        one = bl.simulate(books[n], fills, costs)
        np.testing.assert_array_equal(one.log_returns[0], sim.log_returns[n])
        np.testing.assert_array_equal(one.turnover[0], sim.turnover[n])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: bl.momentum(R, 0), "k >= 1"),
        (lambda: bl.ma_crossover(R, 3, 3), "fast < slow"),
        (lambda: bl.flat(R, start=3, end=7), "T - 1"),
        (lambda: bl.flat(R[:, 0]), r"\[T, A\]"),
        (lambda: bl.simulate(np.ones((5, 2)), Fills.same_close(R), Costs()), "filled against"),
        (lambda: bl.oracle_levels(np.zeros(3), (0, 1), 0.0), r"\[L, A\]"),
    ],
)
def test_errors(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()
