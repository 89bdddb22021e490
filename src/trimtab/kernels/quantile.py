"""Triton radix-select kernels for the q-quantile of |x| over the finite elements of many tensors.

The reference it must match is :func:`trimtab.quantile.abs_quantiles_reference`.

Algorithm (MSB radix select on the float's bits)
------------------------------------------------
For a float32 ``x``, ``bits = bitcast<int32>(x) & 0x7FFFFFFF`` is monotone in ``|x|`` (it is the
order used by IEEE 754 for non-negative floats), and ``bits >= 0x7F800000`` exactly when ``x``
is ±Inf or NaN. fp16 and bf16 are converted to float32 in registers, which is exact. The
target is the element of rank ``k = ceil(q * n_finite)`` (1-based) of the sorted finite |x|.

* pass 1 reads every element and builds, per tensor, a histogram of ``bits >> 20`` (the 8
  exponent and top 3 mantissa bits: 2048 bins, bins 2040-2047 are the non-finite ones);
  ``select`` (one program per tensor) counts the non-finite elements, computes ``k``, and finds
  the bin holding rank k with a cumulative sum, on the device.
* pass 2 reads every element again; only those in the chosen bin (a masked histogram skips the
  others) enter a 4096-bin histogram of ``(bits >> 8) & 4095``; ``select`` again. The answer is
  now known to 23 of its 31 bits: the result is the lower edge of that sub-bin, so it is never
  above the exact value and is within a relative ``2**-15`` of it; it *is* the exact value for
  fp16 and bf16 inputs (their float32 images have at most 10 mantissa bits).
* pass 3 (256 bins of ``bits & 255``) makes the result exact. Its programs return at once
  unless the tensor's ``needs_exact`` flag (set on the device by ``select``) is on: when
  ``exact=True`` was asked, or when the answer is a float32 subnormal, where 8 missing bits
  would be a large relative error.

Contention: every program accumulates its histogram over a chunk of up to 256K elements in
registers (``tl.histogram`` per block of ``BLOCK``) and adds only its non-zero bins to the global
``[num_tensors, bins]`` int64 histogram at the end, so global atomics number about
``programs * distinct bins``, not elements. Inside a block, two skews that would serialise the
histogram's shared-memory atomics are taken out first: exact zeros (ReLU outputs, sparse
gradients) are counted with a reduction, and a block whose counted elements all fall in one bin
(constant tensors) adds its count to that bin directly.

Bytes moved: ``2 * n * itemsize`` (3x with ``exact=True`` or a subnormal answer) plus
``8 * (2048 + 4096 + 256) * num_tensors`` of histogram, zeroed once by one memset. Launches:
memset, pass 1, select, pass 2, select, pass 3, select; nothing is read back to the host, so the
sequence is sync-free and CUDA-graph capturable once the pointer table is cached.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from trimtab.kernels._table import DTYPE_CODES, pointer_table

# (shift, bits) of the three radix digits of the 31 non-sign bits: 11 + 12 + 8.
DIGITS = ((20, 11), (8, 12), (0, 8))
# Tunables, read at each launch (benchmarks/bench_quantile.py --sweep times alternatives). With
# 16 warps a block is 16 elements per thread, which keeps pass 1 near 64 registers per thread.
BLOCK = 8192  # elements per tl.histogram call
NUM_WARPS = 16
# A block with at most this many counted elements sends them straight to global atomics. Off
# (0): with Triton's shared-memory-atomic tl.histogram, a masked histogram of a sparse block is
# cheap, while the scattered atomics need a layout conversion of the whole block.
SPARSE_MAX = 0
MAX_BLOCKS_PER_PROGRAM = 32  # a program reads at most 32 blocks (1 MB of fp32)
PROGRAMS_PER_SM = 4  # aim for about this many programs per SM over the whole launch

# Globals read inside kernels must be constexpr.
ZERO_COL = tl.constexpr(sum(1 << bits for _, bits in DIGITS))  # count of exact zeros
HIST_WIDTH = tl.constexpr(ZERO_COL + 1)
NONFINITE_BIN = tl.constexpr(0x7F800000 >> 20)  # first pass-1 bin of ±Inf and NaN
NORMAL_BIN = tl.constexpr(0x00800000 >> 20)  # pass-1 bins below it hold zero and subnormals


@triton.jit
def _load_abs_bits(addr, start, offs, mask, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """|x| as non-negative int32 float32 bit patterns (``DTYPE`` codes from ``DTYPE_CODES``);
    ``mask=None`` for a full block."""
    if DTYPE == 0:
        base = addr.to(tl.pointer_type(tl.float32))
    elif DTYPE == 1:
        base = addr.to(tl.pointer_type(tl.float16))
    else:  # bf16 read as its int16 bits: its float32 image is those bits shifted left 16
        base = addr.to(tl.pointer_type(tl.int16))
    base += start
    if ALIGNED:
        # Every tensor starts on 16 bytes and every block on BLOCK elements: vector loads.
        base = tl.multiple_of(base, 16)
        offs = tl.max_contiguous(tl.multiple_of(offs, 16), 16)
    p = base + offs
    if mask is None:
        x = tl.load(p)
    else:
        x = tl.load(p, mask=mask, other=0)
    if DTYPE == 2:
        bits = x.to(tl.int32) << 16
    else:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    return bits & 0x7FFFFFFF


@triton.jit
def _count_block(
    acc,
    zeros,
    addr,
    start,
    offs,
    mask,
    row,
    prefix,
    SHIFT: tl.constexpr,
    BITS: tl.constexpr,
    FIRST: tl.constexpr,
    SPARSE_MAX: tl.constexpr,
    DTYPE: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """Add one block's digits to the program's histogram ``acc`` (or straight to ``row``)."""
    NBINS: tl.constexpr = 1 << BITS
    bins = tl.arange(0, NBINS)
    bits = _load_abs_bits(addr, start, offs, mask, DTYPE, ALIGNED)
    if mask is None:
        valid = offs >= 0
    else:
        valid = mask
    if not FIRST:
        valid = valid & ((bits >> (SHIFT + BITS)) == prefix)
    digit = (bits >> SHIFT) & (NBINS - 1)
    # Zeros (digit 0 in every pass) are counted apart, and a block whose elements share one
    # digit adds its count directly: either skew would otherwise serialise the shared-memory
    # atomics of tl.histogram on one address.
    zeros += tl.sum((valid & (bits == 0)).to(tl.int32), axis=0)
    valid = valid & (bits != 0)
    nvalid = tl.sum(valid.to(tl.int32), axis=0)
    if nvalid > 0:
        lo = tl.min(tl.where(valid, digit, NBINS), axis=0)
        hi = tl.max(tl.where(valid, digit, -1), axis=0)
        if lo == hi:
            acc += tl.where(bins == lo, nvalid, 0)
        elif SPARSE_MAX == 0:  # compile-time: no sparse path, no layout conversion
            acc += tl.histogram(digit, NBINS, mask=valid)
        elif nvalid <= SPARSE_MAX:
            # Few matches (a later pass on spread data): global atomics cost less than a
            # block-wide histogram.
            one = tl.full(digit.shape, 1, tl.int64)
            tl.atomic_add(row + digit, one, mask=valid, sem="relaxed")
        else:
            acc += tl.histogram(digit, NBINS, mask=valid)
    return acc, zeros


@triton.jit
def _abs_hist_kernel(
    ptrs,
    numels,
    block_start,
    block_tensor,
    state,  # int64 [T, 4]: prefix, rank within prefix, needs_exact, nonfinite
    hist,  # int64 [T, HIST_WIDTH]
    chunk,
    HIST_OFFSET: tl.constexpr,
    SHIFT: tl.constexpr,
    BITS: tl.constexpr,
    FIRST: tl.constexpr,
    GATED: tl.constexpr,
    DTYPE: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr,
    SPARSE_MAX: tl.constexpr,
):
    """One radix pass over one chunk of one tensor: histogram of the digit
    ``(bits >> SHIFT) & (2**BITS - 1)`` of the elements whose higher bits equal the prefix
    chosen so far for that tensor."""
    NBINS: tl.constexpr = 1 << BITS
    pid = tl.program_id(0)
    t = tl.load(block_tensor + pid)
    start = tl.multiple_of((pid - tl.load(block_start + t)) * chunk, BLOCK)
    count = tl.minimum(tl.load(numels + t) - start, chunk).to(tl.int32)  # <= 0 if empty
    addr = tl.load(ptrs + t)
    row = hist + t * HIST_WIDTH + HIST_OFFSET
    prefix = tl.load(state + t * 4).to(tl.int32)
    if GATED:
        # Programs of a tensor whose answer is already exact read nothing.
        count = tl.where(tl.load(state + t * 4 + 2) != 0, count, 0)
    idx = tl.arange(0, BLOCK)
    bins = tl.arange(0, NBINS)
    acc = tl.zeros([NBINS], dtype=tl.int32)
    zeros = tl.zeros([], dtype=tl.int32)
    # Full blocks unmasked (vector loads), then one masked tail.
    full = count - count % BLOCK
    for i in range(0, full, BLOCK):
        acc, zeros = _count_block(
            acc, zeros, addr, start, i + idx, None, row, prefix,
            SHIFT, BITS, FIRST, SPARSE_MAX, DTYPE, ALIGNED,
        )  # fmt: skip
    if full < count:
        acc, zeros = _count_block(
            acc, zeros, addr, start, full + idx, full + idx < count, row, prefix,
            SHIFT, BITS, FIRST, SPARSE_MAX, DTYPE, ALIGNED,
        )  # fmt: skip
    acc += tl.where(bins == 0, zeros, 0)
    tl.atomic_add(row + bins, acc.to(tl.int64), mask=acc != 0, sem="relaxed")
    if FIRST:
        tl.atomic_add(hist + t * HIST_WIDTH + ZERO_COL, zeros.to(tl.int64), sem="relaxed")


@triton.jit
def _select_kernel(
    numels,
    state,
    hist,
    out,  # float32 [T]
    q_bits,  # q as the int64 bit pattern of a float64, so k is computed in float64
    EXACT: tl.constexpr,
    STAGE: tl.constexpr,
    HIST_OFFSET: tl.constexpr,
    BITS: tl.constexpr,
):
    """Per tensor: the digit whose bin holds the remaining rank; state and result updates."""
    NBINS: tl.constexpr = 1 << BITS
    t = tl.program_id(0)
    bins = tl.arange(0, NBINS)
    h = tl.load(hist + t * HIST_WIDTH + HIST_OFFSET + bins)
    if STAGE == 0:
        nonfinite = tl.sum(tl.where(bins >= NONFINITE_BIN, h, 0), axis=0)
        n_finite = tl.load(numels + t) - nonfinite
        # k = ceil(q * n_finite), the product rounded in float64 as the reference rounds it.
        kq = n_finite.to(tl.float64) * q_bits.to(tl.float64, bitcast=True)
        k = kq.to(tl.int64)
        k = tl.maximum(k + (k.to(tl.float64) < kq).to(tl.int64), 1)
        prefix = tl.zeros([], dtype=tl.int64)
        tl.store(state + t * 4 + 3, nonfinite)
        tl.store(state + t * 4 + 2, (n_finite > 0).to(tl.int64))  # read back by stage 1
    else:
        prefix = tl.load(state + t * 4)
        k = tl.load(state + t * 4 + 1)
    cum = tl.cumsum(h, axis=0)
    digit = tl.sum((cum < k).to(tl.int64), axis=0)
    below = tl.sum(tl.where(bins < digit, h, 0), axis=0)
    prefix = (prefix << BITS) | digit
    tl.store(state + t * 4, prefix)
    tl.store(state + t * 4 + 1, k - below)
    if STAGE == 1:
        # 23 of 31 bits known: the lower edge of the sub-bin (exact for fp16/bf16 inputs).
        any_finite = tl.load(state + t * 4 + 2) != 0
        value = (prefix << 8).to(tl.int32).to(tl.float32, bitcast=True)
        tl.store(out + t, tl.where(any_finite, value, 0.0))
        if EXACT:
            needs = any_finite
        else:
            # Subnormal answers need the last 8 bits; an answer of exactly 0 does not.
            zero = (prefix == 0) & (k - below <= tl.load(hist + t * HIST_WIDTH + ZERO_COL))
            needs = any_finite & ((prefix >> 12) < NORMAL_BIN) & ~zero
        tl.store(state + t * 4 + 2, needs.to(tl.int64))
    if STAGE == 2:
        value = prefix.to(tl.int32).to(tl.float32, bitcast=True)
        needs = tl.load(state + t * 4 + 2) != 0
        tl.store(out + t, tl.where(needs, value, tl.load(out + t)))


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _chunk(total: int, device: torch.device) -> int:
    """Elements per program: enough programs to fill the GPU, few enough to keep flushes rare."""
    target = PROGRAMS_PER_SM * _num_sms(device)
    blocks = -(-total // (target * BLOCK))
    return BLOCK * max(1, min(MAX_BLOCKS_PER_PROGRAM, blocks))


def abs_quantiles_triton(
    tensors: Sequence[torch.Tensor], q: float, exact: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel path of :func:`trimtab.abs_quantiles`: ``(values float32 [T], nonfinite int64 [T])``.

    ``tensors`` must be non-empty, contiguous, on one device and share one dtype among
    float32, float16, bfloat16 (the public entry arranges that).
    """
    dtype = tensors[0].dtype
    device = tensors[0].device
    num = len(tensors)
    chunk = _chunk(sum(t.numel() for t in tensors), device)
    table = pointer_table(tensors, chunk)
    hist = torch.zeros((num, HIST_WIDTH.value), dtype=torch.int64, device=device)
    state = torch.empty((num, 4), dtype=torch.int64, device=device)
    out = torch.empty(num, dtype=torch.float32, device=device)
    aligned = all(t.data_ptr() % 16 == 0 for t in tensors)
    # float64 bits of q (at least 1e-300: same k, and the bits stay a 64-bit kernel argument)
    q_bits = struct.unpack("<q", struct.pack("<d", max(float(q), 1e-300)))[0]
    # fp16 and bf16 have at most 10 mantissa bits: two passes already give their exact value.
    digits = DIGITS if dtype == torch.float32 else DIGITS[:2]
    offset = 0
    for stage, (shift, bits) in enumerate(digits):
        _abs_hist_kernel[(table.num_blocks,)](
            table.ptrs,
            table.numels,
            table.block_start,
            table.block_tensor,
            state,
            hist,
            chunk,
            HIST_OFFSET=offset,
            SHIFT=shift,
            BITS=bits,
            FIRST=stage == 0,
            GATED=stage == 2,
            DTYPE=DTYPE_CODES[dtype],
            ALIGNED=aligned,
            BLOCK=BLOCK,
            SPARSE_MAX=SPARSE_MAX,
            num_warps=NUM_WARPS,
        )
        _select_kernel[(num,)](
            table.numels,
            state,
            hist,
            out,
            q_bits,
            EXACT=exact,
            STAGE=stage,
            HIST_OFFSET=offset,
            BITS=bits,
            num_warps=4,
        )
        offset += 1 << bits
    return out, state[:, 3]
