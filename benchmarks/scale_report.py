"""The reward-scale benchmark's results: records merged from partial calls, cells (mean ± s.e.
over seeds), the markdown table and one plot per env; ``scale.py`` writes them with :func:`write`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trimtab.benchmarking import markdown_table, write_json

ARMS = ("adaptive", "fixed", "off", "tuned")
#: what each env reports, in the env's own (unscaled) units
METRIC = {"cartpole": "greedy return", "market": "out-of-sample Sharpe (mean over folds)"}


def _mean(xs: list) -> float | None:
    finite = [x for x in xs if x is not None and math.isfinite(x)]
    return math.fsum(finite) / len(finite) if finite else None


def market_fields(summary: dict) -> dict[str, Any]:
    """A market run's record fields from its ``summary.json``: the fold Sharpes and returns,
    their mean (the metric), and buy & hold's Sharpe over the same test windows."""
    folds = [f for f in summary.get("folds") or [] if "sharpe" in f]
    if not folds:
        return {}
    return {"fold_sharpe": [f["sharpe"] for f in folds],
            "fold_return": [f.get("total_return") for f in folds],
            "value": _mean([f["sharpe"] for f in folds]),
            "fold_buy_hold": [f.get("buy_hold_sharpe") for f in folds],
            "buy_hold": _mean([f.get("buy_hold_sharpe") for f in folds])}  # fmt: skip


def fill_from_runs(records: list[dict]) -> None:
    """Add buy & hold to market records written before it was recorded, from their run
    directories' ``summary.json`` where it is readable from here (paths as recorded)."""
    for r in records:
        path = Path(r["run_dir"]) / "summary.json"
        if r["env"] == "market" and "buy_hold" not in r and path.is_file():
            fields = market_fields(json.loads(path.read_text()))
            if fields.get("fold_sharpe") == r.get("fold_sharpe"):  # the very run
                r.update(fold_buy_hold=fields["fold_buy_hold"], buy_hold=fields["buy_hold"])


def merge_records(*lists: list[dict]) -> list[dict]:
    """Records by (env, arm, scale, seed, steps); a later list replaces an earlier record unless
    it holds no result for it (not started / incomplete) and the earlier one does."""
    out: dict[tuple, dict] = {}
    for recs in lists:
        for r in recs:
            k = (r["env"], r["arm"], float(r["scale"]), r["seed"], r["steps"])
            old = out.get(k)
            if old is not None and old.get("value") is not None and r.get("value") is None:
                continue
            out[k] = r
    return sorted(out.values(), key=lambda r: (r["env"], r["steps"], _arm_order(r["arm"]),
                                                float(r["scale"]), r["seed"]))  # fmt: skip


def _arm_order(label: str) -> tuple[int, str]:
    """The arms in ARMS order, each variant (``ARM (VARIANT)``) after its plain arm."""
    arm = label.split(" (")[0]
    return (ARMS.index(arm) if arm in ARMS else len(ARMS), label)


def _mean_se(v: list[float]) -> tuple[float | None, float | None]:
    n = len(v)
    if n == 0:
        return None, None
    m = math.fsum(v) / n
    if n == 1:
        return m, None
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in v) / (n - 1) / n)


def aggregate(records: list[dict]) -> list[dict]:
    cells: dict[tuple, dict] = {}
    for r in records:
        k = (r["env"], r["steps"], r["arm"], float(r["scale"]))
        c = cells.setdefault(k, {"env": k[0], "steps": k[1], "arm": k[2], "scale": k[3],
                                 "seeds": {}, "status": {}})  # fmt: skip
        c["status"][r["status"]] = c["status"].get(r["status"], 0) + 1
        if r.get("value") is not None:
            c["seeds"][str(r["seed"])] = r["value"]
    for (env, steps, arm, scale), c in list(cells.items()):
        tuned = arm.replace("fixed", "tuned", 1)
        if (
            arm.split(" (")[0] == "fixed"
            and scale == 1.0
            and any(k[:3] == (env, steps, tuned) for k in cells)
        ):  # tuned at x1 is fixed at x1: the same config, run once
            cells.setdefault((env, steps, tuned, scale), {**c, "arm": tuned, "same_as": arm})
    hold: dict[tuple, dict] = {}  # (env, steps, scale) -> seed -> buy & hold (a whole run's)
    for r in records:
        if r.get("buy_hold") is not None and r["status"] == "done":
            k = (r["env"], r["steps"], float(r["scale"]))
            hold.setdefault(k, {}).setdefault(str(r["seed"]), r["buy_hold"])
    for c in cells.values():
        c["mean"], c["se"] = _mean_se(list(c["seeds"].values()))
        c["n"] = len(c["seeds"])
        seeds = hold.get((c["env"], c["steps"], c["scale"]))
        if seeds:
            mean, se = _mean_se(list(seeds.values()))
            c["buy_hold"] = {"env": c["env"], "mean": mean, "se": se, "n": len(seeds)}
    return list(cells.values())


