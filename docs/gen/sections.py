"""A results file as a section of a page: its script and command, then each record with its
provenance, its scalar fields and its tables of rows (a renderer of its own where one is named)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gen import ROOT
from gen.markdown import flat, fmt, indent, table
from gen.records import PROVENANCE, load_json, provenance_line, recorded_command, records
from gen.scripts import reproduce_command, script_for


def list_tables(rec: dict, max_rows: int = 40) -> list[tuple[str, list[dict]]]:
    """The record's lists of row dicts, found up to two levels down: ``(where, rows)``."""
    found: list[tuple[str, list[dict]]] = []

    def walk(d: dict, where: str, depth: int) -> None:
        for k, v in d.items():
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                found.append((f"{where}{k}", v))
            elif isinstance(v, dict) and depth > 0:
                walk(v, f"{where}{k}.", depth - 1)

    walk(rec, "", 2)
    return found


def rows_table(rows: list[dict], max_rows: int = 40, max_cols: int = 12) -> str:
    flats = [flat(r, depth=1) for r in rows]
    cols: list[str] = []
    for f in flats:
        for k in f:
            if k not in cols and k not in PROVENANCE:
                cols.append(k)
    dropped = cols[max_cols:]
    cols = cols[:max_cols]
    body = [[f.get(c, "") for c in cols] for f in flats[:max_rows]]
    out = table([f"`{c}`" for c in cols], body)
    notes = []
    if len(rows) > max_rows:
        notes.append(f"{len(rows) - max_rows} more rows")
    if dropped:
        notes.append("more columns: " + ", ".join(f"`{c}`" for c in dropped[:12]))
    if notes:
        out += "\n*In the JSON: " + "; ".join(notes) + ".*\n"
    return out


#: a table of more rows than this is folded (a click opens it), so a page reads summary first
OPEN_ROWS = 8


def generic_record(rec: dict) -> str:
    out = []
    skip = (*PROVENANCE, "command", "how")
    scalars = {
        k: v
        for k, v in flat(rec, depth=1).items()
        if k not in skip and not (isinstance(v, list) and len(v) > 6)
    }
    if scalars:
        items = list(scalars.items())
        out.append(table(["field", "value"], [[f"`{k}`", v] for k, v in items[:30]]))
        if len(items) > 30:
            out.append(f"\n*{len(items) - 30} more fields in the JSON.*\n")
    for where, rows in list_tables(rec)[:6]:
        if len(rows) > OPEN_ROWS:
            # the summary above reads first; the raw rows open on a click
            out.append(f'\n??? info "`{where}`: {len(rows)} rows"\n\n' + indent(rows_table(rows)))
        else:
            out.append(f"\n`{where}`:\n\n" + rows_table(rows))
    return "\n".join(out)


def stress_record(rec: dict) -> str:
    """A stress file: per stability mode and market, how many runs kept every fold finite and
    how many the sentinel halted (what did not fail), then the rows."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for r in rec.get("rows", []):
        cells.setdefault((str(r.get("stability")), str(r.get("market"))), []).append(r)
    body = []
    for (mode, market), rows in cells.items():
        total = sum(int(r.get("folds_total") or 0) for r in rows)
        finite = sum(int(r.get("folds_finite") or 0) for r in rows)
        halted = sum(1 for r in rows if r.get("halted"))
        fires = sorted({str(r["first_fire"]) for r in rows if r.get("first_fire")})
        body.append(
            [f"`{mode}`", market, str(len(rows)), f"{finite} of {total}", str(halted),
             ", ".join(fires[:3]) or "none"]
        )  # fmt: skip
    out = table(["stability", "market", "runs", "folds finite", "runs halted", "first fire"], body)
    return out + "\n" + generic_record(rec)


def bsuite_record(rec: dict) -> str:
    """A bsuite file: per stability mode and experiment, bsuite's own score of its ids, the
    per-seed scores' mean ± s.e., how many ids ran their whole episode budget, the episodes,
    env steps and seconds; then the rest of the record (the targets, where their cells ran)."""
    body = []
    for arm, exps in rec.get("cells", {}).items():
        for exp, c in exps.items():
            se = c.get("per_seed_se")
            per_seed = fmt(c.get("per_seed_mean")) + ("" if se is None else f" ± {fmt(se)}")
            body.append(
                [f"`{arm}`", exp, fmt(c.get("score")), per_seed,
                 f"{c.get('complete_ids')} of {c.get('ids')}",
                 str(sum((c.get("episodes") or {}).values())), fmt(c.get("env_steps")),
                 fmt(c.get("seconds"))]
            )  # fmt: skip
    heads = ["stability", "experiment", "bsuite score", "per seed", "whole budget", "episodes",
             "env steps", "seconds"]  # fmt: skip
    out = table(heads, body)
    if not rec.get("full_budget", True):
        out += ("\n*Not every id ran its whole episode budget: bsuite's analysis scored the "
                "episodes each log has, which is not bsuite's score.*\n")  # fmt: skip
    rest = {k: v for k, v in rec.items() if k != "cells"}
    return out + "\n" + generic_record(rest)


RENDERERS: dict[str, Callable[[dict], str]] = {"stress": stress_record, "bsuite": bsuite_record}


def file_section(path: Path, level: int = 2, render: Callable[[dict], str] | None = None) -> str:
    """One results file: its script and command, then each record with its provenance."""
    data = load_json(path)
    script = script_for(path.stem)
    if render is None:
        render = next((f for k, f in RENDERERS.items() if path.stem.split("_")[0] == k), None)
    h = "#" * level
    out = [f"{h} `{path.name}`\n"]
    if script is not None:
        out.append(f"Written by `{script.relative_to(ROOT).as_posix()}`. Reproduce with:\n")
    out.append("```bash\n" + reproduce_command(script) + "\n```\n")
    recs = records(data)
    for key, rec in recs:
        if key:
            out.append(f'??? note "record `{key}`"\n')
            body = [provenance_line(rec)]
            cmd = recorded_command(rec)
            if cmd:
                body.append(f"Recorded command: `{fmt(cmd)}`\n")
            body.append((render or generic_record)(rec))
            out.append(indent("\n".join(body)))
        else:
            out.append(provenance_line(rec))
            cmd = recorded_command(rec)
            if cmd:
                out.append(f"Recorded command: `{fmt(cmd)}`\n")
            out.append((render or generic_record)(rec))
    return "\n".join(out) + "\n"
