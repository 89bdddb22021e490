"""Env steps per second of the whole training loop (act, env step, checks, replay, learn) on a
GPU, as the number of envs grows: the market with learning, and the torch CartPole's collection
alone; each beside ``--stability off`` (the same loop with no stability part: the plain torch
alternative) in the same invocation.

    python benchmarks/bench_throughput.py --device cuda [--envs 16 256 1024 4096] \\
        [--modes adaptive off] [--steps 2000] [--cartpole-envs 4096] [--out FILE --key NAME]

Every row is one ``trimtab train`` process, one at a time, after an untimed first run that fills
Triton's cache. Market rows: the embedded market, one walk-forward fold of ``--steps`` gradient
steps (``walkforward.learning_starts`` = 8 batched env steps), ``env.n_envs`` = N, one gradient
step per batched env step of N envs, batch 256 (so the gradient steps per env step fall as N
grows: the figure is the loop's rate at that replay ratio, which the row states). CartPole rows:
``examples/cartpole_gpu.toml`` with ``env.n_envs`` = N and ``gym.learning_starts`` =
``gym.total_steps`` (no gradient step: collection alone, its sentinel check included). The rate
is ``env_steps / loop_s`` of the run's summary: the loop's wall time includes the fold's
evaluation and its checkpoint, so it is a lower bound on the rate of the training loop itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trimtab.benchmarking import benchmark_parser, invocation, provenance, save_record

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "throughput_h200.json"


def market_sets(n_envs: int, steps: int) -> list[str]:
    return [f"env.n_envs={n_envs}", "agent.batch_size=256", "walkforward.folds=1",
            f"walkforward.steps_per_fold={steps}", f"walkforward.learning_starts={8 * n_envs}",
            f"run.checkpoint_every={steps}"]  # fmt: skip


def cartpole_sets(n_envs: int, batched_steps: int) -> list[str]:
    total = n_envs * batched_steps
    return ["--config", str(ROOT / "examples" / "cartpole_gpu.toml"), "--set",
            f"env.n_envs={n_envs}", "--set", f"gym.total_steps={total}", "--set",
            f"gym.learning_starts={total}", "--set", "gym.eval_episodes=1"]  # fmt: skip


def run_one(device: str, mode: str, args: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "trimtab", "train", "--device", device, "--stability", mode,
           "--out", str(out), "--no-progress", *args]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    s = json.loads((out / "summary.json").read_text())
    loop = s["timings"]["loop_s"]
    return {"env_steps": s["env_steps"], "updates": s["updates"], "loop_s": loop,
            "env_steps_per_s": s["env_steps"] / loop, "updates_per_s": s["updates"] / loop,
            "updates_per_env_step": s["updates"] / max(s["env_steps"], 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(
        __doc__,
        DEFAULT_OUT,
        device="cuda",
        key=True,
        quick="tiny runs on any device (the test)",
        quick_writes=False,
    )
    p.add_argument("--envs", type=int, nargs="+", default=[16, 256, 1024, 4096])
    p.add_argument("--modes", nargs="+", default=["adaptive", "off"])
    p.add_argument("--steps", type=int, default=2000, help="gradient steps of a market row")
    p.add_argument("--cartpole-envs", type=int, nargs="*", default=[4096])
    p.add_argument("--cartpole-steps", type=int, default=2000, help="batched env steps")
    args = p.parse_args(argv)
    if args.quick:
        args.envs, args.steps, args.cartpole_envs, args.cartpole_steps = [4], 20, [8], 20
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        jobs = []
        for n in args.envs:
            sets = [w for s in market_sets(n, args.steps) for w in ("--set", s)]
            jobs += [("market", n, mode, sets) for mode in args.modes]
        for n in args.cartpole_envs:
            jobs += [("cartpole", n, mode, cartpole_sets(n, args.cartpole_steps))
                     for mode in args.modes]  # fmt: skip
        # an untimed first run of each kind fills Triton's cache (the first run compiles)
        warmed = set()
        for i, (env, n, mode, sets) in enumerate(jobs):
            if (env, mode) not in warmed:
                run_one(args.device, mode, sets, Path(tmp) / f"warm{i}")
                warmed.add((env, mode))
            row = {"env": env, "n_envs": n, "mode": mode,
                   **run_one(args.device, mode, sets, Path(tmp) / f"run{i}")}  # fmt: skip
            rows.append(row)
            rate = row.get("env_steps_per_s")
            print(f"{env:8} n_envs {n:5d} {mode:8} "
                  + (f"{rate:12,.0f} env steps/s, {row['updates_per_s']:7.1f} updates/s"
                     if rate else f"error: {row['error'][-300:]}"), flush=True)  # fmt: skip
            save(args, argv, rows)  # after every row: a run cut short keeps what it measured
    return save(args, argv, rows)


def save(args: Any, argv: list[str] | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The record of the rows so far, each beside the same loop with stability off measured in
    this invocation (``rate_vs_off``), written to ``--out`` when given."""
    for r in rows:
        off = next((o for o in rows if o["env"] == r["env"] and o["n_envs"] == r["n_envs"]
                    and o["mode"] == "off" and "env_steps_per_s" in o), None)  # fmt: skip
        if off is not None and "env_steps_per_s" in r:
            r["rate_vs_off"] = r["env_steps_per_s"] / off["env_steps_per_s"]
    record = {**provenance(args.device), "command": invocation(__file__, argv),
              "rows": rows}  # fmt: skip
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
