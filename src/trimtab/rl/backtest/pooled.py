"""A walk-forward run's backtest: each fold's agent beside the baselines on the same days,
fills and costs, and the pooled out-of-sample result over all test days with intervals.

Per fold (:func:`fold_backtest`), the greedy agent's daily net returns are set beside every
baseline of :mod:`trimtab.rl.backtest.baselines`, filled and charged by the same formula
(:mod:`trimtab.rl.backtest.execution`). Pooled (:func:`pool`), the folds' test windows are
concatenated into one out-of-sample curve per strategy, read back from the run directory's
``folds/fold_K.csv`` (so a resumed run pools the folds it finished before), and written as
``oos.csv``; its statistics carry stationary-bootstrap intervals over days, and the agent is
reported as a paired daily difference against each baseline.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from trimtab.rl.backtest import baselines as bl
from trimtab.rl.backtest import stats
from trimtab.rl.backtest.execution import OPTIMISTIC

__all__ = ["BASELINES", "SIMPLE_BASELINES", "fold_backtest", "pool"]

#: every baseline, in the order tables show them; ``oracle`` on the synthetic market only
BASELINES = ("buy_and_hold", "flat", "momentum", "reversal", "ma_crossover", "random", "oracle")
#: the simple rules an agent must beat to earn its place (not flat: it is the zero; not the
#: oracle: it knows what no trader knows)
SIMPLE_BASELINES = ("buy_and_hold", "momentum", "reversal", "ma_crossover", "random")
#: the per-fold keys of each baseline
_FOLD_KEYS = ("sharpe", "total_return", "max_drawdown", "turnover")


def _levels(cfg: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in cfg.env.levels)


def _oracle_edge(market: Any, start: int, end: int, execution: str) -> np.ndarray:
    """What the new position of each decision ``start .. end - 1`` is expected to earn, per
    unit weight, by one who knows the day's regime and the model's parameters (if the regime
    stays): ``E[r_{t+1}]`` filled at the close just seen; from the next open, the intraday
    part of bar t+1 and the overnight part of bar t+2; from the next close, bar t+2."""
    spec = market.spec
    regime = market.regimes[start:end]
    m1 = spec.expected_return(regime, market.log_returns[start:end])
    m2 = spec.expected_return(regime, m1)  # E[r_{t+2}]: the AR(1) one step further
    if execution == "same_close":
        return m1
    if execution == "next_close":
        return m2
    theta = spec.overnight_share
    return (1.0 - theta) * m1 + theta * m2


def _baseline_levels(
    market: Any, start: int, end: int, cfg: Any, agent_turnover: float, seed: int
) -> dict[str, np.ndarray]:
    """Target levels ``[L, A]`` (``random``: ``[N, L, A]``) of every baseline over decision
    days ``start .. end - 1``; each reads returns up to its decision day only."""
    r, levels, b = market.log_returns, _levels(cfg), cfg.backtest
    n_days, n_assets = end - start, r.shape[1]
    at = {"start": start, "end": end, "levels": levels}
    out = {
        "buy_and_hold": bl.buy_and_hold(r, **at),
        "flat": bl.flat(r, **at),
        "momentum": bl.momentum(r, b.momentum_days, **at),
        "reversal": bl.reversal(r, **at),
        "ma_crossover": bl.ma_crossover(r, b.ma_fast, b.ma_slow, **at),
        "random": bl.random_levels(agent_turnover, b.random_draws, seed, levels, n_days, n_assets),
    }
    if market.regimes is not None:
        edge = _oracle_edge(market, start, end, cfg.env.execution)
        out["oracle"] = bl.oracle_levels(edge, levels, market.costs.per_turnover)
    return out


def fold_backtest(
    market: Any, fold: Any, ev: Any, cfg: Any
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The fold's statistics (agent and baselines) and its daily curves, dated.

    ``ev`` is the agent's :class:`trimtab.rl.envs.trading.Evaluation` over decisions
    ``train_end - 1 .. test_end - 2``, earning bars ``train_end .. test_end - 1``."""
    start, end = fold.train_end - 1, fold.test_end - 1
    ppy, costs = market.periods_per_year, market.costs
    rf = costs.cash_per_bar
    fills = market.fills.slice(start + 1, end + 1)
    seed = cfg.run.seed * 1000 + fold.index
    levels = _baseline_levels(market, start, end, cfg, float(np.mean(ev.turnover)), seed)
    sims = {name: bl.simulate(lv, fills, costs) for name, lv in levels.items()}
    still = not np.any(ev.asset_log_returns)  # prices that never move: no Sharpe means anything

    def sharpe(x: np.ndarray) -> float | None:
        return None if still else stats.sharpe(x, ppy, rf)

    agent = {
        k: v
        for k, v in stats.window_stats(ev.log_returns, ev.weights, ppy, rf, draws=0).items()
        if k != "sharpe_ci95"
    }
    agent["sharpe"] = sharpe(ev.log_returns)
    cost_bps = costs.turnover_bps
    per: dict[str, dict[str, Any]] = {}
    for name, sim in sims.items():
        x, w = _one(sim.log_returns), _one(sim.weights)
        per[name] = {
            "sharpe": sharpe(x),
            "total_return": stats.total_return(x),
            "max_drawdown": stats.max_drawdown(x),
            "turnover": stats.turnover(w),
        }
    draws = sims["random"].log_returns  # [N, L]
    draw_sharpes = np.array([stats.sharpe(d, ppy, rf) for d in draws])
    median = int(np.argsort(draw_sharpes)[len(draw_sharpes) // 2])
    per["random"] = {
        "sharpe": sharpe(draws[median]),
        "total_return": stats.total_return(draws[median]),
        "max_drawdown": stats.max_drawdown(draws[median]),
        "turnover": float(np.mean(sims["random"].turnover)),
        "draws": len(draws),
        "agent_percentile": None if still else _percentile(agent["sharpe"], draw_sharpes),
    }
    breakeven = {
        name: stats.breakeven_bps(
            ev.log_returns,
            ev.turnover,
            _one(sims[name].log_returns),
            _one(sims[name].turnover),
            cost_bps,
        )
        for name in ("flat", "buy_and_hold")
    }
    bh = per["buy_and_hold"]
    row = {
        **agent,
        "baselines": per,
        "breakeven_bps": breakeven,
        "buy_hold_sharpe": bh["sharpe"],
        "buy_hold_return": bh["total_return"],
        "buy_hold_max_drawdown": bh["max_drawdown"],
    }
    dates = np.array([str(d) for d in market.data.dates[start + 1 : end + 1]], dtype=object)
    curves: dict[str, np.ndarray] = {"date": dates, "agent_log_return": ev.log_returns}
    for name, sim in sims.items():
        curves[f"{name}_log_return"] = draws[median] if name == "random" else _one(sim.log_returns)
    curves["turnover"] = ev.turnover
    curves["buy_and_hold_turnover"] = _one(sims["buy_and_hold"].turnover)
    for i, a in enumerate(market.data.assets):
        curves[f"weight_{a}"] = ev.weights[:, i]
    curves["random_draws"] = draws.astype(np.float32)  # [N, L]: a file of its own
    return row, curves


def _one(x: np.ndarray) -> np.ndarray:
    """A one-strategy :class:`~trimtab.rl.backtest.baselines.Simulated` array without its
    leading draw axis (of length 1)."""
    return np.asarray(x)[0]


def _percentile(value: float | None, sample: np.ndarray) -> float | None:
    """The percent of ``sample`` below ``value`` (ties count half)."""
    if value is None or sample.size == 0:
        return None
    below = float(np.sum(sample < value)) + 0.5 * float(np.sum(sample == value))
    return 100.0 * below / sample.size


def _read_curve(path: Path) -> dict[str, np.ndarray]:
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    out: dict[str, np.ndarray] = {}
    for j, name in enumerate(header):
        cells = [r[j] for r in body]
        out[name] = (
            np.array(cells, dtype=object)
            if name == "date"
            else np.array([float(c) for c in cells], dtype=np.float64)
        )
    return out


def pool(run_dir: str | Path, rows: list[dict[str, Any]], market: Any, cfg: Any) -> dict[str, Any]:
    """The pooled out-of-sample backtest of the folds in ``rows`` (their curves read from
    ``run_dir/folds``): ``oos`` (the agent), ``baselines`` and ``vs_baselines``; writes
    ``run_dir/oos.csv``. Empty when no fold has a curve."""
    run = Path(run_dir)
    parts, draws = [], []
    for r in rows:
        path = run / "folds" / f"fold_{r['fold']}.csv"
        if not path.is_file():
            continue
        parts.append((r["fold"], _read_curve(path)))
        npy = run / "folds" / f"fold_{r['fold']}_random_draws.npy"
        draws.append(np.load(npy) if npy.is_file() else None)
    if not parts:
        return {}
    cat = {k: np.concatenate([p[k] for _, p in parts]) for k in parts[0][1]}
    cat["fold"] = np.concatenate([np.full(len(p["date"]), k) for k, p in parts])
    _write_csv(run / "oos.csv", cat)
    ppy, costs, b = market.periods_per_year, market.costs, cfg.backtest
    rf = costs.cash_per_bar
    weights = np.stack([cat[k] for k in cat if k.startswith("weight_")], axis=1)
    still = not np.any(market.log_returns)

    def summary_of(x: np.ndarray, w: np.ndarray | None) -> dict[str, Any]:
        out = stats.window_stats(
            x,
            w if w is not None else np.zeros((len(x), 1)),
            ppy,
            rf,
            draws=b.bootstrap_draws,
            block=b.block_days,
            seed=cfg.run.seed,
        )
        if still:
            out["sharpe"], out["sharpe_ci95"] = None, None
        if w is None:
            for key in ("turnover", "exposure", "hit_rate"):
                out.pop(key, None)
        return out

    agent = cat["agent_log_return"]
    oos = {
        "days": len(agent),
        "start": str(cat["date"][0]),
        "end": str(cat["date"][-1]),
        "folds": len(parts),
        **summary_of(agent, weights),
        "turnover": stats.turnover(weights),
        "skew": _moment(agent, 3),
        "kurtosis": _moment(agent, 4),
        "periods_per_year": ppy,
        "risk_free_pct": costs.cash_pct,
        "cost_bps": costs.turnover_bps,
        "commission_bps": costs.commission_bps,
        "half_spread_bps": costs.half_spread_bps,
        "borrow_pct": costs.borrow_pct,
        "execution": cfg.env.execution,
        "optimistic": cfg.env.execution in OPTIMISTIC,
    }
    names = [n for n in BASELINES if f"{n}_log_return" in cat]
    base = {n: summary_of(cat[f"{n}_log_return"], None) for n in names}
    if draws and all(d is not None for d in draws):
        pooled_draws = np.concatenate(draws, axis=1).astype(np.float64)  # [N, days]
        sharpes = np.array([stats.sharpe(d, ppy, rf) for d in pooled_draws])
        # the random strategy's Sharpe is the median draw's, its interval the middle 95% of
        # the draws (the spread of turnover-matched luck); its curve is each fold's median draw
        base["random"].update(
            sharpe=None if still else float(np.median(sharpes)),
            sharpe_ci95=None if still else [float(np.percentile(sharpes, q)) for q in (2.5, 97.5)],
            draws=len(sharpes),
            sharpe_p05=float(np.percentile(sharpes, 5)),
            sharpe_p95=float(np.percentile(sharpes, 95)),
            agent_percentile=None if still else _percentile(oos["sharpe"], sharpes),
        )
    zero = np.zeros(len(agent))
    oos["breakeven_bps"] = {
        "flat": stats.breakeven_bps(agent, cat["turnover"], zero, zero, costs.turnover_bps),
        "buy_and_hold": stats.breakeven_bps(
            agent,
            cat["turnover"],
            cat["buy_and_hold_log_return"],
            cat["buy_and_hold_turnover"],
            costs.turnover_bps,
        ),
    }
    vs = {
        n: stats.paired_difference(
            agent,
            cat[f"{n}_log_return"],
            ppy,
            draws=b.bootstrap_draws,
            block=b.block_days,
            seed=cfg.run.seed,
        )
        for n in names
    }
    return {"oos": oos, "baselines": base, "vs_baselines": vs}


def _moment(x: np.ndarray, k: int) -> float | None:
    """Skewness (k = 3) or kurtosis (k = 4, normal = 3) of the simple returns."""
    s = np.expm1(np.asarray(x, np.float64))
    sd = s.std()
    if s.size < 3 or sd == 0:
        return None
    return float(np.mean(((s - s.mean()) / sd) ** k))


def _write_csv(path: Path, cols: dict[str, np.ndarray]) -> None:
    from trimtab.rl.run.checkpoint import atomic_write_text

    names = list(cols)
    lines = [",".join(names)]
    for i in range(len(cols["date"])):
        lines.append(",".join(_cell(cols[c][i]) for c in names))
    atomic_write_text(path, "\n".join(lines) + "\n")


def _cell(v: Any) -> str:
    return v if isinstance(v, str) else f"{v:.10g}"
