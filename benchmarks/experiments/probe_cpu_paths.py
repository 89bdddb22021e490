"""Where the adaptive CPU step's time goes, and what two ways out would buy: the estimator's fold
(eager, TorchScript as the CPU path runs it, and ``torch.compile``) and Adam's step (time, aten
ops, the Python between them; compiled whole with ``--compile``).

    python benchmarks/experiments/probe_cpu_paths.py [--compile] [--out PATH] [--key NAME]

CPU only, one thread. ``--compile`` needs a C++ compiler (inductor's CPU backend) and takes about
a minute: it times ``torch.compile`` of ``ema_fold.fold_reference`` and of the multi-tensor Adam
group step, neither of which trimtab uses (compiled code is not the reference bit for bit, and
design invariant 6 makes the reference the CPU path).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks
import bench_trainer
from trimtab._script import scripted
from trimtab.benchmarking import benchmark_parser, invocation, provenance, save_record
from trimtab.ema_fold import fold_reference as _fold_reference
from trimtab.estimate import AdaptiveEMA
from trimtab.optim import _multi_tensor as mt
from trimtab.rl.config import TrainConfig

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "probe_cpu_paths.json"


def _per_call_us(fn: Any, n: int, rounds: int = 5) -> float:
    """The median over ``rounds`` of the mean wall time of ``n`` calls, in microseconds."""
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def fold_paths(compile_too: bool) -> dict[str, Any]:
    """One ``update_log`` fold of 3 slots (two observed), each way."""
    ema = AdaptiveEMA(3, device="cpu")
    obs = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([True, True, False])
    g = torch.Generator().manual_seed(0)

    def args() -> tuple[Any, ...]:
        o = obs * (1.0 + 0.01 * torch.rand(3, generator=g))
        return (ema._t, ema._rows, ema._bank, ema._q_level, ema._q_slope, o, mask, True)

    script = scripted(_fold_reference)
    for _ in range(20):
        script(*args())
    out: dict[str, Any] = {
        "slots": 3,
        "eager_us": _per_call_us(lambda: _fold_reference(*args()), 200),
        "torchscript_us": _per_call_us(lambda: script(*args()), 400),
    }
    if compile_too:
        t0 = time.perf_counter()
        compiled = torch.compile(_fold_reference, dynamic=False, fullgraph=True)
        for _ in range(3):
            compiled(*args())
        out["compile_s"] = time.perf_counter() - t0
        out["compiled_us"] = _per_call_us(lambda: compiled(*args()), 400)
    return out


def adam_step(compile_too: bool) -> dict[str, Any]:
    """The default config's adaptive learner: its optimizer's step alone, timed, and its aten ops
    and Python time under ``torch.profiler``; ``off``'s torch Adam step beside it."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device("cpu")
    cfg = bench_trainer.mode_config(TrainConfig(), "adaptive", device, "off")
    opt = bench_trainer.prepare(cfg, device)["learner"].agent.optimizer
    for _ in range(5):
        opt.step()
    out: dict[str, Any] = {
        "params": [sum(p.numel() for p in g["params"]) for g in opt.param_groups],
        "step_ms": _per_call_us(opt.step, 50) / 1e3,
    }
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            opt.step()
    events = prof.key_averages()
    out["aten_ops_per_step"] = sum(e.count for e in events if e.key.startswith("aten::")) / 20
    step = [e for e in events if e.key.startswith("Optimizer.step#")]
    out["python_between_ops_ms"] = step[0].self_cpu_time_total / 20 / 1e3 if step else None
    off = bench_trainer.mode_config(TrainConfig(), "off", device, "off")
    torch_adam = bench_trainer.prepare(off, device)["learner"].agent.optimizer
    for _ in range(5):
        torch_adam.step()
    out["off_torch_adam_step_ms"] = _per_call_us(torch_adam.step, 50) / 1e3
    if compile_too:
        plain = mt.adam_group_step_multi_tensor
        mt.adam_group_step_multi_tensor = torch.compile(plain, dynamic=False)
        try:
            t0 = time.perf_counter()
            for _ in range(3):
                opt.step()
            out["compile_s"] = time.perf_counter() - t0
            out["compiled_step_ms"] = _per_call_us(opt.step, 50) / 1e3
        finally:
            mt.adam_group_step_multi_tensor = plain
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, key=True)
    p.add_argument("--compile", action="store_true", help="also time torch.compile (slow)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    record = {**provenance("cpu"), "fold": fold_paths(args.compile),
              "adam": adam_step(args.compile),
              "command": invocation(__file__, argv)}  # fmt: skip
    f, a = record["fold"], record["adam"]
    print(f"fold of 3 slots: eager {f['eager_us']:.0f} us, TorchScript {f['torchscript_us']:.0f} us"
          + (f", compiled {f['compiled_us']:.0f} us ({f['compile_s']:.1f} s to compile)"
             if "compiled_us" in f else ""))  # fmt: skip
    print(f"Adam step (default config, adaptive): {a['step_ms']:.2f} ms (off's torch Adam "
          f"{a['off_torch_adam_step_ms']:.2f} ms), "
          f"{a['aten_ops_per_step']:.0f} aten ops, {a['python_between_ops_ms']:.2f} ms of Python"
          + (f"; compiled group step {a['compiled_step_ms']:.2f} ms ({a['compile_s']:.1f} s)"
             if "compiled_step_ms" in a else ""))  # fmt: skip
    save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
