"""Walk-forward folds over market data: windows, per-fold features, out-of-sample evaluation.

Fold ``k`` trains on window ``k`` and is evaluated, greedily and out of sample, on window
``k + 1``. The decision on the last training day earns the first test day's return, so every
test-window return is earned by exactly one out-of-sample decision and no training reward
touches the test window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trimtab.rl import metrics
from trimtab.rl.config import TrainConfig
from trimtab.rl.data import DataError, MarketData, describe_moves, extreme_moves, load_ohlcv
from trimtab.rl.env import evaluate
from trimtab.rl.features import WARMUP, FeatureNormalizer, compute_features

__all__ = ["Fold", "MarketSet", "evaluate_fold", "load_market", "make_folds"]


@dataclass(frozen=True)
class Fold:
    """Day indices (into the post-warm-up arrays) of one fold: train ``[a, b)``, test ``[b, c)``."""

    index: int
    train_start: int
    train_end: int
    test_end: int


@dataclass
class MarketSet:
    """The market of a run: raw data, features ``[T, A, F]`` and log returns ``[T, A]``,
    with the feature warm-up rows already cut off. ``extreme [T, A]`` marks the one-day moves
    of a user's files far outside the asset's own spread (:func:`trimtab.rl.data.extreme_moves`;
    none for the embedded market, whose crashes are by design)."""

    data: MarketData
    features: np.ndarray
    log_returns: np.ndarray
    extreme: np.ndarray | None = None

    @property
    def n_days(self) -> int:
        return self.features.shape[0]

    def date(self, i: int) -> str:
        return str(self.data.dates[i])


def load_market(cfg: TrainConfig) -> MarketSet:
    """The embedded synthetic market, or the user's files; raises ``DataError`` on bad data."""
    if cfg.data.paths:
        data = load_ohlcv(list(cfg.data.paths), gaps=cfg.data.gaps)
    else:
        from trimtab.rl.market import MarketSpec, simulate

        seed = cfg.run.seed if cfg.data.market_seed is None else cfg.data.market_seed
        maker = MarketSpec.stress if cfg.data.stress else MarketSpec
        data = simulate(maker(n_days=cfg.data.synthetic_days, seed=seed)).data
    feats = compute_features(data)[WARMUP:]
    rets = data.log_returns()[WARMUP:]
    extreme = extreme_moves(data.log_returns())[WARMUP:] if cfg.data.paths else None
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
    return MarketSet(data, feats.astype(np.float32), rets, extreme)


def minimum_window(cfg: TrainConfig) -> int:
    """The fewest days a walk-forward window may have: one training episode plus two days."""
    return max(cfg.env.episode_days + 2, cfg.walkforward.window_days)


def make_folds(n_days: int, cfg: TrainConfig) -> list[Fold]:
    """Contiguous equal windows ending at the last day; fold k: train window k, test k + 1."""
    k = cfg.walkforward.folds
    w = cfg.walkforward.window_days or n_days // (k + 1)
    first = n_days - (k + 1) * w
    return [Fold(i, first + i * w, first + (i + 1) * w, first + (i + 2) * w) for i in range(k)]


def fold_arrays(market: MarketSet, fold: Fold) -> tuple[np.ndarray, FeatureNormalizer]:
    """Features of every day up to the fold's test end, normalised by training-window stats."""
    norm = FeatureNormalizer().fit(market.features[fold.train_start : fold.train_end])
    return norm.transform(market.features[: fold.test_end]).astype(np.float32), norm


def _test_moves(market: MarketSet, fold: Fold) -> list[str]:
    """The extreme one-day moves whose returns the test window earns (dated)."""
    if market.extreme is None:
        return []
    mask = np.zeros_like(market.extreme)
    mask[fold.train_end : fold.test_end] = market.extreme[fold.train_end : fold.test_end]
    return describe_moves(market.data, mask, limit=len(mask))


def evaluate_fold(
    market: MarketSet,
    fold: Fold,
    feats: np.ndarray,
    policy: Any,
    cfg: TrainConfig,
    device: torch.device,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Greedy out-of-sample run over the test window; metrics for the agent and baselines."""
    ev = evaluate(
        feats,
        market.log_returns[: fold.test_end],
        policy,
        levels=cfg.env.levels,
        cost_bps=cfg.env.cost_bps,
        start=fold.train_end - 1,
        end=fold.test_end - 1,
        device=device,
        capture=cfg.run.cuda_graph != "off",  # on a CUDA device (the learn step's switch)
    )
    agent = metrics.window_metrics(ev.log_returns, ev.weights)
    bh = metrics.buy_and_hold(ev.asset_log_returns, cfg.env.cost_bps)
    bh_metrics = bh.metrics()
    # prices that never move: any Sharpe ratio is costs over a rounding error, so none is given
    still = not np.any(ev.asset_log_returns)
    row = {
        "fold": fold.index,
        "train_start": market.date(fold.train_start),
        "train_end": market.date(fold.train_end - 1),
        "test_start": market.date(fold.train_end),
        "test_end": market.date(fold.test_end - 1),
        **agent.as_dict(),
        "sharpe": None if still else agent.sharpe,
        "buy_hold_sharpe": None if still else bh_metrics.sharpe,
        "buy_hold_return": bh_metrics.total_return,
        "buy_hold_max_drawdown": bh_metrics.max_drawdown,
        "flat_sharpe": 0.0,
        "flat_return": 0.0,
        # flags: numbers that a bad tick or a lost-everything day make meaningless
        "extreme_moves": _test_moves(market, fold),
        "ruin": None if ev.ruin is None else market.date(fold.train_end - 1 + ev.ruin),
    }
    curves = {
        "agent_log_return": ev.log_returns,
        "buy_hold_log_return": bh.log_returns,
        "turnover": ev.turnover,
        **{f"weight_{a}": ev.weights[:, i] for i, a in enumerate(market.data.assets)},
    }
    return row, curves
