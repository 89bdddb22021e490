"""The fused Adam(W) step of :class:`trimtab.optim.Adam`: one launch per parameter group for the
update and its statistics, then one launch per step for everything that follows.

References (the CPU path and the test oracles): the update and the workspace it writes,
:func:`trimtab.optim._reference.adam_group_step_reference` (the same signature, the same
statistics: the same sampled chunks and histograms, see :mod:`trimtab.kernels.optim_layout`);
the finalize (:mod:`trimtab.kernels.optim_finalize`), ``trimtab.optim.Adam``'s torch finalize.
A set ``skip`` flag (``found_inf``) makes every program step no block: nothing is written.

Update (``_adam_kernel``, one launch per group)
-----------------------------------------------
Reads ``w, g, m, v`` once and writes ``w, m, v`` once (28 bytes per float32 parameter, as
``torch.optim.AdamW(fused=True)``); the decay rate, L1 threshold and weight bound are read from
the state-vector slots inside the kernel. With statistics on, the kernel also reduces the group
to ``Σ w·u, Σ w², Σ u², Σ|u|, Σ_{L1}|w|``, the finite count, the clamp's engagement count,
the max ``|w|`` and ``Σ g², Σ v̂`` (the gradient-growth statistic), and the *sampled* chunks
add two 256-bin histograms each of ``|w|``, ``|m|``, ``|v|`` to the group's workspace.

Programs. The pointer table cuts each tensor into blocks of ``BLOCK`` = 4096 elements; program
``p`` steps blocks ``[p K, (p + 1) K)`` (``K`` from :func:`blocks_per_program`: about
``PROGRAMS_PER_SM`` programs per multiprocessor), each block in chunks of ``SUB`` = 1024. A
block of a tensor whose four pointers are 16-byte aligned, and that lies wholly inside it, is
read and written with unmasked 16-byte accesses; the pointers come from a table, so without
that branch and its ``tl.multiple_of`` hint every access was a 4-byte one (and the kernel
needed 208 registers a thread: one CTA per multiprocessor). The statistics accumulate per lane
over all of a program's chunks and are reduced once per program (one multi-operand
``tl.reduce``, eight to ten scalar atomics), not once per block: at 100M parameters a
per-block reduction and its atomics cost more than the update itself.

Replicated partials. A group's ``parts`` workspace holds ``R`` replicas (``REPLICAS`` = 256, a
power of two) of one 40-byte row ``[Σ w·u, Σ w², Σ u², Σ|u|, Σ_{L1}|w|`` (float32 bits),
``engaged, max |w| bits, finite`` (int32), ``Σ g², Σ v̂]`` (float32 bits), and program ``p``
adds to replica ``p % R``, so no two programs of a wave contend for an address. The finalize
reduces the ``R`` rows (a vectorised ``tl.sum`` / ``tl.max``) and zeroes them. The partial sums
stay float32: each lane adds its own elements, each program adds its lanes pairwise, the
finalize adds the replicas pairwise, so only the summation order (hence the last bits) differs
from the reference's. The counts are summed in int64, the max is an integer max of the non-
negative float bits (exact).

Sampling. ``tl.histogram`` costs compute proportional to its bin count on every element
(Triton lowers it to warp ballots: about 2.3 ps per element per 256 bins on the H200, a
fifth of the 8.6 ps an element's 28 bytes take), so only one chunk in ``S`` is histogrammed:
chunk ``c`` (numbered through the table, ``BLOCK / SUB`` per block, so ``SUB`` consecutive
elements of one tensor or fewer at its end) at phase ``t`` (a device counter the finalize
advances every step) is when ``(c + t) % S == 0``. The sample is systematic over chunks, so
each tensor contributes its share, and over ``S`` consecutive steps every chunk is histogrammed
exactly once. Sampling chunks rather than whole blocks spreads the histogram work over the
programs: at 1M parameters (``S`` = 4, one program a block) every program histograms one of
its four chunks, where one program in four histogramming its whole block made those programs
the kernel's tail. ``S`` is the largest power of two with at least ``MIN_SAMPLE`` (2**17)
sampled elements, at most ``MAX_SAMPLE_STRIDE`` (64): 1 below 256K parameters, 4 at 1M, 64
from 8.4M up. The q-quantile of a sample of ``n`` elements has rank error
``sqrt(q (1 - q) / n)`` (2.7e-4 at q = 0.99, n = 2**17; for a Gaussian about 0.4% of the p99's
value), below the bin resolution and far below the step-to-step noise the EMA smooths. A
tensor smaller than ``S`` chunks is seen once every ``S`` steps.

Quantile digits (no second pass). Coarse: the float32 exponent, ``bits >> 23`` (256 bins, one
per octave). Window: 256 sub-bins of ``2**15`` bits (``2**-8`` of an octave) starting at the
group's ``sel`` base, centred on last step's quantile (an octave wide in bits, so about
``q/√2 .. q·√2``), plus the count below the window. The finalize (and its reference) return

- the lower edge of the window sub-bin holding the rank when the rank is inside the window:
  never above the order statistic of the (sampled) rank and within a relative ``2**-8``
  (0.39%) of it, the base being aligned to ``2**15`` bits so no sub-bin straddles an octave;
- the lower edge of its octave otherwise (the first step, a quantile that moved by more than
  ``√2`` in one step): never above, and at least half of it.

The next window is centred on this step's quantile (on the octave itself after a coarse step).

Finalize (``_finalize_kernel``, one launch per step, one program)
-----------------------------------------------------------------
For every group at once: the reduction of the scalar partials' ``R`` replicas (one
``[groups, R]`` tile per word), the quantiles, the observations (weight bound with the
engagement correction, decay rate, L1 rate, p99 of ``|w|, |m|, |v|``), the engagement
correction's and the slots' :class:`~trimtab.AdaptiveEMA` updates (the same arithmetic as
``estimate.py``, its ``dof``-dependent thresholds read from a table computed by it), the slot
writes, the step counters' increments, the sampling phase, and the zeroing of the workspaces
(histograms and replicas) for the next step.
All state is loaded before a block-wide barrier and written after it, so no warp can read a
value another has already replaced.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from trimtab.kernels._table import PointerTable, pointer_table
from trimtab.kernels.optim_layout import (
    BINS,
    BLOCK,
    COARSE_SHIFT,
    FINE_SHIFT,
    HIST_OFFSET,
    INT_UNDER,
    PART_WIDTH,
    SUB,
    WINDOW_OFFSET,
    Workspace,
    sample_stride,
)

NUM_WARPS = 8
PROGRAMS_PER_SM = 2
# Whether tl.histogram takes a mask (Triton >= 3.4).
HIST_MASK = tl.constexpr("mask" in inspect.signature(tl.histogram).parameters)


# --- the update -----------------------------------------------------------------------------
@triton.jit
def _add_stats(
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9
):  # fmt: skip
    """Combine of the statistics' one multi-operand reduction (PART_* order; 6 is a max)."""
    return (
        a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, tl.maximum(a6, b6), a7 + b7,
        a8 + b8, a9 + b9,
    )  # fmt: skip


