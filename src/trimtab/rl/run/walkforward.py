"""Walk-forward folds over market data: windows, per-fold features, out-of-sample evaluation.

Fold ``k`` trains on windows ``0`` to ``k`` (``walkforward.train_window = "expanding"``) or
on window ``k`` alone (``"rolling"``), less the last ``walkforward.embargo`` days (purging: no
training reward or n-step target comes within that many days of a test day) and is
evaluated, greedily and out of sample, on window ``k + 1``. The decision on the last day
before the test window (its information is that day's close) earns the first test day's
return, so every test-window return is earned by exactly one out-of-sample decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trimtab.rl.backtest.execution import OPTIMISTIC, Costs, Fills, fill_returns
from trimtab.rl.config import TrainConfig, embargo_days
from trimtab.rl.data.features import WARMUP, FeatureNormalizer, compute_features, select_features
from trimtab.rl.data.load import DataError, MarketData, issues_in_window, load_ohlcv
from trimtab.rl.envs.trading import evaluate

__all__ = ["Fold", "MarketSet", "costs_of", "evaluate_fold", "load_market", "make_folds"]


@dataclass(frozen=True)
class Fold:
    """Day indices (into the post-warm-up arrays) of one fold: window ``[a, b)``, test
    ``[b, c)``; training uses ``[a, b - embargo)`` (:attr:`fit_end`)."""

    index: int
    train_start: int
    train_end: int
    test_end: int
    embargo: int = 0

    @property
    def fit_end(self) -> int:
        """The end of the days trained on (and that fit the feature normaliser)."""
        return self.train_end - self.embargo


@dataclass
class MarketSet:
    """The market of a run: raw data, features ``[T, A, F]``, close-to-close log returns
    ``[T, A]`` and the fills of ``env.execution`` (:class:`Fills`), with the feature warm-up
    rows already cut off; its bars per year and costs. On the embedded market, also the regime
    of each day and the spec (what the oracle baseline knows); ``None`` for a user's files."""

    data: MarketData
    features: np.ndarray
    log_returns: np.ndarray
    fills: Fills
    costs: Costs
    periods_per_year: float
    regimes: np.ndarray | None = None
    spec: Any = None

    @property
    def n_days(self) -> int:
        return self.features.shape[0]

    def date(self, i: int) -> str:
        return str(self.data.dates[i])


def costs_of(cfg: TrainConfig, periods_per_year: float) -> Costs:
    """The config's costs, accruing per bar of ``periods_per_year``."""
    e = cfg.env
    return Costs(e.commission_bps, e.half_spread_bps, e.borrow_pct, e.cash_pct, periods_per_year)


def load_market(cfg: TrainConfig) -> MarketSet:
    """The embedded synthetic market, or the user's files; raises ``DataError`` on bad data."""
    regimes, spec = None, None
    if cfg.data.paths:
        data = load_ohlcv(
            list(cfg.data.paths), gaps=cfg.data.gaps, max_gap_days=cfg.data.max_gap_days
        )
    else:
        from trimtab.rl.data.synthetic import MarketSpec, simulate

        maker = MarketSpec.stress if cfg.data.stress else MarketSpec
        sim = simulate(maker(n_days=cfg.data.synthetic_days, seed=cfg.data.market_seed))
        data, regimes, spec = sim.data, sim.regimes[WARMUP:], sim.spec
    periods = data.periods_per_year  # refuses mixed or irregular bar spacing
    feats = select_features(compute_features(data)[WARMUP:], cfg.env.features)
    rets = data.log_returns()
    fills = fill_returns(rets, data.open, data.close, cfg.env.execution).slice(WARMUP, None)
    rets = rets[WARMUP:]
    data = data.slice(WARMUP, None)
    window = minimum_window(cfg)
    need = (cfg.walkforward.folds + 1) * window
    if data.n_days < need:
        raise DataError(
            f"{data.source}: {data.n_days} usable days after the {WARMUP}-day feature warm-up, "
            f"but {cfg.walkforward.folds} folds need at least {need} "
            f"({cfg.walkforward.folds + 1} windows of at least {window} days). "
            "Give more data, fewer --folds, or a shorter env.episode_days."
        )
    return MarketSet(
        data, feats.astype(np.float32), rets, fills, costs_of(cfg, periods), periods, regimes, spec
    )


def minimum_window(cfg: TrainConfig) -> int:
    """The fewest days a walk-forward window may have: one training episode plus two days,
    plus the embargo."""
    return max(cfg.env.episode_days + 2 + embargo_days(cfg), cfg.walkforward.window_days)


def make_folds(n_days: int, cfg: TrainConfig) -> list[Fold]:
    """Contiguous equal windows ending at the last day; fold k: train window k, or windows 0 to
    k (``walkforward.train_window = "expanding"``), less the embargo; test window k + 1."""
    k, gap = cfg.walkforward.folds, embargo_days(cfg)
    w = cfg.walkforward.window_days or n_days // (k + 1)
    first = n_days - (k + 1) * w
    anchored = cfg.walkforward.train_window == "expanding"
    return [
        Fold(i, first if anchored else first + i * w, first + (i + 1) * w, first + (i + 2) * w, gap)
        for i in range(k)
    ]


def fold_arrays(
    market: MarketSet, fold: Fold, bins: int = 0
) -> tuple[np.ndarray, FeatureNormalizer]:
    """Features of every day up to the fold's test end, normalised by training-window stats
    (with ``bins`` piecewise-linear components each: ``env.feature_bins``)."""
    norm = FeatureNormalizer(bins=bins).fit(market.features[fold.train_start : fold.fit_end])
    return norm.transform(market.features[: fold.test_end]).astype(np.float32), norm


def evaluate_fold(
    market: MarketSet,
    fold: Fold,
    feats: np.ndarray,
    policy: Any,
    cfg: TrainConfig,
    device: torch.device,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Greedy out-of-sample run over the test window, and every baseline on the same days,
    fills and costs: the fold's row and its daily curves (dated)."""
    from trimtab.rl.backtest.pooled import fold_backtest

    ev = evaluate(
        feats,
        market.fills.slice(None, fold.test_end),
        policy,
        levels=cfg.env.levels,
        costs=market.costs,
        start=fold.train_end - 1,
        end=fold.test_end - 1,
        device=device,
        capture=cfg.run.cuda_graph != "off",  # on a CUDA device (the learn step's switch)
    )
    first, last = market.date(fold.train_end), market.date(fold.test_end - 1)
    row = {
        "fold": fold.index,
        "train_start": market.date(fold.train_start),
        "train_end": market.date(fold.fit_end - 1),
        "embargo_days": fold.embargo,
        "test_start": first,
        "test_end": last,
        "execution": cfg.env.execution,
        "optimistic": cfg.env.execution in OPTIMISTIC,
        # flags: numbers that a data problem or a lost-everything day make untrustworthy
        "data_flags": issues_in_window(market.data, first, last),
        "ruin": None if ev.ruin is None else market.date(fold.train_end + ev.ruin),
    }
    stats, curves = fold_backtest(market, fold, ev, cfg)
    row.update(stats)
    return row, curves
