"""Where the captured learn step's GPU time goes: the kernels of one replay of its CUDA graph,
by name, per stability mode (what ``bench_trainer.py``'s captured rows are made of).

    python benchmarks/experiments/profile_graph.py [--modes off adaptive] [--replays 20] \\
        [--out PATH]

Each mode's learner is built and captured as ``bench_trainer.py`` does (the default config,
``run.cuda_graph = "on"``); its graph is replayed under ``torch.profiler`` and the GPU kernels
are summed by name (time and launches per replay). A second table does the same for the step
run eagerly, as a cross-check where the profiler cannot see into a graph. Needs CUDA.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks
import bench_trainer
from trimtab.benchmarking import (
    benchmark_parser,
    invocation,
    kernel_census,
    provenance,
    save_record,
)
from trimtab.rl.config import TrainConfig

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "profile_graph_h200.json"


def _kernels(prof: Any, n: int) -> dict[str, dict[str, float]]:
    """GPU kernels and copies of a profile, by name: µs and launches per replay (of ``n``)."""
    census = kernel_census(prof, n, copies=True)
    return {k: {"us": us, "launches": census["by_name"][k]}
            for k, us in census["us_by_name"].items()}  # fmt: skip


def profile(fn: Any, n: int) -> dict[str, dict[str, float]]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return _kernels(prof, n)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, key=True)
    p.add_argument("--modes", nargs="+", default=["off", "fixed", "adaptive"])
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_graph.py profiles a CUDA graph: it needs a CUDA device")
    device = torch.device("cuda")
    base = TrainConfig()
    torch.set_num_threads(base.run.threads)
    record: dict[str, Any] = {**provenance(device), "replays": args.replays, "modes": {}}
    for mode in args.modes:
        out: dict[str, Any] = {}
        for graph in ("on", "off"):
            cfg = bench_trainer.mode_config(base, mode, device, graph)
            m = bench_trainer.prepare(cfg, device)
            learner = m["learner"]
            if graph == "on":
                g = learner.sampled_graph.graph
                kern = profile(g.replay, args.replays)
            else:
                step = functools.partial(learner.learn_from, m["replay"], m["gen"],
                                         cfg.agent.batch_size)  # fmt: skip
                kern = profile(step, args.replays)
            total = sum(k["us"] for k in kern.values())
            launches = sum(k["launches"] for k in kern.values())
            label = "graph" if graph == "on" else "eager"
            out[label] = {"kernel_us": total, "launches": launches,
                          "top": dict(list(kern.items())[: args.top])}  # fmt: skip
            print(
                f"== {mode} {label}: {launches:.0f} kernels, {total:.0f} us of kernel time per step"
            )
            for name, k in list(kern.items())[: args.top]:
                print(f"  {k['us']:8.1f} us  {k['launches']:5.1f}x  {name}")
        record["modes"][mode] = out
    record["command"] = invocation(__file__, argv)
    save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
