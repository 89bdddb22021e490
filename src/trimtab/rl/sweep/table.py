"""A sweep's merged table: per cell, the mean ± standard error over seeds of each trial metric
that exists, printed, and written as ``sweep.csv``, ``sweep.json`` and ``sweep.png``; beside it
the deflated Sharpe ratio of the best trial over all trials, and ``trimtab train --seeds``'s
per-seed table."""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "METRICS",
    "SIMPLE_BASELINES",
    "format_seeds_table",
    "format_table",
    "merge",
    "selection",
    "trial_metrics",
    "write_outputs",
]

#: metric -> what it is; a trial has those its kind of run reports (a run written before the
#: pooled backtest: oos_sharpe and oos_return are its means over folds, no baseline columns)
METRICS = {
    "oos_sharpe": "market: out-of-sample Sharpe, pooled over all test days",
    "fold_sharpe": "market: out-of-sample Sharpe, mean over folds",
    "oos_return": "market: out-of-sample total return, pooled over all test days",
    "buy_hold_sharpe": "market: buy & hold's Sharpe on the same days",
    "best_baseline_sharpe": "market: the best simple baseline's Sharpe on the same days",
    "vs_best": "market: agent minus the best baseline, information ratio",
    "oracle_sharpe": "synthetic market: the oracle's Sharpe (a ceiling, not a rival)",
    "eval_return": "Gymnasium: greedy evaluation, mean episode return",
}
#: the baselines the best one is chosen from: never flat (the zero) nor the oracle (it knows
#: the market's regimes); the same as trimtab.rl.backtest.pooled.SIMPLE_BASELINES, written out
#: so that reading a table does not import the backtest
SIMPLE_BASELINES = ("buy_and_hold", "momentum", "reversal", "ma_crossover", "random")
#: a trial's text metric: which baseline was best (the table shows the most frequent)
TEXT = "best_baseline"
#: the periods per year of a run whose summary does not say (daily bars)
_DEFAULT_PPY = 252.0


def trial_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """A finished run's metrics from its ``summary.json`` (a halted run: the folds it finished):
    floats, and ``best_baseline`` the name of the best of :data:`SIMPLE_BASELINES`."""
    out: dict[str, Any] = {}
    folds = [f for f in summary.get("folds") or [] if f.get("sharpe") is not None]
    if folds:
        out["oos_sharpe"] = math.fsum(f["sharpe"] for f in folds) / len(folds)
        out["fold_sharpe"] = out["oos_sharpe"]
        out["oos_return"] = math.fsum(f["total_return"] for f in folds) / len(folds)
    oos = summary.get("oos") or {}
    for key, name in (("oos_sharpe", "sharpe"), ("oos_return", "total_return")):
        if oos.get(name) is not None:
            out[key] = float(oos[name])
    baselines = summary.get("baselines") or {}
    sharpes = {n: float(b["sharpe"]) for n, b in baselines.items()
               if isinstance(b, dict) and b.get("sharpe") is not None}  # fmt: skip
    if "buy_and_hold" in sharpes:
        out["buy_hold_sharpe"] = sharpes["buy_and_hold"]
    simple = {n: sharpes[n] for n in SIMPLE_BASELINES if n in sharpes}
    if simple:
        best = max(simple, key=simple.__getitem__)
        out["best_baseline_sharpe"], out[TEXT] = simple[best], best
        vs = (summary.get("vs_baselines") or {}).get(best) or {}
        if vs.get("information_ratio") is not None:
            out["vs_best"] = float(vs["information_ratio"])
    if "oracle" in sharpes:
        out["oracle_sharpe"] = sharpes["oracle"]
    if summary.get("eval"):
        out["eval_return"] = float(summary["eval"]["mean_return"])
    return out


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {m: v for m, v in metrics.items() if m != TEXT}


