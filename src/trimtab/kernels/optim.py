"""The fused Adam(W) step of :class:`trimtab.optim.Adam`: update and statistics in one pass.

The reference it must match is :func:`trimtab.optim._reference.adam_group_step_reference`.

One launch per parameter group reads ``w, g, m, v`` once and writes ``w, m, v`` once, like
``torch.optim.AdamW(fused=True)``; in the same pass each program reduces its block to the
group's statistics (``Σ w·u``, ``Σ w²``, ``Σ u²``, ``Σ |u|``, the clamp's engagement count and
the max ``|w|``) and adds the block's bit-histograms of ``|w|``, ``|m|``, ``|v|`` to the group's.

Quantiles without a second pass
-------------------------------
The histograms use the digits of :mod:`trimtab.kernels.quantile` (``bits >> 20``: 2048 coarse
bins of the exponent and 3 mantissa bits; then ``(bits >> 8) & 4095`` inside one coarse bin).
The exact radix select needs a second read to histogram the fine digit inside the coarse bin
that holds the rank. Here the fine histogram is taken, in the same pass, inside the coarse bin
that held the rank *at the previous step* (``sel``): weights and moments move slowly, so the
bin rarely changes. :func:`finish_quantiles` then returns the lower edge of the fine sub-bin
(never above the exact order statistic, within ``2**-15`` of it, as the core kernel) when the
rank is still in last step's bin, and the lower edge of the coarse bin (within one coarse bin,
a relative ``2**-3``) on the first step and on a step where the rank moved to another bin.

Bytes moved per element (float32): read 16, write 12 (as fused AdamW), plus per program
``3 * 2048 + 3 * 4096`` histogram bins of which only the non-zero ones are added atomically.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from trimtab.kernels._table import pointer_table

BLOCK = 4096
NUM_WARPS = 8
COARSE_SHIFT = 20
COARSE_BINS = 2048
FINE_SHIFT = 8
FINE_BINS = 4096
NONFINITE_BITS = 0x7F800000
# int32 workspace layout per group: engaged, max |w| bits, then 3 coarse and 3 fine histograms.
INT_ENGAGED, INT_MAXBITS = 0, 1
HIST_OFFSET = 2
FINE_OFFSET = HIST_OFFSET + 3 * COARSE_BINS
INT_WIDTH = FINE_OFFSET + 3 * FINE_BINS
NUM_SUMS = 4


@triton.jit
def _hist_add(
    bits,
    valid,
    hist_row,
    fine_row,
    sel,
    BLOCK: tl.constexpr,
    CSHIFT: tl.constexpr,
    CBINS: tl.constexpr,
    FSHIFT: tl.constexpr,
    FBINS: tl.constexpr,
):
    """Add a block's coarse digits, and its fine digits inside coarse bin ``sel``, to a row."""
    coarse = tl.where(valid, bits >> CSHIFT, 0)
    h = tl.histogram(coarse, CBINS)
    # Masked-off lanes were counted in bin 0: take them out (tl.histogram has no mask argument
    # in older Triton releases).
    nvalid = tl.sum(valid.to(tl.int32), axis=0)
    cb = tl.arange(0, CBINS)
    h = h - tl.where(cb == 0, BLOCK - nvalid, 0)
    tl.atomic_add(hist_row + cb, h, mask=h != 0, sem="relaxed")
    inbin = valid & (coarse == sel)
    nin = tl.sum(inbin.to(tl.int32), axis=0)
    if nin > 0:
        fine = tl.where(inbin, (bits >> FSHIFT) & (FBINS - 1), 0)
        hf = tl.histogram(fine, FBINS)
        fb = tl.arange(0, FBINS)
        hf = hf - tl.where(fb == 0, BLOCK - nin, 0)
        tl.atomic_add(fine_row + fb, hf, mask=hf != 0, sem="relaxed")


