"""The run report: PNG plots and ``report.html`` rebuilt from the files of a run directory.

Reads ``summary.json``, ``metrics.csv`` and ``folds/fold_K.csv`` only, so ``trimtab report
RUN_DIR`` can rebuild it at any time. Columns of ``metrics.csv`` are grouped by prefix:
``loss/`` (losses), ``bound/`` (state-vector bounds), ``engaged/`` (clamp engagement rates).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from trimtab.rl.checkpoint import atomic_write_text

__all__ = ["ReportError", "build_report", "format_fold_table"]

_PREFIXES = {
    "loss/": ("losses.png", "Training losses", "loss", True),
    "bound/": ("bounds.png", "State-vector bounds", "bound value", True),
    "engaged/": ("engagement.png", "Clamp engagement rates", "fraction of elements", False),
}


_CSS = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "img{max-width:100%}.bad{color:#b00}"
)


class ReportError(ValueError):
    """The run directory lacks what a report is built from."""


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    import pandas as pd

    frame = pd.read_csv(path)
    return {c: frame[c].to_numpy() for c in frame.columns}


def _plot_equity(run: Path, summary: dict[str, Any], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    folds = summary.get("folds", [])
    if not folds or not _market(summary):  # a Gymnasium run has no equity curve
        return None
    n = len(folds)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    for ax, fold in zip(axes.flat, folds):
        k = fold["fold"]
        path = run / "folds" / f"fold_{k}.csv"
        if not path.is_file():
            ax.set_title(f"fold {k}: no equity file")
            continue
        data = _read_csv(path)
        x = np.arange(len(data["agent_log_return"]))
        ax.plot(x, np.exp(np.cumsum(data["agent_log_return"])), label="agent", lw=1.6)
        ax.plot(x, np.exp(np.cumsum(data["buy_hold_log_return"])), label="buy & hold", lw=1.2)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="flat")
        ax.set_title(
            f"fold {k} test {fold.get('test_start', '')}…{fold.get('test_end', '')}\n"
            f"Sharpe {fold['sharpe']:.2f} vs B&H {fold['buy_hold_sharpe']:.2f}",
            fontsize=9,
        )
        ax.set_xlabel("test day")
        ax.set_ylabel("equity (start = 1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("Out-of-sample equity per fold (greedy policy, net of costs)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_prefix(metrics: dict[str, np.ndarray], prefix: str, out_dir: Path) -> Path | None:
    import matplotlib.pyplot as plt

    fname, title, ylabel, log = _PREFIXES[prefix]
    cols = [c for c in metrics if c.startswith(prefix)]
    if not cols or "step" not in metrics:
        return None
    fig, ax = plt.subplots(figsize=(10, 4))
    step = metrics["step"]
    plotted = False
    for c in cols:
        y = metrics[c].astype(float)
        ok = np.isfinite(y)
        if ok.any():
            ax.plot(step[ok], y[ok], label=c[len(prefix) :], lw=1.0)
            plotted = True
    if "fold" in metrics:
        fold = metrics["fold"]
        for b in step[1:][np.diff(fold) != 0]:
            ax.axvline(b, color="k", lw=0.6, ls="--", alpha=0.5)
    # log scale when some column has a positive value (np.nanmin of an all-NaN column warns)
    if log and any((metrics[c].astype(float) > 0).any() for c in cols):
        ax.set_yscale("log")
    ax.set_title(title + " (dashed: fold boundaries)")
    ax.set_xlabel("gradient step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(fontsize=8, ncol=2)
    else:  # a run that halted before its first finite value
        ax.text(0.5, 0.5, "no finite value logged", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    path = out_dir / fname
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_fold_table(summary: dict[str, Any]) -> str:
    """A market run's out-of-sample results per fold as a markdown table (printed at the end
    of a run, used in README)."""
    head = (
        "| fold | test window | Sharpe | B&H Sharpe | return | B&H return | max DD | turnover "
        "| hit rate | steps | non-finite | flags |\n" + "|---" * 12 + "|"
    )
    rows = [
        f"| {r['fold']} | {r['test_start']} … {r['test_end']} | {r['sharpe']:+.2f} | "
        f"{r['buy_hold_sharpe']:+.2f} | {r['total_return']:+.1%} | {r['buy_hold_return']:+.1%} | "
        f"{r['max_drawdown']:.1%} | {r['turnover']:.3f} | {r['hit_rate']:.1%} | {r['steps']} | "
        f"{r['nonfinite']} | {fold_flags(r)} |"
        for r in summary["folds"]
    ]
    return "\n".join([head, *rows])


def fold_flags(row: dict[str, Any]) -> str:
    """What makes a fold's out-of-sample numbers untrustworthy, in a few words ("" if nothing)."""
    flags = []
    if row.get("extreme_moves"):
        flags.append(f"{len(row['extreme_moves'])} extreme move(s) in test window: check data")
    if row.get("ruin"):
        flags.append(f"ruin on {row['ruin']}")
    return "; ".join(flags)


