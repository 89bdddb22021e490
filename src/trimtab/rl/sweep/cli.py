"""``trimtab sweep``: config overrides × seeds as Ray tasks, one merged table;
``trimtab train --seeds``: one config's seeds the same way, one table of seeds
(docs: guides/sweeps.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trimtab.rl.sweep.spec import SweepError, SweepSpec, Trial

__all__ = [
    "add_command",
    "build_trials",
    "cmd_sweep",
    "cmd_train_seeds",
    "engine_of",
    "seed_trials",
]


def add_command(sub: Any) -> None:
    from trimtab.rl.help_format import DefaultsFormatter

    p = sub.add_parser(
        "sweep",
        formatter_class=DefaultsFormatter,
        help="run config overrides × seeds as Ray tasks, then one merged table",
        description="Each trial is an ordinary run directory OUT/CELL/seedN. Rerun the same "
        "command with the same --out to continue: finished trials are skipped.",
    )
    p.add_argument("file", nargs="?", type=Path, help="TOML sweep file (keys: out, config, "
                   "set, seeds, [grid], [[cells]]); flags add to it")  # fmt: skip
    p.add_argument("--out", type=Path, help="the sweep's directory (tables and run directories)")
    p.add_argument("--config", type=Path, help="the base train config (TOML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one value of the base config (repeatable)")  # fmt: skip
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="sweep a key over values; several make a product (repeatable)")  # fmt: skip
    p.add_argument("--cell", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="one cell of a list, each crossed with the grid (repeatable)")  # fmt: skip
    p.add_argument("--seeds", nargs="+", type=int, help="run.seed of each trial (default: 0)")
    p.add_argument("--address", help="a Ray cluster to run on (default: a local Ray instance)")
    p.add_argument("--cpus", type=int, help="CPUs of the local Ray instance (default: all)")
    p.add_argument("--gpus-per-trial", type=float, default=0.25,
                   help="the share of a GPU a CUDA trial asks Ray for")  # fmt: skip
    p.add_argument("--serial", action="store_true",
                   help="no Ray: run the trials one after another in this process")  # fmt: skip
    p.add_argument("--population", action="store_true",
                   help="no Ray: run every trial at once in this process, stepped in turn, each "
                   "on a CUDA stream of its own (on a GPU their steps overlap: the sweeps "
                   "guide)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="list the trials and stop")
    p.set_defaults(func=cmd_sweep)


def build_trials(args: argparse.Namespace) -> tuple[list[Trial], Path]:
    """The sweep file (if any) and the flags as validated trials and the output directory."""
    from trimtab.rl.sweep.spec import base_data, load_sweep_file, parse_cell, parse_grid

    spec: dict[str, Any] = load_sweep_file(args.file) if args.file else {}
    out = args.out or (Path(spec["out"]) if "out" in spec else None)
    if out is None:
        raise SweepError('trimtab sweep needs --out DIR (or out = "DIR" in the sweep file)')
    sets = spec.get("set", [])
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise SweepError(f'sweep file {args.file}: set is a list of "key=value" strings')
    base = base_data(args.config or spec.get("config"), [*sets, *args.overrides])
    grid = dict(spec.get("grid", []))
    grid.update(parse_grid(args.grid))  # a flag replaces the file's values of its key
    cells = [parse_cell(c) for c in args.cell] or spec.get("cells", [])
    seeds = args.seeds or spec.get("seeds") or [0]
    if not isinstance(seeds, list) or not all(type(s) is int for s in seeds):
        raise SweepError(f"seeds must be a list of integers, got {seeds!r}")
    return SweepSpec.build(base, list(grid.items()), cells, seeds).trials(out), out


def cmd_sweep(args: argparse.Namespace) -> int:
    from trimtab.rl.sweep.table import format_table
    from trimtab.rl.sweep.trials import require_ray, run_sweep

    trials, out = build_trials(args)
    if args.dry_run:
        for t in trials:
            print(f"{t.label}  seed {t.seed}  {t.run_dir}")
        print(f"{len(trials)} trials")
        return 0
    engine = engine_of(args)
    if engine == "ray":
        require_ray()
    try:
        result = run_sweep(trials, out, engine=engine, address=args.address, cpus=args.cpus,
                           gpus_per_trial=args.gpus_per_trial)  # fmt: skip
    except KeyboardInterrupt:
        print("trimtab: sweep interrupted; rerun the same command to continue (finished "
              "trials are skipped)", file=sys.stderr)  # fmt: skip
        return 130
    print()
    print(format_table(result.cells, result.selection))
    png = ", sweep.png" if (out / "sweep.png").exists() else ""
    print(f"table: {out}/sweep.csv, sweep.json{png}  ({result.seconds:.0f} s)")
    if result.failed:
        print(f"{len(result.failed)} of {len(trials)} trials failed "
              "(rerun the same command to retry them):", file=sys.stderr)  # fmt: skip
        for r in result.failed:
            print(f"  {r.trial.label} seed {r.trial.seed}: {r.error}  ({r.trial.run_dir})",
                  file=sys.stderr)  # fmt: skip
        return 1
    return 0


def engine_of(args: argparse.Namespace) -> str:
    """The engine the flags ask for: ``serial``, ``population`` or (neither) ``ray``; the
    placement flags of Ray with another engine are an error, not ignored."""
    if args.serial and args.population:
        raise SweepError("--serial and --population: give one of them")
    engine = "serial" if args.serial else "population" if args.population else "ray"
    if engine != "ray":
        placement = {"--cpus": args.cpus, "--address": getattr(args, "address", None)}
        given = [flag for flag, value in placement.items() if value is not None]
        if given:
            raise SweepError(f"{given[0]} places Ray tasks; --{engine} runs no Ray: drop it")
    return engine


def seed_trials(args: argparse.Namespace, data: dict[str, Any]) -> tuple[list[Trial], Path]:
    """``trimtab train --seeds``'s flags as one trial per seed, in ``OUT/seedN``; ``data`` is
    the config file with the flags and overrides folded in (``cli_train.config_data``)."""
    import time

    from trimtab.rl.config import RunConfig

    if args.resume is not None:
        raise SweepError(
            "--seeds starts runs, --resume continues one: to continue the seeds, rerun the "
            "same command with the same --out (finished seeds are skipped)"
        )
    if args.seed is not None:
        raise SweepError("--seed and --seeds: give one of them")
    if args.dist_backend or _under_torchrun():
        raise SweepError("--seeds runs its seeds as Ray tasks (or --serial), not under torchrun")
    out = args.out
    if out is None:
        stability = data.get("run", {}).get("stability", RunConfig.stability)
        out = f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{stability}-{len(args.seeds)}seeds"
    spec = SweepSpec.build(data, seeds=args.seeds)
    return spec.trials(Path(out), cell_dirs=False), Path(out)


def _under_torchrun() -> bool:
    from trimtab.rl.run.ddp import world_size_from_env

    return world_size_from_env() > 1


def cmd_train_seeds(args: argparse.Namespace, data: dict[str, Any]) -> int:
    """Each seed an ordinary run directory ``OUT/seedN`` (run as a sweep of one cell), then a
    row per seed, their mean ± s.e. and the best seed's deflated Sharpe ratio."""
    from trimtab.rl.sweep.table import format_seeds_table
    from trimtab.rl.sweep.trials import require_ray, run_sweep

    trials, out = seed_trials(args, data)
    engine = engine_of(args)
    if engine == "ray":
        require_ray()
    try:
        result = run_sweep(trials, out, engine=engine, cpus=args.cpus)
    except KeyboardInterrupt:
        print(f"trimtab: interrupted; rerun with --out {out} to continue (finished seeds are "
              "skipped)", file=sys.stderr)  # fmt: skip
        return 130
    print()
    print(format_seeds_table(result.results, result.selection))
    print(f"run directories: {out}/seedN; table: {out}/sweep.csv, sweep.json  "
          f"({result.seconds:.0f} s)")  # fmt: skip
    if result.failed:
        print(f"{len(result.failed)} of {len(trials)} seeds failed (rerun with --out {out} to "
              "retry them)", file=sys.stderr)  # fmt: skip
        return 1
    return 0
