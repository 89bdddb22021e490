"""Why a large population on a GPU learned worse than a small one (record ``pop32_db1fe76`` of
``benchmarks/results/population_h200.json``: 1 of 32 CartPole seeds solved, where three seeds as
a population of three all did): the same seeds as one population with trimtab's pointer-table
caches at their size and at a size that never evicts, beside chosen seeds run alone (one
process after another), each seed's greedy return, its training episodes' last-100 return and
its timings, after one warm-up run that fills Triton's cache.

    python benchmarks/experiments/probe_population.py --device cuda [--seeds 1 ... 32]
        [--alone 4 5 6] [--table-cache 64 1000000] [--config examples/cartpole_fast.toml]
        [--set KEY=VALUE ...] [--out FILE --key NAME]

The hypothesis it tests: the tables (``trimtab.kernels._table``: device arrays of tensor
addresses, cached by those addresses, 64 tables and 256 arrays, least recently used evicted)
are shared by every CUDA stream of the process; with 32 members a table can be evicted and its
memory reused on the stream that built it while another member's stream still has a kernel to
read it. If the members learn as they do alone with caches that never evict, and not without,
the eviction is the cause. ``--table-cache N`` sets both caches' sizes in the population's
process (``_CACHE_SIZE`` and ``_ARRAY_CACHE_SIZE``); each size is one row.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks
from population import CONFIG, QUICK, SOLVED
from trimtab.benchmarking import benchmark_parser, provenance, save_record

#: the population's process with the table caches resized first (argv: size, then train's)
_SIZED = (
    "import sys; import trimtab.kernels._table as t; "
    "assert hasattr(t, '_CACHE_SIZE') and hasattr(t, '_ARRAY_CACHE_SIZE'), 'renamed caches'; "
    "t._CACHE_SIZE = t._ARRAY_CACHE_SIZE = int(sys.argv[1]); "
    "from trimtab.cli import main; sys.exit(main(sys.argv[2:]))"
)


def _train_args(args: Any, sets: list[str], *extra: str) -> list[str]:
    out = ["train", "--config", str(args.config), "--device", args.device, "--no-progress",
           *extra]  # fmt: skip
    for s in sets:
        out += ["--set", s]
    return out


def _seed(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    if not path.is_file():
        error = run_dir / "sweep_error.txt"
        return {"error": error.read_text()[-1500:] if error.is_file() else "no summary.json"}
    s = json.loads(path.read_text())
    ret = s["folds"][0].get("mean_return") if s["folds"] else None
    return {"seed": s["seed"], "greedy_return": ret, "solved": ret is not None and ret >= SOLVED,
            "train_return_last100": s.get("train_return_last100"), "updates": s["updates"],
            "timings": s.get("timings"), "halted": s["halted"]}  # fmt: skip


def _summary(name: str, seeds: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    rets = [s["greedy_return"] for s in seeds if s.get("greedy_return") is not None]
    return {
        "way": name,
        "n": len(seeds),
        "wall_s": round(wall, 2),
        "solved": sum(bool(s.get("solved")) for s in seeds),
        "greedy_mean": statistics.mean(rets) if rets else None,
        "greedy_se": statistics.stdev(rets) / len(rets) ** 0.5 if len(rets) > 1 else None,
    }


def population_row(args: Any, sets: list[str], size: int, runs: Path) -> dict[str, Any]:
    out = runs / f"population-cache{size}"
    argv = _train_args(args, sets, "--seeds", *map(str, args.seeds), "--population",
                       "--out", str(out))  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _SIZED, str(size), *argv], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    wall = time.perf_counter() - t0
    seeds = [_seed(out / f"seed{s}") for s in args.seeds]
    row = {
        "way": f"population, table caches {size}",
        "table_cache": size,
        "rc": proc.returncode,
        "wall_s": wall,
        "seeds": seeds,
        "summary": _summary("population", seeds, wall),
    }
    if proc.returncode != 0:
        row["stderr"] = proc.stderr[-2000:]
    return row


def alone_row(args: Any, sets: list[str], runs: Path) -> dict[str, Any]:
    seeds, rc, t0 = [], 0, time.perf_counter()
    for s in args.alone:
        out = runs / f"alone-seed{s}"
        argv = _train_args(args, sets, "--seed", str(s), "--out", str(out))
        proc = subprocess.run([sys.executable, "-m", "trimtab", *argv], capture_output=True,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        rc = max(rc, proc.returncode)
        seeds.append(_seed(out))
    wall = time.perf_counter() - t0
    return {"way": "alone, one after another", "rc": rc, "wall_s": wall, "seeds": seeds,
            "summary": _summary("alone", seeds, wall)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, None, quick="tiny runs on any device (the test)",
                         device="cuda", key=True, out_help="a JSON file of records")  # fmt: skip
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--seeds", nargs="+", type=int, default=list(range(1, 33)))
    p.add_argument("--alone", nargs="*", type=int, default=[4, 5, 6],
                   help="seeds also run alone, one process after another")  # fmt: skip
    p.add_argument("--table-cache", nargs="+", type=int, default=[64, 1_000_000],
                   help="sizes of the pointer-table caches, one population row each")  # fmt: skip
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--runs", type=Path, help="run directories (default: temp)")
    args = p.parse_args(argv)
    sets = [*args.sets, *(QUICK if args.quick else [])]
    runs = args.runs or Path(tempfile.mkdtemp(prefix="probe-population-"))
    # a warm-up run of the same kernels first (a few updates): every row runs Triton's cache warm
    warm = _train_args(args, [*sets, "gym.eval_episodes=1"], "--seed", "0", "--out",
                       str(runs / "warmup"))  # fmt: skip
    if not args.quick:
        warm += ["--set", "gym.total_steps=16384", "--set", "gym.learning_starts=8192"]
    subprocess.run([sys.executable, "-m", "trimtab", *warm], capture_output=True, check=False)
    record: dict[str, Any] = {**provenance(args.device), "config": str(args.config),
                              "sets": sets, "seeds": args.seeds, "rows": []}  # fmt: skip
    jobs = [("population", n) for n in args.table_cache] + ([("alone", 0)] if args.alone else [])
    for way, size in jobs:
        row = (
            population_row(args, sets, size, runs)
            if way == "population"
            else alone_row(args, sets, runs)
        )
        record["rows"].append(row)
        print(json.dumps({"way": row["way"], **row["summary"]}), flush=True)
        if args.out is not None:  # row by row: a call cut short keeps what ran
            save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
