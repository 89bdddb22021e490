"""Where a `trimtab train` process spends the time outside its run's own timings: starting the
interpreter, importing, reading the command line and config, and after the run, the interpreter's
exit (a warm default run on a GPU spent about 7 s there, ``default_run.py``'s ``start_s``).

    python benchmarks/experiments/profile_startup.py [--device cuda] [--quick] [--warm]
        [--set KEY=VALUE ...] [--out FILE --key NAME]

The run is ``python -m trimtab train`` in a child process (``child_env``: one OpenMP thread,
bytecode cached) through a wrapper that prints a timestamp at each boundary: the interpreter
running the wrapper, ``trimtab.rl.run.runner`` imported (torch and the trainer's modules),
``train_steps`` entered and returned (the run: its summary's ``timings`` split it further), the
wrapper's ``main`` returned, and Python's last ``atexit`` handler (the exit after it: the
interpreter's and CUDA's teardown, worker processes joined). The parent's clock brackets the
whole process. ``--warm``: one run first, untimed, so that Triton's and Python's caches hold what
the timed one loads (a machine's later run); ``--quick``: a few updates on two short folds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks
from default_run import QUICK  # the default run's --quick settings
from trimtab.benchmarking import benchmark_parser, child_env, invocation, provenance, save_record

#: What the child runs: ``trimtab``'s ``__main__`` with a timestamp at each boundary ("T name t").
WRAPPER = """
import atexit, runpy, sys, time
print("T python", time.time(), file=sys.stderr, flush=True)
atexit.register(lambda: print("T atexit", time.time(), file=sys.stderr, flush=True))
import trimtab.rl.run.runner as runner
print("T imported", time.time(), file=sys.stderr, flush=True)
steps = runner.train_steps
def timed(*args, **kwargs):
    print("T entered", time.time(), file=sys.stderr, flush=True)
    out = yield from steps(*args, **kwargs)
    print("T returned", time.time(), file=sys.stderr, flush=True)
    return out
runner.train_steps = timed
sys.argv = ["trimtab", *sys.argv[1:]]
try:
    runpy.run_module("trimtab", run_name="__main__")
finally:
    print("T main", time.time(), file=sys.stderr, flush=True)
"""
#: (phase, from, to): the process's wall time in consecutive parts
PHASES = [
    ("interpreter", "spawn", "python"),
    ("imports", "python", "imported"),
    ("command_line", "imported", "entered"),
    ("run", "entered", "returned"),
    ("after_run", "returned", "main"),
    ("atexit", "main", "atexit"),
    ("exit", "atexit", "ended"),
]


def run_once(device: str, sets: list[str], out: Path, pycache: Path) -> dict[str, Any]:
    """One timed ``trimtab train`` process: its boundaries' timestamps and its summary."""
    cmd = [sys.executable, "-c", WRAPPER, "train", "--device", device, "--no-progress",
           "--out", str(out)]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    spawn = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(pycache))
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"trimtab train failed ({proc.returncode}): {proc.stderr[-2000:]}")
    stamps = {"spawn": spawn, "ended": ended}
    for line in proc.stderr.splitlines():
        if line.startswith("T "):
            _, name, t = line.split()
            stamps[name] = float(t)
    missing = [b for _, _, b in PHASES if b not in stamps]
    if missing:
        raise RuntimeError(f"no timestamp for {missing}; the child printed: {proc.stderr[-800:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"stamps": stamps, "summary": summary}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, None, quick="two short folds, a few updates", device="cpu",
                         key=True, out_help="a JSON file of records (default: none)")  # fmt: skip
    p.add_argument("--warm", action="store_true", help="one untimed run first (warm caches)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    sets = [*args.sets, *(QUICK if args.quick else [])]
    with tempfile.TemporaryDirectory(prefix="profile-startup-") as tmp:
        root = Path(tmp)
        if args.warm:
            run_once(args.device, sets, root / "warm", root / "pycache")
        got = run_once(args.device, sets, root / "timed", root / "pycache")
    st, summary = got["stamps"], got["summary"]
    phases = {name: st[b] - st[a] for name, a, b in PHASES}
    wall = st["ended"] - st["spawn"]
    record: dict[str, Any] = {
        **provenance(args.device), "command": invocation(__file__, argv), "sets": sets,
        "warm": args.warm, "quick": args.quick, "wall_s": wall, "phases_s": phases,
        "run_timings_s": summary.get("timings", {}),
    }  # fmt: skip
    print(f"trimtab train --device {args.device}: {wall:.2f} s wall")
    for name, s in phases.items():
        print(f"  {s:7.2f} s  {name}")
    for name, s in record["run_timings_s"].items():
        print(f"      {s:7.2f} s  run: {name}")
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