def _fmt(c: dict | None) -> str:
    if c is None or c["mean"] is None:
        return "-"
    prec, sign = (2, "+") if c["env"] == "market" else (1, "")  # a Sharpe shows its sign
    se = "" if c["se"] is None else f" ± {c['se']:.{prec}f}"
    same = f", = {c['same_as']}" if c.get("same_as") else ""
    return f"{c['mean']:{sign}.{prec}f}{se} ({c['n']}{same})"


def markdown(cells: list[dict]) -> str:
    lines = []
    for env, steps in sorted({(c["env"], c["steps"]) for c in cells}):
        mine = [c for c in cells if c["env"] == env and c["steps"] == steps]
        scales = sorted({c["scale"] for c in mine})
        arms = sorted({c["arm"] for c in mine}, key=_arm_order)
        body = []
        for a in arms:
            row = {c["scale"]: c for c in mine if c["arm"] == a}
            body.append([a, *(_fmt(row.get(s)) for s in scales)])
        hold = {s: c["buy_hold"] for c in mine for s in [c["scale"]] if c.get("buy_hold")}
        if hold:  # the same test windows per seed: what holding the asset scored there
            body.append(["buy & hold", *(_fmt(hold.get(s)) for s in scales)])
        header = ["arm", *(f"×{s:g}" for s in scales)]
        lines += [f"**{env}**, {steps}: {METRIC[env]}, mean ± s.e. over seeds (n seeds)", "",
                  markdown_table(header, body, "l" + "r" * len(scales)), ""]  # fmt: skip
    return "\n".join(lines)


def plot(cells: list[dict], path_for: Any) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    written = []
    for env, steps in sorted({(c["env"], c["steps"]) for c in cells}):
        mine = [c for c in cells if c["env"] == env and c["steps"] == steps and c["n"]]
        if not mine:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        arms = sorted({c["arm"] for c in mine}, key=_arm_order)
        for i, a in enumerate(arms):
            row = sorted((c for c in mine if c["arm"] == a), key=lambda c: c["scale"])
            shift = 1.0 + 0.06 * (i - (len(arms) - 1) / 2)  # side by side on the log axis
            xs = [c["scale"] * shift for c in row]
            line = ax.errorbar(xs, [c["mean"] for c in row], yerr=[c["se"] or 0.0 for c in row],
                               marker="o", capsize=3, label=a)  # fmt: skip
            for x, c in zip(xs, row):
                seeds = list(c["seeds"].values())
                ax.scatter([x] * len(seeds), seeds, s=9, alpha=0.45, color=line[0].get_color())
        ax.set_xscale("log")
        scales = [c["scale"] for c in mine]
        ax.set_xlim(min(scales) / 3, max(scales) * 3)  # a decade at least: arms side by side
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("training reward scale")
        ax.set_ylabel(METRIC[env])
        ax.set_title(f"{env}, {steps}: mean ± s.e. over seeds (dots: seeds)", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = path_for(env)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


def write(out: Path, records: list[dict], extra: dict[str, Any]) -> dict[str, Any]:
    cells = aggregate(records)
    table = markdown(cells)
    out.parent.mkdir(parents=True, exist_ok=True)
    plots = plot(cells, lambda env: out.with_name(f"{out.stem}_{env}.png"))
    doc = {**extra, "records": records, "cells": cells, "table": table, "plots": plots}
    write_json(out, doc, indent=1)
    out.with_suffix(".md").write_text(table)
    return doc
