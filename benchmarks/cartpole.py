"""CartPole-v1 with examples/cartpole.toml: full runs per (stability mode, seed), each a
single-threaded ``trimtab train`` process, several at once; greedy returns into cartpole.json.

    python benchmarks/cartpole.py --modes off --seeds 1 2 3 [--jobs 2] [--set KEY=VALUE ...]

Each run is an ordinary run directory under ``--runs``; the JSON gains one record (keyed by
``--key``) with the machine, date, commit, command and per-run greedy returns, and the mean ±
standard error over seeds per mode.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trimtab.benchmarking import provenance

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cartpole.json"


def run_one(mode: str, seed: int, runs: Path, sets: list[str], quick: bool) -> dict:
    out = runs / f"{mode}-s{seed}"
    config = str(ROOT / "examples" / "cartpole.toml")
    cmd = [sys.executable, "-m", "trimtab", "train", "--config", config, "--stability", mode,
           "--seed", str(seed), "--out", str(out)]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    if quick:
        cmd += ["--set", "gym.total_steps=2000", "--set", "gym.learning_starts=500",
                "--set", "gym.eval_episodes=2"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=None)
    row = {"mode": mode, "seed": seed, "run_dir": str(out), "seconds": time.perf_counter() - t0,
           "rc": proc.returncode}  # fmt: skip
    summary = out / "summary.json"
    if proc.returncode == 0 and summary.is_file():
        s = json.loads(summary.read_text())
        row.update(greedy_return=s["eval"]["mean_return"], halted=s.get("halted"),
                   train_return_last100=s.get("train_return_last100"))  # fmt: skip
    else:
        row["error"] = (proc.stderr or proc.stdout)[-2000:]
    return row


def aggregate(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for mode in sorted({r["mode"] for r in rows}):
        vals = [r["greedy_return"] for r in rows if r["mode"] == mode and "greedy_return" in r]
        n = len(vals)
        mean = sum(vals) / n if n else math.nan
        se = (
            (math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) / math.sqrt(n))
            if n > 1
            else math.nan
        )
        out[mode] = {"n": n, "mean": mean, "stderr": se, "values": vals}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["off"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--jobs", type=int, default=2, help="runs at once (one CPU thread each)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--runs", type=Path, default=Path("runs/cartpole-bench"))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--key", default=None, help="record name in the JSON (default: date-commit)")
    p.add_argument("--quick", action="store_true", help="2k steps, 2 episodes (a smoke test)")
    args = p.parse_args(argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    jobs = [(m, s) for m in args.modes for s in args.seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda ms: run_one(*ms, args.runs, args.sets, args.quick), jobs))
    record = {**provenance(), "command": " ".join(sys.argv), "sets": args.sets, "runs": rows,
              "summary": aggregate(rows)}  # fmt: skip
    for mode, agg in record["summary"].items():
        print(f"{mode}: greedy return {agg['mean']:.1f} ± {agg['stderr']:.1f} (n={agg['n']}) "
              f"{agg['values']}")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['mode']} seed {r['seed']} failed (rc {r['rc']}): {r['error'][-300:]}")
    if not args.quick:
        data = json.loads(args.out.read_text()) if args.out.is_file() else {}
        key = args.key or f"run_{record['date'][:10]}_{record['commit'][:7]}"
        data[key] = record
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
