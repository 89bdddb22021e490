"""The run report: PNG plots and ``report.html`` rebuilt from the files of a run directory.

Reads ``summary.json``, ``oos.csv``, ``folds/fold_K.csv`` and ``metrics.csv`` only, so
``trimtab report RUN_DIR`` can rebuild it at any time. A market run's report reads top down as
a trader asks: how it fills and what it costs, the verdict, the data's warnings, the pooled
out-of-sample table beside every baseline, dated plots, the folds, then training diagnostics.
Tables live in :mod:`trimtab.rl.report.tables`, plots in :mod:`trimtab.rl.report.plots`.
"""

from __future__ import annotations

import functools
import html
import json
import multiprocessing
import warnings
from concurrent.futures import BrokenExecutor, Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from trimtab.rl.report.plots import PREFIXES, market_figure, market_plots, plot_prefix, read_oos
from trimtab.rl.report.plots import read_csv as _read_csv
from trimtab.rl.report.tables import (
    FOLD_HEAD,
    PAIRED_HEAD,
    POOLED_HEAD,
    aggregate_folds,
    best_baseline,
    breakeven_line,
    cost_line,
    fold_flags,
    fold_rows,
    format_fold_table,
    html_table,
    paired_rows,
    pooled_rows,
    random_line,
    verdict,
)
from trimtab.rl.run.checkpoint import atomic_write_text

__all__ = ["ReportError", "aggregate_folds", "best_baseline", "build_report", "draw_plot",
           "fold_flags", "format_fold_table", "report_pool", "run_identity"]  # fmt: skip

_CSS = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
    "table{border-collapse:collapse;margin:0.5em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:first-child{text-align:left}img{max-width:100%}.bad{color:#b00}"
    ".verdict{font-size:1.15em;font-weight:bold;padding:0.5em;background:#f4f4f4}"
    ".warn{border:2px solid #b00;background:#fff2f2;padding:0.5em 1em;color:#700}"
    ".warn td,.warn th{text-align:left;white-space:nowrap}.warn td:last-child{white-space:normal}"
    ".optimistic{color:#b00;font-weight:bold}"
)

#: the columns of a Gymnasium run's greedy evaluation (its one "fold")
_GYM_COLUMNS = [("fold", "{}", "fold"), ("episodes", "{}", "episodes"),
                ("mean_return", "{:.1f}", "mean return"), ("std_return", "{:.1f}", "std"),
                ("min_return", "{:.1f}", "min"), ("max_return", "{:.1f}", "max"),
                ("steps", "{}", "steps"), ("nonfinite", "{}", "non-finite slots")]  # fmt: skip


class ReportError(ValueError):
    """The run directory lacks what a report is built from."""


def run_identity(argv: list[str] | None = None) -> dict[str, Any]:
    """What produced a run: trimtab's version, the commit of its source
    (:func:`trimtab._source.source_commit`: ``TRIMTAB_COMMIT``, or the git checkout's ``HEAD``,
    ``-dirty`` with uncommitted changes to the package) and the command line."""
    import sys

    from trimtab import __version__
    from trimtab._source import source_commit

    commit = source_commit()  # None: an installed wheel, or no git; the version says enough
    argv = list(sys.argv if argv is None else argv)
    return {"version": __version__, "commit": commit, "command": command_line(argv)}


def command_line(argv: list[str]) -> str:
    """``argv`` as the user typed it: ``trimtab train ...`` whether it ran through the
    ``trimtab`` script or ``python -m trimtab`` (whose ``argv[0]`` is a path into the install);
    any other program (a user's script calling :func:`trimtab.rl.train.train`) as it is."""
    import shlex

    first = Path(argv[0]) if argv else Path()
    if first.name == "trimtab" or (first.name == "__main__.py" and first.parent.name == "trimtab"):
        return shlex.join(["trimtab", *argv[1:]])
    return shlex.join(argv)


def _market(summary: dict[str, Any]) -> bool:
    """Whether the run was walked forward over dated data (the market's report), by its env's
    registered kind; a kind no longer registered reads as one long run."""
    from trimtab.rl.configio import ConfigError
    from trimtab.rl.envs.registry import env_kind

    try:
        return env_kind(str(summary.get("env", "market")), summary.get("env_impl", "gymnasium")
                        ).walk_forward  # fmt: skip
    except ConfigError:
        return False


def _gym_table(summary: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for _, _, h in _GYM_COLUMNS)
    body = []
    for f in summary.get("folds", []):
        cells = []
        for c, fmt, _ in _GYM_COLUMNS:
            v = f.get(c)
            text = "" if c not in f else "undefined" if v is None else fmt.format(v)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _figures(paths: list[Path | None]) -> str:
    return "".join(
        f'<figure><img src="plots/{p.name}" alt="{p.stem}"></figure>' for p in paths if p
    )


