# ruff: noqa: B023, E501  (a throwaway probe: lambdas are called inside their loop iteration)
"""Probe: which block-histogram strategy is fast on this GPU's Triton (a tuning aid).

Times one pass over 100M float32 building a histogram of the top bits of |x|, by strategy and
bin count, on normal data and on constant data (worst-case contention)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _hist_tl(
    x_ptr,
    out_ptr,
    n,
    SHIFT: tl.constexpr,
    BINS: tl.constexpr,
    BLOCK: tl.constexpr,
    ITERS: tl.constexpr,
):
    pid = tl.program_id(0)
    acc = tl.zeros([BINS], dtype=tl.int32)
    for i in range(ITERS):
        offs = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        b = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        acc += tl.histogram(tl.where(m, b >> SHIFT, 0), BINS)
    r = tl.arange(0, BINS)
    tl.atomic_add(out_ptr + r, acc, mask=acc != 0, sem="relaxed")


@triton.jit
def _hist_atomic(
    x_ptr,
    out_ptr,
    n,
    SHIFT: tl.constexpr,
    BINS: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    row = pid % ROWS
    tl.atomic_add(out_ptr + row * BINS + (b >> SHIFT), 1, mask=m, sem="relaxed")


@triton.jit
def _hist_onehot(
    x_ptr,
    out_ptr,
    n,
    SHIFT: tl.constexpr,
    BINS: tl.constexpr,
    BLOCK: tl.constexpr,
    ITERS: tl.constexpr,
):
    pid = tl.program_id(0)
    acc = tl.zeros([BINS], dtype=tl.int32)
    r = tl.arange(0, BINS)
    for i in range(ITERS):
        offs = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        b = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        bb = tl.where(m, b >> SHIFT, -1)
        acc += tl.sum((bb[:, None] == r[None, :]).to(tl.int32), axis=0)
    tl.atomic_add(out_ptr + r, acc, mask=acc != 0, sem="relaxed")


@triton.jit
def _read_only(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_max(out_ptr, tl.max(tl.abs(x), axis=0).to(tl.int32, bitcast=True))


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    n = 100_000_000
    data = {"normal": torch.randn(n, device="cuda"), "const": torch.full((n,), 1.5, device="cuda")}
    out = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    print(
        f"read-only max: {bench(lambda: _read_only[(triton.cdiv(n, 8192),)](data['normal'], out, n, BLOCK=8192, num_warps=8)):.3f} ms"
    )
    for dname, x in data.items():
        for bins, shift in ((256, 23), (2048, 20)):
            for block, warps, iters in ((1024, 4, 8), (2048, 8, 8), (4096, 8, 4), (8192, 16, 4)):
                grid = (triton.cdiv(n, block * iters),)
                ms = bench(
                    lambda: _hist_tl[grid](
                        x, out, n, SHIFT=shift, BINS=bins, BLOCK=block, ITERS=iters, num_warps=warps
                    )
                )
                print(
                    f"{dname:6s} tl.histogram bins={bins:5d} block={block:5d} warps={warps:2d}: {ms:.3f} ms",
                    flush=True,
                )
            for rows in (1, 64, 1024):
                if rows * bins > out.numel():
                    continue
                ms = bench(
                    lambda: _hist_atomic[(triton.cdiv(n, 4096),)](
                        x, out, n, SHIFT=shift, BINS=bins, BLOCK=4096, ROWS=rows, num_warps=8
                    )
                )
                print(
                    f"{dname:6s} global atomics bins={bins:5d} rows={rows:5d}: {ms:.3f} ms",
                    flush=True,
                )
            if bins <= 256:
                ms = bench(
                    lambda: _hist_onehot[(triton.cdiv(n, 256 * 16),)](
                        x, out, n, SHIFT=shift, BINS=bins, BLOCK=256, ITERS=16, num_warps=8
                    )
                )
                print(f"{dname:6s} one-hot sum bins={bins:5d}: {ms:.3f} ms", flush=True)
        ms = bench(lambda: torch.histc(x, 256, 0, 4))
        print(f"{dname:6s} torch.histc 256: {ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