@triton.jit
def _adam_kernel(
    w_ptrs,
    g_ptrs,
    m_ptrs,
    v_ptrs,
    step_ptrs,  # int64 [T] data pointers (steps: float32 0-dim, incremented by the finalize)
    numels,
    block_start,
    block_tensor,  # pointer-table layout (see kernels/_table.py)
    l1_flags,  # int32 [T]: 1 where the tensor takes the L1 proximal step
    decay_slot,
    l1_slot,
    bound_slot,  # float32 0-dim views of this group's state-vector slots
    sums,  # float32 view of this group's parts, [REPLICAS, PART_WIDTH]
    parts,  # int32 [REPLICAS, PART_WIDTH] of this group (scalar partials, see above)
    ints,  # int32 [INT_WIDTH] of this group
    sel,  # int32 [3] of this group: window base bits of |w|, |m|, |v| (-1: none)
    phase,  # int32 [1]: sampling phase
    skip,  # 0-dim float32: nonzero skips the step (found_inf; read only with SKIP)
    grad_scale,  # 0-dim float32: the gradients' loss scale (read only with UNSCALE)
    num_blocks,  # blocks of the pointer table
    blocks_per_program,  # program p steps blocks [p * this, (p + 1) * this)
    stride,  # sampling stride S
    lr,
    beta1,
    beta2,
    log2_beta1,
    log2_beta2,
    eps,
    decay_factor,  # 1 - lr * weight_decay for a fixed rate (ignored with AUTO)
    headroom,  # the clamp binds at headroom x the bound; engagements count |w| > the bound
    AUTO: tl.constexpr,
    STATS: tl.constexpr,
    L1: tl.constexpr,
    CLAMP: tl.constexpr,
    SKIP: tl.constexpr,
    UNSCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    SUB: tl.constexpr,
    BINS: tl.constexpr,
    CSHIFT: tl.constexpr,
    FSHIFT: tl.constexpr,
    UNDER: tl.constexpr,
    HIST_OFFSET: tl.constexpr,
    WINDOW_OFFSET: tl.constexpr,
    REPLICAS: tl.constexpr,
    PART_WIDTH: tl.constexpr,
    FLOOR: tl.constexpr,
):
    pid = tl.program_id(0)
    lane = tl.arange(0, SUB)
    # Loop-invariant scalars: the slots are read once per program.
    if AUTO:
        d = tl.load(decay_slot)
        decay_factor = 1.0 - lr * tl.where(d > 0.0, d, 0.0)  # fmax(slot, 0): NaN -> 0
    thr = 0.0
    if L1:
        lam = tl.load(l1_slot)
        thr = lr * tl.where(lam > 0.0, lam, 0.0)
    bound = float("inf")
    if CLAMP:
        bnd = tl.load(bound_slot)
        bound = tl.where(bnd != bnd, float("inf"), tl.where(bnd > FLOOR, bnd, FLOOR))
    # Statistics accumulate per lane over every block of the program, then reduce once.
    acc_wu = tl.zeros([SUB], tl.float32)
    acc_ww = tl.zeros([SUB], tl.float32)
    acc_uu = tl.zeros([SUB], tl.float32)
    acc_au = tl.zeros([SUB], tl.float32)
    acc_l1 = tl.zeros([SUB], tl.float32)
    acc_eng = tl.zeros([SUB], tl.int32)
    acc_max = tl.zeros([SUB], tl.int32)
    acc_fin = tl.zeros([SUB], tl.int32)
    acc_gg = tl.zeros([SUB], tl.float32)
    acc_vh = tl.zeros([SUB], tl.float32)
    ph = 0
    if STATS:
        ph = tl.load(phase)
    inv_scale = 1.0
    if UNSCALE:
        inv_scale = 1.0 / tl.load(grad_scale)
    first = pid * blocks_per_program
    last = tl.minimum(first + blocks_per_program, num_blocks)
    if SKIP:
        # A skipped step (non-finite gradients) steps no block: nothing is stored and the
        # statistics stay zero; the finalize leaves every estimate and counter as it was.
        last = tl.where(tl.load(skip) != 0, first, last)
    for blk in range(first, last):
        t = tl.load(block_tensor + blk)
        start = (blk - tl.load(block_start + t)) * BLOCK
        n = tl.load(numels + t)
        w_raw = tl.load(w_ptrs + t)
        g_raw = tl.load(g_ptrs + t)
        m_raw = tl.load(m_ptrs + t)
        v_raw = tl.load(v_ptrs + t)
        wp = w_raw.to(tl.pointer_type(tl.float32))
        gp = g_raw.to(tl.pointer_type(tl.float32))
        mp = m_raw.to(tl.pointer_type(tl.float32))
        vp = v_raw.to(tl.pointer_type(tl.float32))
        step = tl.load(tl.load(step_ptrs + t).to(tl.pointer_type(tl.float32))) + 1.0
        bc1 = 1.0 - tl.exp2(step * log2_beta1)
        bc2 = 1.0 - tl.exp2(step * log2_beta2)
        bc2_sqrt = tl.sqrt(bc2)
        inv_bc2 = 1.0 / bc2  # per block: v̂ = v * inv_bc2 costs a multiply per element
        prox = False
        if L1:
            prox = tl.load(l1_flags + t) != 0
        # Chunk blk * CHUNKS + j is histogrammed when (chunk + phase) % stride == 0.
        chunk0 = blk * (BLOCK // SUB) + ph
        # A whole block of 16-byte aligned tensors loads 16 bytes a lane and needs no mask;
        # a tensor's last block, or a tensor at an odd address, takes the masked path.
        aligned = ((w_raw | g_raw | m_raw | v_raw) & 15) == 0
        if aligned & (start + BLOCK <= n):
            wp = tl.multiple_of(wp, 16)
            gp = tl.multiple_of(gp, 16)
            mp = tl.multiple_of(mp, 16)
            vp = tl.multiple_of(vp, 16)
            for c in range(0, BLOCK, SUB):
                offs = tl.multiple_of(start + c, SUB) + lane
                (acc_wu, acc_ww, acc_uu, acc_au, acc_l1, acc_eng, acc_max, acc_fin, acc_gg,
                 acc_vh) = _chunk(
                    wp, gp, mp, vp, offs, n, True, (chunk0 + c // SUB) % stride == 0, prox,
                    acc_wu, acc_ww, acc_uu, acc_au, acc_l1, acc_eng, acc_max, acc_fin, acc_gg,
                    acc_vh, decay_factor, thr, bound, headroom, bc1, bc2_sqrt, inv_bc2, lr,
                    beta1, beta2, eps, ints, sel, inv_scale,
                    STATS, L1, CLAMP, UNSCALE, BINS, CSHIFT, FSHIFT, UNDER, HIST_OFFSET,
                    WINDOW_OFFSET,
                )  # fmt: skip
        else:
            for c in range(0, BLOCK, SUB):
                offs = start + c + lane
                (acc_wu, acc_ww, acc_uu, acc_au, acc_l1, acc_eng, acc_max, acc_fin, acc_gg,
                 acc_vh) = _chunk(
                    wp, gp, mp, vp, offs, n, False, (chunk0 + c // SUB) % stride == 0, prox,
                    acc_wu, acc_ww, acc_uu, acc_au, acc_l1, acc_eng, acc_max, acc_fin, acc_gg,
                    acc_vh, decay_factor, thr, bound, headroom, bc1, bc2_sqrt, inv_bc2, lr,
                    beta1, beta2, eps, ints, sel, inv_scale,
                    STATS, L1, CLAMP, UNSCALE, BINS, CSHIFT, FSHIFT, UNDER, HIST_OFFSET,
                    WINDOW_OFFSET,
                )  # fmt: skip
    if STATS:
        s_wu, s_ww, s_uu, s_au, s_l1, n_eng, max_bits, n_fin, s_gg, s_vh = tl.reduce(
            (acc_wu, acc_ww, acc_uu, acc_au, acc_l1, acc_eng, acc_max, acc_fin, acc_gg, acc_vh),
            0,
            _add_stats,
        )
        # This program's replica of the scalar partials: no two programs of a wave share one.
        rs = sums + (pid % REPLICAS) * PART_WIDTH
        ri = parts + (pid % REPLICAS) * PART_WIDTH
        # Words as PART_* above: 0..4 the float sums, 5 engaged, 6 max |w| bits, 7 finite,
        # 8 Σ g², 9 Σ v̂.
        tl.atomic_add(rs + 0, s_wu, sem="relaxed")
        tl.atomic_add(rs + 1, s_ww, sem="relaxed")
        tl.atomic_add(rs + 2, s_uu, sem="relaxed")
        tl.atomic_add(rs + 3, s_au, sem="relaxed")
        if L1:
            tl.atomic_add(rs + 4, s_l1, sem="relaxed")
        if CLAMP:
            tl.atomic_add(ri + 5, n_eng, sem="relaxed")
        tl.atomic_max(ri + 6, max_bits, sem="relaxed")
        tl.atomic_add(ri + 7, n_fin, sem="relaxed")
        tl.atomic_add(rs + 8, s_gg, sem="relaxed")
        tl.atomic_add(rs + 9, s_vh, sem="relaxed")


@triton.jit
def _chunk(
    wp, gp, mp, vp, offs, n, FULL: tl.constexpr, sampled, prox,
    acc_wu, acc_ww, acc_uu, acc_au, acc_l1, acc_eng, acc_max, acc_fin, acc_gg, acc_vh,
    decay_factor, thr, bound, headroom, bc1, bc2_sqrt, inv_bc2, lr, beta1, beta2, eps, ints,
    sel, inv_scale, STATS: tl.constexpr, L1: tl.constexpr, CLAMP: tl.constexpr,
    UNSCALE: tl.constexpr, BINS: tl.constexpr,
    CSHIFT: tl.constexpr, FSHIFT: tl.constexpr, UNDER: tl.constexpr,
    HIST_OFFSET: tl.constexpr, WINDOW_OFFSET: tl.constexpr,
):  # fmt: skip
    """Step ``SUB`` elements at ``offs`` and add their statistics to the accumulators
    (``FULL``: every lane in range, unmasked 16-byte accesses)."""
    mask = offs < n
    if FULL:
        w = tl.load(wp + offs)
        g = tl.load(gp + offs)
        m = tl.load(mp + offs)
        v = tl.load(vp + offs)
    else:
        w = tl.load(wp + offs, mask=mask, other=0.0)
        g = tl.load(gp + offs, mask=mask, other=0.0)
        m = tl.load(mp + offs, mask=mask, other=0.0)
        v = tl.load(vp + offs, mask=mask, other=0.0)
    if UNSCALE:
        g = g * inv_scale
    m = beta1 * m + (1.0 - beta1) * g
    gg = g * g
    v = beta2 * v + (1.0 - beta2) * gg
    u = (m / bc1) / (tl.sqrt(v) / bc2_sqrt + eps)
    w_new = w * decay_factor - lr * u
    if L1:
        shrunk = tl.where(w_new > 0, 1.0, -1.0) * tl.maximum(tl.abs(w_new) - thr, 0.0)
        w_new = tl.where(prox, tl.where(w_new == 0, w_new, shrunk), w_new)
    a = tl.abs(w_new)
    w_out = w_new
    if CLAMP:
        over = a > bound  # the engagement test's count: exceedances of the bound
        cut = bound * headroom  # where the clamp binds (inf stays inf)
        # False for NaN: the clamp never hides a non-finite weight
        w_out = tl.where(a > cut, tl.where(w_new > 0, cut, -cut), w_new)
    if FULL:
        tl.store(wp + offs, w_out)
        tl.store(mp + offs, m)
        tl.store(vp + offs, v)
    else:
        tl.store(wp + offs, w_out, mask=mask)
        tl.store(mp + offs, m, mask=mask)
        tl.store(vp + offs, v, mask=mask)
    if STATS:
        if FULL:
            acc_wu += w * u
            acc_uu += u * u
            acc_au += tl.abs(u)
        else:
            acc_wu += tl.where(mask, w * u, 0.0)
            acc_uu += tl.where(mask, u * u, 0.0)
            acc_au += tl.where(mask, tl.abs(u), 0.0)
        acc_ww += w * w  # masked lanes loaded 0 (and so have g = v = 0)
        acc_gg += gg
        acc_vh += v * inv_bc2
        if L1:
            acc_l1 += tl.where(mask & prox, tl.abs(w), 0.0)
        a_bits = a.to(tl.int32, bitcast=True)
        finite = mask & (a_bits < 0x7F800000)
        if CLAMP:
            acc_eng += (finite & over).to(tl.int32)
        # Non-negative floats order as their int32 bits: an integer max is exact.
        acc_max = tl.maximum(acc_max, tl.where(finite, a_bits, 0))
        acc_fin += finite.to(tl.int32)
        if sampled:
            _histograms(a_bits, m, v, mask, ints, sel, BINS, CSHIFT, FSHIFT, UNDER,
                        HIST_OFFSET, WINDOW_OFFSET)  # fmt: skip
    return acc_wu, acc_ww, acc_uu, acc_au, acc_l1, acc_eng, acc_max, acc_fin, acc_gg, acc_vh


@triton.jit
def _histograms(
    a_bits,
    m,
    v,
    mask,
    ints,
    sel,
    BINS: tl.constexpr,
    CSHIFT: tl.constexpr,
    FSHIFT: tl.constexpr,
    UNDER: tl.constexpr,
    HIST_OFFSET: tl.constexpr,
    WINDOW_OFFSET: tl.constexpr,
):
    """Add one sampled chunk's coarse and window histograms of |w|, |m|, |v| to ``ints``."""
    b = tl.arange(0, BINS)
    for k in tl.static_range(3):
        if k == 0:
            bits = a_bits
        elif k == 1:
            bits = tl.abs(m).to(tl.int32, bitcast=True)
        else:
            bits = v.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        valid = mask & (bits < 0x7F800000)
        h = _hist(bits >> CSHIFT, valid, BINS)
        tl.atomic_add(ints + HIST_OFFSET + k * BINS + b, h, mask=h != 0, sem="relaxed")
        base = tl.load(sel + k)
        if base >= 0:
            rel = bits - base
            n_below = tl.sum((valid & (rel < 0)).to(tl.int32), axis=0)
            tl.atomic_add(ints + UNDER + k, n_below, sem="relaxed")
            inwin = valid & (rel >= 0) & (rel < (BINS << FSHIFT))
            hw = _hist(tl.where(inwin, rel >> FSHIFT, 0), inwin, BINS)
            tl.atomic_add(ints + WINDOW_OFFSET + k * BINS + b, hw, mask=hw != 0, sem="relaxed")


@triton.jit
def _hist(digit, valid, BINS: tl.constexpr):
    """``tl.histogram`` of the ``valid`` lanes' digits."""
    if HIST_MASK:
        h = tl.histogram(digit, BINS, mask=valid)
    else:  # Triton < 3.4: the other lanes are counted in bin 0, then taken back out
        h = tl.histogram(tl.where(valid, digit, 0), BINS)
        off = tl.sum((valid == 0).to(tl.int32), axis=0)
        h = h - tl.where(tl.arange(0, BINS) == 0, off, 0)
    return h


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def blocks_per_program(num_blocks: int, device: torch.device) -> int:
    """Blocks each program steps: enough programs for ``PROGRAMS_PER_SM`` per multiprocessor,
    so the statistics' one reduction and atomics per program are amortised over many blocks."""
    return max(1, -(-num_blocks // (PROGRAMS_PER_SM * _num_sms(device))))


_flag_cache: dict[tuple, torch.Tensor] = {}


def _l1_flags(l1_params: Sequence[bool], device: torch.device) -> torch.Tensor:
    """int32 device flags of ``l1_params``, built once per distinct pattern (no per-step copy)."""
    key = (device, tuple(bool(f) for f in l1_params))
    flags = _flag_cache.get(key)
    if flags is None:
        flags = torch.tensor([int(f) for f in key[1]], dtype=torch.int32).to(device)
        _flag_cache[key] = flags
    return flags


def adam_group_step_triton(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    steps: Sequence[torch.Tensor],
    work: Workspace,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float | None,
    slots: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    l1_params: Sequence[bool],
    clamp: bool,
    stats: bool,
    floor: float,
    skip: torch.Tensor | None = None,
    grad_scale: torch.Tensor | None = None,
    capturable: bool = True,
    stride: int | None = None,
    per_program: int | None = None,
    headroom: float = 1.0,
) -> None:
    """Launch the fused step for one group: the signature, and the results, of its reference
    :func:`trimtab.optim._reference.adam_group_step_reference` (float32 contiguous parameters
    and moments on one device; gradients are made contiguous).

    ``steps`` are read as ``step + 1`` and not written (the finalize increments them).
    ``slots``: the group's decay, L1 and weight-bound slot views, read inside the kernel;
    ``weight_decay=None`` reads the decay slot. ``work``: the group's workspace (zero before
    the launch; ``parts`` with ``R`` a power of two). ``skip``: a 0-dim float32 device tensor,
    nonzero steps nothing. ``grad_scale``: a 0-dim float32 device tensor the gradients are
    divided by (a GradScaler's scale). ``capturable``: ignored (steps always stay on the
    device). ``stride``: the sampling stride (default :func:`sample_stride` of the group's
    elements). ``per_program``: blocks per program (default :func:`blocks_per_program`); it
    changes no result beyond the sums' rounding.
    """
    parts = work.parts
    assert parts.dtype == torch.int32 and parts.dim() == 2 and parts.shape[1] == PART_WIDTH
    replicas = parts.shape[0]
    assert replicas & (replicas - 1) == 0 and parts.is_contiguous()
    grads = [g if g.is_contiguous() else g.contiguous() for g in grads]
    wt, gt, mt, vt, st = group_tables(params, grads, exp_avgs, exp_avg_sqs, steps)
    if stride is None:
        stride = sample_stride(sum(p.numel() for p in params))
    k = per_program or blocks_per_program(wt.num_blocks, parts.device)
    l1 = any(l1_params)
    _adam_kernel[(triton.cdiv(wt.num_blocks, k),)](
        wt.ptrs, gt.ptrs, mt.ptrs, vt.ptrs, st.ptrs,
        wt.numels, wt.block_start, wt.block_tensor,
        _l1_flags(l1_params, parts.device), *slots, parts.view(torch.float32), parts,
        work.ints, work.sel, work.phase,
        parts if skip is None else skip, parts if grad_scale is None else grad_scale,
        wt.num_blocks, k, int(stride),
        float(lr), float(beta1), float(beta2),
        math.log2(beta1) if beta1 > 0 else -math.inf,
        math.log2(beta2) if beta2 > 0 else -math.inf,
        float(eps),
        1.0 - lr * weight_decay if weight_decay is not None else 1.0, float(headroom),
        AUTO=weight_decay is None, STATS=stats, L1=l1, CLAMP=clamp,
        SKIP=skip is not None, UNSCALE=grad_scale is not None, BLOCK=BLOCK, SUB=SUB,
        BINS=BINS, CSHIFT=COARSE_SHIFT, FSHIFT=FINE_SHIFT, UNDER=INT_UNDER,
        HIST_OFFSET=HIST_OFFSET, WINDOW_OFFSET=WINDOW_OFFSET,
        REPLICAS=replicas, PART_WIDTH=PART_WIDTH, FLOOR=floor,
        num_warps=NUM_WARPS, num_stages=1,
    )  # fmt: skip


def group_tables(params, grads, exp_avgs, exp_avg_sqs, steps) -> tuple[PointerTable, ...]:
    """The update's pointer tables (cached by :func:`pointer_table`)."""
    return (
        *(pointer_table(ts, BLOCK) for ts in (params, grads, exp_avgs, exp_avg_sqs)),
        pointer_table(steps, 1),
    )
