"""``trimtab train`` with several learner processes (torchrun, DDP, gloo) against one process, the
same total work: ``--steps`` gradient steps of one batch in all, split evenly over the ranks
(each rank's batch is the run's batch, so the samples drawn and the env steps taken are the
same in total), on the default market (1 fold) on the CPU.

    python benchmarks/bench_ddp.py [--steps 600] [--layouts 1x1 2x1] [--repeats 2] \\
        [--quick] [--out benchmarks/results/ddp_cpu.json]

A layout ``PxT`` is P processes of T torch threads each. Per run: wall time of the whole
command (start-up, process group, report included) and ``train_s``, the training loop's time
from rank 0's summary.json; the throughput is samples (batch x steps, summed over ranks) per
second of ``train_s``. Layouts are interleaved over repeats, and the machine's load average is
recorded before each run: on a shared machine other processes take cores from every layout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trimtab.benchmarking import provenance

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "ddp_cpu.json"
COMMON = ["walkforward.folds=1"]
QUICK = ["data.synthetic_days=300", "env.episode_days=16", "env.n_envs=4",
         "walkforward.learning_starts=12", "agent.batch_size=16", "agent.hidden=16",
         "agent.n_atoms=11", "agent.replay_capacity=1000"]  # fmt: skip


def command(procs: int, threads: int, steps: int, out: Path, quick: bool) -> list[str]:
    launch = [sys.executable, "-m", "trimtab"]
    if procs > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node", str(procs), "-m", "trimtab"]  # fmt: skip
    cmd = [*launch, "train", "--device", "cpu", "--out", str(out), "--no-progress"]
    sets = [*COMMON, f"walkforward.steps_per_fold={steps // procs}", f"run.threads={threads}",
            f"run.checkpoint_every={10 * steps}", *(QUICK if quick else [])]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_one(layout: str, steps: int, runs: Path, repeat: int, quick: bool) -> dict[str, Any]:
    procs, threads = (int(x) for x in layout.split("x"))
    out = runs / f"{layout}-r{repeat}"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(command(procs, threads, steps, out, quick), capture_output=True,
                          text=True, env=env)  # fmt: skip
    row: dict[str, Any] = {"layout": layout, "procs": procs, "threads": threads,
                           "repeat": repeat, "load_avg_1min_before": load,
                           "wall_s": time.perf_counter() - t0, "rc": proc.returncode}  # fmt: skip
    summary = out / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        row["error"] = (proc.stderr or proc.stdout)[-2000:]
        return row
    s = json.loads(summary.read_text())
    batch = _config_value(out, "agent", "batch_size")
    row.update(
        train_s=s["seconds"],
        updates_per_rank=s["updates"],
        samples=procs * s["updates"] * batch,
        env_steps=procs * s["env_steps"],
        world_size=s.get("world_size", 1),
    )
    row["samples_per_s"] = row["samples"] / max(row["train_s"], 1e-9)
    return row


def _config_value(run_dir: Path, section: str, key: str) -> Any:
    import tomllib

    return tomllib.loads((run_dir / "config.toml").read_text())[section][key]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600, help="gradient steps in all (over ranks)")
    p.add_argument("--layouts", nargs="+", default=["1x1", "2x1"], help="PROCSxTHREADS")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a tiny net and market (a smoke test)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--runs", type=Path, help="where the run directories go (default: a temp dir)")
    args = p.parse_args(argv)
    source = provenance("cpu")  # the tree the runs start from (HEAD may move meanwhile)
    if args.quick and args.steps == 600:
        args.steps = 16
    runs = args.runs or Path(tempfile.mkdtemp(prefix="bench_ddp-"))
    rows = []
    for r in range(args.repeats):  # interleaved: the machine's load changes over time
        for layout in args.layouts:
            row = run_one(layout, args.steps, runs, r, args.quick)
            rows.append(row)
            shown = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                     if k != "error"}  # fmt: skip
            print(json.dumps(shown), flush=True)
            if "error" in row:
                raise SystemExit(f"{layout} failed:\n{row['error']}")
    per_layout: dict[str, Any] = {}
    for layout in args.layouts:
        mine = [r for r in rows if r["layout"] == layout]
        per_layout[layout] = {
            "samples_per_s": [r["samples_per_s"] for r in mine],
            "train_s": [r["train_s"] for r in mine],
            "wall_s": [r["wall_s"] for r in mine],
            "best_samples_per_s": max(r["samples_per_s"] for r in mine),
        }
    base = per_layout[args.layouts[0]]["best_samples_per_s"]
    for layout in args.layouts:
        per_layout[layout]["speedup_vs_" + args.layouts[0]] = (
            per_layout[layout]["best_samples_per_s"] / base
        )
    result = {
        "benchmark": "ddp_cpu",
        **source,
        "quick": args.quick,
        "steps_total": args.steps,
        "config": [*COMMON, *(QUICK if args.quick else [])],
        "layouts": per_layout,
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for layout, v in per_layout.items():
        print(f"{layout}: best {v['best_samples_per_s']:.0f} samples/s, "
              f"x{v['speedup_vs_' + args.layouts[0]]:.2f} vs {args.layouts[0]}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
