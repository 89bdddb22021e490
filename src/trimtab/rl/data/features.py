"""Causal per-asset features of daily bars, and a normaliser fit on the training window only.

Every feature at day t is a function of bars 0..t; nothing reads day t+1 or later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trimtab.rl.data.load import MarketData

FEATURE_NAMES = ("ret_1", "ret_5", "ret_20", "vol_20", "hl_range", "volume_z", "autocorr_20",
                 "mkt_autocorr_20", "ac_move_1", "mkt_ac_move_1", "mkt_vol_10")  # fmt: skip
#: what the agent observes unless ``env.features`` says otherwise: today's move and the market's
#: volatility level, the two inputs of the market's regime-dependent bet; every other feature
#: added noise that a fold's data could not average out (docs:
#: guides/walk-forward.md#what-the-agent-was-given)
DEFAULT_FEATURES = ("ret_1", "mkt_vol_10")
#: piecewise-linear bins of each feature unless ``env.feature_bins`` says otherwise
#: (:class:`FeatureNormalizer`)
FEATURE_BINS = 0
#: more bins than this cut a training window's few hundred days into bins of a few days each
MAX_FEATURE_BINS = 64
RETURN_HORIZONS = (1, 5, 20)
VOL_WINDOW = 20
VOLUME_WINDOW = 20
#: days of the rolling lag-1 autocorrelation: whether yesterday's move tends to continue
#: (momentum) or reverse, the sign of the bet on it
AUTOCORR_WINDOW = 20
#: days of the market-wide volatility level ``mkt_vol_10``: short enough to follow a change of
#: regime within days, long enough that four assets' mean |r| is not one day's noise
MKT_VOL_WINDOW = 10
WARMUP = max(*RETURN_HORIZONS, VOL_WINDOW, VOLUME_WINDOW - 1, AUTOCORR_WINDOW + 1)
"""Days 0..WARMUP-1 lack a full look-back; their features are NaN. Slice them off."""
STD_FLOOR = 1e-12
"""Numerical guard only: a feature constant over the fit window is centred, not scaled."""


def select_features(features: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """The columns ``names`` (a subset of ``FEATURE_NAMES``, in the order given) of
    :func:`compute_features`' ``[T, A, F]``: the observation ``env.features`` configures."""
    unknown = [n for n in names if n not in FEATURE_NAMES]
    if unknown:
        raise ValueError(f"unknown features {unknown}; known: {list(FEATURE_NAMES)}")
    return features[..., [FEATURE_NAMES.index(n) for n in names]]


