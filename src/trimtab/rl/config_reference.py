"""Every key of the trainer's config with its type, default and meaning, read from the config
dataclasses themselves (their annotations, defaults and the comments beside each field), so the
reference cannot drift from the code: ``trimtab config`` prints it, the docs site's config page
is generated from it.

    trimtab config [--device cuda] [--format text|markdown|json]
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
from typing import Any, Literal, get_args, get_origin, get_type_hints

__all__ = ["field_comments", "format_reference", "reference"]


def field_comments(cls: type) -> dict[str, str]:
    """The comment of each field of dataclass ``cls``: the comment lines right above it and the
    comment at the end of its line, joined (the way trimtab's config files document a key)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[int, str] = {}  # line (1-based) -> its comment's text
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[str, str] = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        row = node.lineno - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments.get(row, ""))
            row -= 1
        trailing = [comments[r] for r in range(node.lineno, node.end_lineno + 1) if r in comments]
        text = " ".join(part for part in above + trailing if part and part != "fmt: skip")
        out[node.target.id] = text
    return out


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in get_args(tp))
    if origin is tuple:
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if get_args(tp):  # a union
        return " | ".join("none" if a is type(None) else _type_name(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _allowed(tp: Any) -> list[Any] | None:
    """The values a Literal annotation (or a union holding one) allows."""
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    values = [v for a in get_args(tp) if get_origin(a) is Literal for v in get_args(a)]
    return values or None


def reference(device: str = "cpu") -> list[dict[str, Any]]:
    """One entry per config key, in the order of the config file's sections: ``key``
    ("agent.lr"), ``type``, ``default`` (as written in the dataclass: ``"auto"`` where the
    device profile decides), ``device_default`` (the value a run on ``device`` gets when the key
    is not set), ``meaning`` (the field's comment) and ``allowed`` (a Literal's values, else
    None)."""
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import from_dict, to_dict

    resolved = from_dict(TrainConfig, {"run": {"device": device}})
    out = []
    for section in dataclasses.fields(TrainConfig):
        cls = get_type_hints(TrainConfig)[section.name]
        hints, comments = get_type_hints(cls), field_comments(cls)
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = f.default
            else:
                default = f.default_factory()  # type: ignore[misc]
            out.append({
                "key": f"{section.name}.{f.name}",
                "type": _type_name(hints[f.name]),
                "default": to_dict(default),
                "device_default": to_dict(getattr(getattr(resolved, section.name), f.name)),
                "meaning": comments.get(f.name, ""),
                "allowed": _allowed(hints[f.name]),
            })  # fmt: skip
    return out


def _value(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else f'"{v}"'


def format_reference(entries: list[dict[str, Any]], fmt: str = "text", device: str = "cpu") -> str:
    """``entries`` (from :func:`reference`) as ``"text"`` (for a terminal), ``"markdown"`` (a
    table per section) or ``"json"``."""
    if fmt == "json":
        return json.dumps(entries, indent=1)
    sections: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        sections.setdefault(e["key"].split(".")[0], []).append(e)
    lines: list[str] = []
    for name, keys in sections.items():
        if fmt == "markdown":
            lines += [f"## `[{name}]`", "", f"| key | type | default | on {device} | meaning |",
                      "|---|---|---|---|---|"]  # fmt: skip
            for e in keys:
                meaning, kind = e["meaning"].replace("|", "\\|"), e["type"].replace("|", "\\|")
                default, here = _value(e["default"]), _value(e["device_default"])
                lines.append(f"| `{e['key']}` | {kind} | `{default}` | `{here}` | {meaning} |")
            lines.append("")
            continue
        lines.append(f"[{name}]")
        for e in keys:
            note = e["type"]
            if e["device_default"] != e["default"]:
                note += f"; default {_value(e['default'])}, resolved on {device}"
            name = e["key"].split(".", 1)[1]
            lines.append(f"  {name} = {_value(e['device_default'])}    # {note}")
            lines += textwrap.wrap(e["meaning"], 96, initial_indent="      ",
                                   subsequent_indent="      ")  # fmt: skip
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
