"""CartPole-v1 with examples/cartpole.toml (or ``--config``): full runs per (stability mode, seed),
each a single-threaded ``trimtab train`` process, several at once; greedy returns and wall times
into cartpole.json.

    python benchmarks/cartpole.py --modes off --seeds 1 2 3 [--jobs 2] [--set KEY=VALUE ...]
    python benchmarks/cartpole.py --config examples/cartpole_gpu.toml --device cuda \
        --modes adaptive --seeds 1 2 3 --jobs 3 --out benchmarks/results/cartpole_h200.json

Each run is an ordinary run directory under ``--runs``; the JSON gains one record (keyed by
``--key``) with the machine, date, commit, command and per-run greedy returns and wall times
(the whole process's, start-up included; ``train_s`` the training loop's), and per mode the mean
± standard error over seeds of both and how many runs solved it (greedy >= 475 over the
evaluation's episodes, 100 by default). Runs that share a device at once slow each other.
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

from trimtab.benchmarking import provenance, save_record

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cartpole.json"


SOLVED = 475.0  # CartPole-v1's reward threshold


def run_one(
    mode: str, seed: int, runs: Path, sets: list[str], quick: bool,
    config: Path = ROOT / "examples" / "cartpole.toml", device: str = "cpu",
) -> dict:  # fmt: skip
    out = runs / f"{mode}-s{seed}"
    cmd = [sys.executable, "-m", "trimtab", "train", "--config", str(config), "--stability", mode,
           "--seed", str(seed), "--out", str(out), "--device", device,
           "--no-progress"]  # fmt: skip
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
                   train_return_last100=s.get("train_return_last100"), train_s=s["seconds"],
                   solved=s["eval"]["mean_return"] >= SOLVED)  # fmt: skip
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
        walls = [r["seconds"] for r in rows if r["mode"] == mode and "greedy_return" in r]
        wall = sum(walls) / n if n else math.nan
        wall_se = (
            math.sqrt(sum((w - wall) ** 2 for w in walls) / (n - 1)) / math.sqrt(n)
            if n > 1
            else math.nan
        )
        solved = sum(bool(r.get("solved")) for r in rows if r["mode"] == mode)
        out[mode] = {"n": n, "mean": mean, "stderr": se, "values": vals, "wall_s": wall,
                     "wall_se": wall_se, "solved": solved}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["off"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--jobs", type=int, default=2, help="runs at once (one CPU thread each)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "cartpole.toml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--runs", type=Path, default=Path("runs/cartpole-bench"))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--key", default=None, help="record name in the JSON (default: date-commit)")
    p.add_argument("--quick", action="store_true", help="2k steps, 2 episodes (a smoke test)")
    args = p.parse_args(argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    jobs = [(m, s) for m in args.modes for s in args.seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda ms: run_one(*ms, args.runs, args.sets, args.quick,
                                                args.config, args.device), jobs))  # fmt: skip
    record = {**provenance(args.device), "command": " ".join(sys.argv), "sets": args.sets,
              "config": str(args.config), "device": args.device, "jobs": args.jobs,
              "runs": rows, "summary": aggregate(rows)}  # fmt: skip
    for mode, agg in record["summary"].items():
        print(f"{mode}: greedy return {agg['mean']:.1f} ± {agg['stderr']:.1f} (n={agg['n']}) "
              f"{agg['values']}; solved {agg['solved']}/{agg['n']}; wall {agg['wall_s']:.1f} ± "
              f"{agg['wall_se']:.1f} s")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['mode']} seed {r['seed']} failed (rc {r['rc']}): {r['error'][-300:]}")
    if not args.quick:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