@triton.jit
def _adam_kernel(
    w_ptrs,
    g_ptrs,
    m_ptrs,
    v_ptrs,  # int64 [T] data pointers
    numels,
    block_start,
    block_tensor,  # pointer-table layout (see kernels/_table.py)
    steps,  # float32 [T]: step count of each tensor, already incremented
    l1_flags,  # int32 [T]: 1 where the tensor takes the L1 proximal step
    coef,  # float32 [3] of this group: decay rate, L1 threshold per unit lr, weight bound
    sums,  # float32 [4] of this group: Σ w·u, Σ w², Σ u², Σ |u|
    ints,  # int32 [INT_WIDTH] of this group: engaged, max bits, histograms
    sel,  # int32 [3] of this group: last step's coarse bin of |w|, |m|, |v| (-1: none)
    lr,
    beta1,
    beta2,
    log2_beta1,
    log2_beta2,
    eps,
    STATS: tl.constexpr,
    L1: tl.constexpr,
    CLAMP: tl.constexpr,
    BLOCK: tl.constexpr,
    HIST_OFFSET: tl.constexpr,
    FINE_OFFSET: tl.constexpr,
    CSHIFT: tl.constexpr,
    CBINS: tl.constexpr,
    FSHIFT: tl.constexpr,
    FBINS: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(block_tensor + pid)
    offs = (pid - tl.load(block_start + t)) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < tl.load(numels + t)
    wp = tl.load(w_ptrs + t).to(tl.pointer_type(tl.float32))
    gp = tl.load(g_ptrs + t).to(tl.pointer_type(tl.float32))
    mp = tl.load(m_ptrs + t).to(tl.pointer_type(tl.float32))
    vp = tl.load(v_ptrs + t).to(tl.pointer_type(tl.float32))
    w = tl.load(wp + offs, mask=mask, other=0.0)
    g = tl.load(gp + offs, mask=mask, other=0.0)
    m = tl.load(mp + offs, mask=mask, other=0.0)
    v = tl.load(vp + offs, mask=mask, other=0.0)

    step = tl.load(steps + t)
    bc1 = 1.0 - tl.exp2(step * log2_beta1)
    bc2_sqrt = tl.sqrt(1.0 - tl.exp2(step * log2_beta2))
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    u = (m / bc1) / (tl.sqrt(v) / bc2_sqrt + eps)
    decay = tl.load(coef + 0)
    w_new = w * (1.0 - lr * decay) - lr * u
    if L1:
        thr = lr * tl.load(coef + 1)
        prox = tl.load(l1_flags + t) != 0
        shrunk = tl.where(w_new > 0, 1.0, -1.0) * tl.maximum(tl.abs(w_new) - thr, 0.0)
        w_new = tl.where(prox, tl.where(w_new == 0, w_new, shrunk), w_new)
    a = tl.abs(w_new)
    w_out = w_new
    if CLAMP:
        bound = tl.load(coef + 2)
        over = a > bound  # False for NaN: the clamp never hides a non-finite weight
        w_out = tl.where(over, tl.where(w_new > 0, bound, -bound), w_new)
    tl.store(wp + offs, w_out, mask=mask)
    tl.store(mp + offs, m, mask=mask)
    tl.store(vp + offs, v, mask=mask)

    if STATS:
        wu = tl.where(mask, w * u, 0.0)
        tl.atomic_add(sums + 0, tl.sum(wu, axis=0), sem="relaxed")
        tl.atomic_add(sums + 1, tl.sum(w * w, axis=0), sem="relaxed")
        uu = tl.where(mask, u * u, 0.0)
        tl.atomic_add(sums + 2, tl.sum(uu, axis=0), sem="relaxed")
        tl.atomic_add(sums + 3, tl.sum(tl.where(mask, tl.abs(u), 0.0), axis=0), sem="relaxed")
        a_bits = a.to(tl.int32, bitcast=True)
        finite = mask & (a_bits < 0x7F800000)
        if CLAMP:
            n_over = tl.sum((finite & over).to(tl.int32), axis=0)
            tl.atomic_add(ints + 0, n_over, sem="relaxed")
        # Non-negative floats order as their int32 bits: an integer max is exact.
        tl.atomic_max(ints + 1, tl.max(tl.where(finite, a_bits, 0), axis=0), sem="relaxed")
        for k in tl.static_range(3):
            if k == 0:
                bits = a_bits
            elif k == 1:
                bits = tl.abs(m).to(tl.int32, bitcast=True)
            else:
                bits = tl.abs(v).to(tl.int32, bitcast=True)
            valid = mask & (bits < 0x7F800000)
            _hist_add(
                bits,
                valid,
                ints + HIST_OFFSET + k * CBINS,
                ints + FINE_OFFSET + k * FBINS,
                tl.load(sel + k),
                BLOCK,
                CSHIFT,
                CBINS,
                FSHIFT,
                FBINS,
            )


def adam_group_step_triton(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    steps: torch.Tensor,
    l1_flags: torch.Tensor,
    coef: torch.Tensor,
    sums: torch.Tensor,
    ints: torch.Tensor,
    sel: torch.Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    stats: bool,
    l1: bool,
    clamp: bool,
) -> None:
    """Launch the fused step for one group (float32, contiguous tensors on one device).

    ``steps`` ([T] float32) must already hold the incremented step counts; ``coef``, ``sums``,
    ``ints`` and ``sel`` are this group's rows of the optimizer's workspaces (``sums`` and
    ``ints`` zeroed by the caller before the launch).
    """
    if not params:
        return
    wt = pointer_table(params, BLOCK)
    gt = pointer_table(grads, BLOCK)
    mt = pointer_table(exp_avgs, BLOCK)
    vt = pointer_table(exp_avg_sqs, BLOCK)
    _adam_kernel[(wt.num_blocks,)](
        wt.ptrs, gt.ptrs, mt.ptrs, vt.ptrs,
        wt.numels, wt.block_start, wt.block_tensor,
        steps, l1_flags, coef, sums, ints, sel,
        float(lr), float(beta1), float(beta2),
        math.log2(beta1) if beta1 > 0 else -math.inf,
        math.log2(beta2) if beta2 > 0 else -math.inf,
        float(eps),
        STATS=stats, L1=l1, CLAMP=clamp, BLOCK=BLOCK,
        HIST_OFFSET=HIST_OFFSET, FINE_OFFSET=FINE_OFFSET,
        CSHIFT=COARSE_SHIFT, CBINS=COARSE_BINS, FSHIFT=FINE_SHIFT, FBINS=FINE_BINS,
        num_warps=NUM_WARPS,
    )  # fmt: skip


def finish_quantiles(
    ints: torch.Tensor, sel: torch.Tensor, q: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(quantiles, counts)``, both ``[G, 3]`` (of |w|, |m|, |v|): the ``q``-quantile of each
    group's histogram and its count of finite elements, on the device. Updates ``sel`` in place
    to this step's coarse bins, for the next step's fine histogram.
    """
    hist = ints[:, HIST_OFFSET:FINE_OFFSET].reshape(-1, 3, COARSE_BINS).to(torch.int64)
    fine = ints[:, FINE_OFFSET:].reshape(-1, 3, FINE_BINS).to(torch.int64)
    cum = hist.cumsum(-1)
    n = cum[..., -1:]
    rank = torch.ceil(n.double() * q).long().clamp(min=1)
    chosen = torch.searchsorted(cum, rank).clamp(max=COARSE_BINS - 1)
    below = torch.where(chosen > 0, cum.gather(-1, (chosen - 1).clamp(min=0)), 0)
    fcum = fine.cumsum(-1)
    within = rank - below
    fchosen = torch.searchsorted(fcum, within).clamp(max=FINE_BINS - 1)
    refined = (chosen == sel.unsqueeze(-1).long()) & (fcum[..., -1:] >= within)
    bits = (chosen << COARSE_SHIFT) | torch.where(refined, fchosen << FINE_SHIFT, 0)
    value = bits.to(torch.int32).view(torch.float32)
    value = torch.where(n > 0, value, torch.zeros_like(value)).squeeze(-1)
    sel.copy_(torch.where(n > 0, chosen, -1).squeeze(-1).to(sel.dtype))
    return value, n.squeeze(-1)
