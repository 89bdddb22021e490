"""A sweep's merged table: per cell, the mean ± standard error over seeds of each trial metric
that exists, printed, and written as ``sweep.csv``, ``sweep.json`` and ``sweep.png``."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["METRICS", "format_table", "merge", "trial_metrics", "write_outputs"]

#: metric -> what it is; a trial has those its kind of run reports
METRICS = {
    "oos_sharpe": "market: out-of-sample Sharpe, mean over folds",
    "oos_return": "market: out-of-sample total return, mean over folds",
    "eval_return": "Gymnasium: greedy evaluation, mean episode return",
}


def trial_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """A finished run's metrics from its ``summary.json`` (a halted run: the folds it finished)."""
    out: dict[str, float] = {}
    folds = [f for f in summary.get("folds") or [] if "sharpe" in f]
    if folds:
        out["oos_sharpe"] = math.fsum(f["sharpe"] for f in folds) / len(folds)
        out["oos_return"] = math.fsum(f["total_return"] for f in folds) / len(folds)
    if summary.get("eval"):
        out["eval_return"] = float(summary["eval"]["mean_return"])
    return out


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error s / sqrt(n) (sample s, n - 1); NaN where undefined."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n == 1:
        return mean, math.nan
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def merge(results: Sequence[Any], trials: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per cell (in the sweep's order): its overrides, trial counts by status, and per
    metric the mean, standard error, n and per-seed values of the finished trials."""
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
    for row in cells.values():
        values = row.pop("_v")
        row["metrics"] = {}
        for m in (m for m in METRICS if m in values):
            pairs = sorted(values[m])
            mean, se = _mean_se([v for _, v in pairs])
            row["metrics"][m] = {"mean": _finite(mean), "se": _finite(se), "n": len(pairs),
                                 "seeds": {str(s): _finite(v) for s, v in pairs}}  # fmt: skip
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


def format_table(cells: Sequence[dict[str, Any]]) -> str:
    """A Markdown table: cell, trials done/halted/failed, each metric as mean ± s.e. (n)."""
    metrics = _metrics_of(cells)
    head = ["cell", "trials", "done", "halted", "failed", *(f"{m} (mean ± s.e.)" for m in metrics)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for c in cells:
        stats = [c["metrics"].get(m) for m in metrics]
        cols = [c["cell"], c["trials"], c["done"], c["halted"], c["failed"], *map(_pm, stats)]
        lines.append("| " + " | ".join(str(x) for x in cols) + " |")
    return "\n".join(lines)


def write_outputs(
    out: Path, cells: list[dict[str, Any]], trials: list[dict[str, Any]], plot: bool = True
) -> None:
    """``sweep.json`` (the table, every trial with its status, error and run directory),
    ``sweep.csv`` (the table) and, if ``plot``, ``sweep.png`` (each metric per cell, seeds as
    dots)."""
    from trimtab.rl.checkpoint import atomic_write_json, atomic_write_text

    metrics = _metrics_of(cells)
    atomic_write_json(out / "sweep.json", {"metrics": {m: METRICS[m] for m in metrics},
                                           "cells": cells, "trials": trials})  # fmt: skip
    keys = list(dict.fromkeys(k for c in cells for k in c["overrides"]))
    head = ["cell", *keys, "trials", "done", "halted", "failed"]
    head += [f"{m}_{s}" for m in metrics for s in ("mean", "se", "n")]
    rows = []
    for c in cells:
        row = [c["cell"], *(c["overrides"].get(k, "") for k in keys)]
        row += [c["trials"], c["done"], c["halted"], c["failed"]]
        for m in metrics:
            s = c["metrics"].get(m, {})
            row += [_csv(s.get("mean")), _csv(s.get("se")), s.get("n", 0)]
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
