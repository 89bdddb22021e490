"""Performance statistics: hand-worked values on tiny series, annualisation, bootstrap intervals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trimtab.rl.backtest import stats


def logs(simple: list[float]) -> np.ndarray:
    """Net log returns of the given simple returns."""
    return np.log1p(np.asarray(simple, np.float64))


def ar1(n: int, phi: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.normal(size=n)
    x = np.zeros(n)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + e[t]
    return x


def test_excess_is_simple_return_above_the_cash_rate() -> None:
    np.testing.assert_allclose(
        stats.excess(logs([0.01, -0.02, 0.03]), rf=0.001), [0.009, -0.021, 0.029], atol=1e-15
    )


def test_sharpe_hand_worked_and_annualised_by_the_callers_periods() -> None:
    r = logs([0.01, -0.02, 0.03, 0.0])
    # mean 0.005; squared deviations 0.005^2 + 0.025^2 + 0.025^2 + 0.005^2 = 0.0013 over 3
    want = 0.005 / math.sqrt(0.0013 / 3) * math.sqrt(252)
    assert stats.sharpe(r, 252) == pytest.approx(want, rel=1e-12)
    # weekly bars annualise with sqrt(52), not sqrt(252)
    assert stats.sharpe(r, 52) / stats.sharpe(r, 252) == pytest.approx(math.sqrt(52 / 252))
    # rf = 0.005 a bar: the mean excess is 0
    assert stats.sharpe(r, 252, rf=0.005) == pytest.approx(0.0, abs=1e-12)


def test_sharpe_is_zero_without_risk_or_without_bars() -> None:
    assert stats.sharpe(logs([0.01]), 252) == 0.0
    assert stats.sharpe(np.array([]), 252) == 0.0
    assert stats.sharpe(logs([0.002] * 10), 252) == 0.0
    # a flat book earns the cash rate exactly: its excess is rounding, its Sharpe 0
    rf = 0.05 / 252
    assert stats.sharpe(np.full(100, math.log1p(rf)), 252, rf=rf) == 0.0


def test_sortino_hand_worked_and_none_without_downside() -> None:
    r = logs([0.01, -0.02, 0.03, 0.0])
    # downside: min(x, 0)^2 = [0, 4e-4, 0, 0], mean 1e-4, deviation 0.01
    assert stats.sortino(r, 252) == pytest.approx(0.005 / 0.01 * math.sqrt(252), rel=1e-12)
    assert stats.sortino(logs([0.01, 0.02, 0.0]), 252) is None
    assert stats.sortino(np.array([]), 252) is None


def test_curve_statistics_hand_worked() -> None:
    r = logs([0.1, -0.5, 0.2, 1.0])  # equity 1 -> 1.1 -> 0.55 -> 0.66 -> 1.32
    assert stats.total_return(r) == pytest.approx(0.32)
    assert stats.max_drawdown(r) == pytest.approx(0.5)  # from the peak 1.1 to 0.55
    assert stats.annual_return(r, 4) == pytest.approx(0.32)  # four bars a year: one year
    assert stats.annual_return(r, 8) == pytest.approx(1.32**2 - 1)
    assert stats.calmar(r, 4) == pytest.approx(0.32 / 0.5)
    # the curve starts at 1: a first bar's loss is a drawdown
    assert stats.max_drawdown(logs([-0.1, 0.05])) == pytest.approx(0.1)
    assert stats.max_drawdown(logs([0.1, 0.05])) == 0.0
    assert stats.calmar(logs([0.1, 0.05]), 252) is None


def test_pooled_drawdown_is_at_least_each_parts() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        a, b = rng.normal(0, 0.02, 50), rng.normal(0, 0.02, 70)
        pooled = stats.max_drawdown(np.concatenate([a, b]))
        assert pooled >= stats.max_drawdown(a) - 1e-15
        assert pooled >= stats.max_drawdown(b) - 1e-15


def test_turnover_and_exposure_hand_worked() -> None:
    w = np.array([[0.5, 0.0], [0.5, -0.5], [0.0, 0.0]])
    assert stats.turnover(w) == pytest.approx((0.5 + 0.5 + 1.0) / 3)  # entry from flat counts
    assert stats.exposure(w) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert stats.turnover(np.zeros((0, 2))) == 0.0


def test_stationary_bootstrap_indices() -> None:
    rng = np.random.default_rng(0)
    n, draws, mean_block = 1000, 200, 5.0
    idx = stats.stationary_bootstrap(n, draws, mean_block, rng)
    assert idx.shape == (draws, n) and np.issubdtype(idx.dtype, np.integer)
    assert idx.min() >= 0 and idx.max() < n
    # a new block starts where the index does not follow on (mod n, wrapping around); a
    # fresh start that happens to follow on is rare (1 / n)
    breaks = (idx[:, 1:] != (idx[:, :-1] + 1) % n).sum()
    assert draws * n / (breaks + draws) == pytest.approx(mean_block, rel=0.05)
    assert (idx[:, 1:] == 0).any() and ((idx[:, :-1] == n - 1) & (idx[:, 1:] == 0)).any()
    iid = stats.stationary_bootstrap(n, 10, 1.0, rng)
    assert len(np.unique(iid[0])) < n  # draws with replacement
    assert stats.stationary_bootstrap(0, 3, 2.0, rng).shape == (3, 0)


def test_auto_block_length_grows_with_dependence() -> None:
    iid = np.random.default_rng(1).normal(size=2000)
    assert 1.0 <= stats.auto_block_length(iid) < 3.0
    persistent = ar1(2000, 0.8, 2)
    b = stats.auto_block_length(persistent)
    assert 10.0 < b <= math.ceil(3 * math.sqrt(2000))
    assert stats.auto_block_length(np.ones(100)) == 1.0
    assert stats.auto_block_length(np.arange(5.0)) == 1.0
    assert stats.auto_block_length(ar1(30, 0.99, 3)) <= 10.0  # at most n / 3


def test_sharpe_interval_contains_the_estimate_and_shrinks_with_n() -> None:
    rng = np.random.default_rng(4)
    long = rng.normal(0.0005, 0.01, 8000)
    short = long[:500]
    lo, hi = stats.sharpe_ci(long, 252, draws=500)
    assert lo < stats.sharpe(long, 252) < hi
    lo_s, hi_s = stats.sharpe_ci(short, 252, draws=500)
    assert lo_s < stats.sharpe(short, 252) < hi_s
    # the width of a mean's interval falls as 1 / sqrt(n): 4x here
    assert (hi - lo) < 0.5 * (hi_s - lo_s)
    assert stats.sharpe_ci(long, 252, draws=300, seed=7) == stats.sharpe_ci(
        long, 252, draws=300, seed=7
    )
    assert stats.sharpe_ci(logs([0.01]), 252) == (0.0, 0.0)


def test_paired_difference_of_a_series_with_itself_is_zero() -> None:
    r = np.random.default_rng(5).normal(0, 0.01, 300)
    out = stats.paired_difference(r, r, 252, draws=200)
    assert out == {
        "annual_return": 0.0,
        "annual_return_ci95": [0.0, 0.0],
        "information_ratio": 0.0,
        "information_ratio_ci95": [0.0, 0.0],
        "p_positive": 0.0,
    }


def test_paired_difference_hand_worked_and_paired() -> None:
    rng = np.random.default_rng(6)
    base = rng.normal(0, 0.01, 400)
    # a constant daily lead of 0.001 in simple returns: no spread, so every resample agrees
    better = np.log1p(np.expm1(base) + 0.001)
    out = stats.paired_difference(better, base, 252, draws=200)
    assert out["annual_return"] == pytest.approx(0.252)
    assert out["annual_return_ci95"] == pytest.approx([0.252, 0.252])
    assert out["p_positive"] == 1.0
    # noisy lead: the intervals bracket the estimates, and pairing removes the common part
    noisy = np.log1p(np.expm1(base) + 0.001 + rng.normal(0, 0.001, 400))
    out = stats.paired_difference(noisy, base, 252, draws=500)
    d = np.expm1(noisy) - np.expm1(base)
    ir = d.mean() / d.std(ddof=1) * math.sqrt(252)
    assert out["information_ratio"] == pytest.approx(ir)
    lo, hi = out["information_ratio_ci95"]
    assert lo < ir < hi and lo > 0
    lo, hi = out["annual_return_ci95"]
    assert lo < out["annual_return"] < hi
    assert out["p_positive"] == 1.0


def test_breakeven_cost_hand_worked() -> None:
    n = 10
    tau_agent, tau_base = np.full(n, 0.2), np.zeros(n)
    gross_agent, gross_base = np.full(n, 0.001), np.zeros(n)
    charged = 10.0
    net_agent = gross_agent - charged * 1e-4 * tau_agent
    # 0.001 of gross edge a bar over 0.2 of extra turnover: 0.005 = 50 bp
    be = stats.breakeven_bps(net_agent, tau_agent, gross_base, tau_base, charged)
    assert be == pytest.approx(50.0)
    at_be = gross_agent - be * 1e-4 * tau_agent  # charged 50 bp, the agent ties the baseline
    assert at_be.mean() == pytest.approx(gross_base.mean(), abs=1e-15)
    # an agent behind before costs: negative breakeven
    assert stats.breakeven_bps(-net_agent, tau_agent, gross_base, tau_base, 0.0) < 0
    assert stats.breakeven_bps(net_agent, tau_agent, gross_base, tau_agent, charged) is None


def test_window_stats_is_json_friendly_with_hand_hit_rate() -> None:
    r = np.array([0.01, -0.01, 0.02, 0.0])
    w = np.array([[0.5], [0.5], [0.0], [-0.5]])  # a position on bars 0, 1 and 3
    out = stats.window_stats(r, w, 252, draws=100)
    assert set(out) == {"sharpe", "sharpe_ci95", "sortino", "calmar", "total_return",
                        "annual_return", "max_drawdown", "turnover", "exposure", "hit_rate",
                        "n_days"}  # fmt: skip
    assert out["hit_rate"] == pytest.approx(1 / 3)  # bar 2 (flat) does not count
    assert out["n_days"] == 4 and out["turnover"] == pytest.approx((0.5 + 0 + 0.5 + 0.5) / 4)
    assert out["sharpe"] == pytest.approx(stats.sharpe(r, 252))
    json.dumps(out, allow_nan=False)
    idle = stats.window_stats(np.zeros(5), np.zeros((5, 2)), 252, draws=50)
    assert idle["hit_rate"] is None and idle["sortino"] is None and idle["calmar"] is None
    assert idle["sharpe"] == 0.0 and idle["sharpe_ci95"] == [0.0, 0.0]
    json.dumps(idle, allow_nan=False)
    huge = stats.window_stats(np.full(3, 5.0), np.ones((3, 1)), 252, draws=20)
    assert huge["annual_return"] is None  # exp(5 * 252) overflows: None, not inf
    json.dumps(huge, allow_nan=False)


def phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def test_deflated_sharpe_against_the_formula_worked_by_hand() -> None:
    trials = [0.05, 0.1, 0.0, -0.05]
    # V = sample variance: mean 0.025, squared deviations 2 (0.025^2 + 0.075^2) = 0.0125 / 3
    sd = math.sqrt(0.0125 / 3)
    gamma = 0.5772156649015329
    z_1 = 0.6744897501960817  # Z^-1(1 - 1/4)
    z_2 = 1.3287219496247633  # Z^-1(1 - 1/(4e)) = Z^-1(0.90803...)
    sr0 = sd * ((1 - gamma) * z_1 + gamma * z_2)
    sr, t_obs, skew, kurt = 0.1, 253, -0.5, 4.0
    denom = math.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr**2)  # 1 + 0.05 + 0.0075
    want = phi((sr - sr0) * math.sqrt(t_obs - 1) / denom)
    got = stats.deflated_sharpe(sr, trials, t_obs, skew, kurt)
    assert got == pytest.approx(want, rel=1e-12)
    assert 0.0 < got < 1.0
    # one trial: no selection, the probabilistic Sharpe ratio against 0
    psr = phi(sr * math.sqrt(t_obs - 1) / denom)
    assert stats.deflated_sharpe(sr, [sr], t_obs, skew, kurt) == pytest.approx(psr)
    # more unskilled trials of the same spread raise the bar
    many = np.random.default_rng(0).normal(0, sd, 200)
    assert stats.deflated_sharpe(sr, many, t_obs, skew, kurt) < got


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: stats.sharpe(np.zeros((3, 2)), 252), ValueError, "series"),
        (lambda: stats.stationary_bootstrap(5, 2, 0.5, np.random.default_rng()), ValueError,
         "mean_block"),
        (lambda: stats.sharpe_ci(np.zeros(5), 252, level=1.0), ValueError, "level"),
        (lambda: stats.paired_difference(np.zeros(3), np.zeros(4), 252), ValueError,
         "same bars"),
        (lambda: stats.window_stats(np.zeros(3), np.zeros((4, 1)), 252), ValueError, "bars"),
        (lambda: stats.deflated_sharpe(0.1, [], 10, 0.0, 3.0), ValueError, "trial"),
    ],
)  # fmt: skip
def test_errors(call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call()
