"""Frozen dataclass configs from TOML and ``key=value`` overrides, validated field by field.

One config object becomes the command line and is saved with every run
(docs/contributing/style.md): the loaders here turn nested dicts into nested frozen dataclasses,
reject unknown keys and wrong types with the dotted path of the offending key, and write the
resolved config back as TOML.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ConfigError", "apply_overrides", "check_fields", "from_dict", "load_toml", "to_dict",
           "to_toml"]  # fmt: skip

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown, or of the wrong type or range."""


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = get_origin(tp)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{where}: must be one of {list(get_args(tp))}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        said = [e.split(": ", 1)[-1] for e in errors]  # each alternative, said once
        raise ConfigError(f"{where}: {'; or '.join(said)}" if said else f"{where}: got {value!r}")
    if origin in (tuple, list, Sequence):
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(
                _convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args))
            )
        item = args[0] if args else Any
        return tuple(_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, where)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported field type {_type_name(tp)}")


def check_fields(obj: Any, section: str) -> None:
    """Every field of the config dataclass ``obj`` against its annotation (a ``Literal``'s
    values, integers, finite numbers, strings, booleans, tuples of those): what the TOML path
    checks, for a config built in Python. Raises :class:`ConfigError` naming ``section.key``."""
    hints = get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if not dataclasses.is_dataclass(hints[f.name]):
            try:
                _convert(getattr(obj, f.name), hints[f.name], f"{section}.{f.name}")
            except ConfigError as e:
                raise ConfigError(f"invalid [{section}] config: {e}") from None


def from_dict(cls: type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; missing keys take defaults, unknown keys raise."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(prefix + k for k in unknown)}; known keys here: {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        path = f"{where}.{name}" if where else name
        default = fields[name].default_factory  # type: ignore[misc]
        if isinstance(value, Mapping) and default is not dataclasses.MISSING:
            # A partial table overrides the field's *default instance*, not the class defaults.
            value = {**to_dict(default()), **value}
        kwargs[name] = _convert(value, hints[name], path)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def to_dict(obj: Any) -> Any:
    """A dataclass config as plain TOML-able data (tuples become lists, None is dropped)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            v = to_dict(getattr(obj, f.name))
            if v is not None:
                out[f.name] = v
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def to_toml(obj: Any) -> str:
    import tomli_w

    return tomli_w.dumps(to_dict(obj))


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from None


def _parse_scalar(text: str) -> Any:
    """Parse the right-hand side of ``key=value`` as a TOML value, else keep it as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings (values parsed as TOML) to a nested dict copy."""
    out: dict[str, Any] = _deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a table")
        node[parts[-1]] = _parse_scalar(text.strip())
    return out


def _deepcopy(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deepcopy(v) if isinstance(v, Mapping) else v for k, v in d.items()}
