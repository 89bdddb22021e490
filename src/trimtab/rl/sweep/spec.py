"""What a sweep runs: cells (a grid and/or a list of config overrides) × seeds, from flags or a
TOML sweep file, each trial's :class:`TrainConfig` validated before any trial starts.

A sweep file (every key optional; ``trimtab sweep FILE`` flags add to or replace it)::

    out = "sweeps/stress"            # the sweep's directory (--out)
    config = "base.toml"             # a train config, relative to this file (--config)
    set = ["walkforward.folds=2"]    # overrides of the base (--set)
    seeds = [0, 1, 2]                # (--seeds)
    [grid]                           # the product of these values (--grid KEY=V1,V2)
    "run.stability" = ["adaptive", "fixed", "off"]
    [[cells]]                        # a list of cells, each crossed with the grid (--cell)
    "data.stress" = true
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trimtab.rl.configio import (
    ConfigError,
    _parse_scalar,
    apply_overrides,
    from_dict,
    load_toml,
    to_dict,
)

__all__ = [
    "SweepError",
    "SweepSpec",
    "Trial",
    "load_sweep_file",
    "parse_assignment",
    "split_values",
]

#: keys a sweep sets itself: every trial's run directory, seed and (quiet) progress
_OWNED = {"run.out": "--out", "run.seed": "--seeds", "run.progress": "the sweep"}
_SWEEP_FILE_KEYS = ("out", "config", "set", "seeds", "grid", "cells")


class SweepError(ValueError):
    """A sweep that cannot run as given: a bad spec, a foreign output directory, Ray missing."""


@dataclass(frozen=True)
class Trial:
    """One run of a sweep: a cell's overrides at one seed, and where its run directory is."""

    cell: str  # the cell's directory name
    overrides: tuple[tuple[str, Any], ...]  # (dotted key, value) of the cell, in order
    seed: int
    cfg: Any  # the validated TrainConfig, run.out = run_dir
    run_dir: Path

    @property
    def label(self) -> str:
        return cell_label(self.overrides)


@dataclass(frozen=True)
class SweepSpec:
    """Base config data, the cells and the seeds: :meth:`trials` expands and validates them."""

    base: Mapping[str, Any]
    cells: tuple[tuple[tuple[str, Any], ...], ...] = ((),)
    seeds: tuple[int, ...] = (0,)

    @staticmethod
    def build(
        base: Mapping[str, Any],
        grid: Sequence[tuple[str, Sequence[Any]]] = (),
        cells: Sequence[Sequence[tuple[str, Any]]] = (),
        seeds: Sequence[int] = (0,),
    ) -> SweepSpec:
        """Cells = each listed cell (one empty cell if none) × the product of the grid."""
        listed = [tuple(c) for c in cells] or [()]
        keys = [k for k, _ in grid]
        for key, values in grid:
            if not values:
                raise SweepError(f"--grid {key}: no values")
        if len(set(keys)) != len(keys):
            raise SweepError(f"--grid names a key twice: {keys}")
        product = list(itertools.product(*[list(v) for _, v in grid]))
        out = [c + tuple(zip(keys, combo)) for c in listed for combo in product]
        if len(set(seeds)) != len(seeds) or not seeds:
            raise SweepError(f"--seeds must be distinct integers, got {list(seeds)}")
        return SweepSpec(base, tuple(out), tuple(int(s) for s in seeds))

    def trials(self, out: Path, cell_dirs: bool = True) -> list[Trial]:
        """Every (cell, seed) trial with its validated config, in ``out/CELL/seedN``; a bad key
        or value raises :class:`SweepError` naming the cell, before anything is written.
        ``cell_dirs=False`` (one cell: the seeds of one config) puts them in ``out/seedN``."""
        from trimtab.rl.config import TrainConfig

        if not cell_dirs and len(self.cells) != 1:
            raise SweepError(f"{len(self.cells)} cells need a folder each: cell_dirs=True")
        names = _cell_names(self.cells) if cell_dirs else [""]
        trials = []
        for cell, name in zip(self.cells, names):
            for key, _ in cell:
                if key in _OWNED:
                    raise SweepError(f"{key} cannot be swept as a cell: it is set by {_OWNED[key]}")
                if cell_keys(cell).count(key) > 1:
                    raise SweepError(f"cell {cell_label(cell)} sets {key} twice")
            for seed in self.seeds:
                run_dir = (Path(out) / name / f"seed{seed}").resolve()
                data = _deep(self.base)
                for key, value in cell:
                    set_key(data, key, value)
                data.setdefault("run", {}).update(seed=seed, out=str(run_dir), progress=False)
                try:
                    cfg = from_dict(TrainConfig, data)
                except ConfigError as e:
                    where = f"cell {cell_label(cell)}: " if cell else ""
                    raise SweepError(f"{where}{e}") from None
                if cfg.run.device.startswith("cuda:"):
                    raise SweepError(
                        f"run.device = {cfg.run.device!r}: a sweep's trial runs on the GPU Ray "
                        'gives it; set run.device = "cuda"'
                    )
                trials.append(Trial(name, cell, seed, cfg, run_dir))
        return trials


