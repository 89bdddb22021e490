"""The synthetic market: determinism, documented regime statistics, stress, learnable structure."""

from __future__ import annotations

import numpy as np
import pytest

from trimtab.rl.backtest.stats import sharpe
from trimtab.rl.data.features import WARMUP, compute_features
from trimtab.rl.data.synthetic import DEFAULT_REGIMES, MarketSpec, simulate
from trimtab.rl.envs.trading import evaluate

FIELDS = ("open", "high", "low", "close", "volume", "adj_close")


def test_same_seed_same_market_other_seed_other_market() -> None:
    a, b = simulate(MarketSpec(n_days=300, seed=7)), simulate(MarketSpec(n_days=300, seed=7))
    c = simulate(MarketSpec(n_days=300, seed=8))
    for k in FIELDS:
        np.testing.assert_array_equal(getattr(a.data, k), getattr(b.data, k))
    np.testing.assert_array_equal(a.regimes, b.regimes)
    assert not np.array_equal(a.data.close, c.data.close)


def test_bars_are_consistent_on_business_days() -> None:
    d = simulate(MarketSpec(n_days=500)).data
    assert d.n_assets == 4 and d.n_days == 500 and d.dates.dtype == np.dtype("datetime64[D]")
    assert np.all(np.is_busday(d.dates)) and np.all(np.diff(d.dates) > np.timedelta64(0))
    assert np.all(d.high >= np.maximum(d.open, d.close)) and np.all(
        d.low <= np.minimum(d.open, d.close)
    )
    assert np.all(d.low > 0) and np.all(d.volume > 0)


def test_regime_statistics_match_the_documented_table() -> None:
    spec = MarketSpec(n_days=30_000, seed=3)
    m = simulate(spec)
    r, k = m.data.log_returns(), m.regimes
    vol_mult, drift_mult = np.asarray(spec.vol_mult), np.asarray(spec.drift_mult)
    assert len(np.unique(k)) == 4
    for j, reg in enumerate(DEFAULT_REGIMES):
        now = np.flatnonzero(k[1:] == j) + 1
        now = now[k[now - 1] == j]  # both days in the regime: a clean lag-1 pair
        x = r[now] / vol_mult
        assert np.std(x) == pytest.approx(reg.vol, rel=0.15), reg.name
        ac = np.mean([np.corrcoef(r[now, a], r[now - 1, a])[0, 1] for a in range(4)])
        assert ac == pytest.approx(reg.ar, abs=0.08), reg.name
        cc = np.corrcoef(r[now].T)[np.triu_indices(4, 1)].mean()
        assert cc == pytest.approx(reg.corr, abs=0.1), reg.name
        z = (x - x.mean(0)) / x.std(0)
        assert np.mean(z**4) > 3.3, reg.name  # Student-t tails: kurtosis above the normal's 3
    mean_calm = r[k == 0].mean(0) / drift_mult
    assert mean_calm.mean() == pytest.approx(DEFAULT_REGIMES[0].drift, abs=1e-4)
    # Persistence: mean run length of each regime close to its documented duration.
    runs = np.split(k, np.flatnonzero(np.diff(k)) + 1)
    for j, reg in enumerate(DEFAULT_REGIMES):
        lengths = [len(run) for run in runs if run[0] == j]
        assert np.mean(lengths) == pytest.approx(reg.duration, rel=0.35), reg.name


def test_stress_segment_scales_vol_20x_and_mean_return_100x_of_calm() -> None:
    base = simulate(MarketSpec(n_days=4000, seed=1))
    spec = MarketSpec.stress(start_frac=0.5, end_frac=0.75, n_days=4000, seed=1)
    st = simulate(spec)
    lo, hi = spec.stress_range()
    assert (lo, hi) == (2000, 3000) and st.stressed[lo:hi].all() and st.stressed.sum() == 1000
    np.testing.assert_array_equal(st.data.close[:lo], base.data.close[:lo])  # same past
    r = st.data.log_returns()[lo:hi]  # per asset: a long position's reward, up to scale
    calm = DEFAULT_REGIMES[0]
    ratio_mean = np.mean(r.mean(0) / (calm.drift * np.asarray(spec.drift_mult)))
    ratio_std = np.mean(r.std(0) / (calm.vol * np.asarray(spec.vol_mult)))
    assert -140 < ratio_mean < -65  # a crash: a long loses ~x100 the calm gain per day
    assert 18 < ratio_std < 22
    assert np.all(np.isfinite(st.data.close)) and np.all(st.data.close > 0)


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="stress_start_frac"):
        MarketSpec(stress_start_frac=0.9, stress_end_frac=0.5)
    with pytest.raises(ValueError, match="vol_mult"):
        MarketSpec(n_assets=3, vol_mult=(1.0, 1.0))
    assert MarketSpec(n_assets=6).vol_mult == (0.8, 1.0, 1.25, 1.5, 0.8, 1.0)
    p = MarketSpec().transition_matrix()
    np.testing.assert_allclose(p.sum(1), 1.0)
    np.testing.assert_allclose(np.diag(p), [1 - 1 / r.duration for r in DEFAULT_REGIMES])


def test_structure_is_learnable_out_of_sample() -> None:
    """Regime-conditional momentum beats equal-weight buy & hold on every test window.

    Oracle: bet sign(phi_regime) * sign(today's return) per asset. Feature-only: the regime
    whose documented volatility is nearest (in log) to ``vol_20`` stands in for the true one.
    """
    spec = MarketSpec()
    m = simulate(spec)
    feats = compute_features(m.data)[WARMUP:]
    r = m.data.log_returns()[WARMUP:]
    k = m.regimes[WARMUP:]
    phi = np.array([g.ar for g in spec.regimes])
    sig = (
        np.array([g.vol for g in spec.regimes])[None, None, :]
        * np.array(spec.vol_mult)[None, :, None]
    )
    guess = np.abs(np.log(feats[:, :, 3:4] / sig)).argmin(-1)
    assert np.mean(guess == k[:, None]) > 0.7  # the regime shows in the features

    n = len(r)
    test0 = int(0.7 * n)
    windows = [(s, s + (n - 1 - test0) // 3) for s in range(test0, n - 3, (n - 1 - test0) // 3)][:3]
    # The oracle wins on every test window, the feature-only rule on average over them.
    for regime, bar, agg in ((k[:, None], 1.0, min), (guess, 0.5, np.mean)):
        gains = []
        for s, e in windows:
            bets = np.sign(phi[regime] * r)[s:e].astype(np.int64)
            ev = evaluate(feats, r, bets + 1, start=s, end=e, costs=1.0)
            long = evaluate(feats, r, np.full_like(bets, 2), start=s, end=e, costs=1.0)
            gains.append(sharpe(ev.log_returns, 252) - sharpe(long.log_returns, 252))
        assert agg(gains) > bar, gains
