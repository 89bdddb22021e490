"""The run report: PNG plots and ``report.html`` rebuilt from the files of a run directory.

Reads ``summary.json``, ``metrics.csv`` and ``folds/fold_K.csv`` only, so ``trimtab report
RUN_DIR`` can rebuild it at any time. Columns of ``metrics.csv`` are grouped by prefix:
``loss/`` (losses), ``bound/`` (state-vector bounds), ``engaged/`` (clamp engagement rates).
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from trimtab.rl.checkpoint import atomic_write_text

__all__ = ["ReportError", "aggregate_folds", "build_report", "format_fold_table", "run_identity"]

_PREFIXES = {
    "loss/": ("losses.png", "Training losses", "loss", True),
    "bound/": ("bounds.png", "State-vector bounds", "bound value", True),
    "engaged/": ("engagement.png", "Clamp engagement rates", "fraction clamped", False),
}


_CSS = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "img{max-width:100%}.bad{color:#b00}"
)


class ReportError(ValueError):
    """The run directory lacks what a report is built from."""


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    """The columns of a CSV of numbers (an empty cell is NaN) as float arrays; a column with
    another value in it, as strings. (The csv module: pandas would add its import, a third of
    a CartPole run's report.)"""
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        return {}
    header, body = rows[0], rows[1:]
    out: dict[str, np.ndarray] = {}
    for j, name in enumerate(header):
        cells = [r[j] if j < len(r) else "" for r in body]
        try:
            out[name] = np.array([float(c) if c else np.nan for c in cells], dtype=np.float64)
        except ValueError:
            out[name] = np.array(cells, dtype=object)
    return out


def _figure(**kwargs: Any) -> Any:
    """A matplotlib figure outside pyplot (no backend set, no figure manager: what a PNG
    written by a library needs, without pyplot's import)."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _margins(
    fig: Any,
    *,
    left: float,
    right: float,
    top: float,
    bottom: float,
    wspace: float = 0.0,
    hspace: float = 0.0,
) -> None:
    """Fixed margins, in inches (the figure's fractions follow from its size): the room the
    labels and titles need, set once; ``tight_layout`` would measure every text to find it
    (a third of the report's time)."""
    w, h = fig.get_size_inches()
    rows, cols = fig.axes[0].get_subplotspec().get_gridspec().get_geometry()
    cell_w = (w - left - right - wspace * (cols - 1)) / cols
    cell_h = (h - top - bottom - hspace * (rows - 1)) / rows
    fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h,
                        wspace=wspace / cell_w, hspace=hspace / cell_h)  # fmt: skip


def _plot_equity(run: Path, summary: dict[str, Any], out: Path) -> Path | None:
    folds = summary.get("folds", [])
    if not folds or not _market(summary):  # a Gymnasium run has no equity curve
        return None
    n = len(folds)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = _figure(figsize=(5 * cols, 3.4 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
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
            f"Sharpe {_fmt(fold['sharpe'], '{:.2f}')} vs B&H "
            f"{_fmt(fold['buy_hold_sharpe'], '{:.2f}')}",
            fontsize=9,
        )
        ax.set_xlabel("test day")
        ax.set_ylabel("equity (start = 1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("Out-of-sample equity per fold (greedy policy, net of costs)")
    _margins(fig, left=0.7, right=0.15, top=0.95, bottom=0.5, wspace=0.75, hspace=1.05)
    fig.savefig(out, dpi=110)
    return out


def _plot_prefix(metrics: dict[str, np.ndarray], prefix: str, out_dir: Path) -> Path | None:
    fname, title, ylabel, log = _PREFIXES[prefix]
    cols = [c for c in metrics if c.startswith(prefix)]
    if not cols or "step" not in metrics:
        return None
    fig = _figure(figsize=(10, 4))
    ax = fig.subplots()
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
    _margins(fig, left=0.85, right=0.15, top=0.4, bottom=0.5)
    path = out_dir / fname
    fig.savefig(path, dpi=110)
    return path


def _fmt(v: Any, fmt: str) -> str:
    """``v`` in ``fmt``; "undefined" for a None number (a Sharpe ratio of prices that never
    move), "" for a missing one."""
    if v is None:
        return "undefined"
    return fmt.format(v)


def aggregate_folds(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A market run over its folds: Sharpe mean and standard error over the folds that have
    one, the return compounded over every test window, the mean max drawdown, turnover and hit
    rate (agent and buy & hold); None without folds."""
    if not rows:
        return None

    def mean_se(key: str) -> tuple[float | None, float | None]:
        v = np.array([r[key] for r in rows if r.get(key) is not None], dtype=np.float64)
        if v.size == 0:
            return None, None
        se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else None
        return float(v.mean()), se

    sharpe, sharpe_se = mean_se("sharpe")
    bh_sharpe, bh_se = mean_se("buy_hold_sharpe")
    compound = float(np.prod([1.0 + r["total_return"] for r in rows]) - 1.0)
    bh_compound = float(np.prod([1.0 + r["buy_hold_return"] for r in rows]) - 1.0)
    return {
        "folds": len(rows), "sharpe": sharpe, "sharpe_se": sharpe_se,
        "buy_hold_sharpe": bh_sharpe, "buy_hold_sharpe_se": bh_se,
        "total_return": compound, "buy_hold_return": bh_compound,
        "max_drawdown": float(np.mean([r["max_drawdown"] for r in rows])),
        "turnover": float(np.mean([r["turnover"] for r in rows])),
        "hit_rate": float(np.mean([r["hit_rate"] for r in rows])),
        "steps": int(sum(r["steps"] for r in rows)),
        "nonfinite": int(sum(r["nonfinite"] for r in rows)),
    }  # fmt: skip


def run_identity(argv: list[str] | None = None) -> dict[str, Any]:
    """What produced a run: trimtab's version, the commit of its source
    (:func:`trimtab._source.source_commit`: ``TRIMTAB_COMMIT``, or the git checkout's ``HEAD``,
    ``-dirty`` with uncommitted changes to the package) and the command line."""
    import shlex
    import sys

    from trimtab import __version__
    from trimtab._source import source_commit

    commit = source_commit()  # None: an installed wheel, or no git; the version says enough
    argv = sys.argv if argv is None else argv
    return {"version": __version__, "commit": commit, "command": shlex.join(argv)}


def format_fold_table(summary: dict[str, Any]) -> str:
    """A market run's out-of-sample results per fold as a markdown table (printed at the end
    of a run, used in README)."""
    head = (
        "| fold | test window | Sharpe | B&H Sharpe | return | B&H return | max DD | turnover "
        "| hit rate | steps | non-finite | flags |\n" + "|---" * 12 + "|"
    )

    def sharpe(v: float | None) -> str:
        return "undefined" if v is None else f"{v:+.2f}"

    rows = [
        f"| {r['fold']} | {r['test_start']} … {r['test_end']} | {sharpe(r['sharpe'])} | "
        f"{sharpe(r['buy_hold_sharpe'])} | {r['total_return']:+.1%} | "
        f"{r['buy_hold_return']:+.1%} | "
        f"{r['max_drawdown']:.1%} | {r['turnover']:.3f} | {r['hit_rate']:.1%} | {r['steps']} | "
        f"{r['nonfinite']} | {fold_flags(r)} |"
        for r in summary["folds"]
    ]
    agg = summary.get("aggregate") or aggregate_folds(summary["folds"])
    if agg is not None and len(summary["folds"]) > 1:
        rows.append(
            f"| all | {agg['folds']} folds | {_mean_se(agg['sharpe'], agg['sharpe_se'])} | "
            f"{_mean_se(agg['buy_hold_sharpe'], agg['buy_hold_sharpe_se'])} | "
            f"{agg['total_return']:+.1%} | {agg['buy_hold_return']:+.1%} | "
            f"{agg['max_drawdown']:.1%} | {agg['turnover']:.3f} | {agg['hit_rate']:.1%} | "
            f"{agg['steps']} | {agg['nonfinite']} | mean ± s.e.; returns compounded |"
        )
    return "\n".join([head, *rows])


def _mean_se(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "undefined"
    return f"{mean:+.2f}" + (f" ± {se:.2f}" if se is not None else "")


def fold_flags(row: dict[str, Any]) -> str:
    """What makes a fold's out-of-sample numbers untrustworthy, in a few words ("" if nothing)."""
    flags = []
    if row.get("extreme_moves"):
        flags.append(f"{len(row['extreme_moves'])} extreme move(s) in test window: check data")
    if row.get("ruin"):
        flags.append(f"ruin on {row['ruin']}")
    return "; ".join(flags)


#: the columns of a market run's out-of-sample results per fold: key, format, header
_MARKET_COLUMNS = [("fold", "{}", "fold"), ("test_start", "{}", "test start"),
                   ("test_end", "{}", "test end"), ("sharpe", "{:+.2f}", "Sharpe"),
                   ("buy_hold_sharpe", "{:+.2f}", "buy & hold Sharpe"),
                   ("total_return", "{:+.1%}", "return"),
                   ("buy_hold_return", "{:+.1%}", "buy & hold return"),
                   ("max_drawdown", "{:.1%}", "max drawdown"), ("turnover", "{:.3f}", "turnover"),
                   ("hit_rate", "{:.1%}", "hit rate"), ("steps", "{}", "steps"),
                   ("nonfinite", "{}", "non-finite slots")]  # fmt: skip
#: the columns of a Gymnasium run's greedy evaluation (its one "fold")
_GYM_COLUMNS = [("fold", "{}", "fold"), ("episodes", "{}", "episodes"),
                ("mean_return", "{:.1f}", "mean return"), ("std_return", "{:.1f}", "std"),
                ("min_return", "{:.1f}", "min"), ("max_return", "{:.1f}", "max"),
                ("steps", "{}", "steps"), ("nonfinite", "{}", "non-finite slots")]  # fmt: skip


def _market(summary: dict[str, Any]) -> bool:
    return not str(summary.get("env", "market")).startswith("gym:")


def _fold_table(summary: dict[str, Any]) -> str:
    market = _market(summary)
    cols = _MARKET_COLUMNS if market else _GYM_COLUMNS
    head = "".join(f"<th>{html.escape(h)}</th>" for _, _, h in cols)
    head += "<th>flags</th>" if market else ""
    body = []
    for f in summary.get("folds", []):
        cells = []
        for c, fmt, _ in cols:
            v = f.get(c)
            text = "" if c not in f else _fmt(v, fmt)
            cells.append(f"<td>{html.escape(text)}</td>")
        if market:
            cells.append(f"<td class=bad>{html.escape(fold_flags(f))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    agg = summary.get("aggregate") if market else None
    if agg:
        cells = {
            "fold": "all", "test_start": f"{agg['folds']} folds", "test_end": "",
            "sharpe": _mean_se(agg["sharpe"], agg["sharpe_se"]),
            "buy_hold_sharpe": _mean_se(agg["buy_hold_sharpe"], agg["buy_hold_sharpe_se"]),
        }  # fmt: skip
        row = []
        for c, fmt, _ in cols:
            text = cells[c] if c in cells else _fmt(agg.get(c), fmt)
            row.append(f"<th>{html.escape(text)}</th>")
        row.append("<th>mean ± s.e.; returns compounded</th>")
        body.append("<tr>" + "".join(row) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def build_report(run_dir: str | Path) -> Path:
    """Write ``plots/*.png`` and ``report.html`` in ``run_dir``; return the HTML path."""
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
    who = summary.get("identity") or {}
    commit = f" (commit {who['commit']})" if who.get("commit") else ""
    config = run / "config.toml"
    config_html = (
        f"<details><summary>config.toml</summary><pre>{html.escape(config.read_text())}</pre>"
        "</details>"
        if config.is_file()
        else ""
    )
    ident = (
        f"<p>Seed <b>{html.escape(str(summary.get('seed', '?')))}</b>. trimtab "
        f"{html.escape(str(who.get('version', '?')))}{html.escape(commit)}. "
        f"{html.escape(str(summary.get('seconds', '?')))} s. Command: "
        f"<code>{html.escape(str(who.get('command', '?')))}</code></p>{config_html}"
    )
    if _market(summary):
        note = " Sharpe: annualised, mean/std of daily net simple returns × √252."
        heading = "Out-of-sample results per fold"
    else:
        note, heading = "", "Greedy evaluation"
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>trimtab run {title}</title>
<style>{_CSS}</style>
</head><body><h1>trimtab run: {html.escape(run.name)}</h1>
<p>Environment: <b>{html.escape(str(summary.get("env", "market")))}</b>.
Stability mode: <b>{html.escape(str(summary.get("stability")))}</b>.{note}</p>{ident}{status}
<h2>{heading}</h2>{_fold_table(summary)}{sentinel}<h2>Plots</h2>{figs}
</body></html>
"""
    out = run / "report.html"
    atomic_write_text(out, doc)
    return out