def _sentinel(run: Path) -> str:
    sp = run / "sentinel.json"
    if not sp.is_file():
        return ""
    fired = json.loads(sp.read_text()).get("fired", [])
    if not fired:
        return "<h2>Sentinel</h2><p>No slot fired.</p>"
    rows = "".join(
        f"<tr><td>{html.escape(str(r.get('name')))}</td><td>{r.get('phase')}</td>"
        f"<td>{r.get('step')}</td><td>{r.get('kind')}</td><td>{r.get('value')}</td></tr>"
        for r in fired
    )
    return (
        "<h2>Sentinel: first firings</h2><table><tr><th>slot</th><th>phase</th>"
        f"<th>step</th><th>kind</th><th>value</th></tr>{rows}</table>"
    )


def _identity(run: Path, summary: dict[str, Any]) -> str:
    who = summary.get("identity") or {}
    commit = f" (commit {who['commit']})" if who.get("commit") else ""
    config = run / "config.toml"
    config_html = (
        f"<details><summary>config.toml</summary><pre>{html.escape(config.read_text())}</pre>"
        "</details>"
        if config.is_file()
        else ""
    )
    halted = summary.get("halted")
    status = (
        f"<p class=bad>Halted: {html.escape(str(halted))}</p>"
        if halted
        else "<p>Completed every fold.</p>"
    )
    return (
        f"<p>Seed <b>{html.escape(str(summary.get('seed', '?')))}</b>. trimtab "
        f"{html.escape(str(who.get('version', '?')))}{html.escape(commit)}. "
        f"Training took {html.escape(str(summary.get('seconds', '?')))} s. Command: "
        f"<code>{html.escape(str(who.get('command', '?')))}</code></p>{config_html}{status}"
    )


def _warnings(summary: dict[str, Any]) -> str:
    """Every data warning, then the data's issues as a table (where there are any)."""
    lines = summary.get("data_warnings") or []
    issues = summary.get("data_issues") or []
    if not lines and not issues:
        return "<p>Data: no warnings.</p>"
    # a warning that an issue row carries word for word is read once, in the table
    tabled = {str(i.get("message", "")) for i in issues}
    items = "".join(f"<li>{html.escape(str(w))}</li>" for w in lines if str(w) not in tabled)
    out = "<div class=warn><h2>Data warnings</h2>" + (f"<ul>{items}</ul>" if items else "")
    if issues:
        keys = ("kind", "asset", "first", "last", "message")
        rows = [[str(i.get(k, "")) for k in keys] for i in issues]
        out += html_table(keys, rows)
    return out + "</div>"


def _pooled(summary: dict[str, Any], note: str | None) -> str:
    if not summary.get("oos"):
        return (
            "<h2>Pooled out of sample</h2><p>This run has no pooled out-of-sample result "
            "(written before trimtab pooled its folds, or no fold finished): see the folds "
            "below.</p>"
        )
    oos = summary["oos"]
    out = (
        f"<h2>Pooled out of sample: {oos.get('days', '?')} bars, "
        f"{html.escape(str(oos.get('start', '?')))} … {html.escape(str(oos.get('end', '?')))}"
        "</h2><p>Every strategy on the same days, fills and costs; max DD of the whole "
        "curve.</p>" + html_table(POOLED_HEAD, pooled_rows(summary))
    )
    if summary.get("vs_baselines"):
        out += "<h3>Agent minus each baseline, paired by day</h3>" + html_table(
            PAIRED_HEAD, paired_rows(summary)
        )
    for line in (random_line(summary), breakeven_line(summary)):
        out += f"<p>{html.escape(line)}</p>" if line else ""
    return out + (f"<p class=bad>{html.escape(note)}</p>" if note else "")


def _market_body(run: Path, summary: dict[str, Any], paths: list[Path], note: str | None) -> str:
    costs = cost_line(summary)
    cls = " class=optimistic" if "OPTIMISTIC" in costs else ""
    said = verdict(summary)
    rows = fold_rows(summary)
    how = ""
    if rows and rows[-1][0] == "all":  # how the row of all folds is made: a note, not a flag
        how = f"<p>Row “all”: {html.escape(rows[-1][-1])}.</p>"
        rows[-1] = [*rows[-1][:-1], ""]
    folds = html_table(FOLD_HEAD, rows, flag_col=len(FOLD_HEAD) - 1) + how
    return (
        f"<p{cls}>{html.escape(costs)}. Sharpe: annualised mean over standard deviation of "
        "the bars' net returns in excess of cash.</p>"
        + (f"<p class=verdict>{html.escape(said)}</p>" if said else "")
        + _warnings(summary)
        + _pooled(summary, note if summary.get("oos") else None)
        + f"<h2>Out-of-sample plots</h2>{_figures(paths)}"
        + f"<h2>Out-of-sample results per fold</h2>{folds}"
    )