def _sample(summary: dict[str, Any]) -> dict[str, Any]:
    """What the deflated Sharpe ratio needs of a trial: bars per year, bars, skew, kurtosis
    (of the pooled daily returns; an older run: its folds' days, moments unknown)."""
    oos = summary.get("oos") or {}
    ppy = oos.get("periods_per_year") or summary.get("periods_per_year") or _DEFAULT_PPY
    days = oos.get("days")
    if days is None:
        days = sum(int(f.get("n_days") or 0) for f in summary.get("folds") or [])
    return {"periods_per_year": float(ppy), "n_obs": int(days), "skew": oos.get("skew"),
            "kurtosis": oos.get("kurtosis")}  # fmt: skip


def _scored(results: Sequence[Any]) -> list[tuple[Any, float, float, dict[str, Any]]]:
    """``(result, Sharpe, per-bar Sharpe, sample)`` of each finished trial with a Sharpe."""
    from trimtab.rl.backtest.selection import per_bar

    out = []
    for r in results:
        sharpe = trial_metrics(r.summary).get("oos_sharpe") if r.summary else None
        if sharpe is None or not math.isfinite(sharpe):
            continue
        sample = _sample(r.summary)
        out.append((r, sharpe, per_bar(sharpe, sample["periods_per_year"]), sample))
    return out


def _select(results: Sequence[Any]) -> tuple[dict[str, Any] | None, dict[str, float | None]]:
    """:func:`selection`, and per cell the deflated Sharpe ratio of its best seed against the
    same trials (the best of a cell is also picked from all N: the same luck to beat)."""
    from trimtab.rl.backtest.selection import deflated_sharpe, expected_max_sharpe

    scored = _scored(results)
    if not scored:
        return None, {}
    per = [s for _, _, s, _ in scored]
    n = len(per)
    mean = math.fsum(per) / n
    var = math.fsum((s - mean) ** 2 for s in per) / (n - 1) if n > 1 else 0.0

    def dsr(item: tuple[Any, float, float, dict[str, Any]]) -> float | None:
        _, _, sr, sample = item
        if sample["n_obs"] < 2:
            return None
        return deflated_sharpe(sr, per, sample["n_obs"], sample["skew"], sample["kurtosis"])

    best_of: dict[str, tuple[Any, float, float, dict[str, Any]]] = {}
    for item in scored:
        cell = item[0].trial.cell
        if cell not in best_of or item[2] > best_of[cell][2]:
            best_of[cell] = item
    best = max(scored, key=lambda item: item[2])
    r, sharpe, sr, sample = best
    sr0 = expected_max_sharpe(n, var)
    top = {
        "n_trials": n, "cell": r.trial.label, "dir": r.trial.cell, "seed": r.trial.seed,
        "run_dir": str(r.trial.run_dir), "sharpe": sharpe, "dsr": dsr(best),
        "expected_max_sharpe": sr0 * math.sqrt(sample["periods_per_year"]),
        "sharpe_per_bar": sr, "expected_max_sharpe_per_bar": sr0, "var_sharpe_per_bar": var,
        **sample, "normal_assumed": sample["skew"] is None or sample["kurtosis"] is None,
    }  # fmt: skip
    return top, {cell: dsr(item) for cell, item in best_of.items()}


def selection(results: Sequence[Any]) -> dict[str, Any] | None:
    """The best trial by out-of-sample Sharpe and its deflated Sharpe ratio (Bailey & López de
    Prado 2014: :mod:`trimtab.rl.backtest.selection`) over the ``n_trials`` finished trials
    with a Sharpe, each per bar (annualised / sqrt(periods per year)); its ``n_obs`` days,
    skew and kurtosis are those of its pooled returns (unknown: normal assumed). None
    without such a trial. ``expected_max_sharpe`` (annualised) is the best Sharpe that luck
    alone gives ``n_trials`` trials that differ as much as these do."""
    return _select(results)[0]


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error s / sqrt(n) (sample s, n - 1); NaN where undefined."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n == 1:
        return mean, math.nan
    if min(values) == max(values):  # the seeds agree (one market's baselines): no rounding noise
        return values[0], 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def _stats(pairs: list[tuple[int, float]]) -> dict[str, Any]:
    pairs = sorted(pairs)
    mean, se = _mean_se([v for _, v in pairs])
    return {"mean": _finite(mean), "se": _finite(se), "n": len(pairs),
            "seeds": {str(s): _finite(v) for s, v in pairs}}  # fmt: skip


