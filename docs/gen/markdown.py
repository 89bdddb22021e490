"""Markdown for the generated pages: a value as a table cell, signed figures, tables, nested
records flattened to columns, and the indent of a block folded under an admonition."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def fmt(v: Any) -> str:
    """A cell: floats to 4 significant digits, NaN/None as n/a, lists of scalars joined."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4g}"
    if isinstance(v, list):
        if len(v) <= 6 and all(not isinstance(x, (dict, list)) for x in v):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return f"({len(v)} values)"
    if isinstance(v, dict):
        return f"({len(v)} fields)"
    s = str(v).replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= 120 else s[:117] + "…"


def signed(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:+.{digits}f}".replace("-", "−")


def table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in r) + " |" for r in rows
    ]
    return "\n".join(lines) + "\n"


def flat(d: dict, prefix: str = "", depth: int = 1) -> dict[str, Any]:
    """Scalar fields of ``d``, nested dicts flattened ``depth`` levels as ``a.b``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and depth > 0:
            out.update(flat(v, f"{prefix}{k}.", depth - 1))
        elif not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict)):
            out[f"{prefix}{k}"] = v
    return out


def indent(text: str) -> str:
    return "\n".join(("    " + line) if line.strip() else "" for line in text.splitlines()) + "\n"