#: the columns of a market run's out-of-sample results per fold
_MARKET_COLUMNS = [("fold", "{}"), ("test_start", "{}"), ("test_end", "{}"),
                   ("sharpe", "{:.2f}"), ("buy_hold_sharpe", "{:.2f}"),
                   ("total_return", "{:+.1%}"), ("buy_hold_return", "{:+.1%}"),
                   ("max_drawdown", "{:.1%}"), ("turnover", "{:.3f}"), ("hit_rate", "{:.1%}"),
                   ("steps", "{}"), ("nonfinite", "{}")]  # fmt: skip
#: the columns of a Gymnasium run's greedy evaluation (its one "fold")
_GYM_COLUMNS = [("fold", "{}"), ("episodes", "{}"), ("mean_return", "{:.1f}"),
                ("std_return", "{:.1f}"), ("min_return", "{:.1f}"), ("max_return", "{:.1f}"),
                ("steps", "{}"), ("nonfinite", "{}")]  # fmt: skip


def _market(summary: dict[str, Any]) -> bool:
    return not str(summary.get("env", "market")).startswith("gym:")


def _fold_table(summary: dict[str, Any]) -> str:
    cols = _MARKET_COLUMNS if _market(summary) else _GYM_COLUMNS
    head = "".join(f"<th>{c}</th>" for c, _ in cols)
    body = []
    for f in summary.get("folds", []):
        cells = []
        for c, fmt in cols:
            v = f.get(c)
            cells.append(f"<td>{html.escape(fmt.format(v) if v is not None else '')}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def build_report(run_dir: str | Path) -> Path:
    """Write ``plots/*.png`` and ``report.html`` in ``run_dir``; return the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    run = Path(run_dir)
    summary_path = run / "summary.json"
    if not summary_path.is_file():
        raise ReportError(
            f"{run} has no summary.json: it is not a finished trimtab run directory "
            "(a run that was interrupted has none; resume it with `trimtab train --resume`)"
        )
    summary = json.loads(summary_path.read_text())
    plots = run / "plots"
    plots.mkdir(exist_ok=True)
    images = [_plot_equity(run, summary, plots / "equity.png")]
    metrics_path = run / "metrics.csv"
    if metrics_path.is_file() and metrics_path.stat().st_size > 0:
        metrics = _read_csv(metrics_path)
        images += [_plot_prefix(metrics, p, plots) for p in _PREFIXES]
    figs = "".join(
        f'<figure><img src="plots/{p.name}" alt="{p.stem}"></figure>' for p in images if p
    )
    halted = summary.get("halted")
    status = (
        f"<p class=bad>Halted: {html.escape(str(halted))}</p>"
        if halted
        else "<p>Completed every fold.</p>"
    )
    sentinel = ""
    sp = run / "sentinel.json"
    if sp.is_file():
        fired = json.loads(sp.read_text()).get("fired", [])
        if fired:
            rows = "".join(
                f"<tr><td>{html.escape(str(r.get('name')))}</td><td>{r.get('phase')}</td>"
                f"<td>{r.get('step')}</td><td>{r.get('kind')}</td><td>{r.get('value')}</td></tr>"
                for r in fired
            )
            sentinel = (
                "<h2>Sentinel: first firings</h2><table><tr><th>slot</th><th>phase</th>"
                f"<th>step</th><th>kind</th><th>value</th></tr>{rows}</table>"
            )
        else:
            sentinel = "<h2>Sentinel</h2><p>No slot fired.</p>"
    title = html.escape(run.name)
    if _market(summary):
        note = " Sharpe: annualised, mean/std of daily net simple returns × √252."
        heading = "Out-of-sample results per fold"
    else:
        note, heading = "", "Greedy evaluation"
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>trimtab run {title}</title>
<style>{_CSS}</style>
</head><body><h1>trimtab run: {html.escape(run.name)}</h1>
<p>Environment: <b>{html.escape(str(summary.get("env", "market")))}</b>.
Stability mode: <b>{html.escape(str(summary.get("stability")))}</b>.{note}</p>{status}
<h2>{heading}</h2>{_fold_table(summary)}{sentinel}<h2>Plots</h2>{figs}
</body></html>
"""
    out = run / "report.html"
    atomic_write_text(out, doc)
    return out
