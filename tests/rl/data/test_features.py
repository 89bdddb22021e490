"""Features: hand-checked values, no look-ahead, normalisation by the training window only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from trimtab.rl.data.features import FEATURE_NAMES, WARMUP, FeatureNormalizer, compute_features
from trimtab.rl.data.synthetic import MarketSpec, simulate


@pytest.fixture(scope="module")
def data():
    return simulate(MarketSpec(n_days=400, seed=5)).data


def test_shapes_warmup_and_hand_checked_values(data) -> None:
    f = compute_features(data)
    assert f.shape == (400, 4, len(FEATURE_NAMES))
    assert np.isnan(f[:WARMUP]).all() and np.isfinite(f[WARMUP:]).all()
    t, a = 123, 2
    lp = np.log(data.adj_close[:, a])
    assert f[t, a, 0] == pytest.approx(lp[t] - lp[t - 1])
    assert f[t, a, 1] == pytest.approx(lp[t] - lp[t - 5])
    assert f[t, a, 2] == pytest.approx(lp[t] - lp[t - 20])
    assert f[t, a, 3] == pytest.approx(np.std(np.diff(lp[t - 20 : t + 1]), ddof=1))
    assert f[t, a, 4] == pytest.approx(np.log(data.high[t, a] / data.low[t, a]))
    lv = np.log1p(data.volume[t - 19 : t + 1, a])
    assert f[t, a, 5] == pytest.approx((lv[-1] - lv.mean()) / lv.std(ddof=1))


def test_constant_volume_gives_zero_z_score(data) -> None:
    flat = replace(data, volume=np.full_like(data.volume, 5.0))
    assert np.all(compute_features(flat)[WARMUP:, :, 5] == 0.0)


@pytest.mark.parametrize("t", [WARMUP, 150, 398])
def test_no_look_ahead(data, t: int) -> None:
    """Changing every bar after day t changes no feature at or before t, nor any normalised
    feature of a training window ending at t (normaliser fit on that window)."""
    rng = np.random.default_rng(t)
    future = {}
    for k in ("open", "high", "low", "close", "adj_close", "volume"):
        arr = getattr(data, k).copy()
        arr[t + 1 :] *= rng.uniform(0.3, 3.0, size=arr[t + 1 :].shape)
        future[k] = arr
    changed = replace(data, **future)
    f0, f1 = compute_features(data), compute_features(changed)
    np.testing.assert_array_equal(f0[: t + 1], f1[: t + 1])
    assert not np.allclose(f0[t + 1 :], f1[t + 1 :])  # the perturbation did reach the future

    train = slice(WARMUP, t + 1)
    if t + 1 - WARMUP >= 2:
        n0 = FeatureNormalizer().fit(f0[train])
        n1 = FeatureNormalizer().fit(f1[train])
        np.testing.assert_array_equal(n0.transform(f0[train]), n1.transform(f1[train]))


def test_normaliser_uses_training_statistics_only(data) -> None:
    f = compute_features(data)[WARMUP:]
    train, test = f[:200], f[200:]
    norm = FeatureNormalizer().fit(train)
    z = norm.transform(train)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-10)
    np.testing.assert_allclose(z.std(0, ddof=1), 1.0, rtol=1e-10)
    zt = norm.transform(test)
    np.testing.assert_allclose(zt, (test - train.mean(0)) / train.std(0, ddof=1))
    assert not np.allclose(zt.mean(0), 0.0, atol=1e-3)  # the test window is not re-centred
    back = FeatureNormalizer.from_state_dict(norm.state_dict())
    np.testing.assert_array_equal(back.transform(test), zt)


def test_normaliser_edge_cases() -> None:
    x = np.ones((10, 2, 3))
    x[:, 0, 0] = np.arange(10)
    z = FeatureNormalizer().fit_transform(x)
    assert np.all(z[:, 1:, :] == 0.0) and np.isfinite(z).all()  # constant: centred, not scaled
    with pytest.raises(ValueError, match="WARMUP"):
        FeatureNormalizer().fit(np.full((5, 1, 1), np.nan))
    with pytest.raises(RuntimeError, match="before fit"):
        FeatureNormalizer().transform(x)


def test_signed_moves_and_the_features_a_run_observes(data) -> None:
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import ConfigError, from_dict
    from trimtab.rl.data.features import DEFAULT_FEATURES, select_features

    f = compute_features(data)
    t, a = 200, 1
    move = f[t, a, 0] / f[t, a, 3]  # today's return in units of its 20-day volatility
    assert f[t, a, 8] == pytest.approx(f[t, a, 6] * move)
    assert f[t, a, 9] == pytest.approx(f[t, :, 6].mean() * move)
    assert DEFAULT_FEATURES == ("ret_1", "mkt_vol_10")
    picked = select_features(f, ("vol_20", "ret_1"))
    assert np.array_equal(picked, f[..., [3, 0]], equal_nan=True)
    cfg = from_dict(TrainConfig, {"env": {"features": ["ret_1", "mkt_ac_move_1"]}})
    assert cfg.env.features == ("ret_1", "mkt_ac_move_1")
    for bad in (["ret_2"], [], ["ret_1", "ret_1"]):
        with pytest.raises(ConfigError, match=r"features=.* must be distinct names from"):
            from_dict(TrainConfig, {"env": {"features": bad}})
    with pytest.raises(ConfigError, match=r"env\.features .* does nothing in a Gymnasium run"):
        from_dict(TrainConfig, {"env": {"name": "gym:CartPole-v1", "features": ["ret_1"]}})


def test_market_volatility_level_by_hand(data) -> None:
    """``mkt_vol_10`` at day t: the assets' mean of log(mean |r| over days t-9..t), the same
    for every asset (causality: test_no_look_ahead, which covers every feature)."""
    f = compute_features(data)
    r = np.diff(np.log(data.adj_close), axis=0)  # r[i] is day i + 1's return
    col = FEATURE_NAMES.index("mkt_vol_10")
    for t in (30, 200, len(f) - 1):
        want = np.mean([np.log(np.abs(r[t - 10 : t, a]).mean()) for a in range(r.shape[1])])
        assert f[t, :, col] == pytest.approx(np.full(r.shape[1], want))


def test_piecewise_linear_bins_by_hand_and_saved() -> None:
    # one asset, one feature whose training values are 0..8: z has quantile edges at 0, 1/2, 1
    x = np.arange(9.0).reshape(9, 1, 1)
    norm = FeatureNormalizer(bins=2).fit(x)
    mean, sd = 4.0, np.std(np.arange(9.0), ddof=1)
    z = (np.array([-2.0, 0.0, 3.0, 4.0, 6.0, 8.0, 20.0, np.nan]) - mean) / sd
    out = norm.transform(z.reshape(-1, 1, 1) * sd + mean)
    assert out.shape == (8, 1, 3)  # [z, c_1, c_2]
    lo, mid, hi = (0.0 - mean) / sd, 0.0, (8.0 - mean) / sd
    c1 = np.clip((z - lo) / (mid - lo), 0, 1)
    c2 = np.clip((z - mid) / (hi - mid), 0, 1)
    np.testing.assert_allclose(out[:7, 0], np.stack([z, c1, c2], -1)[:7], atol=1e-12)
    assert np.isnan(out[7]).all()  # a NaN stays NaN in every component
    assert out[0, 0].tolist() == pytest.approx([z[0], 0.0, 0.0])  # below the training range
    assert out[6, 0, 1:].tolist() == [1.0, 1.0]  # above it: every bin full (z still says how far)
    back = FeatureNormalizer.from_state_dict(norm.state_dict())
    np.testing.assert_array_equal(back.transform(x), norm.transform(x))
    # a state saved without bins (an earlier run) loads as standardisation alone
    plain = FeatureNormalizer().fit(x).state_dict()
    assert "bins" not in plain and FeatureNormalizer.from_state_dict(plain).bins == 0


def test_piecewise_linear_bins_of_a_constant_feature_and_bad_counts() -> None:
    x = np.ones((10, 2, 1))
    x[:, 0, 0] = np.arange(10)
    out = FeatureNormalizer(bins=3).fit_transform(x)
    assert out.shape == (10, 2, 4) and np.isfinite(out).all()
    # the constant asset's bins have no width: each is a step at its edge (z = 0 >= 0: all 1)
    assert np.all(out[:, 1, 1:] == 1.0) and np.all(out[:, 1, 0] == 0.0)
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ValueError, match="bins="):
            FeatureNormalizer(bins=bad)
    with pytest.raises(RuntimeError, match="no edges"):
        FeatureNormalizer(np.zeros((2, 1)), np.ones((2, 1)), bins=2).transform(x)
