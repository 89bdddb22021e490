"""Benchmark of trimtab.abs_quantile(s) against torch's ways of getting a quantile of |x|.

Prints a markdown table (ms, GB/s over one read of the input, relative error against the exact
order statistic) and writes JSON. ``--quick`` runs tiny sizes on the CPU (interpreter) so a test
keeps this script working; ``--sweep`` also times the kernel's tunables on the GPU (``SWEEP``:
bracket block and warps, sample stride/run/rows, bracket width Z, buffer capacity and pools,
radix blocks, fused or separate selects, and the forced fallback), with the path each tensor
took.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trimtab.benchmarking import benchmark_parser, commit, markdown_table, write_json

Q = 0.99
DEFAULT_OUT = Path(__file__).parent / "results" / "quantile.json"
TORCH_QUANTILE_MAX = 16_000_000  # torch.quantile refuses larger inputs
_LAST: list[object] = [None]


def _time_ms(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median time of ``fn`` in ms: CUDA events on the GPU, perf_counter on the CPU."""
    if device.type == "cuda":
        fn()  # warm-up: compile, cache pointer tables
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            _LAST[0] = fn()  # the interpreter is slow: keep the result instead of re-running
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` captured in a CUDA graph (after a warm-up on a side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _histc_two_pass(a: torch.Tensor, k: int) -> torch.Tensor:
    """A linear histogram over [0, max], then one over the chosen bin (syncs on the host)."""
    bins = 2048
    hi = a.max().item()
    c = torch.histc(a, bins, 0, hi).cumsum(0)
    b = int(torch.searchsorted(c, torch.tensor([float(k)], device=a.device)).item())
    lo_edge, width = b * hi / bins, hi / bins
    below = c[b - 1].item() if b > 0 else 0.0
    c2 = torch.histc(a, bins, lo_edge, lo_edge + width).cumsum(0) + below
    b2 = int(torch.searchsorted(c2, torch.tensor([float(k)], device=a.device)).item())
    return torch.tensor(lo_edge + (b2 + 0.5) * width / bins)


def _single_methods(x: torch.Tensor, k: int, impl: str) -> dict[str, Callable[[], torch.Tensor]]:
    import trimtab
    from trimtab.quantile import abs_quantile_reference

    n = x.numel()
    methods = {
        "trimtab": lambda: trimtab.abs_quantile(x, Q, impl=impl),
        "trimtab exact": lambda: trimtab.abs_quantile(x, Q, impl=impl, exact=True),
        "reference": lambda: abs_quantile_reference(x, Q)[0],
        "torch.kthvalue": lambda: x.abs().kthvalue(k).values,
        "torch.topk": lambda: x.abs().topk(n - k + 1).values[-1],
        "torch.sort": lambda: x.abs().sort().values[k - 1],
        "torch.histc x2": lambda: _histc_two_pass(x.abs(), k),
    }
    if n <= TORCH_QUANTILE_MAX:
        methods["torch.quantile"] = lambda: torch.quantile(x.abs(), Q, interpolation="higher")
    return methods


def _batch_methods(xs: list[torch.Tensor], ks: list[int], impl: str):
    import trimtab
    from trimtab.quantile import abs_quantiles_reference

    return {
        "trimtab": lambda: trimtab.abs_quantiles(xs, Q, impl=impl),
        "trimtab exact": lambda: trimtab.abs_quantiles(xs, Q, impl=impl, exact=True),
        "reference": lambda: abs_quantiles_reference(xs, Q)[0],
        "torch.kthvalue loop": lambda: torch.stack(
            [x.abs().reshape(-1).kthvalue(k).values for x, k in zip(xs, ks)]
        ),
        "torch.topk loop": lambda: torch.stack(
            [x.abs().reshape(-1).topk(x.numel() - k + 1).values[-1] for x, k in zip(xs, ks)]
        ),
    }


def _mlp_batch(total: int, device: torch.device, layers: int = 12) -> list[torch.Tensor]:
    """Parameters and gradients of an MLP (``4 * layers`` tensors) scaled to ``total`` floats."""
    widths = [1024, 4096, 4096, 2048, 2048, 1024, 512, 512, 256, 256, 128, 128, 64][: layers + 1]
    shapes = []
    for a, b in itertools.pairwise(widths):
        shapes += [(b, a), (b,)]
    scale = math.sqrt(total / 2 / sum(math.prod(s) for s in shapes))
    shapes = [tuple(max(1, round(d * scale)) for d in s) for s in shapes]
    params = [torch.randn(s, device=device) for s in shapes]
    return params + [p * 1e-3 for p in params]  # "gradients": another scale


def run(quick: bool, sweep: bool) -> dict:
    use_cuda = torch.cuda.is_available()  # --quick: tiny sizes, on the GPU where there is one
    device = torch.device("cuda" if use_cuda else "cpu")
    if not use_cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel module loads
    impl = "triton"
    reps = 20 if use_cuda else 1
    sizes = [1000, 4096] if quick else [4096, 1 << 20, 16 << 20, 100_000_000]
    batch_total = 20_000 if quick else 44_000_000
    torch.manual_seed(0)
    cases = [(f"{n:,}", [torch.randn(n, device=device)]) for n in sizes]
    batch = _mlp_batch(batch_total, device, layers=2 if quick else 12)
    cases.append((f"{len(batch)} tensors ({batch_total:,})", batch))
    rows = []
    for name, xs in cases:
        ks = [max(1, math.ceil(Q * x.numel())) for x in xs]
        exact = [x.abs().reshape(-1).float().kthvalue(k).values.item() for x, k in zip(xs, ks)]
        nbytes = sum(x.numel() * x.element_size() for x in xs)
        single = len(xs) == 1
        methods = _single_methods(xs[0], ks[0], impl) if single else _batch_methods(xs, ks, impl)
        if use_cuda:
            for key in ("trimtab", "trimtab exact"):
                methods[f"{key} (graph)"] = _graphed(methods[key])
        for method, fn in methods.items():
            ms = _time_ms(fn, device, reps)
            base = methods[method.removesuffix(" (graph)")]
            got = base() if use_cuda else _LAST[0]
            got = torch.as_tensor(got).reshape(-1).float().cpu().tolist()
            err = max(abs(g - e) / e if e else abs(g) for g, e in zip(got, exact))
            rows.append(
                {"case": name, "method": method, "elements": nbytes // xs[0].element_size(),
                 "tensors": len(xs), "ms": ms, "gb_per_s": nbytes / ms / 1e6, "rel_err": err}
            )  # fmt: skip
            print(
                f"{name:>24} {method:>24} {ms:9.4f} ms {nbytes / ms / 1e6:8.1f} GB/s err {err:.1e}"
            )
    result = {"rows": rows}
    if sweep and use_cuda:
        result["sweep"] = _sweep(cases, device, reps)
    return result


# One tunable (or a coupled pair) changed at a time from the defaults, so that one GPU call
# tells which settings matter; "fallback" rows send every tensor to the radix select over the
# whole tensor (a huge DIRECT_MAX), the fallback's passes, to time them and their tunables.
SWEEP: list[tuple[str, dict]] = [
    ("defaults", {}),
    *[(f"bracket {b}/{w}", {"BRACKET_BLOCK": b, "BRACKET_WARPS": w})
      for b, w in ((1024, 4), (2048, 4), (4096, 8), (4096, 16), (8192, 16))],
    ("bracket vector loads", {"BRACKET_VECTOR": True}),
    *[(f"sample stride {s}", {"SAMPLE_STRIDE": s}) for s in (16, 32, 128, 256)],
    *[(f"sample run {r}", {"SAMPLE_RUN": r}) for r in (8, 32)],
    *[(f"sample rows {r}", {"SAMPLE_ROWS": r}) for r in (64, 128, 512)],
    ("sample warps 4", {"SAMPLE_WARPS": 4}),
    *[(f"z {z}", {"Z": z}) for z in (4.0, 6.0)],
    *[(f"cap mult {c}", {"CAP_MULT": c}) for c in (2.0, 8.0)],
    *[(f"pools {p}", {"POOLS": p}) for p in (8, 64, 128)],
    *[(f"buf block {b}", {"BUF_BLOCK": b}) for b in (256, 512, 2048)],
    *[(f"programs/SM {p}", {"PROGRAMS_PER_SM": p}) for p in (2, 8)],
    ("direct max 8K", {"DIRECT_MAX": 1 << 13}),
    ("direct max 128K", {"DIRECT_MAX": 1 << 17}),
    ("unfused selects", {"FUSED": False}),
    ("fallback", {"DIRECT_MAX": 1 << 40}),
    *[(f"fallback radix {b}/{w}", {"DIRECT_MAX": 1 << 40, "BLOCK": b, "NUM_WARPS": w})
      for b, w in ((4096, 8), (4096, 16), (16384, 16))],
]  # fmt: skip


def _sweep(cases, device, reps) -> list[dict]:
    """Kernel tunables (module constants read at each call) against the large cases: graphed
    time, and how many tensors took each path (direct, buffer, answered, miss, overflow)."""
    import collections

    import trimtab
    import trimtab.kernels.quantile as kq

    names = {k for _, config in SWEEP for k in config}
    saved = {k: getattr(kq, k) for k in names}
    out = []
    try:
        for label, config in SWEEP:
            for k, v in {**saved, **config}.items():
                setattr(kq, k, v)
            for name, xs in cases[2:]:
                fn = _graphed(lambda xs=xs: trimtab.abs_quantiles(xs, Q))
                ms = _time_ms(fn, device, reps)
                flat = [x.reshape(-1) for x in xs]
                paths = dict(collections.Counter(kq.paths(kq.run(flat, Q)[1])))
                out.append({"case": name, "config": label, **config, "graph_ms": ms,
                            "paths": paths})  # fmt: skip
                print(f"sweep {name:>24} {label:>24}: {ms:.4f} ms (graph) {paths}")
    finally:
        for k, v in saved.items():
            setattr(kq, k, v)
    return out


def _markdown(rows: list[dict]) -> str:
    body = [(r["case"], r["method"], f"{r['ms']:.4f}", f"{r['gb_per_s']:.1f}",
             f"{r['rel_err']:.1e}") for r in rows]  # fmt: skip
    return markdown_table(["case", "method", "ms", "GB/s", "rel. error"], body, "llrrr")


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser(__doc__, DEFAULT_OUT, quick="tiny sizes (interpreter without CUDA)")
    parser.add_argument("--sweep", action="store_true", help="also time kernel tunables (GPU)")
    args = parser.parse_args(argv)
    result = run(args.quick, args.sweep)
    import triton

    cuda = torch.cuda.is_available()
    result.update(
        device=torch.cuda.get_device_name() if cuda else "cpu (TRITON_INTERPRET)",
        torch=torch.__version__,
        triton=triton.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=commit(),
        q=Q,
        bytes_counted="elements * itemsize, one read of the input",
    )
    print(_markdown(result["rows"]))
    write_json(args.out, result, indent=2)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
