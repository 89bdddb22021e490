"""The run report's plots, built from a run directory's files: dated out-of-sample curves of
a market run (pooled equity, drawdowns, positions, per fold) and the training diagnostics.

Figures are built outside pyplot (:func:`market_figures` returns them, so tests can read their
axes); :func:`trimtab.rl.report.build.build_report` saves them as PNG.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from trimtab.rl.report.tables import SIMPLE, label, ordered

__all__ = ["POOLED_PLOTS", "PREFIXES", "market_figure", "market_figures", "market_plots",
           "plot_prefix", "read_csv", "read_oos"]  # fmt: skip

PREFIXES = {
    "loss/": ("losses.png", "Training losses", "loss", True),
    "bound/": ("bounds.png", "State-vector bounds", "bound value", True),
    "engaged/": ("engagement.png", "Clamp engagement rates", "fraction clamped", False),
}
#: one colour per strategy in every plot; the agent's is the one drawn thick
_COLOURS = {"agent": "#000000", "buy_and_hold": "#1f77b4", "flat": "#7f7f7f",
            "momentum": "#ff7f0e", "reversal": "#2ca02c", "ma_crossover": "#9467bd",
            "random": "#8c564b", "oracle": "#bcbd22"}  # fmt: skip


#: the most assets the positions plot gives a panel each (past it: one heat map)
_PANELS = 6


def read_csv(path: Path) -> dict[str, np.ndarray]:
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


def figure(**kwargs: Any) -> Any:
    """A matplotlib figure outside pyplot (no backend set, no figure manager: what a PNG
    written by a library needs, without pyplot's import)."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def margins(
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


def dates_of(col: np.ndarray | None) -> np.ndarray | None:
    """A ``date`` column as datetime64 (day or finer, as written), or None where there is none
    or it does not parse (a run directory written before curves were dated)."""
    if col is None:
        return None
    try:
        return np.array([str(c) for c in col], dtype="datetime64")
    except ValueError:
        return None


def _date_axis(ax: Any, offset: bool = True) -> None:
    """Dated ticks that do not overlap: a few per axis, each labelled only as far as it
    differs from its neighbour (matplotlib's concise formatter; ``offset``: the year or month
    they share, at the axis's end)."""
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, show_offset=offset))


def _strategies(cols: dict[str, np.ndarray]) -> list[str]:
    """The baselines with a curve in ``cols``, in the tables' order."""
    names = [c[: -len("_log_return")] for c in cols if c.endswith("_log_return")]
    return ordered([n for n in names if n not in ("agent", "buy_hold")])


def _bh(cols: dict[str, np.ndarray]) -> np.ndarray | None:
    """Buy & hold's daily log returns (named ``buy_hold_log_return`` in older run dirs)."""
    return cols.get("buy_and_hold_log_return", cols.get("buy_hold_log_return"))


def _boundaries(ax: Any, x: np.ndarray, fold: np.ndarray | None, labels: bool = True) -> None:
    """A dashed line where each fold's test window starts, labelled at the top."""
    if fold is None or len(fold) == 0:
        return
    starts = np.flatnonzero(np.r_[True, np.diff(fold) != 0])
    for i in starts:
        if i > 0:
            ax.axvline(x[i], color="k", lw=0.7, ls="--", alpha=0.45)
        if labels:
            ax.text(x[i], 1.0, f" fold {int(fold[i])}", transform=ax.get_xaxis_transform(),
                    fontsize=7, va="bottom", ha="left", color="#555")  # fmt: skip


def _equity(x: np.ndarray) -> np.ndarray:
    """The equity curve (start = 1, the day before the first bar) of daily log returns."""
    return np.exp(np.cumsum(np.nan_to_num(np.asarray(x, np.float64))))


def _drawdown(x: np.ndarray) -> np.ndarray:
    log_eq = np.cumsum(np.nan_to_num(np.asarray(x, np.float64)))
    return np.expm1(log_eq - np.maximum.accumulate(np.maximum(log_eq, 0.0)))


def _random_band(run: Path, folds: list[int]) -> np.ndarray | None:
    """The 5th and 95th percentile, day by day, of the random draws' pooled equity ``[2, L]``
    (``folds/fold_K_random_draws.npy``), or None where a fold has none."""
    parts = []
    for k in folds:
        p = run / "folds" / f"fold_{k}_random_draws.npy"
        if not p.is_file():
            return None
        parts.append(np.load(p).astype(np.float64))
    if not parts or len({p.shape[0] for p in parts}) != 1:
        return None
    eq = np.exp(np.cumsum(np.concatenate(parts, axis=1), axis=1))
    return np.percentile(eq, [5, 95], axis=0)


