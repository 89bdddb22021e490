"""Sweep the sentinel check kernel's launch constants on the GPU (a tuning aid, not a benchmark
of record): prints ms per (block, tile, warps) on the bench_sentinel workload."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sentinel as bench
from trimtab import Rule, Sentinel
from trimtab.kernels import sentinel as ks


def main() -> None:
    ts = bench.make_tensors(1, torch.device("cuda"))
    nbytes = sum(t.numel() * t.element_size() for t in ts)
    bound = torch.ones((), device="cuda")
    rows = []
    for block, tile, warps in itertools.product(
        (8192, 16384, 32768), (2048, 4096, 8192), (4, 8, 16)
    ):
        if tile > block:
            continue
        ks.CHECK_BLOCK, ks.CHECK_TILE, ks.CHECK_WARPS = block, tile, warps
        s = Sentinel("cuda")
        for i, t in enumerate(ts):
            s.add(f"t{i}", t, Rule.above(bound, factor=4.0, name="b"), phase="p")
        ms = bench.time_cuda_graph(lambda s=s: s.check("p"), 100)
        rows.append((ms, block, tile, warps))
        print(
            f"block={block:6d} tile={tile:5d} warps={warps:2d}: {ms:.4f} ms "
            f"{nbytes / ms / 1e6:.0f} GB/s",
            flush=True,
        )
    print("best:", min(rows))


if __name__ == "__main__":
    main()
