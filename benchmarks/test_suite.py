"""The README's test command, timed: wall and CPU time of ``python -m pytest -q`` (every test
but those marked ``slow``) and what it reported (passed, skipped, failed), with the machine it
ran on, written to ``benchmarks/results/test_suite.json`` (the README's test time is read from
there).

    python benchmarks/test_suite.py [--quick] [--key NAME] [--out FILE.json]

``--quick`` times ``tests/test_readme.py`` alone (what a test runs, so this script cannot rot).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from trimtab.benchmarking import benchmark_parser, provenance, save_record

ROOT = Path(__file__).resolve().parents[1]


def run(quick: bool) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["tests/test_readme.py"] if quick else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|skipped|failed|errors?)", last)}
    return {
        "command": "python -m pytest -q" + (" tests/test_readme.py" if quick else ""),
        "quick": quick,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "pytest_summary": last,
        **counts,
        "cpus": os.cpu_count(),
        **provenance(),
    }


def main(argv: list[str] | None = None) -> int:
    p = benchmark_parser(
        __doc__, ROOT / "benchmarks/results/test_suite.json", key=True,
        quick="time tests/test_readme.py alone (a test runs this)",
    )  # fmt: skip
    args = p.parse_args(argv)
    rec = run(args.quick)
    key = save_record(args.out, args.key, rec)
    print(f"{key}: {rec['pytest_summary']} (wall {rec['wall_s']} s, CPU {rec['cpu_s']} s)")
    return 0 if rec["exit_code"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
