"""``trimtab train`` with several learner processes (torchrun, DDP, gloo) against one process, the
same total work: ``--steps`` gradient steps of one batch in all, split evenly over the ranks
(each rank's batch is the run's batch, so the samples drawn and the env steps taken are the
same in total), on the default market (1 fold) on the CPU.

    python benchmarks/bench_ddp.py [--steps 600] [--layouts 1x1 2x1] [--repeats 2] \\
        [--device cpu|cuda] [--dist-backend gloo|nccl] [--full] [--quick] [--out PATH]

``--device cuda``: each rank on ``cuda:LOCAL_RANK`` (the default backend, NCCL, needs one GPU
per rank; ``--dist-backend gloo`` lets ranks share GPUs). ``--full``: the unmodified default
``trimtab train`` (all folds, every rank the run's full ``steps_per_fold``: P times the samples
of one process), its wall time and fold table per layout, instead of the split-steps work.

A layout ``PxT`` is P processes of T torch threads each. Per run: wall time of the whole
command (start-up, process group, report included) and ``train_s``, the training loop's time
from rank 0's summary.json; the throughput is samples (batch x steps, summed over ranks) per
second of ``train_s``. Layouts are interleaved over repeats, and the machine's load average is
recorded before each run: on a shared machine other processes take cores from every layout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trimtab.benchmarking import benchmark_parser, provenance, write_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "ddp_cpu.json"
COMMON = ["walkforward.folds=1"]
QUICK = ["data.synthetic_days=300", "env.episode_days=16", "env.n_envs=4",
         "walkforward.learning_starts=12", "agent.batch_size=16", "agent.hidden=16",
         "agent.n_atoms=11", "agent.replay_capacity=1000"]  # fmt: skip


def command(procs: int, threads: int, steps: int, out: Path, quick: bool, device: str = "cpu",
            backend: str | None = None, full: bool = False) -> list[str]:  # fmt: skip
    launch = [sys.executable, "-m", "trimtab"]
    if procs > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node", str(procs), "-m", "trimtab"]  # fmt: skip
    cmd = [*launch, "train", "--device", device, "--out", str(out), "--no-progress"]
    if procs > 1 and backend:
        cmd += ["--dist-backend", backend]
    sets = [*COMMON, f"walkforward.steps_per_fold={steps // procs}", f"run.threads={threads}",
            f"run.checkpoint_every={10 * steps}", *(QUICK if quick else [])]  # fmt: skip
    if full:  # the default run as a user types it
        sets = QUICK if quick else []
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_one(layout: str, steps: int, runs: Path, repeat: int, quick: bool, device: str = "cpu",
            backend: str | None = None, full: bool = False) -> dict[str, Any]:  # fmt: skip
    procs, threads = (int(x) for x in layout.split("x"))
    out = runs / f"{layout}-r{repeat}"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    cmd = command(procs, threads, steps, out, quick, device, backend, full)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
    if full or len(s["folds"]) > 1 or device != "cpu":
        from trimtab.rl.report.build import format_fold_table

        row["folds"] = s["folds"]
        row["fold_table"] = format_fold_table(s)
    return row


def _config_value(run_dir: Path, section: str, key: str) -> Any:
    import tomllib

    return tomllib.loads((run_dir / "config.toml").read_text())[section][key]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(
        __doc__, DEFAULT_OUT, quick="a tiny net and market (a smoke test)", device="cpu"
    )
    p.add_argument("--steps", type=int, default=600, help="gradient steps in all (over ranks)")
    p.add_argument("--layouts", nargs="+", default=["1x1", "2x1"], help="PROCSxTHREADS")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--runs", type=Path, help="where the run directories go (default: a temp dir)")
    p.add_argument("--dist-backend", choices=["gloo", "nccl"], help="default: the trainer's")
    p.add_argument("--full", action="store_true", help="the unmodified default run (all folds)")
    args = p.parse_args(argv)
    source = provenance(args.device)  # the tree the runs start from (HEAD may move meanwhile)
    if args.quick and args.steps == 600:
        args.steps = 16
    runs = args.runs or Path(tempfile.mkdtemp(prefix="bench_ddp-"))
    rows = []
    for r in range(args.repeats):  # interleaved: the machine's load changes over time
        for layout in args.layouts:
            row = run_one(layout, args.steps, runs, r, args.quick, args.device,
                          args.dist_backend, args.full)  # fmt: skip
            rows.append(row)
            shown = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                     if k not in ("error", "folds", "fold_table")}  # fmt: skip
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
        "benchmark": "ddp_cpu" if args.device == "cpu" else "ddp_train_cuda",
        **source,
        "quick": args.quick,
        "device": args.device,
        "dist_backend": args.dist_backend,
        "full_default_run": args.full,
        "steps_total": None if args.full else args.steps,
        "config": [*([] if args.full else COMMON), *(QUICK if args.quick else [])],
        "layouts": per_layout,
        "runs": rows,
    }
    write_json(args.out, result, indent=1)
    for layout, v in per_layout.items():
        print(f"{layout}: best {v['best_samples_per_s']:.0f} samples/s, "
              f"x{v['speedup_vs_' + args.layouts[0]]:.2f} vs {args.layouts[0]}")  # fmt: skip
    for row in rows:
        if "fold_table" in row:
            print(f"\n{row['layout']}, repeat {row['repeat']}: {row['wall_s']:.1f} s wall, "
                  f"{row['train_s']:.1f} s training\n{row['fold_table']}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
