"""Step time of trimtab.optim.Adam against torch.optim.AdamW(fused=True) and (foreach=True), for
1M, 10M and 100M float32 parameters split over about 50 tensors.

Rows: ``trimtab`` (every default feature on: weight clamp, adaptive decay, the statistics
oracle), ``trimtab-nostats`` (weight_decay fixed, weight_clamp off: the bare update, so the
oracle's cost is the difference), ``fused``, ``foreach``. Target: trimtab <= 1.3x fused AdamW.
On CUDA every row is timed twice: ``graph`` (the step captured in a CUDA graph, torch's with
capturable=True, and replayed) and ``eager`` (``opt.step()`` called from Python); each is the
median over many steps, each step timed with CUDA events. Bytes moved per step for AdamW: read
w, g, m, v and write w, m, v, 28 bytes per float32 parameter (the GB/s column uses that count
for every row).

    python benchmarks/bench_optim.py                 # H200: writes benchmarks/results/optim.json
    python benchmarks/bench_optim.py --quick --out /tmp/optim.json   # CPU, tiny sizes
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from pathlib import Path

import torch

import trimtab.optim as topt
from trimtab.benchmarking import benchmark_parser, commit, markdown_table, write_json
from trimtab.lifecycle import detached

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "optim.json"
BYTES_PER_PARAM = 28
NUM_TENSORS = 50


def make_params(total: int, device: torch.device) -> list[torch.Tensor]:
    """About NUM_TENSORS tensors: matrices of varied sizes and a few biases, ``total`` floats."""
    sizes = [max(1, int(total * w)) for w in torch.linspace(0.5, 1.5, NUM_TENSORS).tolist()]
    scale = total / sum(sizes)
    sizes = [max(1, int(s * scale)) for s in sizes]
    g = torch.Generator(device="cpu").manual_seed(0)
    ps = [(0.05 * torch.randn(n, generator=g)).to(device).requires_grad_() for n in sizes]
    for p in ps:
        p.grad = 0.01 * torch.randn(p.shape, generator=g).to(device)
    return ps


def build(name: str, ps: list[torch.Tensor], cuda: bool):
    if name == "trimtab":
        with detached():
            return topt.Adam(ps, lr=1e-3, capturable=cuda)  # every feature on by default
    if name == "trimtab-nostats":
        with detached():
            return topt.Adam(ps, lr=1e-3, weight_decay=0.01, weight_clamp=False, capturable=cuda)
    if name == "fused":
        return torch.optim.AdamW(ps, lr=1e-3, fused=True, capturable=cuda)
    return torch.optim.AdamW(ps, lr=1e-3, foreach=True, capturable=cuda)


def _event_times(fn, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return times


def time_eager(opt, reps: int) -> list[float]:
    for _ in range(3):
        opt.step()
    torch.cuda.synchronize()
    return _event_times(opt.step, reps)


def time_graph(opt, reps: int) -> list[float]:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for _ in range(3):
        graph.replay()
    return _event_times(graph.replay, reps)


def time_cpu(opt, reps: int) -> list[float]:
    opt.step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser(__doc__, DEFAULT_OUT, quick="tiny sizes, few reps (CPU smoke)")
    parser.add_argument("--reps", type=int, default=None)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if cuda else "cpu")
    sizes = [10_000, 30_000] if args.quick else [1_000_000, 10_000_000, 100_000_000]
    reps = args.reps or (3 if args.quick else 200)
    names = ["trimtab", "trimtab-nostats", "fused", "foreach"]
    if not cuda:
        names.remove("fused")  # fused AdamW needs a GPU
    modes = ["graph", "eager"] if cuda else ["eager"]
    base = "fused" if cuda else "foreach"
    rows = []
    for total in sizes:
        for mode in modes:
            for name in names:
                ps = make_params(total, device)
                opt = build(name, ps, cuda)
                if not cuda:
                    times = time_cpu(opt, reps)
                else:
                    times = time_graph(opt, reps) if mode == "graph" else time_eager(opt, reps)
                median = statistics.median(times)
                rows.append(
                    dict(
                        params=sum(p.numel() for p in ps), tensors=len(ps), optimizer=name,
                        mode=mode, median_s=median, gbps=BYTES_PER_PARAM * total / median / 1e9,
                    )
                )  # fmt: skip
                del opt, ps
    ref_time = {(r["params"], r["mode"]): r["median_s"] for r in rows if r["optimizer"] == base}
    for r in rows:
        r["ratio_vs_" + base] = r["median_s"] / ref_time[(r["params"], r["mode"])]
    result = dict(
        benchmark="optim",
        device=torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        torch=torch.__version__,
        triton=_triton_version(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=commit(),
        quick=args.quick,
        graphs=cuda,
        rows=rows,
    )
    out = args.out
    write_json(out, result, indent=2)
    ratio = "ratio_vs_" + base
    header = ["params", "mode", "optimizer", "median step (ms)", "GB/s (28 B/param)", f"x {base}"]
    body = [(f"{r['params']:,}", r["mode"], r["optimizer"], f"{r['median_s'] * 1e3:.3f}",
             f"{r['gbps']:.0f}", f"{r[ratio]:.2f}") for r in rows]  # fmt: skip
    print(markdown_table(header, body, "rllrrr"))
    print(f"\nwrote {out}")
    return result


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


if __name__ == "__main__":
    main()
