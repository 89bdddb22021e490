"""Where a trainer gradient step's launches come from: device operations (non-view aten ops,
each a kernel launch on CUDA) and Triton launches, grouped by the trimtab function that issued
them, per stability mode. Explains the guard overhead of ``bench_trainer.py``.

    python benchmarks/experiments/profile_step.py [--device cuda] [--out PATH]
"""

from __future__ import annotations

import collections
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks
import bench_trainer
from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, write_json
from trimtab.rl.config import TrainConfig

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "profile_step.json"
_VIEWS = {"detach", "view", "unsqueeze", "squeeze", "select", "reshape", "t", "expand", "slice",
          "_unsafe_view", "as_strided", "alias", "permute", "transpose", "split", "unbind",
          "_reshape_alias", "chunk", "narrow", "unflatten", "flatten", "lift_fresh",
          "_local_scalar_dense", "is_nonzero"}  # fmt: skip


def _where() -> str:
    frames = [f for f in traceback.extract_stack() if "/trimtab/" in f.filename]
    frames = [f for f in frames if not f.filename.endswith(("rl/agent/dqn.py",))] or frames
    if not frames:
        return "autograd/other"

    def name(f: traceback.FrameSummary) -> str:
        return f"{f.filename.split('trimtab/')[-1]}:{f.name}"

    return name(frames[0]) if len(frames) == 1 else f"{name(frames[0])} > {name(frames[-1])}"


class _Count(TorchDispatchMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] not in _VIEWS:
            self.counts[_where()] += 1
        return func(*args, **(kwargs or {}))


def _warm(mode: str, device: torch.device) -> Callable[[], None]:
    """One gradient step of the default config in ``mode``, warmed up as bench_trainer does."""
    cfg = TrainConfig()
    # eager (cuda_graph off): the launches a captured step's graph holds, counted one by one
    run = replace(cfg.run, stability=mode, cuda_graph="off")
    m = bench_trainer.prepare(replace(cfg, run=run), device)
    learner, replay, gen = m["learner"], m["replay"], m["gen"]
    return lambda: learner.learn(replay.sample(cfg.agent.batch_size, gen), replay)


def profile(mode: str, device: torch.device) -> dict:
    step = _warm(mode, device)
    aten: collections.Counter = collections.Counter()
    trit: collections.Counter = collections.Counter()
    import triton.runtime.jit as tjit

    run = tjit.JITFunction.run

    def counted(self, *a, **k):
        trit[f"{_where()} [{self.fn.__name__}]"] += 1
        return run(self, *a, **k)

    tjit.JITFunction.run = counted
    try:
        with _Count(aten):
            step()
    finally:
        tjit.JITFunction.run = run
    return {
        "aten_ops": sum(aten.values()),
        "triton_launches": sum(trit.values()),
        "aten_by_site": dict(aten.most_common()),
        "triton_by_site": dict(trit.most_common()),
    }


def host_profile(mode: str, device: torch.device, steps: int = 60, top: int = 25) -> list:
    """cProfile of ``steps`` gradient steps (launches are asynchronous on CUDA, so this is the
    host's cost): the ``top`` functions by own time, as ``[file:function, calls, ms/step]``."""
    import cProfile
    import pstats

    step = _warm(mode, device)
    bench_trainer._sync(device)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    bench_trainer._sync(device)
    stats = pstats.Stats(prof).stats
    rows = []
    for (file, _, func), (_, calls, tottime, _, _) in stats.items():
        short = file.split("site-packages/")[-1].split("src/")[-1]
        rows.append([f"{short}:{func}", calls // steps, 1e3 * tottime / steps])
    rows.sort(key=lambda r: -r[2])
    return rows[:top]


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser(__doc__, DEFAULT_OUT, device="auto")
    parser.add_argument("--host", action="store_true", help="also cProfile the host's time")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(TrainConfig().run.threads)
    rows = {m: profile(m, device) for m in ("off", "fixed", "adaptive")}
    print(f"launches per gradient step on {device}\n")
    body = [(m, r["aten_ops"], r["triton_launches"]) for m, r in rows.items()]
    print(markdown_table(["stability", "device ops (aten)", "Triton launches"], body, "lrr"))
    print("\nadaptive, by site:")
    for k, v in list(rows["adaptive"]["aten_by_site"].items())[:25]:
        print(f"{v:6d}  {k}")
    for k, v in rows["adaptive"]["triton_by_site"].items():
        print(f"{v:6d}  {k}")
    result = {"benchmark": "profile_step", **provenance(device), "modes": rows}
    if args.host:
        result["host"] = {m: host_profile(m, device) for m in ("off", "adaptive")}
        for m, top in result["host"].items():
            print(f"\nhost time per step, {m} (own time, top functions):")
            for name, calls, ms in top:
                print(f"{ms:8.3f} ms {calls:5d} calls  {name}")
    write_json(args.out, result, indent=2)
    return result


if __name__ == "__main__":
    main()