def compute_features(data: MarketData) -> np.ndarray:
    """Features ``[T, A, F]`` (float64, order ``FEATURE_NAMES``); rows ``< WARMUP`` are NaN.

    With ``p`` = adjusted close and ``r_t = log p_t - log p_{t-1}``:

    - ``ret_h``  = log p_t - log p_{t-h} for h in 1, 5, 20;
    - ``vol_20`` = standard deviation (ddof=1) of r_{t-19..t};
    - ``hl_range`` = log(high_t / low_t);
    - ``volume_z`` = z-score of log(1 + volume_t) within days t-19..t (0 when constant);
    - ``autocorr_20`` = the sample correlation of (r_{t-19..t}) with (r_{t-20..t-1}): the
      lag-1 autocorrelation of the last 20 returns (0 when either window is constant);
    - ``mkt_autocorr_20`` = the mean of ``autocorr_20`` over the assets (the same for each):
      one market-wide estimate, less noisy than an asset's own when regimes are shared;
    - ``ac_move_1`` = ``autocorr_20 * ret_1 / vol_20`` and ``mkt_ac_move_1`` =
      ``mkt_autocorr_20 * ret_1 / vol_20``: today's move in units of recent volatility, signed
      by whether moves have lately continued (> 0) or reversed (< 0). The bet on yesterday's
      move flips sign with the autocorrelation; a product of two inputs is what a small ReLU
      network learns last from noisy rewards, so it is given as one input (0 where vol_20 is 0).
    """
    log_p = np.log(data.adj_close)
    t_len, n = log_p.shape
    out = np.full((t_len, n, len(FEATURE_NAMES)), np.nan)
    for f, h in enumerate(RETURN_HORIZONS):
        out[h:, :, f] = log_p[h:] - log_p[:-h]
    r = np.diff(log_p, axis=0)  # r[i] is the return of day i + 1
    if t_len > VOL_WINDOW:
        out[VOL_WINDOW:, :, 3] = sliding_window_view(r, VOL_WINDOW, axis=0).std(axis=-1, ddof=1)
    out[:, :, 4] = np.log(data.high / data.low)
    lv = np.log1p(data.volume)
    if t_len >= VOLUME_WINDOW:
        win = sliding_window_view(lv, VOLUME_WINDOW, axis=0)
        sd = win.std(axis=-1, ddof=1)
        z = (lv[VOLUME_WINDOW - 1 :] - win.mean(axis=-1)) / np.maximum(sd, STD_FLOOR)
        out[VOLUME_WINDOW - 1 :, :, 5] = np.where(sd > STD_FLOOR, z, 0.0)
    if t_len > AUTOCORR_WINDOW + 1:
        ac = _lag1_autocorr(r, AUTOCORR_WINDOW)
        out[AUTOCORR_WINDOW + 1 :, :, 6] = ac
        out[AUTOCORR_WINDOW + 1 :, :, 7] = ac.mean(axis=1, keepdims=True)
    vol = out[:, :, 3]
    move = np.where(vol > STD_FLOOR, out[:, :, 0] / np.where(vol > STD_FLOOR, vol, 1.0), 0.0)
    out[:, :, 8] = out[:, :, 6] * move
    out[:, :, 9] = out[:, :, 7] * move
    if t_len > MKT_VOL_WINDOW:
        mean_abs = np.abs(sliding_window_view(r, MKT_VOL_WINDOW, axis=0)).mean(axis=-1)
        level = np.log(np.maximum(mean_abs, STD_FLOOR)).mean(axis=1, keepdims=True)
        out[MKT_VOL_WINDOW:, :, 10] = level
    out[:WARMUP] = np.nan
    return out


def _lag1_autocorr(r: np.ndarray, w: int) -> np.ndarray:
    """``[T' , A]``: the correlation of ``r[i+1 .. i+w]`` with ``r[i .. i+w-1]`` for each
    ``i``; ``r[i]`` is day ``i + 1``'s return, so row ``j`` belongs to day ``j + w + 1``."""
    now = sliding_window_view(r[1:], w, axis=0)  # [T', A, w]
    lag = sliding_window_view(r[:-1], w, axis=0)
    a = now - now.mean(-1, keepdims=True)
    b = lag - lag.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    return np.where(den > STD_FLOOR, (a * b).sum(-1) / np.maximum(den, STD_FLOOR), 0.0)


def encoded_width(n_features: int, bins: int) -> int:
    """Values per asset that :meth:`FeatureNormalizer.transform` returns for ``n_features``
    features and ``bins`` piecewise-linear bins: each feature's standardised value and its
    ``bins`` components."""
    return n_features * (1 + bins)


