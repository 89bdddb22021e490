"""What one batched env step of a run costs the GPU: the kernels it launches (its captured
collection and learn graphs, and whatever runs eagerly around them) and their summed time, for
one run alone. With a population's wall time (``benchmarks/population.py``) this gives the rate
at which the device worked through the members' kernels, beside what one run alone reaches.

    python benchmarks/experiments/profile_member_step.py [--config examples/cartpole_fast.toml]
        [--skip 400] [--steps 100] [--census] [--set KEY=VALUE ...] [--out FILE --key NAME]

The run (``trimtab train``'s own loop, :func:`trimtab.rl.run.runner.train_steps`, on CUDA) is
stepped ``--skip`` batched env steps (past ``gym.learning_starts``, the warm-ups and the
captures), then ``--steps`` more under ``torch.profiler`` (the kernels of graph replays are
seen one by one), then closed as an interrupted run is. Also timed: the same number of steps
again without the profiler (wall seconds a step, after a synchronize), and as many again with
each graph launch timed alone on an idle device (the host's cost of a launch). Needs CUDA.

``--census``: where the kernels come from. The steps run eagerly (``run.cuda_graph = 'off'``:
the same operators, each seen with the Python stack that called it) and every kernel is counted
at the line of the learn step, the collection or the loop it came from, and at the innermost
line of trimtab that launched it (:func:`trimtab.benchmarking.labelled_ops`); no timing.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import (
    benchmark_parser,
    invocation,
    kernel_census,
    labelled_ops,
    provenance,
    save_record,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "cartpole_fast.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "profile_member_step.json"


def _config(path: Path, out: Path, sets: list[str]) -> Any:
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict, load_toml

    data = apply_overrides(load_toml(path), [*sets, 'run.device="cuda"', "run.progress=false",
                                             f'run.out="{out}"'])  # fmt: skip
    return from_dict(TrainConfig, data)


@contextlib.contextmanager
def idle_launches() -> Iterator[list[float]]:
    """The host seconds of each ``CUDAGraph.replay`` call in the block, each made with the
    device idle (a synchronize before it), so that a launch never waits for a full queue: what
    launching a captured graph costs the host by itself."""
    replay = torch.cuda.CUDAGraph.replay
    seconds: list[float] = []

    def timed(graph: torch.cuda.CUDAGraph) -> None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        replay(graph)
        seconds.append(time.perf_counter() - t0)

    torch.cuda.CUDAGraph.replay = timed  # type: ignore[method-assign]
    try:
        yield seconds
    finally:
        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]


#: the functions whose lines a census groups kernels by: the learn step, collection, the loop
PHASES = ("guarded_step", "collect", "_train_fold")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from trimtab.rl.run.runner import train_steps

    p = benchmark_parser(__doc__, DEFAULT_OUT, quick="a few steps", key=True)
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--skip", type=int, default=400, help="batched env steps before profiling")
    p.add_argument("--steps", type=int, default=100, help="batched env steps profiled")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--census", action="store_true",
                   help="eager steps (run.cuda_graph = 'off'), each kernel counted at the source "
                        "that launched it; no timing")  # fmt: skip
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_member_step.py needs a CUDA device")
    skip, steps = (150, 10) if args.quick else (args.skip, args.steps)
    sets = [*args.sets, 'run.cuda_graph="off"'] if args.census else args.sets
    with tempfile.TemporaryDirectory(prefix="member-step-") as tmp:
        run = train_steps(_config(args.config, Path(tmp) / "run", sets))
        try:
            for _ in range(skip):
                next(run)
            torch.cuda.synchronize()
            labels = labelled_ops(PHASES) if args.census else contextlib.nullcontext()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                with labels:
                    for _ in range(steps):
                        next(run)
                torch.cuda.synchronize()
            census = kernel_census(prof, steps)
            wall, launches = math.nan, []
            if not args.census:
                t0 = time.perf_counter()
                for _ in range(steps):
                    next(run)
                torch.cuda.synchronize()
                wall = time.perf_counter() - t0
                with idle_launches() as launches:
                    for _ in range(steps):
                        next(run)
        finally:
            run.close()
    result: dict[str, Any] = {
        "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT)
                      else args.config),
        "sets": sets, "skip": skip, "steps": steps,
        "kernels_per_step": census["kernels"],
        "kernel_us_per_step": census["kernel_us"],
        "top": dict(list(census["by_name"].items())[:25]),
    }  # fmt: skip
    r = result
    print(f"{args.config.name}: {r['kernels_per_step']:.0f} kernels a batched env step, "
          f"{r['kernel_us_per_step']:.0f} µs of kernel time")  # fmt: skip
    if args.census:
        result["by_phase"] = census["by_phase"]
        result["by_source"] = census["by_source"]
        for title, counts in (("by line of the step", census["by_phase"]),
                              ("by trimtab line", census["by_source"])):  # fmt: skip
            print(title)
            for k, v in counts.items():
                print(f"  {v:6.1f}  {k}")
    else:
        result["wall_us_per_step"] = 1e6 * wall / steps
        result["graph_launches_per_step"] = len(launches) / steps
        result["launch_host_us"] = 1e6 * sum(launches) / max(len(launches), 1)
        print(f"{r['wall_us_per_step']:.0f} µs of wall time a step (unprofiled)\n"
              f"{r['graph_launches_per_step']:.1f} graph launches a step, "
              f"{r['launch_host_us']:.1f} µs of host time each (device idle)")  # fmt: skip
        for k, v in result["top"].items():
            print(f"  {v:6.1f}  {k}")
    if args.out:
        record = {**provenance("cuda"), "command": invocation(__file__, argv), **result}
        save_record(args.out, args.key, record)
    return result


if __name__ == "__main__":
    main()
