"""The batched envs' step kernels against their torch references: one step of the market env
(``BatchedTradingEnv``, ``trimtab.kernels.market``) and of the torch CartPole
(``BatchedCartPole``, ``trimtab.kernels.cartpole``), each as its kernel and as its eager
reference (the env's own step, ``impl="torch"``), at several numbers of envs.

    python benchmarks/bench_env_step.py [--device cuda] [--quick] [--reps 200] [--out FILE]

Each row: milliseconds a step (the mean over ``--reps`` steps in a row, CUDA events around
them, the step's random draw included; the eager reference's launches are part of its cost),
env steps a second, and GB/s against the step's bytes moved as ``launch_step``'s docstring in
each kernel module counts them (the same count for both rows: what one step must read and
write). On a CPU only the references run (the kernels need CUDA); ``--quick``: a few envs and
steps, for the test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, write_json
from trimtab.rl.backtest.execution import Fills
from trimtab.rl.envs.cartpole import BatchedCartPole
from trimtab.rl.envs.trading import BatchedTradingEnv

DEFAULT_OUT = Path(__file__).parent / "results" / "env_step.json"
SIZES = (1024, 16384, 131072)
ASSETS, FEATURES, DAYS, WINDOW = 3, 8, 512, 64


def market_bytes(n: int, dtype: torch.dtype, parts: bool) -> int:
    """``trimtab.kernels.market.launch_step``'s count, int64 actions."""
    s, a, af = torch.finfo(dtype).bits // 8, ASSETS, ASSETS * FEATURES
    reads = 8 * a + 3 * a * s + 2 * af * s + 24 + s
    writes = 2 * (af + a) * s + a * s + 16 + 3 * s + 2 + (a * s if parts else 0)
    return n * (reads + writes)


def cartpole_bytes(n: int, dtype: torch.dtype) -> int:
    """``trimtab.kernels.cartpole.launch_step``'s count, int64 actions."""
    return n * (170 if dtype == torch.float64 else 106)


def _market_env(n: int, device: torch.device, dtype: torch.dtype, impl: str) -> BatchedTradingEnv:
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((DAYS, ASSETS, FEATURES))
    pre, post = 0.01 * rng.standard_normal((2, DAYS, ASSETS))
    fills = Fills(pre, post, "next_open")
    return BatchedTradingEnv(feats, fills, n, WINDOW, device=device, dtype=dtype,
                             reward_parts=True, impl=impl)  # fmt: skip


def time_steps(step: Any, action: torch.Tensor, reps: int, device: torch.device) -> float:
    """Mean ms a step over ``reps`` steps in a row, after three to warm up (and compile)."""
    for _ in range(3):
        step(action)
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            step(action)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        step(action)
    return (time.perf_counter() - t0) * 1e3 / reps


def run(sizes: tuple[int, ...], reps: int, device: torch.device) -> list[dict[str, Any]]:
    impls = ("torch", "triton") if device.type == "cuda" else ("torch",)
    rows = []
    for n in sizes:
        for dtype in (torch.float32, torch.float64):
            for impl in impls:
                env = _market_env(n, device, dtype, impl)
                action = torch.randint(0, 3, (n, ASSETS), device=device)
                ms = time_steps(env.step, action, reps, device)
                rows.append({"env": "market", "impl": impl, "n_envs": n, "dtype": str(dtype),
                             "ms": ms, "bytes": market_bytes(n, dtype, True)})  # fmt: skip
                pole = BatchedCartPole(n, device, 0, dtype, impl=impl)
                pole.reset()
                action = torch.randint(0, 2, (n,), device=device)
                ms = time_steps(pole.step, action, reps, device)
                rows.append({"env": "cartpole", "impl": impl, "n_envs": n, "dtype": str(dtype),
                             "ms": ms, "bytes": cartpole_bytes(n, dtype)})  # fmt: skip
    for r in rows:
        r["env_steps_per_s"] = r["n_envs"] / (r["ms"] * 1e-3)
        r["gbps"] = r["bytes"] / (r["ms"] * 1e-3) / 1e9
        ref = next(x for x in rows if x["env"] == r["env"] and x["n_envs"] == r["n_envs"]
                   and x["dtype"] == r["dtype"] and x["impl"] == "torch")  # fmt: skip
        r["speedup_vs_torch"] = ref["ms"] / r["ms"]
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser(__doc__, DEFAULT_OUT, quick="64 envs, 5 steps", device="auto",
                              quick_writes=False)  # fmt: skip
    parser.add_argument("--reps", type=int, default=None, help="steps timed (default 200)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sizes = (64,) if args.quick else SIZES
    reps = args.reps or (5 if args.quick else 200)
    rows = run(sizes, reps, device)
    body = [(r["env"], r["impl"], f"{r['n_envs']:,}", r["dtype"].replace("torch.", ""),
             f"{r['ms']:.4f}", f"{r['env_steps_per_s']:.3g}", f"{r['gbps']:.3g}",
             f"{r['speedup_vs_torch']:.2f}x") for r in rows]  # fmt: skip
    print(markdown_table(["env", "step", "envs", "dtype", "ms", "env steps/s", "GB/s",
                          "vs torch"], body))  # fmt: skip
    report = {"benchmark": "env_step", **provenance(args.device), "device": args.device,
              "quick": args.quick, "reps": reps, "rows": rows}  # fmt: skip
    if args.out is not None:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