class _RunFiles:
    """A run directory's report inputs, each file read once, on first use: one object serves
    every plot drawn in one process."""

    def __init__(self, run: Path, summary: dict[str, Any] | None = None) -> None:
        self.run = run
        if summary is not None:
            self.summary = summary  # what the cached property would read

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.run / "summary.json").read_text())

    @functools.cached_property
    def metrics(self) -> dict[str, Any]:
        return _read_csv(self.run / "metrics.csv")

    @functools.cached_property
    def oos(self) -> dict[str, Any]:
        return read_oos(self.run)


def draw_plot(run_dir: str, job: str) -> Path | None:
    """Draw one plot of a run's report into ``RUN_DIR/plots``: ``job`` a market plot's file name
    (:func:`~trimtab.rl.report.plots.market_plots`) or a training diagnostics prefix
    (:data:`~trimtab.rl.report.plots.PREFIXES`); returns the file written, or None where the
    run logged nothing for it. Reads the run directory's files itself, so that a worker process
    can draw it from the two strings."""
    return _draw(_RunFiles(Path(run_dir)), job)


def _draw(files: _RunFiles, job: str) -> Path | None:
    """:func:`draw_plot` from ``files`` (what an earlier plot read is not read again)."""
    plots = files.run / "plots"
    if job in PREFIXES:
        folds = files.summary.get("folds") if _market(files.summary) else None
        return plot_prefix(files.metrics, job, plots, folds)
    market_figure(files.run, files.summary, job, files.oos).savefig(plots / job, dpi=110)
    return plots / job


def build_report(run_dir: str | Path, pool: Executor | None = None) -> Path:
    """Write ``plots/*.png`` and ``report.html`` in ``run_dir``; return the HTML path. ``pool``
    (worker processes, e.g. :func:`report_pool`): its workers draw the plots side by side
    (:func:`draw_plot`, a job each), this process writes the HTML."""
    run = Path(run_dir)
    summary_path = run / "summary.json"
    if not summary_path.is_file():
        raise ReportError(
            f"{run} has no summary.json: it is not a finished trimtab run directory "
            "(a run that was interrupted has none; resume it with `trimtab train --resume`)"
        )
    summary = json.loads(summary_path.read_text())
    (run / "plots").mkdir(exist_ok=True)
    # every plot is one job, drawn here one after another or by pool's workers side by side
    files = _RunFiles(run, summary)  # in this process, each input file is read once
    dated, note = market_plots(run, summary, files.oos) if _market(summary) else ([], None)
    metrics_path = run / "metrics.csv"
    logged = metrics_path.is_file() and metrics_path.stat().st_size > 0
    jobs = [*dated, *(PREFIXES if logged else ())]
    runs = [str(run)] * len(jobs)
    drawn: list[Path | None] | None = None
    if pool is not None:
        try:
            drawn = list(pool.map(draw_plot, runs, jobs))
        except BrokenExecutor as e:  # a worker died (killed, out of memory): draw them here
            warnings.warn(f"the report's plot workers failed ({e}); drawing the plots in this "
                          "process", RuntimeWarning, stacklevel=2)  # fmt: skip
    if drawn is None:
        drawn = [_draw(files, job) for job in jobs]
    done = dict(zip(jobs, drawn, strict=True))
    training: list[Path | None] = [done[p] for p in PREFIXES if p in done]
    title = html.escape(run.name)
    env = (
        f"<p>Environment: <b>{html.escape(str(summary.get('env', 'market')))}</b>. "
        f"Stability mode: <b>{html.escape(str(summary.get('stability')))}</b>.</p>"
    )
    if _market(summary):
        paths = [done[name] for name in dated if done[name] is not None]
        body = (
            _market_body(run, summary, paths, note)
            + "<h2>Training diagnostics</h2>"
            + (_figures(training) or "<p>No training metrics logged (no metrics.csv).</p>")
            + _sentinel(run)
        )
    else:  # a Gymnasium run: its evaluation, the sentinel, the training plots
        body = (
            f"<h2>Greedy evaluation</h2>{_gym_table(summary)}{_sentinel(run)}"
            f"<h2>Plots</h2>{_figures(training)}"
        )
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>trimtab run {title}</title>
<style>{_CSS}</style>
</head><body><h1>trimtab run: {title}</h1>
{env}{_identity(run, summary)}{body}
</body></html>
"""
    out = run / "report.html"
    atomic_write_text(out, doc)
    return out


def report_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` processes for reports and their plots (``spawn``: the parent may hold a CUDA
    context), each importing the report's modules and matplotlib's renderer as it starts, which
    the pool asks of every worker now: while the caller trains, not when the first job comes."""
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_import_report)
    for _ in range(workers):  # the pool starts its workers as jobs come: one job each
        pool.submit(int)
    return pool


def _import_report() -> None:
    """A report worker's start: what drawing a plot imports, before any job."""
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401