def cell_keys(cell: Sequence[tuple[str, Any]]) -> list[str]:
    return [k for k, _ in cell]


def format_value(value: Any) -> str:
    """A value as written after ``KEY=`` (TOML, but strings bare)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return repr(value)


def cell_label(cell: Sequence[tuple[str, Any]]) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in cell) or "(base)"


_SLUG = str.maketrans({"[": "", "]": "", " ": "", ",": "+", '"': "", "'": ""})


def _cell_names(cells: Sequence[Sequence[tuple[str, Any]]]) -> list[str]:
    """Directory names: the overrides, made file-safe; a hash where too long or colliding."""
    names = []
    for cell in cells:
        text = "_".join(f"{k}={format_value(v)}" for k, v in cell) or "base"
        slug = re.sub(r"[^A-Za-z0-9._=+-]", "-", text.translate(_SLUG))
        if len(slug) > 80:
            slug = slug[:70] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]
        names.append(slug)
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SweepError(f"two cells are the same (or name the same directory): {dup}")
    return names


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """``data[a][b] = value`` for ``key = "a.b"``, a typed value (no string parsing)."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SweepError(f"{key}: {part} is not a table")
    node[parts[-1]] = value


def split_values(text: str) -> list[str]:
    """``V1,V2,...`` split at commas outside brackets and quotes (``[-1,1],[-1,0,1]``: two)."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [v.strip() for v in out]


def parse_assignment(item: str, flag: str) -> tuple[str, str]:
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise SweepError(f"{flag} {item!r} must look like section.key=value")
    key, text = item.split("=", 1)
    return key.strip(), text.strip()


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[Any]]]:
    grid = []
    for item in items:
        key, text = parse_assignment(item, "--grid")
        values = split_values(text)
        if any(v == "" for v in values):
            raise SweepError(f"--grid {item!r}: an empty value")
        grid.append((key, [_parse_scalar(v) for v in values]))
    return grid


def parse_cell(items: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    pairs = [parse_assignment(item, "--cell") for item in items]
    return tuple((key, _parse_scalar(text)) for key, text in pairs)


def load_sweep_file(path: Path) -> dict[str, Any]:
    """A sweep file's keys, ``config`` resolved against the file's folder and checked."""
    data = load_toml(path)
    unknown = sorted(set(data) - set(_SWEEP_FILE_KEYS))
    if unknown:
        raise SweepError(
            f"sweep file {path}: unknown keys {unknown}; known: {list(_SWEEP_FILE_KEYS)}"
        )
    if "config" in data:
        data["config"] = path.parent / data["config"]
    grid = data.get("grid", {})
    grid = _flatten(grid) if isinstance(grid, Mapping) else None
    if grid is None or not all(isinstance(v, list) for _, v in grid):
        raise SweepError(f"sweep file {path}: [grid] maps each key to a list of values")
    data["grid"] = grid
    cells = data.get("cells", [])
    if not isinstance(cells, list) or not all(isinstance(c, Mapping) for c in cells):
        raise SweepError(f"sweep file {path}: [[cells]] is a list of tables of key = value")
    data["cells"] = [tuple(_flatten(c)) for c in cells]
    return data


def _flatten(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"run.stability": [...]}`` or ``{run = {stability = [...]}}``: dotted keys either way."""
    out = []
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += _flatten(value, dotted + ".")
        else:
            out.append((dotted, value))
    return out


def base_data(config: Path | None, overrides: Sequence[str]) -> dict[str, Any]:
    data: dict[str, Any] = load_toml(config) if config else {}
    return apply_overrides(data, overrides)


def same_config(a: Any, b: Any) -> list[str]:
    """The dotted keys where two configs differ (their TOML data), empty if none."""
    return _diff(to_dict(a), to_dict(b), "")


def _diff(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [d for k in sorted(set(a) | set(b))
                for d in _diff(a.get(k), b.get(k), f"{where}.{k}" if where else k)]  # fmt: skip
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def _deep(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep(v) if isinstance(v, Mapping) else v for k, v in d.items()}