def _names(pairs: list[tuple[int, str]]) -> dict[str, Any]:
    """The most frequent name (the first seed's where tied), and each seed's."""
    pairs = sorted(pairs)
    counts = Counter(v for _, v in pairs)
    return {"name": counts.most_common(1)[0][0], "n": len(pairs),
            "seeds": {str(s): v for s, v in pairs}}  # fmt: skip


def merge(results: Sequence[Any], trials: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per cell (in the sweep's order): its overrides, trial counts by status, per
    metric the mean, standard error, n and per-seed values of the finished trials, the best
    baseline's name (most frequent over seeds) and the deflated Sharpe ratio of the cell's
    best seed over all the sweep's trials (``dsr``)."""
    cells: dict[str, dict[str, Any]] = {}
    for t in trials:
        row = cells.setdefault(t.cell, {"cell": t.label, "dir": t.cell,
                                        "overrides": dict(t.overrides), "trials": 0,
                                        "done": 0, "halted": 0, "failed": 0, "_v": {}})  # fmt: skip
        row["trials"] += 1
    for r in results:
        row = cells[r.trial.cell]
        row[r.status] += 1
        for m, v in (trial_metrics(r.summary) if r.summary else {}).items():
            row["_v"].setdefault(m, []).append((r.trial.seed, v))
    _, dsr = _select(results)
    for row in cells.values():
        values = row.pop("_v")
        row["metrics"] = {m: _stats(values[m]) for m in METRICS if m in values}
        if TEXT in values:
            row[TEXT] = _names(values[TEXT])
        if dsr.get(row["dir"]) is not None:
            row["dsr"] = dsr[row["dir"]]
    return list(cells.values())


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no NaN


def _metrics_of(cells: Sequence[dict[str, Any]]) -> list[str]:
    return [m for m in METRICS if any(m in c["metrics"] for c in cells)]


def _pm(stats: dict[str, Any] | None) -> str:
    if not stats or stats["mean"] is None:
        return "-"
    se = "" if stats["se"] is None else f" ± {stats['se']:.3g}"
    return f"{stats['mean']:+.3g}{se}"


def _name(text: dict[str, Any] | None) -> str:
    """``momentum``, or ``momentum 3/5`` where the seeds' best baselines differ."""
    if not text:
        return "-"
    k = sum(v == text["name"] for v in text["seeds"].values())
    return text["name"] if k == text["n"] else f"{text['name']} {k}/{text['n']}"


def _dsr(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_selection(sel: dict[str, Any] | None) -> str:
    """One line: the best trial, its deflated Sharpe ratio and what luck alone would give."""
    if not sel:
        return ""
    where = f"{sel['cell']} seed {sel['seed']}" if sel["dir"] else f"seed {sel['seed']}"
    normal = ", normal returns assumed" if sel["normal_assumed"] else ""
    return (f"deflated Sharpe ratio of the best of {sel['n_trials']} trials ({where}: Sharpe "
            f"{sel['sharpe']:+.3g} over {sel['n_obs']} days{normal}): {_dsr(sel['dsr'])} "
            f"(best Sharpe from luck alone: {sel['expected_max_sharpe']:+.3g})")  # fmt: skip


def format_table(cells: Sequence[dict[str, Any]], sel: dict[str, Any] | None = None) -> str:
    """A Markdown table: cell, trials done/halted/failed, each metric as mean ± s.e. (n), the
    best baseline's name and the cell's best seed's deflated Sharpe ratio; below it, given
    :func:`selection`, the line of :func:`format_selection`."""
    metrics = _metrics_of(cells)
    text = any(TEXT in c for c in cells)
    dsr = any("dsr" in c for c in cells)
    head = ["cell", "trials", "done", "halted", "failed"]
    for m in metrics:
        head.append(f"{m} (mean ± s.e.)")
        if m == "best_baseline_sharpe" and text:
            head.append("best baseline")
    head += ["DSR (best seed)"] if dsr else []
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for c in cells:
        cols = [c["cell"], c["trials"], c["done"], c["halted"], c["failed"]]
        for m in metrics:
            cols.append(_pm(c["metrics"].get(m)))
            if m == "best_baseline_sharpe" and text:
                cols.append(_name(c.get(TEXT)))
        cols += [_dsr(c.get("dsr"))] if dsr else []
        lines.append("| " + " | ".join(str(x) for x in cols) + " |")
    if sel:
        lines += ["", format_selection(sel)]
    return "\n".join(lines)


#: ``trimtab train --seeds``'s table: (header, metric, format) in order; those no seed has
#: are left out (``oos_max_drawdown`` and ``oos_turnover`` are :func:`seed_metrics`' own)
SEED_COLUMNS = (
    ("Sharpe", "oos_sharpe", "{:+.3f}"),
    ("return", "oos_return", "{:+.2%}"),
    ("max DD", "oos_max_drawdown", "{:.2%}"),
    ("turnover", "oos_turnover", "{:.3f}"),
    ("B&H Sharpe", "buy_hold_sharpe", "{:+.3f}"),
    ("best baseline Sharpe", "best_baseline_sharpe", "{:+.3f}"),
    ("vs best (IR)", "vs_best", "{:+.3f}"),
    ("oracle Sharpe", "oracle_sharpe", "{:+.3f}"),
    ("fold-mean Sharpe", "fold_sharpe", "{:+.3f}"),
    ("eval return", "eval_return", "{:+.4g}"),
)


def seed_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """:func:`trial_metrics` and the pooled max drawdown and turnover (an older run: means over
    folds)."""
    out = trial_metrics(summary)
    oos = summary.get("oos") or {}
    folds = [f for f in summary.get("folds") or [] if f.get("sharpe") is not None]
    for key, name in (("oos_max_drawdown", "max_drawdown"), ("oos_turnover", "turnover")):
        if oos.get(name) is not None:
            out[key] = float(oos[name])
        elif folds and all(f.get(name) is not None for f in folds):
            out[key] = math.fsum(f[name] for f in folds) / len(folds)
    return out


def format_seeds_table(results: Sequence[Any], sel: dict[str, Any] | None = None) -> str:
    """A Markdown table of one config's seeds: a row per seed (its status and metrics), then
    their mean ± standard error (n); below it the best seed's deflated Sharpe ratio (picking
    the best seed is a selection too)."""
    per = {r.trial.seed: seed_metrics(r.summary) if r.summary else {} for r in results}
    cols = [c for c in SEED_COLUMNS if any(c[1] in m for m in per.values())]
    text = any(TEXT in m for m in per.values())
    head = ["seed", "status"]
    for header, metric, _ in cols:
        head.append(header)
        if metric == "best_baseline_sharpe" and text:
            head.append("best baseline")
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in results:
        m = per[r.trial.seed]
        row = [str(r.trial.seed), r.status if r.status != "failed" else f"failed: {r.error}"]
        for _, metric, fmt in cols:
            row.append(fmt.format(m[metric]) if metric in m else "-")
            if metric == "best_baseline_sharpe" and text:
                row.append(m.get(TEXT, "-"))
        lines.append("| " + " | ".join(row) + " |")
    n = sum(1 for m in per.values() if m)
    agg = ["mean ± s.e.", f"n={n}"]
    for _, metric, fmt in cols:
        mean, se = _mean_se([m[metric] for m in per.values() if metric in m])
        cell = "-" if math.isnan(mean) else fmt.format(mean)
        agg.append(cell if math.isnan(se) else f"{cell} ± {fmt.format(se).lstrip('+')}")
        if metric == "best_baseline_sharpe" and text:
            agg.append(_name(_names([(s, m[TEXT]) for s, m in per.items() if TEXT in m])))
    lines.append("| " + " | ".join(agg) + " |")
    if sel:
        lines += ["", format_selection(sel)]
    return "\n".join(lines)


def write_outputs(
    out: Path,
    cells: list[dict[str, Any]],
    trials: list[dict[str, Any]],
    plot: bool = True,
    sel: dict[str, Any] | None = None,
) -> None:
    """``sweep.json`` (the table, :func:`selection`, every trial with its status, error and run
    directory), ``sweep.csv`` (the table; ``n_trials`` is the sweep's, the number each cell's
    ``dsr`` is deflated by) and, if ``plot``, ``sweep.png`` (each metric per cell, seeds as
    dots)."""
    from trimtab.rl.run.checkpoint import atomic_write_json, atomic_write_text

    metrics = _metrics_of(cells)
    atomic_write_json(out / "sweep.json", {"metrics": {m: METRICS[m] for m in metrics},
                                           "selection": sel, "cells": cells,
                                           "trials": trials})  # fmt: skip
    keys = list(dict.fromkeys(k for c in cells for k in c["overrides"]))
    text = any(TEXT in c for c in cells)
    head = ["cell", *keys, "trials", "done", "halted", "failed"]
    for m in metrics:
        head += [f"{m}_{s}" for s in ("mean", "se", "n")]
        head += [TEXT] if m == "best_baseline_sharpe" and text else []
    head += ["n_trials", "dsr"] if sel else []
    rows = []
    for c in cells:
        row = [c["cell"], *(c["overrides"].get(k, "") for k in keys)]
        row += [c["trials"], c["done"], c["halted"], c["failed"]]
        for m in metrics:
            s = c["metrics"].get(m, {})
            row += [_csv(s.get("mean")), _csv(s.get("se")), s.get("n", 0)]
            if m == "best_baseline_sharpe" and text:
                row.append((c.get(TEXT) or {}).get("name", ""))
        row += [sel["n_trials"], _csv(c.get("dsr"))] if sel else []
        rows.append(row)
    lines = [head, *rows]
    atomic_write_text(out / "sweep.csv", "".join(_csv_line(r) for r in lines))
    if metrics and plot:
        _plot(out / "sweep.png", cells, metrics)


def _csv(x: float | None) -> str:
    return "" if x is None else repr(x)


def _csv_line(row: list[Any]) -> str:
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(row)
    return buf.getvalue()


def _plot(path: Path, cells: list[dict[str, Any]], metrics: list[str]) -> None:
    """One panel per metric: a bar per cell (mean), its s.e. as an error bar, seeds as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(cells)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics) + 3, 0.45 * n + 1.6),
                             squeeze=False, sharey=True)  # fmt: skip
    y = list(range(n))
    for ax, m in zip(axes[0], metrics):
        stats = [c["metrics"].get(m) for c in cells]
        means = [s["mean"] if s and s["mean"] is not None else 0.0 for s in stats]
        errs = [s["se"] if s and s["se"] is not None else 0.0 for s in stats]
        ax.barh(y, means, xerr=errs, color="#9ecae1", ecolor="#333333", capsize=3)
        for i, s in enumerate(stats):
            seeds = [v for v in (s or {}).get("seeds", {}).values() if v is not None]
            ax.plot(seeds, [i] * len(seeds), "o", color="#08519c", ms=3.5)
        ax.axvline(0.0, color="#888888", lw=0.8)
        ax.set_title(f"{m}\n({METRICS[m].split(': ', 1)[1]})", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(y, [c["cell"] for c in cells], fontsize=8)
    axes[0][0].invert_yaxis()
    fig.suptitle("sweep: mean ± s.e. over seeds (dots: seeds)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
