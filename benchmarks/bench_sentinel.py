"""Cost of one Sentinel.check over an MLP's 48 weight and gradient tensors (44.1M floats), against
the usual PyTorch ways of finding a non-finite value.

Usage: ``python benchmarks/bench_sentinel.py [--quick] [--out PATH] [--device DEVICE]``

Every method is captured in a CUDA graph and timed by replay (CUDA events, median of many, L2
flushed before each replay), so launch overhead is what a captured training step would pay. The
sentinel applies the threshold rule (non-finite, or max|x| > 4 × a state-vector-like slot) to
every tensor. GB/s counts each method as reading every tensor once (176 MB at full size);
``_amp_foreach_non_finite_check_and_unscale_`` also writes them back (× 1.0), which it is not
credited for. Target on an H200: ≤ 0.055 ms (reading 176 MB once at 4.2 TB/s takes 0.042 ms).
``--quick`` shrinks every tensor 64× and times the functions directly (CPU-friendly).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trimtab import Sentinel
from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, write_json
from trimtab.sentinel import Rule

DEFAULT_OUT = Path(__file__).parent / "results" / "sentinel.json"
TARGET_MS = 0.055
#: (fan_in, fan_out) of 12 linear layers: weight + bias, as parameters and gradients = 48 tensors,
#: 2 * 22,048,179 = 44.1M floats.
LAYERS = (
    (288, 2048), (2048, 2048), (2048, 2048), (2048, 1408), (1408, 1536), (1536, 1536),
    (1536, 1536), (1536, 1024), (1024, 1024), (1024, 512), (512, 256), (256, 51),
)  # fmt: skip


def make_tensors(shrink: int, device: torch.device) -> list[torch.Tensor]:
    """The 48 float32 tensors: per layer weight, bias, weight grad, bias grad (finite, ~N(0,1))."""
    gen = torch.Generator(device=device).manual_seed(0)
    out = []
    for fan_in, fan_out in LAYERS:
        for numel in (fan_in * fan_out // shrink, fan_out):
            for _ in range(2):
                out.append(torch.randn(max(1, numel), generator=gen, device=device))
    return out


def methods(ts: list[torch.Tensor]) -> dict[str, tuple[Callable[[], object], Sentinel | None]]:
    """name -> (the check to time, the sentinel it uses if any)."""
    device = ts[0].device
    bound = torch.tensor([1e6], device=device)  # a state-vector slot; nothing exceeds 4e6
    sentinels = {}
    impls = ("triton", "torch") if device.type == "cuda" else ("torch",)
    for impl in impls:
        s = Sentinel(device, impl=impl)
        for i, t in enumerate(ts):
            s.add(f"t{i}", t, Rule.above(bound, factor=4.0, name="bound"), phase="bench")
        sentinels[impl] = s
    found_inf = torch.zeros(1, device=device)
    inv_scale = torch.ones(1, device=device)
    out: dict[str, tuple[Callable[[], object], Sentinel | None]] = {}
    for impl, s in sentinels.items():
        out[f"Sentinel.check [{impl}]"] = (lambda s=s: s.check("bench"), s)
    out["isfinite().all() per tensor"] = (lambda: [t.isfinite().all() for t in ts], None)
    if device.type == "cuda":
        out["_amp_foreach_non_finite_check_and_unscale_"] = (
            lambda: torch._amp_foreach_non_finite_check_and_unscale_(ts, found_inf, inv_scale),
            None,
        )
    out["_foreach_norm(ts, inf)"] = (lambda: torch._foreach_norm(ts, float("inf")), None)
    return out


def time_cuda_graph(fn: Callable[[], object], reps: int) -> float:
    """Median ms of ``reps`` replays of ``fn`` captured in a CUDA graph, L2 flushed before each."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: kernels compiled, pointer tables built
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    # Evict L2 by *reading* 256 MB: a write (zero_) would leave ~60 MB of dirty lines whose
    # write-back lands inside the timed region.
    flush = torch.ones(64 * 2**20, dtype=torch.float32, device="cuda")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.sum()
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_direct(fn: Callable[[], object], reps: int) -> float:
    """Median ms of ``reps`` direct calls (CPU)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(shrink: int, reps: int, device: torch.device) -> tuple[dict[str, dict[str, float]], int]:
    ts = make_tensors(shrink, device)
    nbytes = sum(t.numel() * t.element_size() for t in ts)
    results = {}
    for name, (fn, sentinel) in methods(ts).items():
        ms = time_cuda_graph(fn, reps) if device.type == "cuda" else time_direct(fn, reps)
        results[name] = {"ms": ms, "gbps": nbytes / (ms * 1e-3) / 1e9}
        if sentinel is not None:  # sanity: quiet on finite data, names an injected NaN
            assert not sentinel.report(), f"{name} fired on finite data: {sentinel.report()}"
            ts[17][5] = float("nan")
            sentinel.check("bench")
            first = sentinel.report()[0]
            assert (first.name, first.kind) == ("t17", "nan"), first
            ts[17][5] = 0.0
            sentinel.reset()
    return results, nbytes


def markdown(results: dict[str, dict[str, float]], nbytes: int) -> str:
    body = [(name, f"{r['ms']:.4f}", f"{r['gbps']:.4g}") for name, r in results.items()]
    return markdown_table([f"method ({nbytes / 1e6:.0f} MB read)", "ms", "GB/s"], body)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = benchmark_parser(
        __doc__, DEFAULT_OUT, quick="tensors 64x smaller, 5 reps", device="auto"
    )
    parser.add_argument("--reps", type=int, default=None, help="timed replays (default 200)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    shrink = 64 if args.quick else 1
    reps = args.reps or (5 if args.quick else 200)
    results, nbytes = run(shrink, reps, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    print(f"Sentinel.check vs PyTorch non-finite checks: 48 tensors, {nbytes / 4e6:.1f}M floats")
    print(f"device: {name}; target for Sentinel.check: <= {TARGET_MS} ms at full size\n")
    print(markdown(results, nbytes))
    report: dict[str, object] = {
        "benchmark": "sentinel",
        **provenance(args.device),
        "device": args.device,
        "quick": args.quick,
        "tensors": 48,
        "bytes": nbytes,
        "reps": reps,
        "target_ms": TARGET_MS,
        "results": results,
    }
    write_json(args.out, report, indent=2)
    return report


if __name__ == "__main__":
    main()
