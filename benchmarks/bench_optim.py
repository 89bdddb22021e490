"""Step time of trimtab.optim.Adam (every feature on) against torch.optim.AdamW(fused=True) and
(foreach=True), for 1M, 10M and 100M float32 parameters split over about 50 tensors.

Target: trimtab <= 1.3x torch's fused AdamW. On CUDA each optimizer's step is captured in a
CUDA graph (torch's with capturable=True) and replayed; the median over replays, timed with
CUDA events, is reported. Bytes moved per step for AdamW: read w, g, m, v and write w, m, v,
28 bytes per float32 parameter (the GB/s column uses that count for every row).

    python benchmarks/bench_optim.py                 # H200: writes benchmarks/results/optim.json
    python benchmarks/bench_optim.py --quick --out /tmp/optim.json   # CPU, tiny sizes
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import trimtab.optim as topt
from trimtab.benchmarking import commit
from trimtab.lifecycle import detached

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
    if name == "fused":
        return torch.optim.AdamW(ps, lr=1e-3, fused=True, capturable=cuda)
    return torch.optim.AdamW(ps, lr=1e-3, foreach=True, capturable=cuda)


def time_cuda(opt, reps: int) -> list[float]:
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
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return times


def time_cpu(opt, reps: int) -> list[float]:
    opt.step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few reps (CPU smoke)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON path")
    parser.add_argument("--reps", type=int, default=None)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if cuda else "cpu")
    sizes = [10_000, 30_000] if args.quick else [1_000_000, 10_000_000, 100_000_000]
    reps = args.reps or (3 if args.quick else 100)
    names = ["trimtab", "fused", "foreach"] if cuda else ["trimtab", "foreach"]
    rows = []
    for total in sizes:
        for name in names:
            ps = make_params(total, device)
            opt = build(name, ps, cuda)
            times = time_cuda(opt, reps) if cuda else time_cpu(opt, reps)
            median = statistics.median(times)
            rows.append(
                dict(
                    params=sum(p.numel() for p in ps), tensors=len(ps), optimizer=name,
                    median_s=median, gbps=BYTES_PER_PARAM * total / median / 1e9,
                )
            )  # fmt: skip
            del opt, ps
    base = {r["params"]: r["median_s"] for r in rows if r["optimizer"] == names[1]}
    for r in rows:
        r["ratio_vs_" + names[1]] = r["median_s"] / base[r["params"]]
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
    out = args.out or Path(__file__).resolve().parent / "results" / "optim.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    ratio = "ratio_vs_" + names[1]
    print(f"| params | optimizer | median step (ms) | GB/s (28 B/param) | x {names[1]} |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['params']:,} | {r['optimizer']} | {r['median_s'] * 1e3:.3f} | "
            f"{r['gbps']:.0f} | {r[ratio]:.2f} |"
        )
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