def _plot_pooled_equity(run: Path, oos: dict[str, np.ndarray], x: np.ndarray) -> Any:
    fig = figure(figsize=(12, 5.2))
    ax = fig.subplots()
    fold = oos.get("fold")
    folds = [int(k) for k in dict.fromkeys(fold.tolist())] if fold is not None else []
    band = _random_band(run, folds)
    if band is not None and len(band[0]) == len(x):
        ax.fill_between(x, band[0], band[1], color=_COLOURS["random"], alpha=0.12, lw=0,
                        label="random draws, 5–95%")  # fmt: skip
    for name in _strategies(oos):
        ax.plot(x, _equity(oos[f"{name}_log_return"]), label=label(name), lw=1.1,
                color=_COLOURS.get(name), ls="--" if name == "oracle" else "-")  # fmt: skip
    ax.plot(x, _equity(oos["agent_log_return"]), label="agent", lw=2.2, color=_COLOURS["agent"])
    _log_axis(ax)
    _boundaries(ax, x, fold)
    _date_axis(ax)
    ax.set_ylabel("equity (start = 1, log scale)")
    ax.set_title("Pooled out-of-sample equity: agent and baselines, same days, fills and costs",
                 pad=14)  # fmt: skip
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    margins(fig, left=0.8, right=2.3, top=0.55, bottom=0.45)
    return fig


def _log_axis(ax: Any) -> None:
    """A log scale with plain labels (0.8, 1, 1.5, 2, ...) at a handful of round values:
    matplotlib's own labels only the powers of ten, none within a curve's usual range."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    steps = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5)
    nice = [m * 10.0**e for e in range(int(np.floor(np.log10(lo))) - 1,
                                       int(np.ceil(np.log10(hi))) + 1) for m in steps]  # fmt: skip
    ticks = [t for t in nice if lo <= t <= hi]
    while len(ticks) > 9:  # a wide range: every other one, keeping 1 where it is
        keep = ticks.index(1.0) % 2 if 1.0 in ticks else 0
        ticks = ticks[keep::2]
    if len(ticks) < 3:  # a narrow range (a flat curve): evenly spaced plain values
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(5))
    else:
        ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())


def _plot_drawdowns(oos: dict[str, np.ndarray], x: np.ndarray) -> Any:
    fig = figure(figsize=(12, 3.8))
    ax = fig.subplots()
    agent = _drawdown(oos["agent_log_return"])
    ax.fill_between(x, agent, 0, color="#d62728", alpha=0.25, lw=0)
    ax.plot(x, agent, color="#d62728", lw=1.4, label=f"agent (worst {-agent.min():.1%})")
    shown = ["buy_and_hold"]
    scored = [(n, np.exp(np.sum(oos[f"{n}_log_return"]))) for n in SIMPLE[1:]
              if f"{n}_log_return" in oos]  # fmt: skip
    if scored:  # the simple rule that ended highest, for a second comparison
        shown.append(max(scored, key=lambda s: s[1])[0])
    for name in shown:
        col = _bh(oos) if name == "buy_and_hold" else oos.get(f"{name}_log_return")
        if col is not None:
            dd = _drawdown(col)
            ax.plot(x, dd, lw=1.1, color=_COLOURS.get(name),
                    label=f"{label(name)} (worst {-dd.min():.1%})")  # fmt: skip
    _boundaries(ax, x, oos.get("fold"))
    _date_axis(ax)
    ax.yaxis.set_major_formatter(_percent())
    ax.set_ylabel("drawdown from peak")
    ax.set_title("Pooled out-of-sample drawdowns", pad=14)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    margins(fig, left=0.8, right=2.3, top=0.55, bottom=0.45)
    return fig


def _percent() -> Any:
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0, decimals=0)


def _plot_positions(oos: dict[str, np.ndarray], x: np.ndarray) -> Any:
    """One panel per asset (long above zero in green, short below in red) and the turnover
    beneath; past :data:`_PANELS` assets, one heat map of every asset's weight."""
    assets = [c for c in oos if c.startswith("weight_")]
    heat = len(assets) > _PANELS
    n = 1 if heat or not assets else len(assets)
    fig = figure(figsize=(12, 1.5 + 1.3 * n + 1.3))
    axes = fig.subplots(n + 1, 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [1.3] * n + [1.0]})[:, 0]  # fmt: skip
    fold = oos.get("fold")
    if heat:
        w = np.stack([oos[c] for c in assets])
        top = float(np.nanmax(np.abs(w))) or 1.0
        mesh = axes[0].pcolormesh(x, np.arange(len(assets) + 1), w[:, :-1], cmap="RdYlGn",
                                  vmin=-top, vmax=top, shading="flat")  # fmt: skip
        axes[0].set_yticks(np.arange(len(assets)) + 0.5, [c[len("weight_") :] for c in assets],
                           fontsize=7)  # fmt: skip
    for ax, c in zip(axes[:-1] if not heat else [], assets):
        w = oos[c]
        ax.fill_between(x, w, 0, where=w >= 0, step="post", color="#2ca02c", alpha=0.6, lw=0)
        ax.fill_between(x, w, 0, where=w <= 0, step="post", color="#d62728", alpha=0.6, lw=0)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_ylabel(c[len("weight_") :], rotation=0, ha="right", va="center")
        lim = float(np.nanmax(np.abs(w))) or 1.0
        ax.set_ylim(-1.1 * lim, 1.1 * lim)
        ax.grid(alpha=0.3)
    axes[0].set_title("Agent's positions (weight per asset; green long, red short) and turnover",
                      pad=14)  # fmt: skip
    turnover = oos.get("turnover")
    bottom = axes[-1]
    if turnover is not None:
        bottom.fill_between(x, turnover, 0, step="post", color="#555", alpha=0.6, lw=0)
        bottom.text(0.01, 0.82, f"mean {np.nanmean(turnover):.3f} per bar",
                    transform=bottom.transAxes, fontsize=8)  # fmt: skip
    bottom.set_ylabel("turnover", rotation=0, ha="right", va="center")
    bottom.grid(alpha=0.3)
    for i, ax in enumerate(axes):
        _boundaries(ax, x, fold, labels=i == 0)
        _date_axis(ax)
    margins(fig, left=1.0, right=1.0 if heat else 0.3, top=0.55, bottom=0.45, hspace=0.12)
    if heat:  # in the right margin, so that the heat map keeps the turnover's width
        box = axes[0].get_position()
        cax = fig.add_axes((box.x1 + 0.01, box.y0, 0.012, box.height), label="<colorbar>")
        fig.colorbar(mesh, cax=cax, label="weight")
    return fig


