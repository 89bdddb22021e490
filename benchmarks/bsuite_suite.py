"""bsuite under its own rules: whole experiments x stability arms as trials of ``trimtab sweep``
on Ray, each experiment scored by its own bsuite analysis (``analysis.score``), with bsuite's
own per-scale plots.

    python benchmarks/bsuite_suite.py [--experiments E ...] [--arms A ...] [--ids N]
        [--set KEY=VALUE ...] [--cpus N] [--serial] [--sweep-dir DIR] [--out FILE] [--key NAME]

Every trial is ``trimtab train --config examples/bsuite.toml --env bsuite:E/I --stability A``:
the experiment's episode budget, logged by bsuite's CSV logger in the trial's run directory.
bsuite's ids stand for its seeds (cartpole_scale/0-3 are the four seeds of x0.001); a trial's
``run.seed`` (the agent's initialisation and its replay draws) is the id's number modulo 4, run
as four sweeps, and the env is seeded from it and the id (:mod:`trimtab.rl.envs.bsuite_env`).

The record holds, per arm and experiment, bsuite's score of all its ids, each id's episodes and
whether it ran its whole budget (a run capped by ``--set gym.total_steps=N`` is scored on the
episodes it has: such a record says ``"full_budget": false`` and is not bsuite's score), and the
issue's targets: ``adaptive``'s ``*_scale`` score at least 0.9 of its unscaled experiment's, and
above ``fixed`` and ``off`` by more than the spread of the per-seed scores. Plots (bsuite's
``plot_average`` of each scale experiment and arm) go to ``benchmarks/results/bsuite/``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "bsuite.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "bsuite.json"
PLOTS = ROOT / "benchmarks" / "results" / "bsuite"
EXPERIMENTS = ("cartpole", "cartpole_scale", "mountain_car", "mountain_car_scale")
ARMS = ("adaptive", "fixed", "off")
#: each scale experiment and the unscaled experiment it is held against
SCALED = {"cartpole_scale": "cartpole", "mountain_car_scale": "mountain_car"}
SEEDS = 4  # bsuite's seeds per setting: an id's number modulo 4


def sweep_argv(out: Path, ids: list[str], arms: list[str], seed: int, args: Any) -> list[str]:
    argv = ["sweep", "--config", str(EXAMPLE), "--out", str(out), "--seeds", str(seed)]
    argv += ["--grid", "env.name=" + ",".join(ids), "--grid", "run.stability=" + ",".join(arms)]
    for s in args.set:
        argv += ["--set", s]
    if args.cpus:
        argv += ["--cpus", str(args.cpus)]
    if args.serial:
        argv.append("--serial")
    return argv


def trial_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per finished trial: its id, arm, seed, episodes and run directory."""
    rows = []
    for path in sorted(sweep_dir.rglob("summary.json")):
        s = json.loads(path.read_text())
        if "bsuite_id" not in s:
            continue
        rows.append({"bsuite_id": s["bsuite_id"], "experiment": s["bsuite_experiment"],
                     "arm": s["stability"], "seed": s["seed"],
                     "episodes": s["train_episodes"], "complete": s["bsuite_complete"],
                     "env_steps": s["env_steps"], "seconds": s["seconds"],
                     "run_dir": str(path.parent)})  # fmt: skip
    return rows


def load_logs(run_dirs: list[str]) -> Any:
    """bsuite's frame of the trials' logs (``csv_load.load_one_result_set`` of each)."""
    import pandas as pd

    from trimtab.rl.envs.bsuite_env import bsuite_modules

    bsuite_modules()
    from bsuite.logging import csv_load

    return pd.concat([csv_load.load_one_result_set(str(Path(d) / "bsuite")) for d in run_dirs],
                     sort=False)  # fmt: skip