@dataclass
class FeatureNormalizer:
    """Per (asset, feature) standardisation ``(x - mean) / std`` with statistics of one window,
    and, with ``bins = K > 0``, a piecewise-linear encoding of each standardised value ``z``.

    The encoding (Gorishniy, Rubachev & Babenko 2022, *On Embeddings for Numerical Features in
    Tabular Deep Learning*) cuts ``z``'s range at the ``K + 1`` quantiles ``b_0 .. b_K`` of the
    fit window and gives component ``k`` as ``clip((z - b_{k-1}) / (b_k - b_{k-1}), 0, 1)``
    (a step at ``b_k`` where the bin has no width): the bin ``z`` falls in is a set of inputs,
    so a network gates another input by it in one ReLU layer. A bet whose sign flips between
    levels of a feature (the market's reversal in calm and volatile regimes, momentum in the
    trending one) is then a sum of gated linear terms, not a product that a small network has to
    build out of noisy rewards. The edges are quantiles, not constants: they follow the data's
    scale. Each feature becomes ``[z, c_1 .. c_K]`` (:func:`encoded_width`).

    Fit it on the training window only (``fit(features[train])``) and apply it to that window
    and the following test window: the test window's statistics must not leak into training.
    """

    mean: np.ndarray | None = None  # [A, F]
    std: np.ndarray | None = None  # [A, F]
    bins: int = 0
    edges: np.ndarray | None = None  # [A, F, bins + 1] quantiles of z over the fit window

    def __post_init__(self) -> None:
        if type(self.bins) is not int or self.bins < 0:
            raise ValueError(f"bins={self.bins!r} must be an integer >= 0 (0: no encoding)")

    def fit(self, features: np.ndarray) -> FeatureNormalizer:
        """Fit on ``features[T, A, F]``, which must be finite (slice off ``WARMUP`` rows)."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 3 or x.shape[0] < 2:
            raise ValueError(f"fit needs features [T >= 2, A, F], got shape {x.shape}")
        if not np.isfinite(x).all():
            bad = int(np.argmax(~np.isfinite(x).reshape(len(x), -1).all(1)))
            raise ValueError(
                f"features are not finite at row {bad}; the first WARMUP={WARMUP} rows of "
                "compute_features are NaN by design, slice them off"
            )
        self.mean = x.mean(axis=0)
        sd = x.std(axis=0, ddof=1)
        self.std = np.where(sd > STD_FLOOR, sd, 1.0)
        if self.bins:
            z = (x - self.mean) / self.std
            q = np.quantile(z, np.linspace(0.0, 1.0, self.bins + 1), axis=0)  # [K+1, A, F]
            self.edges = np.moveaxis(q, 0, -1)
        return self

    def transform(self, features: np.ndarray) -> np.ndarray:
        """``features[..., A, F]`` -> ``[..., A, encoded_width(F, bins)]`` (float64): the
        standardised values, each followed by its ``bins`` components."""
        if self.mean is None or self.std is None:
            raise RuntimeError("FeatureNormalizer.transform before fit")
        z = (np.asarray(features, dtype=np.float64) - self.mean) / self.std
        if not self.bins:
            return z
        if self.edges is None:
            raise RuntimeError(f"FeatureNormalizer(bins={self.bins}) has no edges: fit it first")
        lo, hi = self.edges[..., :-1], self.edges[..., 1:]
        width = hi - lo
        zz = z[..., None]
        ramp = np.clip((zz - lo) / np.where(width > STD_FLOOR, width, 1.0), 0.0, 1.0)
        comp = np.where(width > STD_FLOOR, ramp, np.where(np.isnan(zz), np.nan, zz >= hi))
        out = np.concatenate([zz, comp], axis=-1)  # [..., A, F, 1 + K]
        return out.reshape(*z.shape[:-1], encoded_width(z.shape[-1], self.bins))

    def fit_transform(self, features: np.ndarray) -> np.ndarray:
        return self.fit(features).transform(features)

    def state_dict(self) -> dict[str, Any]:
        """Plain lists, for saving with a checkpoint."""
        if self.mean is None or self.std is None:
            raise RuntimeError("FeatureNormalizer.state_dict before fit")
        state: dict[str, Any] = {"mean": self.mean.tolist(), "std": self.std.tolist()}
        if self.bins:
            assert self.edges is not None
            state.update(bins=self.bins, edges=self.edges.tolist())
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> FeatureNormalizer:
        """The normaliser :meth:`state_dict` saved (one saved without ``bins`` has none)."""
        bins = int(state.get("bins", 0))
        edges = np.asarray(state["edges"]) if bins else None
        return cls(np.asarray(state["mean"]), np.asarray(state["std"]), bins, edges)
