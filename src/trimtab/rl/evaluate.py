"""``trimtab eval``: a saved agent, greedy, on other market data (or the data it trained on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from trimtab.rl import checkpoint as ckpt
from trimtab.rl import metrics
from trimtab.rl.agent import AgentConfig, DQNAgent
from trimtab.rl.config import AUTOCAST_DTYPES, TrainConfig
from trimtab.rl.configio import from_dict
from trimtab.rl.data import DataError, load_ohlcv
from trimtab.rl.env import evaluate
from trimtab.rl.features import WARMUP, FeatureNormalizer, compute_features

__all__ = ["evaluate_checkpoint"]


def evaluate_checkpoint(
    path: str | Path, data_paths: list[str] | None, device: str = "cpu"
) -> dict[str, Any]:
    """Greedy out-of-sample metrics of the agent in checkpoint ``path`` over ``data_paths``.

    Features are normalised with the statistics of the last fold the agent trained on (saved
    in the checkpoint), as they were when it was evaluated during training.
    """
    state = ckpt.load(path, fingerprint=None)
    if state.get("normalizer") is None:
        raise ckpt.CheckpointError(
            f"{path} was written mid-fold and holds no feature normaliser; evaluate a fold-end "
            "checkpoint (checkpoints/fold_K.pt) or last.pt of a finished run"
        )
    cfg = from_dict(TrainConfig, state["config"])
    if data_paths:
        data = load_ohlcv(data_paths, gaps=cfg.data.gaps)
        feats = compute_features(data)[WARMUP:]
        rets, dates, assets = data.log_returns()[WARMUP:], data.dates[WARMUP:], data.assets
    else:
        from trimtab.rl.walkforward import load_market

        market = load_market(cfg)
        feats, rets = market.features, market.log_returns
        dates, assets = market.data.dates, market.data.assets
    agent_state = state["agent"]
    n_assets = len(agent_state["branch_sizes"])
    if feats.shape[1] != n_assets:
        raise DataError(
            f"the agent in {path} trades {n_assets} assets but the data has {feats.shape[1]} "
            f"({', '.join(assets)}); give files for exactly {n_assets} assets"
        )
    if len(rets) < 3:
        raise DataError(f"too few rows after the {WARMUP}-day feature warm-up")
    norm = FeatureNormalizer.from_state_dict(state["normalizer"])
    x = norm.transform(feats).astype(np.float32)
    agent = DQNAgent(
        agent_state["obs_dim"],
        agent_state["branch_sizes"],
        AgentConfig.from_dict(agent_state["config"]),
        device,
        autocast=AUTOCAST_DTYPES[cfg.run.autocast],  # act as it acted in training
    )
    # evaluation needs the networks only; the training optimizer's groups are not rebuilt here
    agent.load_state_dict({**agent_state, "optimizer": agent.optimizer.state_dict()})
    v = state["stability"]["state"]["values"]
    bound = float(v[0]) if cfg.run.stability == "adaptive" and np.isfinite(float(v[0])) else None
    if bound is not None:  # the adaptive support the agent ended with
        hi = torch.full((n_assets,), max(bound, 1e-3), device=agent.device)
        agent.support_fn = lambda: (-hi, hi)
    ev = evaluate(
        x, rets, lambda o: agent.act(o.to(agent.device, torch.float32), 0, greedy=True),
        levels=cfg.env.levels, cost_bps=cfg.env.cost_bps, device=device,
    )  # fmt: skip
    m = metrics.window_metrics(ev.log_returns, ev.weights)
    bh = metrics.buy_and_hold(ev.asset_log_returns, cfg.env.cost_bps).metrics()
    return {
        "checkpoint": str(path),
        "start": str(dates[1]),
        "end": str(dates[-1]),
        "days": m.n_days,
        "sharpe": round(m.sharpe, 4),
        "total_return": round(m.total_return, 6),
        "max_drawdown": round(m.max_drawdown, 6),
        "turnover": round(m.turnover, 6),
        "hit_rate": round(m.hit_rate, 4),
        "buy_hold_sharpe": round(bh.sharpe, 4),
        "buy_hold_return": round(bh.total_return, 6),
    }