def score_cells(rows: list[dict[str, Any]], plots: Path | None) -> dict[str, Any]:
    """Per arm and experiment: bsuite's score over its ids, the per-seed scores (the ids of
    one ``number % 4``: bsuite's seeds) and their standard error, and the plot."""
    from trimtab.rl.envs.bsuite_env import analysis_module

    out: dict[str, Any] = {}
    for arm in sorted({r["arm"] for r in rows}):
        for exp in sorted({r["experiment"] for r in rows}):
            mine = [r for r in rows if r["arm"] == arm and r["experiment"] == exp]
            if not mine:
                continue
            analysis = analysis_module(exp)
            df = load_logs([r["run_dir"] for r in mine])
            per_seed = []
            for k in range(SEEDS):
                ids = {r["bsuite_id"] for r in mine if int(r["bsuite_id"].split("/")[1]) % 4 == k}
                if ids:
                    per_seed.append(float(analysis.score(df[df.bsuite_id.isin(ids)])))
            n = len(per_seed)
            mean = sum(per_seed) / n
            se = (math.sqrt(sum((x - mean) ** 2 for x in per_seed) / (n - 1) / n) if n > 1
                  else math.nan)  # fmt: skip
            cell = {"score": float(analysis.score(df)), "per_seed": per_seed,
                    "per_seed_mean": mean, "per_seed_se": se, "ids": len(mine),
                    "complete_ids": sum(r["complete"] for r in mine),
                    "episodes": {r["bsuite_id"]: r["episodes"] for r in mine},
                    "env_steps": sum(r["env_steps"] for r in mine),
                    "seconds": sum(r["seconds"] for r in mine)}  # fmt: skip
            # bsuite's plot of average regret by scale draws only a whole budget's log
            full = cell["complete_ids"] == cell["ids"]
            if plots is not None and exp in SCALED and full:
                plots.mkdir(parents=True, exist_ok=True)
                png = plots / f"{exp}_{arm}.png"
                analysis.plot_average(df).save(str(png), width=8, height=5, dpi=100,
                                               verbose=False)  # fmt: skip
                cell["plot"] = str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)
            out.setdefault(arm, {})[exp] = cell
    return out


def targets(cells: dict[str, Any]) -> dict[str, Any]:
    """The issue's relations, where the cells they need were run: ``adaptive``'s scale score
    >= 0.9 x its unscaled one, and above ``fixed`` and ``off`` by more than 2 standard errors
    of the difference of their per-seed means."""
    out: dict[str, Any] = {}
    ada = cells.get("adaptive", {})
    for scaled, base in SCALED.items():
        if scaled not in ada:
            continue
        row: dict[str, Any] = {"scale_score": ada[scaled]["score"]}
        if base in ada:
            row["unscaled_score"] = ada[base]["score"]
            row["ratio"] = ada[scaled]["score"] / ada[base]["score"] if ada[base]["score"] else None
            row["ratio_met"] = row["ratio"] is not None and row["ratio"] >= 0.9
        for other in ("fixed", "off"):
            if scaled not in cells.get(other, {}):
                continue
            a, b = ada[scaled], cells[other][scaled]
            diff = a["per_seed_mean"] - b["per_seed_mean"]
            se = math.sqrt(a["per_seed_se"] ** 2 + b["per_seed_se"] ** 2)
            row[f"minus_{other}"] = diff
            row[f"minus_{other}_se"] = se
            row[f"above_{other}"] = bool(math.isfinite(se) and diff > 2 * se)
        out[scaled] = row
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), choices=EXPERIMENTS)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--ids", type=int, default=20, help="ids per experiment (bsuite's: 20)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override of examples/bsuite.toml for every trial")  # fmt: skip
    p.add_argument("--cpus", type=int, help="CPUs of the local Ray instance (default: all)")
    p.add_argument("--serial", action="store_true", help="trials one after another, no Ray")
    p.add_argument("--sweep-dir", type=Path, default=ROOT / "runs" / "bsuite_suite")
    p.add_argument("--plots", type=Path, default=PLOTS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--key")
    args = p.parse_args(argv)
    from trimtab.benchmarking import invocation, provenance, save_record
    from trimtab.cli import main as trimtab_main

    failed = 0
    for seed in range(SEEDS):
        ids = [f"bsuite:{e}/{i}" for e in args.experiments for i in range(args.ids)
               if i % SEEDS == seed]  # fmt: skip
        if ids:
            failed += trimtab_main(sweep_argv(args.sweep_dir / f"seed{seed}", ids, args.arms,
                                              seed, args)) != 0  # fmt: skip
    rows = trial_rows(args.sweep_dir)
    cells = score_cells(rows, args.plots)
    full = all(r["complete"] for r in rows)
    record = {**provenance("cpu"), "command": invocation(__file__, argv),
              "config": str(EXAMPLE.relative_to(ROOT)), "overrides": args.set,
              "full_budget": full, "failed_sweeps": failed, "trials": len(rows),
              "cells": cells, "targets": targets(cells)}  # fmt: skip
    print(f"{'arm':<10} {'experiment':<20} {'score':>7} {'per seed':>16} {'ids':>4} {'full':>5}")
    for arm, exps in cells.items():
        for exp, c in exps.items():
            print(f"{arm:<10} {exp:<20} {c['score']:7.3f} {c['per_seed_mean']:8.3f} ± "
                  f"{c['per_seed_se']:5.3f} {c['ids']:4d} {c['complete_ids']:5d}")  # fmt: skip
    print("targets:", json.dumps(record["targets"], indent=1))
    if not full:
        print("not every id ran its whole episode budget: these are not bsuite's scores")
    key = save_record(args.out, args.key, record)
    print(f"record {key} in {args.out}")
    return record


if __name__ == "__main__":
    main()
