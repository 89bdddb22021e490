"""Many seeds in one process: ``trimtab train --seeds S1 S2 ... --population`` (every seed a member
of one population in one process, each on a CUDA stream of its own) beside the same seeds as
separate processes started at once (the way without it) or one after another in one process
(``--serial``: each seed alone on the device), on one device: the whole command's
wall time (start-up, CUDA initialisation, compiling, training, the greedy evaluation and the
reports included) and each seed's greedy return over ``gym.eval_episodes`` episodes.

    python benchmarks/population.py --device cuda [--config examples/cartpole_gpu.toml]
        [--seeds 1 2 3] [--ways population processes serial] [--set KEY=VALUE ...]
        [--out benchmarks/results/population_h200.json] [--key NAME]

A warm-up run (a few updates of the same config) fills this machine's Triton cache and Python's
bytecode cache first (in ``RUNS/pycache``: ``trimtab.benchmarking.child_env``), so every row is
a warm run (a machine's first run is
``benchmarks/default_run.py --cold``'s
figure). ``solved``: the greedy mean return at least 475 (CartPole-v1's threshold). The JSON
gains one record (keyed by ``--key``) with machine, date and commit.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trimtab.benchmarking import (
    benchmark_parser,
    child_env,
    provenance,
    record_key,
    save_record,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "population_h200.json"
CONFIG = ROOT / "examples" / "cartpole_gpu.toml"
SOLVED = 475.0
QUICK = ["gym.total_steps=256", "gym.learning_starts=64", "gym.eval_episodes=2",
         "env.n_envs=4", "gym.train_every=4", "agent.batch_size=16"]  # fmt: skip


def train_argv(config: Path, device: str, sets: list[str], *args: str) -> list[str]:
    """``trimtab train``'s arguments (without the program) for ``config`` with ``sets``."""
    argv = ["train", "--config", str(config), "--device", device, "--no-progress", *args]
    for s in sets:
        argv += ["--set", s]
    return argv


def _cmd(config: Path, device: str, sets: list[str], *args: str) -> list[str]:
    return [sys.executable, "-m", "trimtab", *train_argv(config, device, sets, *args)]


def warm_up(config: Path, device: str, sets: list[str], runs: Path, env: dict[str, str],
            quick: bool) -> None:  # fmt: skip
    """One untimed run of the same kernels (a few updates past learning_starts) that fills this
    machine's Triton cache, so every timed row runs it warm."""
    warm = _cmd(config, device, [*sets, "gym.eval_episodes=1"], "--seed", "0", "--out",
                str(runs / "warmup"))  # fmt: skip
    if not quick:
        warm += ["--set", "gym.total_steps=16384", "--set", "gym.learning_starts=8192"]
    subprocess.run(warm, capture_output=True, text=True, env=env, check=False)


def seed_row(run_dir: Path) -> dict[str, Any]:
    """A seed's greedy return (solved or not), training episodes' last-100 return, updates,
    timings and halt, from its run directory (its error where it wrote no summary)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        error = run_dir / "sweep_error.txt"
        return {"error": error.read_text()[-1500:] if error.is_file() else "no summary.json"}
    s = json.loads(path.read_text())
    fold = s["folds"][0] if s["folds"] else {}
    ret = fold.get("mean_return")
    return {"seed": s["seed"], "greedy_return": ret, "solved": ret is not None and ret >= SOLVED,
            "train_return_last100": s.get("train_return_last100"), "updates": s["updates"],
            "env_steps": s["env_steps"], "train_s": s["seconds"], "timings": s.get("timings"),
            "halted": s["halted"]}  # fmt: skip


def one_process(way: str, config: Path, device: str, sets: list[str], seeds: list[int],
                runs: Path, env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """The seeds in one ``trimtab train --seeds`` process: ``way`` ``"population"`` (every seed
    at once, ``--population``) or ``"serial"`` (one after another, each alone on the device)."""
    out = runs / f"{way}-{len(seeds)}"
    cmd = _cmd(config, device, sets, "--seeds", *map(str, seeds), f"--{way}", "--out",
               str(out))  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    row = {"way": way, "n": len(seeds), "rc": proc.returncode, "wall_s": wall,
           "seeds": [seed_row(out / f"seed{s}") for s in seeds]}  # fmt: skip
    if proc.returncode != 0:
        row["stderr"] = proc.stderr[-2000:]
    return row


def processes(config: Path, device: str, sets: list[str], seeds: list[int], runs: Path,
              env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    outs = [runs / f"processes-{len(seeds)}" / f"seed{s}" for s in seeds]
    t0 = time.perf_counter()
    procs = []
    for s, o in zip(seeds, outs):
        cmd = _cmd(config, device, sets, "--seed", str(s), "--out", str(o))
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, env=env))  # fmt: skip
    errs = [p.communicate()[1] for p in procs]
    wall = time.perf_counter() - t0
    row = {"way": "processes", "n": len(seeds), "rc": max(p.returncode for p in procs),
           "wall_s": wall, "seeds": [seed_row(o) for o in outs]}  # fmt: skip
    if row["rc"] != 0:
        row["stderr"] = next(e for p, e in zip(procs, errs) if p.returncode)[-2000:]
    return row


def summarise(row: dict[str, Any]) -> dict[str, Any]:
    rets = [s["greedy_return"] for s in row["seeds"] if s.get("greedy_return") is not None]
    mean = statistics.mean(rets) if rets else None
    se = statistics.stdev(rets) / len(rets) ** 0.5 if len(rets) > 1 else None
    return {"way": row["way"], "n": row["n"], "wall_s": round(row["wall_s"], 2),
            "solved": sum(bool(s.get("solved")) for s in row["seeds"]),
            "greedy_mean": mean, "greedy_se": se}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, quick="a few updates of tiny runs (the test)",
                         quick_writes=False, device="auto", key=True)  # fmt: skip
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--ways", nargs="+", choices=["population", "processes", "serial"],
                   default=["population", "processes"])  # fmt: skip
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--runs", type=Path, help="run directories (default: temp)")
    args = p.parse_args(argv)
    sets = [*args.sets, *(QUICK if args.quick else [])]
    runs = args.runs or Path(tempfile.mkdtemp(prefix="population-"))
    env = child_env(runs / "pycache")
    warm_up(args.config, args.device, sets, runs, env, args.quick)
    prov = provenance(args.device)
    key = args.key or record_key(prov)  # one record, saved again after every row
    rows = []
    for way in args.ways:
        if way == "processes":
            row = processes(args.config, args.device, sets, args.seeds, runs, env)
        else:
            row = one_process(way, args.config, args.device, sets, args.seeds, runs, env)
        rows.append(row)
        print(json.dumps(summarise(row)), flush=True)
        if args.out is not None:  # saved row by row: a call cut short keeps what ran
            record = {**prov, "config": str(args.config.relative_to(ROOT))
                      if args.config.is_relative_to(ROOT) else str(args.config),
                      "sets": sets, "seeds": args.seeds, "rows": rows,
                      "summary": [summarise(r) for r in rows]}  # fmt: skip
            save_record(args.out, key, record)
    return {"rows": rows, "summary": [summarise(r) for r in rows]}


if __name__ == "__main__":
    main()