def _plot_folds(run: Path, summary: dict[str, Any]) -> Any:
    folds = summary["folds"]
    n = len(folds)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = figure(figsize=(5 * cols, 3.5 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, fold in zip(axes.flat, folds):
        k = fold["fold"]
        path = run / "folds" / f"fold_{k}.csv"
        if not path.is_file():
            ax.set_title(f"fold {k}: no equity file")
            ax.axis("off")
            continue
        data = read_csv(path)
        x = dates_of(data.get("date"))
        dated = x is not None
        if not dated:  # written before curves were dated
            x = np.arange(len(data["agent_log_return"]))
        ax.plot(x, _equity(data["agent_log_return"]), label="agent", lw=1.6,
                color=_COLOURS["agent"])  # fmt: skip
        bh = _bh(data)
        if bh is not None:
            ax.plot(x, _equity(bh), label="buy & hold", lw=1.1, color=_COLOURS["buy_and_hold"])
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_title(
            f"fold {k}: {fold.get('test_start', '')} … {fold.get('test_end', '')}\n"
            f"Sharpe {_sharpe(fold.get('sharpe'))} vs B&H {_sharpe(fold.get('buy_hold_sharpe'))}",
            fontsize=9,
        )
        if dated:
            _date_axis(ax, offset=False)  # the title gives the window's dates
        else:
            ax.set_xlabel("test day")
        ax.tick_params(labelsize=8)
        ax.set_ylabel("equity (start = 1)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("Out-of-sample equity per fold (greedy policy, net of costs)")
    margins(fig, left=0.7, right=0.15, top=0.9, bottom=0.4, wspace=0.7, hspace=0.85)
    return fig


def _sharpe(v: float | None) -> str:
    return "undefined" if v is None else f"{v:+.2f}"


#: the dated plots of a market run that read the pooled ``oos.csv``, in the report's order
POOLED_PLOTS = ("equity_pooled.png", "drawdowns.png", "positions.png")


def read_oos(run: Path) -> dict[str, np.ndarray]:
    """A run's pooled out-of-sample ``oos.csv`` by column; empty where there is none."""
    path = run / "oos.csv"
    return read_csv(path) if path.is_file() else {}


def market_plots(
    run: Path, summary: dict[str, Any], oos: dict[str, np.ndarray] | None = None
) -> tuple[list[str], str | None]:
    """The dated plots a market run directory has the files for, by file name, in the report's
    order (:data:`POOLED_PLOTS`, then the per-fold ``equity.png``), and a note on what could
    not be plotted (None if nothing). ``oos``: the run's :func:`read_oos`, where already read."""
    names: list[str] = []
    note = None
    cols = read_oos(run) if oos is None else oos
    if cols and dates_of(cols.get("date")) is not None and "agent_log_return" in cols:
        names += POOLED_PLOTS
    else:
        note = (
            "This run directory has no dated oos.csv (written before trimtab pooled its folds): "
            "the pooled plots are left out."
        )
    if summary.get("folds"):
        names.append("equity.png")
    return names, note


def market_figure(
    run: Path, summary: dict[str, Any], name: str, oos: dict[str, np.ndarray] | None = None
) -> Any:
    """The market plot ``name`` (one of :func:`market_plots`' names) of a run, as a figure;
    ``oos`` as in :func:`market_plots`."""
    if name == "equity.png":
        return _plot_folds(run, summary)
    oos = read_oos(run) if oos is None else oos
    x = dates_of(oos.get("date"))
    draw = {"equity_pooled.png": lambda: _plot_pooled_equity(run, oos, x),
            "drawdowns.png": lambda: _plot_drawdowns(oos, x),
            "positions.png": lambda: _plot_positions(oos, x)}  # fmt: skip
    return draw[name]()


def market_figures(run: Path, summary: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The dated plots of a market run, by file name (pooled equity, drawdowns, positions,
    per-fold equity), and a note on what could not be plotted (None if nothing)."""
    oos = read_oos(run)
    names, note = market_plots(run, summary, oos)
    return {name: market_figure(run, summary, name, oos) for name in names}, note


def plot_prefix(
    metrics: dict[str, np.ndarray],
    prefix: str,
    out_dir: Path,
    folds: list[dict[str, Any]] | None = None,
) -> Path | None:
    """One training-diagnostics plot over gradient steps, a dashed line at each fold boundary;
    with ``folds`` (a market run's summary rows) each fold is labelled at the top with the dates
    of the window it trained on, so the steps read as a time in the market."""
    fname, title, ylabel, log = PREFIXES[prefix]
    cols = [c for c in metrics if c.startswith(prefix)]
    if not cols or "step" not in metrics:
        return None
    fig = figure(figsize=(10, 4))
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
        _train_windows(ax, step, fold, folds)
    # log scale when some column has a positive value (np.nanmin of an all-NaN column warns)
    if log and any((metrics[c].astype(float) > 0).any() for c in cols):
        ax.set_yscale("log")
    ax.set_title(title + " (dashed: fold boundaries)", pad=14)  # room for the fold labels
    ax.set_xlabel("gradient step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(fontsize=8, ncol=2)
    else:  # a run that halted before its first finite value
        ax.text(0.5, 0.5, "no finite value logged", ha="center", transform=ax.transAxes)
    margins(fig, left=0.85, right=0.15, top=0.6, bottom=0.5)
    path = out_dir / fname
    fig.savefig(path, dpi=110)
    return path


def _train_windows(
    ax: Any, step: np.ndarray, fold: np.ndarray, folds: list[dict[str, Any]] | None
) -> None:
    """Above each fold's first logged step: the fold and the dates it trained on."""
    windows = {
        int(r["fold"]): f"{r['train_start']} … {r['train_end']}"
        for r in folds or []
        if r.get("train_start") and r.get("train_end")
    }
    ok = np.isfinite(fold)
    starts = np.flatnonzero(np.r_[True, np.diff(fold[ok]) != 0])
    for i in starts:
        k = int(fold[ok][i])
        text = f" fold {k}" + (f": trained on {windows[k]}" if k in windows else "")
        ax.text(step[ok][i], 1.0, text, transform=ax.get_xaxis_transform(), fontsize=7,
                va="bottom", ha="left", color="#555")  # fmt: skip
