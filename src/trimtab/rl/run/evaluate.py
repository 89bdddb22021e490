"""``trimtab eval``: a saved agent, greedy, on other market data, or on the days of its own
market that it never trained on (and, apart, the days it did)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trimtab.rl.agent.dqn import AgentConfig, DQNAgent
from trimtab.rl.backtest import baselines, stats
from trimtab.rl.backtest.execution import OPTIMISTIC, fill_returns
from trimtab.rl.config import AUTOCAST_DTYPES, saved_config
from trimtab.rl.data.features import WARMUP, FeatureNormalizer, compute_features, select_features
from trimtab.rl.data.load import DataError, load_ohlcv
from trimtab.rl.envs.trading import evaluate
from trimtab.rl.run import checkpoint as ckpt

__all__ = ["checkpoint_path", "evaluate_checkpoint", "format_window"]


def checkpoint_path(path: str | Path) -> Path:
    """The checkpoint that ``trimtab eval PATH`` reads: ``PATH`` itself, or for a run
    directory its ``checkpoints/last.pt`` (where that was written mid-fold,
    :func:`evaluate_checkpoint` takes the last ``fold_K.pt`` instead)."""
    path = Path(path)
    if path.is_dir():
        last = path / "checkpoints" / "last.pt"
        if not last.is_file():
            what = "a run directory" if (path / "config.toml").is_file() else "a directory"
            raise ckpt.CheckpointError(
                f"{path} is {what} with no checkpoints/last.pt: it has not finished a fold "
                "yet (resume it with trimtab train --resume), or give a checkpoint file"
            )
        return last
    if not path.exists():
        raise ckpt.CheckpointError(
            f"{path} does not exist: give a run directory (its checkpoints/last.pt is read) or "
            "a checkpoint file RUN_DIR/checkpoints/NAME.pt"
        )
    return path


def evaluate_checkpoint(
    path: str | Path, data_paths: list[str] | None, device: str = "cpu"
) -> dict[str, Any]:
    """Greedy metrics of the agent in checkpoint ``path`` over ``data_paths``; without them,
    over its run's market split at the end of its last training window: the headline is out of
    sample (the days after it), ``in_sample`` the days before (training windows included).

    Features are normalised with the statistics of the last fold the agent trained on (saved
    in the checkpoint), as they were when it was evaluated during training.
    """
    given, path = Path(path), checkpoint_path(path)
    state = ckpt.load(path, fingerprint=None)
    if given.is_dir() and state.get("normalizer") is None:  # last.pt is mid-fold
        folds = sorted(given.glob("checkpoints/fold_*.pt"), key=lambda p: int(p.stem[5:] or 0))
        if folds:  # the last finished fold's agent
            path = folds[-1]
            state = ckpt.load(path, fingerprint=None)
    env_name = state.get("config", {}).get("env", {}).get("name", "market")
    if str(env_name) != "market":
        kind = "bsuite" if str(env_name).startswith("bsuite:") else "Gymnasium"
        raise ckpt.CheckpointError(
            f"{path} is a {kind} run's checkpoint (env.name = {env_name!r}); trimtab eval "
            f"tests a market agent on market data. A {kind} run is evaluated greedily at its "
            'end: its greedy returns are in RUN_DIR/summary.json under "eval"'
        )
    if state.get("normalizer") is None:
        raise ckpt.CheckpointError(
            f"{path} was written mid-fold and holds no feature normaliser; evaluate a fold-end "
            "checkpoint (checkpoints/fold_K.pt) or last.pt of a finished run"
        )
    cfg = saved_config(state["config"])
    from trimtab.rl.run.walkforward import costs_of, load_market

    if data_paths:
        data = load_ohlcv(data_paths, gaps=cfg.data.gaps, max_gap_days=cfg.data.max_gap_days)
        for w in data.warnings:  # the same checks as a training run's, said the same way
            print(f"warning: {w}", file=sys.stderr, flush=True)
        periods = data.periods_per_year
        feats = select_features(compute_features(data)[WARMUP:], cfg.env.features)
        all_rets = data.log_returns()
        fills = fill_returns(all_rets, data.open, data.close, cfg.env.execution).slice(WARMUP, None)
        rets, dates, assets = all_rets[WARMUP:], data.dates[WARMUP:], data.assets
        costs = costs_of(cfg, periods)
    else:
        market = load_market(cfg)
        feats, rets, fills, costs = market.features, market.log_returns, market.fills, market.costs
        dates, assets, periods = market.data.dates, market.data.assets, market.periods_per_year
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

    def policy(o: torch.Tensor) -> torch.Tensor:
        return agent.act(o.to(agent.device, torch.float32), 0, greedy=True)

    def window(name: str, start: int, end: int) -> dict[str, Any]:
        ev = evaluate(x, fills, policy, levels=cfg.env.levels, costs=costs, start=start,
                      end=end, device=device, capture=cfg.run.cuda_graph != "off")  # fmt: skip
        rf = costs.cash_per_bar
        m = stats.window_stats(ev.log_returns, ev.weights, periods, rf, draws=0)
        long = baselines.buy_and_hold(rets, start=start, end=end, levels=cfg.env.levels)
        bh = baselines.simulate(long, fills.slice(start + 1, end + 1), costs).log_returns[0]
        still = not np.any(ev.asset_log_returns)  # no price moves: a Sharpe ratio means nothing
        return {
            "window": name, "start": str(dates[start + 1]), "end": str(dates[end]),
            "days": m["n_days"], "sharpe": None if still else round(m["sharpe"], 4),
            "total_return": round(m["total_return"], 6),
            "max_drawdown": round(m["max_drawdown"], 6),
            "turnover": round(m["turnover"], 6), "hit_rate": round(m["hit_rate"] or 0.0, 4),
            "buy_hold_sharpe": None if still else round(stats.sharpe(bh, periods, rf), 4),
            "buy_hold_return": round(stats.total_return(bh), 6),
            "execution": cfg.env.execution, "optimistic": cfg.env.execution in OPTIMISTIC,
            "cost_bps": costs.turnover_bps, "periods_per_year": periods,
            "ruin": None if ev.ruin is None else str(dates[start + 1 + ev.ruin]),
        }  # fmt: skip

    last = len(rets) - 1
    if data_paths:
        return {"checkpoint": str(path), **window("given data", 0, last)}
    # The run's own market: only the days after the last window this agent trained on are out
    # of sample for it (earlier test windows were trained on by the time of this checkpoint).
    from trimtab.rl.run.walkforward import make_folds

    folds = make_folds(len(rets), cfg)
    trained = folds[min(state["progress"]["fold"], len(folds)) - 1]
    split = trained.train_end - 1  # the last training day's decision earns the first test day
    out = {"checkpoint": str(path), **window("out of sample", split, last)}
    if split > 1:
        out["in_sample"] = window("in sample", 0, split)
    return out


def format_window(r: dict[str, Any]) -> str:
    """One evaluation window as ``trimtab train`` prints a fold."""
    sharpe = "undefined (prices do not move)" if r["sharpe"] is None else f"{r['sharpe']:+.2f}"
    bh = "undefined" if r["buy_hold_sharpe"] is None else f"{r['buy_hold_sharpe']:+.2f}"
    ruin = f"  [! ruin on {r['ruin']}: the portfolio lost everything]" if r.get("ruin") else ""
    if r.get("optimistic"):
        ruin += "  [OPTIMISTIC: filled at the close that was just seen]"
    return (
        f"{r['window']} {r['start']}..{r['end']} ({r['days']} days): Sharpe {sharpe} "
        f"(buy & hold {bh}), return {r['total_return']:+.1%} (B&H {r['buy_hold_return']:+.1%}), "
        f"max DD {r['max_drawdown']:.1%}, turnover {r['turnover']:.3f}, "
        f"hit rate {r['hit_rate']:.1%}{ruin}"
    )
