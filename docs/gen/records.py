"""A benchmark's results file: its JSON read (bare ``NaN`` included), the records it holds, and
each record's provenance (machine, date, commit) and the command it records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gen.markdown import fmt

#: Provenance fields of a benchmark record (trimtab.benchmarking.provenance), shown, not tabled.
PROVENANCE = ("machine", "device_name", "device", "date", "commit", "python", "torch", "triton")


def load_json(path: Path) -> Any:
    """A results file: standard JSON, where a bare ``NaN``/``Infinity`` (Python's ``json.dump``
    default) reads as a float and ``null`` as None; both render as "n/a"."""
    return json.loads(
        path.read_text(), parse_constant=lambda c: float(c.replace("Infinity", "inf"))
    )


def records(data: Any) -> list[tuple[str, dict]]:
    """``(key, record)`` pairs of a results file: one record written whole (it has provenance at
    its top), or a dict of records keyed by ``--key``."""
    if not isinstance(data, dict):
        return [("", {"value": data})]
    if any(k in data for k in ("date", "commit", "benchmark", "rows")):
        return [("", data)]
    out = [(k, v) for k, v in data.items() if isinstance(v, dict)]
    return out or [("", data)]


def provenance_line(rec: dict) -> str:
    parts = []
    machine = rec.get("device_name") or rec.get("device")
    if machine:
        parts.append(f"machine **{fmt(machine)}**")
    if rec.get("machine"):
        parts.append(f"host `{fmt(rec['machine'])}`")
    for k in ("date", "commit"):
        if rec.get(k):
            parts.append(f"{k} `{fmt(rec[k])}`")
    for k in ("torch", "triton", "python"):
        if rec.get(k):
            parts.append(f"{k} {fmt(rec[k])}")
    if not parts:
        return "*No provenance recorded in this record.*\n"
    return "Ran on " + ", ".join(parts) + ".\n"


def recorded_command(rec: dict) -> str | None:
    cmd = rec.get("command") or rec.get("how")
    if isinstance(cmd, list):
        cmd = " ".join(map(str, cmd))
    return cmd if isinstance(cmd, str) and cmd else None
