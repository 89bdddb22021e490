"""Window metrics and baselines on hand-worked examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trimtab.rl.metrics import (
    buy_and_hold,
    flat,
    hit_rate,
    max_drawdown,
    sharpe,
    total_return,
    turnover,
    window_metrics,
)

LOG = np.log


def test_sharpe_uses_simple_returns_ddof1_and_252_days() -> None:
    simple = np.array([0.01, -0.01, 0.02])
    # mean 0.00667, std(ddof=1) 0.015275
    expected = (0.02 / 3) / 0.015275252316519467 * math.sqrt(252)
    assert sharpe(np.log1p(simple)) == pytest.approx(expected, rel=1e-12)
    assert sharpe(np.full(10, 0.001)) == 0.0  # zero spread
    assert sharpe(np.array([0.05])) == 0.0 and sharpe(np.array([])) == 0.0


def test_total_return_and_drawdown() -> None:
    r = LOG([1.1, 0.8, 1.1, 1.25])  # equity 1.1, 0.88, 0.968, 1.21
    assert total_return(r) == pytest.approx(0.21)
    assert max_drawdown(r) == pytest.approx(0.2)  # 1.1 -> 0.88
    assert max_drawdown(LOG([0.5, 1.5])) == pytest.approx(0.5)  # a loss on day one counts
    assert max_drawdown(LOG([1.1, 1.2])) == 0.0


def test_turnover_and_hit_rate() -> None:
    w = np.array([[0.5, 0.0], [0.5, 0.5], [-0.5, 0.5], [0.0, 0.0]])
    # |dw| per day: 0.5 (entry), 0.5, 1.0, 1.0 (exit)
    assert turnover(w) == pytest.approx(0.75)
    r = np.array([0.1, -0.1, 0.2, 0.3])  # the flat last day's gain does not count
    assert hit_rate(r, w) == pytest.approx(2 / 3)
    assert hit_rate(r, np.zeros_like(w)) == 0.0


def test_window_metrics_bundle() -> None:
    w = np.array([[0.5, 0.0], [0.5, 0.5], [-0.5, 0.5], [0.0, 0.0]])
    r = np.array([0.1, -0.1, 0.2, 0.3])
    m = window_metrics(r, w)
    assert m.n_days == 4 and m.turnover == pytest.approx(0.75)
    assert m.total_return == pytest.approx(math.expm1(0.5))
    assert set(m.as_dict()) == {
        "sharpe",
        "total_return",
        "max_drawdown",
        "turnover",
        "hit_rate",
        "n_days",
    }
    with pytest.raises(ValueError, match="weights"):
        window_metrics(r, w[:3])


def test_buy_and_hold_drifts_and_rebalanced_does_not() -> None:
    r = LOG([[2.0, 1.0], [1.0, 2.0]])  # asset 0 doubles on day 1, asset 1 on day 2
    bh = buy_and_hold(r)
    np.testing.assert_allclose(bh.log_returns, LOG([1.5, 2.0 / 1.5]))  # value 1 -> 1.5 -> 2
    np.testing.assert_allclose(bh.weights, [[0.5, 0.5], [2 / 3, 1 / 3]])
    np.testing.assert_allclose(bh.turnover, [1.0, 0.0])
    assert bh.metrics().turnover == pytest.approx(0.5)  # the drift is not trading
    rb = buy_and_hold(r, rebalance=True)
    np.testing.assert_allclose(rb.log_returns, LOG([1.5, 1.5]))  # value 1 -> 1.5 -> 2.25
    with_cost = buy_and_hold(r, cost_bps=10.0)
    np.testing.assert_allclose(with_cost.log_returns, bh.log_returns - [1e-3, 0.0])


def test_flat_baseline() -> None:
    m = flat(5, 3).metrics()
    assert (m.sharpe, m.total_return, m.max_drawdown, m.turnover, m.hit_rate) == (0, 0, 0, 0, 0)
