"""A market run's results as tables a trader reads: per fold, pooled out of sample beside every
baseline, the agent's paired differences, and one verdict that claims no more than its intervals.

Everything comes from ``summary.json``'s dict; each table is built once as rows of strings
(:func:`fold_rows`, :func:`pooled_rows`, :func:`paired_rows`) and rendered as markdown or HTML.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["aggregate_folds", "best_baseline", "cost_line", "fold_flags", "format_fold_table",
           "verdict"]  # fmt: skip

#: baselines in the order tables show them (``trimtab.rl.backtest.pooled.BASELINES``, not
#: imported: a report is rebuilt from files, without the backtest's torch import)
ORDER = ("buy_and_hold", "flat", "momentum", "reversal", "ma_crossover", "random", "oracle")
#: the simple rules an agent must beat (not flat: it is the zero; not the oracle: it knows the
#: regime, which no trader does)
SIMPLE = ("buy_and_hold", "momentum", "reversal", "ma_crossover", "random")
LABELS = {"buy_and_hold": "buy & hold", "flat": "flat (cash)", "momentum": "momentum",
          "reversal": "reversal", "ma_crossover": "MA crossover",
          "random": "random (median draw)", "oracle": "oracle (knows the regime)"}  # fmt: skip
_EXECUTION = {
    "next_open": "next open",
    "next_close": "next close (a whole bar late)",
    "same_close": "OPTIMISTIC: filled at the close that was just seen (same_close)",
}


def label(name: str) -> str:
    return LABELS.get(name, name)


def ordered(names: Sequence[str]) -> list[str]:
    """``names`` in the tables' order; names this module does not know come last, as given."""
    return [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]


# -- numbers as text ---------------------------------------------------------------------------


def _num(v: Any, fmt: str, none: str = "undefined") -> str:
    """``v`` in ``fmt``; ``none`` for None (a Sharpe ratio of prices that never move), "" for a
    key that is not there (pass ``...``)."""
    if v is ...:
        return ""
    if v is None:
        return none
    return fmt.format(v + 0.0 if isinstance(v, float) else v)  # + 0.0: no "-0.0%"


def _ordinal(n: int) -> str:
    tail = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{tail}"


def _ci(v: Any, ci: Any, fmt: str) -> str:
    """A value with its 95% interval: ``+0.52 [-0.10, +1.14]``."""
    text = _num(v, fmt)
    if ci and len(ci) == 2 and None not in ci:
        text += f" [{fmt.format(ci[0])}, {fmt.format(ci[1])}]"
    return text


