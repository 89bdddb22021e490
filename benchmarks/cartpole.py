"""CartPole-v1 with examples/cartpole.toml (or ``--config``): full runs per (stability mode, seed),
each a single-threaded ``trimtab train`` process, several at once; greedy returns and wall times
into cartpole.json.

    python benchmarks/cartpole.py --modes off --seeds 1 2 3 [--jobs 2] [--set KEY=VALUE ...]
    python benchmarks/cartpole.py --config examples/cartpole_gpu.toml --device cuda \
        --modes adaptive --seeds 1 2 3 --jobs 3 --out benchmarks/results/cartpole_h200.json
    python benchmarks/cartpole.py --modes adaptive --variant h2 --variant h1 \
        run.weight_headroom=1.0 --curve loss/c51 --curve episode_return --steps 150000

Each run is an ordinary run directory under ``--runs``; the JSON gains one record (keyed by
``--key``) with the machine, date, commit, command and per-run greedy returns and wall times
(the whole process's, start-up included; ``train_s`` the training loop's), and per mode the mean
± standard error over seeds of both and how many runs solved it (greedy >= 475 over the
evaluation's episodes, 100 by default). Runs that share a device at once slow each other.
``--variant NAME KEY=VALUE ...`` (repeatable) runs every mode and seed once per variant, with
its overrides after ``--set``'s; ``--curve COLUMN`` (repeatable) records that metrics.csv
column per run, as (env steps, value) pairs every 5th row; ``--steps`` and ``--episodes`` set
``gym.total_steps`` and ``gym.eval_episodes``.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trimtab.benchmarking import benchmark_parser, invocation, provenance, save_record

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cartpole.json"


SOLVED = 475.0  # CartPole-v1's reward threshold


def run_one(
    mode: str, seed: int, runs: Path, sets: list[str], quick: bool,
    config: Path = ROOT / "examples" / "cartpole.toml", device: str = "cpu",
    variant: str | None = None, curves: tuple[str, ...] = (),
) -> dict:  # fmt: skip
    out = runs / (f"{mode}-s{seed}" if variant is None else f"{mode}-{variant}-s{seed}")
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
    if variant is not None:
        row["variant"] = variant
    summary = out / "summary.json"
    if proc.returncode == 0 and summary.is_file():
        s = json.loads(summary.read_text())
        row.update(greedy_return=s["eval"]["mean_return"], halted=s.get("halted"),
                   train_return_last100=s.get("train_return_last100"), train_s=s["seconds"],
                   solved=s["eval"]["mean_return"] >= SOLVED)  # fmt: skip
        if curves:
            row["curves"] = _curves(out / "metrics.csv", curves)
    else:
        row["error"] = (proc.stderr or proc.stdout)[-2000:]
    return row


def _curves(path: Path, columns: tuple[str, ...], every: int = 5) -> dict[str, list]:
    """Per column, ``[env_steps, value]`` of every ``every``-th row of a run's metrics.csv."""
    if not path.is_file():
        return {}
    with path.open() as fh:
        rows = list(csv.DictReader(fh))[::every]
    return {c: [[float(r["env_steps"]), float(r[c]) if r.get(c) else None] for r in rows]
            for c in columns}  # fmt: skip


def _arm(r: dict) -> str:
    return r["mode"] if "variant" not in r else f"{r['mode']} ({r['variant']})"


def aggregate(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for mode in sorted({_arm(r) for r in rows}):
        vals = [r["greedy_return"] for r in rows if _arm(r) == mode and "greedy_return" in r]
        n = len(vals)
        mean = sum(vals) / n if n else math.nan
        se = (
            (math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) / math.sqrt(n))
            if n > 1
            else math.nan
        )
        walls = [r["seconds"] for r in rows if _arm(r) == mode and "greedy_return" in r]
        wall = sum(walls) / n if n else math.nan
        wall_se = (
            math.sqrt(sum((w - wall) ** 2 for w in walls) / (n - 1)) / math.sqrt(n)
            if n > 1
            else math.nan
        )
        solved = sum(bool(r.get("solved")) for r in rows if _arm(r) == mode)
        out[mode] = {"n": n, "mean": mean, "stderr": se, "values": vals, "wall_s": wall,
                     "wall_se": wall_se, "solved": solved}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict:
    p = benchmark_parser(
        __doc__, DEFAULT_OUT, quick="2k steps, 2 episodes (a smoke test)", device="cpu", key=True
    )
    p.add_argument("--modes", nargs="+", default=["off"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--jobs", type=int, default=2, help="runs at once (one CPU thread each)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "cartpole.toml")
    p.add_argument("--runs", type=Path, default=Path("runs/cartpole-bench"))
    p.add_argument("--variant", nargs="+", action="append", default=None,
                   metavar="NAME KEY=VALUE", help="a name and its config overrides")  # fmt: skip
    p.add_argument("--curve", dest="curves", action="append", default=[], metavar="COLUMN")
    p.add_argument("--steps", type=int, default=None, help="gym.total_steps")
    p.add_argument("--episodes", type=int, default=None, help="gym.eval_episodes")
    args = p.parse_args(argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    sets = [*args.sets, *([f"gym.total_steps={args.steps}"] if args.steps else []),
            *([f"gym.eval_episodes={args.episodes}"] if args.episodes else [])]  # fmt: skip
    variants = [(v[0], v[1:]) for v in args.variant] if args.variant else [(None, [])]
    jobs = [(m, s, name, extra) for name, extra in variants for m in args.modes
            for s in args.seeds]  # fmt: skip
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda j: run_one(j[0], j[1], args.runs, [*sets, *j[3]], args.quick,
                                               args.config, args.device, j[2],
                                               tuple(args.curves)), jobs))  # fmt: skip
    record = {**provenance(args.device), "command": invocation(__file__, argv), "sets": sets,
              "variants": dict(variants) if args.variant else None,
              "config": str(args.config), "device": args.device, "jobs": args.jobs,
              "runs": rows, "summary": aggregate(rows)}  # fmt: skip
    for mode, agg in record["summary"].items():
        print(f"{mode}: greedy return {agg['mean']:.1f} ± {agg['stderr']:.1f} (n={agg['n']}) "
              f"{agg['values']}; solved {agg['solved']}/{agg['n']}; wall {agg['wall_s']:.1f} ± "
              f"{agg['wall_se']:.1f} s")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{_arm(r)} seed {r['seed']} failed (rc {r['rc']}): {r['error'][-300:]}")
    if not args.quick:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
