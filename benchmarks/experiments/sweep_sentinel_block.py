"""Sentinel.check's time on bench_sentinel.py's 48 tensors (44.1M floats) for several kernel
shapes (elements per program, elements per load, warps), beside one read of the same bytes as
one tensor (``torch.amax``) and ``_foreach_norm(inf)``, all in one process:

    python benchmarks/experiments/sweep_sentinel_block.py [--out FILE]

Each shape compiles its own variant of the check kernel (a few seconds each).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_sentinel import make_tensors, time_cuda_graph
from trimtab import Sentinel
from trimtab.benchmarking import benchmark_parser, provenance, write_json
from trimtab.kernels import sentinel as ks
from trimtab.sentinel import Rule

SHAPES = [(16384, 2048, 4), (16384, 2048, 8), (16384, 1024, 4), (8192, 1024, 4), (8192, 2048, 4),
          (32768, 4096, 8), (16384, 4096, 8), (4096, 1024, 4), (8192, 1024, 8)]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = benchmark_parser(__doc__, None, out_help="a JSON file for the times").parse_args(argv)
    dev = torch.device("cuda")
    ts = make_tensors(1, dev)
    nbytes = sum(t.numel() * 4 for t in ts)
    one = torch.cat([t.reshape(-1) for t in ts])
    rows = {"amax of one tensor (one read)": time_cuda_graph(lambda: torch.amax(one), 200),
            "_foreach_norm(ts, inf)": time_cuda_graph(
                lambda: torch._foreach_norm(ts, float("inf")), 200)}  # fmt: skip
    bound = torch.tensor([1e6], device=dev)
    for block, tile, warps in SHAPES:
        ks.CHECK_BLOCK, ks.CHECK_TILE, ks.CHECK_WARPS = block, tile, warps
        s = Sentinel(dev, impl="triton")
        for i, t in enumerate(ts):
            s.add(f"t{i}", t, Rule.above(bound, factor=4.0), phase="bench")
        rows[f"check block {block} tile {tile} warps {warps}"] = time_cuda_graph(
            lambda s=s: s.check("bench"), 200
        )
        assert not s.report()
    for name, ms in rows.items():
        print(f"{name:45} {ms:.4f} ms  {nbytes / ms / 1e6:7.0f} GB/s", flush=True)
    if args.out is not None:
        write_json(args.out, {**provenance("cuda"), "ms": rows, "bytes": nbytes})


if __name__ == "__main__":
    main()
