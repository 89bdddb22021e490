"""Why a large population on a GPU learned worse than a small one (record ``pop32_db1fe76`` of
``benchmarks/results/population_h200.json``: 1 of 32 CartPole seeds solved, where three seeds as
a population of three all did): the same seeds as one population with trimtab's pointer-table
caches at their size and at a size that never evicts, beside chosen seeds run alone (one
process after another), each seed's greedy return, its training episodes' last-100 return and
its timings, after one warm-up run that fills Triton's cache.

    python benchmarks/experiments/probe_population.py --device cuda [--seeds 1 ... 32]
        [--alone 4 5 6] [--table-cache 64 1000000] [--streams own serial shared]
        [--config examples/cartpole_fast.toml] [--set KEY=VALUE ...] [--out FILE --key NAME]

What it tested: first, that the tables (``trimtab.kernels._table``: device arrays of tensor
addresses, cached by those addresses, least recently used evicted) were evicted and their
memory reused on one member's stream while another's kernel still read them.
``--table-cache N`` sets both caches' sizes in the population's process (``_CACHE_SIZE`` and
``_ARRAY_CACHE_SIZE``); each size is a row. Refuted (record ``probe_393ab48``: caches that
never evict learned no better; the members' training returns, not only their greedy ones, were
far below the seeds' alone). ``--streams`` arranges the members' CUDA streams (``_SIZED``),
each arrangement a row, to tell a race between members' streams from other causes. The cause
found meanwhile: every graph was captured on ``torch.cuda.graph``'s one default capture
stream, so all shared that stream's cuBLAS workspace and the members' concurrent replays wrote
it together; each graph now has a capture stream of its own (record ``pop32_45868e1``: 25 of
32 solved, median training return 494).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks
from population import CONFIG, QUICK, seed_row, summarise, train_argv, warm_up
from trimtab.benchmarking import benchmark_parser, provenance, save_record

#: the population's process with the table caches resized first and the members' CUDA streams
#: arranged (argv: size, streams, then train's): "own" as shipped (a stream per member),
#: "serial" a stream per member and the device synchronised after every member's turn (no two
#: members' work on the GPU at once), "shared" one stream for every member (their work in the
#: order the host queued it, no host synchronisation)
_SIZED = (
    "import sys, torch; import trimtab.kernels._table as t; "
    "import trimtab.rl.run.population as p; "
    "assert hasattr(t, '_CACHE_SIZE') and hasattr(t, '_ARRAY_CACHE_SIZE'), 'renamed caches'; "
    "assert hasattr(p, '_turn'), 'renamed _turn'; "
    "t._CACHE_SIZE = t._ARRAY_CACHE_SIZE = int(sys.argv[1]); "
    "mode, turn, one = sys.argv[2], p._turn, []\n"
    "def _turn(m, *rest):\n"
    "    if mode == 'shared' and m.device.type == 'cuda' and m.stream is None:\n"
    "        one[:] = one or [torch.cuda.Stream(m.device)]; m.stream = one[0]\n"
    "    try:\n"
    "        return turn(m, *rest)\n"
    "    finally:\n"
    "        if mode == 'serial' and m.device.type == 'cuda': torch.cuda.synchronize(m.device)\n"
    "p._turn = _turn\n"
    "from trimtab.cli import main; sys.exit(main(sys.argv[3:]))"
)


def population_row(args: Any, sets: list[str], size: int, streams: str, runs: Path,
                   env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    out = runs / f"population-cache{size}-{streams}"
    argv = train_argv(args.config, args.device, sets, "--seeds", *map(str, args.seeds),
                      "--population", "--out", str(out))  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _SIZED, str(size), streams, *argv],
                          capture_output=True, text=True, env=env)  # fmt: skip
    wall = time.perf_counter() - t0
    row = {"way": f"population, table caches {size}, streams {streams}", "table_cache": size,
           "streams": streams, "n": len(args.seeds),
           "rc": proc.returncode, "wall_s": wall,
           "seeds": [seed_row(out / f"seed{s}") for s in args.seeds]}  # fmt: skip
    row["summary"] = summarise(row)
    if proc.returncode != 0:
        row["stderr"] = proc.stderr[-2000:]
    return row


def alone_row(args: Any, sets: list[str], runs: Path, env: dict[str, str]) -> dict[str, Any]:
    seeds, rc, t0 = [], 0, time.perf_counter()
    for s in args.alone:
        out = runs / f"alone-seed{s}"
        argv = train_argv(args.config, args.device, sets, "--seed", str(s), "--out", str(out))
        proc = subprocess.run([sys.executable, "-m", "trimtab", *argv], capture_output=True,
                              text=True, env=env)  # fmt: skip
        rc = max(rc, proc.returncode)
        seeds.append(seed_row(out))
    row = {"way": "alone, one after another", "n": len(seeds), "rc": rc,
           "wall_s": time.perf_counter() - t0, "seeds": seeds}  # fmt: skip
    row["summary"] = summarise(row)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, None, quick="tiny runs on any device (the test)",
                         device="cuda", key=True, out_help="a JSON file of records")  # fmt: skip
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--seeds", nargs="+", type=int, default=list(range(1, 33)))
    p.add_argument("--alone", nargs="*", type=int, default=[4, 5, 6],
                   help="seeds also run alone, one process after another")  # fmt: skip
    p.add_argument("--table-cache", nargs="+", type=int, default=[64, 1_000_000],
                   help="sizes of the pointer-table caches, one population row each")  # fmt: skip
    p.add_argument("--streams", nargs="+", choices=["own", "serial", "shared"], default=["own"],
                   help="the members' CUDA streams (_SIZED), a population row each")  # fmt: skip
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--runs", type=Path, help="run directories (default: temp)")
    args = p.parse_args(argv)
    sets = [*args.sets, *(QUICK if args.quick else [])]
    runs = args.runs or Path(tempfile.mkdtemp(prefix="probe-population-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    warm_up(args.config, args.device, sets, runs, env, args.quick)  # every row runs it warm
    record: dict[str, Any] = {**provenance(args.device), "config": str(args.config),
                              "sets": sets, "seeds": args.seeds, "rows": []}  # fmt: skip
    jobs = [("population", n, s) for n in args.table_cache for s in args.streams]
    jobs += [("alone", 0, "")] if args.alone else []
    for way, size, streams in jobs:
        row = (
            population_row(args, sets, size, streams, runs, env)
            if way == "population"
            else alone_row(args, sets, runs, env)
        )
        record["rows"].append(row)
        print(json.dumps({"way": row["way"], **row["summary"]}), flush=True)
        if args.out is not None:  # row by row: a call cut short keeps what ran
            save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