def _mean_se(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "undefined"
    return f"{mean:+.2f}" + (f" ± {se:.2f}" if se is not None else "")


def _bps(v: Any) -> str:
    return "n/a" if v is None else f"{v:.1f}"


# -- per fold ---------------------------------------------------------------------------------


def best_baseline(
    row: dict[str, Any], among: Sequence[str] = ("momentum", "reversal", "ma_crossover", "random")
) -> tuple[str, float] | None:
    """The baseline of ``among`` with the highest Sharpe ratio in ``row["baselines"]`` (a
    fold's or the pooled dict), or None where none has one."""
    base = row.get("baselines") or {}
    scored = [(n, base[n]["sharpe"]) for n in among
              if n in base and base[n].get("sharpe") is not None]  # fmt: skip
    return max(scored, key=lambda x: x[1]) if scored else None


def fold_flags(row: dict[str, Any]) -> str:
    """What makes a fold's out-of-sample numbers untrustworthy, in a few words ("" if nothing)."""
    flags = list(row.get("data_flags") or [])
    if row.get("extreme_moves"):  # run directories written before data_flags
        flags.append(f"{len(row['extreme_moves'])} extreme move(s) in test window: check data")
    if row.get("ruin"):
        flags.append(f"ruin on {row['ruin']}")
    if row.get("optimistic"):
        flags.append("optimistic fills (same close)")
    return "; ".join(flags)


FOLD_HEAD = ("fold", "test window", "Sharpe", "B&H Sharpe", "best other baseline", "return",
             "B&H return", "max DD", "turnover", "hit rate", "breakeven bp (flat / B&H)",
             "steps", "non-finite", "flags")  # fmt: skip


def fold_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row of :data:`FOLD_HEAD` per fold, then the folds' aggregate."""
    out = []
    folds = summary.get("folds", [])
    for r in folds:
        best = best_baseline(r)
        be = r.get("breakeven_bps")
        out.append([
            str(r["fold"]), f"{r['test_start']} … {r['test_end']}",
            _num(r.get("sharpe"), "{:+.2f}"), _num(r.get("buy_hold_sharpe"), "{:+.2f}"),
            f"{label(best[0])} {best[1]:+.2f}" if best else "",
            _num(r.get("total_return", ...), "{:+.1%}"),
            _num(r.get("buy_hold_return", ...), "{:+.1%}"),
            _num(r.get("max_drawdown", ...), "{:.1%}"), _num(r.get("turnover", ...), "{:.3f}"),
            _num(r.get("hit_rate", ...), "{:.1%}"),
            f"{_bps(be.get('flat'))} / {_bps(be.get('buy_and_hold'))}" if be else "",
            str(r.get("steps", "")), str(r.get("nonfinite", "")), fold_flags(r),
        ])  # fmt: skip
    agg = summary.get("aggregate") or aggregate_folds(folds, summary.get("oos"))
    if agg is not None and len(folds) > 1:
        out.append([
            "all", f"{agg['folds']} folds", _mean_se(agg["sharpe"], agg["sharpe_se"]),
            _mean_se(agg["buy_hold_sharpe"], agg["buy_hold_sharpe_se"]), "",
            # an agent that never held a position has no hit rate: "undefined", not a crash
            _num(agg["total_return"], "{:+.1%}"), _num(agg["buy_hold_return"], "{:+.1%}"),
            _num(agg["max_drawdown"], "{:.1%}"), _num(agg["turnover"], "{:.3f}"),
            _num(agg["hit_rate"], "{:.1%}"), "",
            str(agg["steps"]), str(agg["nonfinite"]),
            f"mean ± s.e.; returns compounded; max DD: {agg.get('max_drawdown_of', 'mean')}",
        ])  # fmt: skip
    return out


def aggregate_folds(
    rows: list[dict[str, Any]], oos: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """A market run over its folds: Sharpe mean and standard error over the folds that have
    one, the return compounded over every test window, the mean turnover and hit rate (agent
    and buy & hold); None without folds.

    The max drawdown is the pooled curve's (``oos["max_drawdown"]``) when given, else the worst
    fold's (a lower bound of the pooled curve's: a drawdown may span folds); never a mean of the
    folds', which understates every one of them. ``max_drawdown_of`` says which."""
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
    if oos and oos.get("max_drawdown") is not None:
        mdd, mdd_of = float(oos["max_drawdown"]), "pooled curve"
    else:
        mdd, mdd_of = float(max(r["max_drawdown"] for r in rows)), "worst fold"
    return {
        "folds": len(rows), "sharpe": sharpe, "sharpe_se": sharpe_se,
        "buy_hold_sharpe": bh_sharpe, "buy_hold_sharpe_se": bh_se,
        "total_return": compound, "buy_hold_return": bh_compound,
        "max_drawdown": mdd, "max_drawdown_of": mdd_of,
        "turnover": float(np.mean([r["turnover"] for r in rows])),
        # hit rate: over the folds that held a position (None: no fold did)
        "hit_rate": _mean_of([r.get("hit_rate") for r in rows]),
        "steps": int(sum(r["steps"] for r in rows)),
        "nonfinite": int(sum(r["nonfinite"] for r in rows)),
    }  # fmt: skip


def _mean_of(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


# -- pooled ---------------------------------------------------------------------------------


POOLED_HEAD = ("strategy", "Sharpe [95% interval]", "total return", "annual return",
               "max DD (whole curve)", "Sortino", "Calmar", "turnover", "exposure")  # fmt: skip


def _pooled_row(name: str, s: dict[str, Any]) -> list[str]:
    return [
        name, _ci(s.get("sharpe"), s.get("sharpe_ci95"), "{:+.2f}"),
        _num(s.get("total_return", ...), "{:+.1%}"), _num(s.get("annual_return", ...), "{:+.1%}"),
        _num(s.get("max_drawdown", ...), "{:.1%}"), _num(s.get("sortino", ...), "{:+.2f}"),
        _num(s.get("calmar", ...), "{:+.2f}"), _num(s.get("turnover", ...), "{:.3f}"),
        _num(s.get("exposure", ...), "{:.1%}"),
    ]  # fmt: skip


def pooled_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The agent's pooled out-of-sample row, then every baseline's on the same days."""
    base = summary.get("baselines") or {}
    rows = [_pooled_row("agent", summary["oos"])]
    rows += [_pooled_row(label(n), base[n]) for n in ordered(list(base))]
    return rows


PAIRED_HEAD = ("agent − baseline", "annual return [95% interval]",
               "information ratio [95% interval]", "P(difference > 0)")  # fmt: skip


def paired_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The agent minus each baseline, paired by day."""
    vs = summary.get("vs_baselines") or {}
    return [
        [f"agent − {label(n)}", _ci(d.get("annual_return"), d.get("annual_return_ci95"), "{:+.1%}"),
         _ci(d.get("information_ratio"), d.get("information_ratio_ci95"), "{:+.2f}"),
         _num(d.get("p_positive", ...), "{:.0%}")]
        for n in ordered(list(vs))
        for d in [vs[n]]
    ]  # fmt: skip


def random_line(summary: dict[str, Any]) -> str:
    """Where the agent's pooled Sharpe ratio falls among random draws at its own turnover."""
    r = (summary.get("baselines") or {}).get("random") or {}
    if not r.get("draws"):
        return ""
    band = ""
    if r.get("sharpe_p05") is not None and r.get("sharpe_p95") is not None:
        band = f", their Sharpe 5–95%: [{r['sharpe_p05']:+.2f}, {r['sharpe_p95']:+.2f}]"
    pct = r.get("agent_percentile")
    where = "undefined" if pct is None else f"{_ordinal(round(pct))} percentile"
    return (
        f"Random baseline: {r['draws']} draws of random positions at the agent's turnover{band}; "
        f"the agent's Sharpe ratio is at their {where}."
    )


def breakeven_line(summary: dict[str, Any]) -> str:
    """The all-in cost per unit turnover at which the pooled agent would only match flat and
    buy & hold (where it trades more, it beats them below that cost)."""
    be = (summary.get("oos") or {}).get("breakeven_bps")
    if not be:
        return ""
    return (
        f"Breakeven cost, pooled: {_bps(be.get('flat'))} bp per unit turnover against flat, "
        f"{_bps(be.get('buy_and_hold'))} bp against buy & hold"
        + (
            " (n/a: the same turnover)."
            if None in (be.get("flat"), be.get("buy_and_hold"))
            else "."
        )
    )


def _excludes_zero(ci: Any) -> int:
    """+1 where a 95% interval lies above 0, -1 below, 0 where it holds 0 or is missing."""
    if not ci or len(ci) != 2 or None in ci:
        return 0
    return 1 if ci[0] > 0 else -1 if ci[1] < 0 else 0


def verdict(summary: dict[str, Any]) -> str | None:
    """One plain-English line on the agent against the best simple baseline (the highest
    pooled Sharpe of :data:`SIMPLE`), claiming an edge only where the paired difference's 95%
    intervals (information ratio and annual return, where given) exclude zero on one side."""
    oos, vs = summary.get("oos"), summary.get("vs_baselines") or {}
    if not oos:
        return None
    best = best_baseline(summary, [n for n in SIMPLE if n in vs])
    if best is None:
        return "No simple baseline has a Sharpe ratio on these days: no verdict."
    name, bsharpe = best
    d = vs[name]
    signs = {_excludes_zero(d.get("information_ratio_ci95"))}
    if d.get("annual_return_ci95"):
        signs.add(_excludes_zero(d.get("annual_return_ci95")))
    sign = signs.pop() if len(signs) == 1 else 0
    ir_ci = d.get("information_ratio_ci95")
    interval = (f", 95% interval [{ir_ci[0]:+.2f}, {ir_ci[1]:+.2f}]"
                if ir_ci and None not in ir_ci else ", no interval")  # fmt: skip
    line = (
        f"The agent against the best simple baseline ({label(name)}): Sharpe "
        f"{_num(oos.get('sharpe'), '{:+.2f}')} vs {bsharpe:+.2f}; its edge, paired by day, is "
        f"{_num(d.get('annual_return'), '{:+.1%}')}/yr, information ratio "
        f"{_num(d.get('information_ratio'), '{:+.2f}')}{interval}: "
    )
    if sign > 0:
        line += "the agent beats it on these days"
        others = [label(n) for n in SIMPLE
                  if n in vs and n != name
                  and _excludes_zero(vs[n].get("information_ratio_ci95")) <= 0]  # fmt: skip
        if others:
            line += f" (but is not distinguishable from {', '.join(others)})"
    elif sign < 0:
        line += "the agent does worse than it"
    else:
        line += "not distinguishable from zero"
    line += "."
    if oos.get("optimistic"):
        line = "OPTIMISTIC FILLS (the close just seen): " + line
    if summary.get("data_warnings"):
        line += " Read the data warnings first."
    return line


def cost_line(summary: dict[str, Any]) -> str:
    """How the backtest fills and charges, and how its Sharpe ratios are annualised."""
    oos = summary.get("oos") or {}
    folds = summary.get("folds") or [{}]
    execution = oos.get("execution") or folds[0].get("execution")
    parts = []
    if execution:
        parts.append("fills: " + _EXECUTION.get(execution, execution))
    if oos.get("cost_bps") is not None:
        costs = f"costs {oos['cost_bps']:.1f} bp per unit turnover"
        if oos.get("borrow_pct") is not None:
            costs += f", borrow {oos['borrow_pct']:.1f}%/yr"
        if oos.get("risk_free_pct") is not None:
            costs += f", cash {oos['risk_free_pct']:.1f}%/yr (risk-free of every Sharpe)"
        parts.append(costs)
    ppy = oos.get("periods_per_year") or summary.get("periods_per_year") or 252
    parts.append(f"Sharpe annualised with {ppy:g} bars/yr")
    return "; ".join(parts)


# -- rendering ------------------------------------------------------------------------------


def markdown(head: Sequence[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def html_table(head: Sequence[str], rows: list[list[str]], flag_col: int | None = None) -> str:
    """An HTML table; cells of ``flag_col`` in red; a row whose first cell is "all" in bold."""
    top = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = []
    for r in rows:
        tag = "th" if r[0] == "all" else "td"
        cells = [f"<{tag}{' class=bad' if j == flag_col else ''}>{html.escape(c)}</{tag}>"
                 for j, c in enumerate(r)]  # fmt: skip
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{top}</tr>{''.join(body)}</table>"


def format_fold_table(summary: dict[str, Any]) -> str:
    """A market run's out-of-sample results as markdown (printed at the end of a run and
    written into the report): how it fills and charges, the per-fold table, then (where the
    run pooled its folds) the agent's pooled row beside every baseline's, the paired
    differences, the random draws and the verdict."""
    parts = [cost_line(summary), "", markdown(FOLD_HEAD, fold_rows(summary))]
    if summary.get("oos"):
        oos = summary["oos"]
        parts += [
            "",
            f"Pooled out of sample: {oos.get('days', '?')} bars, {oos.get('start', '?')} … "
            f"{oos.get('end', '?')}, every strategy on the same days, fills and costs",
            "",
            markdown(POOLED_HEAD, pooled_rows(summary)),
        ]
        if summary.get("vs_baselines"):
            parts += ["", markdown(PAIRED_HEAD, paired_rows(summary))]
        said = (random_line(summary), breakeven_line(summary), verdict(summary))
        extra = [x for x in said if x]
        parts += ["", *extra] if extra else []
    return "\n".join(parts)
