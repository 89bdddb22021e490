"""What one batched env step of a run costs the GPU: the kernels it launches (its captured
collection and learn graphs, and whatever runs eagerly around them) and their summed time, for
one run alone. With a population's wall time (``benchmarks/population.py``) this gives the rate
at which the device worked through the members' kernels, beside what one run alone reaches.

    python benchmarks/experiments/profile_member_step.py [--config examples/cartpole_fast.toml]
        [--skip 400] [--steps 100] [--out FILE --key NAME]

The run (``trimtab train``'s own loop, :func:`trimtab.rl.run.runner.train_steps`, on CUDA) is
stepped ``--skip`` batched env steps (past ``gym.learning_starts``, the warm-ups and the
captures), then ``--steps`` more under ``torch.profiler`` (the kernels of graph replays are
seen one by one), then closed as an interrupted run is. Also timed: the same number of steps
again without the profiler (wall seconds a step, after a synchronize), and as many again with
each graph launch timed alone on an idle device (the host's cost of a launch). Needs CUDA.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import benchmark_parser, invocation, provenance, save_record

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "cartpole_fast.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "profile_member_step.json"


def _config(path: Path, out: Path, sets: list[str]) -> Any:
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict, load_toml

    data = apply_overrides(load_toml(path), [*sets, 'run.device="cuda"', "run.progress=false",
                                             f'run.out="{out}"'])  # fmt: skip
    return from_dict(TrainConfig, data)


def kernels(prof: Any) -> tuple[int, float, Counter]:
    """Kernel launches, their summed µs, and launches by (shortened) name, of a profile."""
    n, us, names = 0, 0.0, Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy"):
            n += 1
            us += e.device_time if hasattr(e, "device_time") else e.cuda_time
            names[e.name[:80]] += 1
    return n, us, names


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from trimtab.rl.run.runner import train_steps

    p = benchmark_parser(__doc__, DEFAULT_OUT, quick="a few steps", key=True)
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--skip", type=int, default=400, help="batched env steps before profiling")
    p.add_argument("--steps", type=int, default=100, help="batched env steps profiled")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_member_step.py needs a CUDA device")
    skip, steps = (150, 10) if args.quick else (args.skip, args.steps)
    with tempfile.TemporaryDirectory(prefix="member-step-") as tmp:
        run = train_steps(_config(args.config, Path(tmp) / "run", args.sets))
        try:
            for _ in range(skip):
                next(run)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    next(run)
                torch.cuda.synchronize()
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
    n, us, names = kernels(prof)
    result = {
        "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT)
                      else args.config),
        "sets": args.sets, "skip": skip, "steps": steps,
        "kernels_per_step": n / steps,
        "kernel_us_per_step": us / steps,
        "wall_us_per_step": 1e6 * wall / steps,
        "graph_launches_per_step": len(launches) / steps,
        "launch_host_us": 1e6 * sum(launches) / max(len(launches), 1),
        "top": {k: v / steps for k, v in names.most_common(25)},
    }  # fmt: skip
    r = result
    print(
        f"{args.config.name}: {r['kernels_per_step']:.0f} kernels a batched env step, "
        f"{r['kernel_us_per_step']:.0f} µs of kernel time; {r['wall_us_per_step']:.0f} µs of "
        f"wall time a step (unprofiled)\n{r['graph_launches_per_step']:.1f} graph launches a "
        f"step, {r['launch_host_us']:.1f} µs of host time each (device idle)"
    )
    for k, v in names.most_common(25):
        print(f"  {v / steps:6.1f}  {k}")
    if args.out:
        record = {**provenance("cuda"), "command": invocation(__file__, argv), **result}
        save_record(args.out, args.key, record)
    return result


if __name__ == "__main__":
    main()
