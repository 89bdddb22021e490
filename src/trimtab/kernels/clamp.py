"""Triton kernel for :func:`trimtab.clamp_finite_` and :func:`trimtab.guard_`: one pass that reads
x, optionally records a sentinel check of it, and writes x back sanitised and clamped.

The torch references are ``trimtab.clamp._clamp_reference_`` and, for the check, the sentinel's
:func:`trimtab.sentinel_state.record_reference`; the sentinel's state is the dict of tensors
described in :mod:`trimtab.kernels.sentinel`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trimtab.kernels._table import pointer_table
from trimtab.kernels.sentinel import REDUCE_BLOCK, record_first_fire, reduce_partials, scratch

#: Elements per program (one load each: x is read exactly once and written once).
CLAMP_BLOCK = 4096


@triton.jit
def _clamp_kernel(
    x_ptr,
    n,
    bound_ptr,
    bound_val,
    counter,
    scratch_nan,
    scratch_max,
    done,
    counters,
    guard_steps,
    slot,
    thr_ptrs,
    factors,
    powers,
    rec_seq,
    rec_step,
    rec_kind,
    rec_val,
    n_counters,
    ACC: tl.constexpr,
    BOUND_PTR: tl.constexpr,
    COUNT: tl.constexpr,
    COUNT_NONFINITE: tl.constexpr,
    GUARD: tl.constexpr,
    BLOCK: tl.constexpr,
    RBLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    x = tl.load(x_ptr + idx, mask=mask, other=0.0)
    y = x.to(ACC)
    a = tl.abs(y)
    isnan = a != a
    finite = a < float("inf")  # False for +-Inf and NaN
    if BOUND_PTR:
        b = tl.load(bound_ptr, volatile=True).to(ACC)
    else:
        b = tl.zeros([BLOCK], dtype=ACC) + bound_val  # (a Python float in the interpreter)
    b = tl.where(b < 0, 0.0, b)  # a negative bound clamps to 0; NaN (unset) stays NaN
    engaged = finite & (a > b)  # False for every element when b is NaN
    # ``b * -1.0``, not ``-b``: Triton lowers unary minus to ``0 - b``, which turns -0.0 into +0.0.
    out = tl.where(finite, tl.where(engaged, tl.where(y > 0, b, b * -1.0), y), 0.0)
    if GUARD:
        # Record the check of the *unsanitised* values before anything is written (design
        # invariant 4); the last program reduces the partials as in the check kernel.
        any_nan = tl.max(isnan.to(tl.int32), axis=0)
        amax = tl.max(tl.where(isnan, 0.0, a), axis=0).to(tl.float64)
        tl.store(scratch_nan + pid, any_nan)
        tl.store(scratch_max + pid, amax)
    tl.store(x_ptr + idx, out.to(x_ptr.dtype.element_ty), mask=mask)
    if COUNT:
        tl.atomic_add(counter, tl.sum((engaged & mask).to(tl.int64), axis=0))
        if COUNT_NONFINITE:
            tl.atomic_add(counter + 1, tl.sum((~finite & mask).to(tl.int64), axis=0))
    if GUARD:
        tl.debug_barrier()
        nprog = tl.num_programs(0)
        arrived = tl.atomic_add(done + slot, 1, sem="acq_rel")
        if arrived == nprog - 1:
            any_nan, amax = reduce_partials(scratch_nan, scratch_max, 0, nprog, RBLOCK)
            step = tl.load(guard_steps + slot)
            gseq = tl.load(counters + n_counters - 1)
            record_first_fire(
                slot,
                any_nan,
                amax,
                step,
                gseq,
                thr_ptrs,
                factors,
                powers,
                rec_seq,
                rec_step,
                rec_kind,
                rec_val,
            )
            tl.store(guard_steps + slot, step + 1)
            tl.store(counters + n_counters - 1, gseq + 1)
            tl.store(done + slot, 0)


def launch_clamp(
    x: torch.Tensor,
    bound: torch.Tensor | float,
    counter: torch.Tensor | None,
    guard: tuple[dict[str, torch.Tensor], int] | None = None,
    block: int | None = None,
) -> None:
    """Sanitise and clamp contiguous ``x`` in place; ``guard=(sentinel state, slot)`` also checks.

    ``bound`` is a float (already validated, rounded to float32 by the launch) or a 1-element
    float32 tensor read by the kernel. ``counter``: int64, 1 or 2 elements, or None.
    """
    block = CLAMP_BLOCK if block is None else block
    n = x.numel()
    grid = max(1, triton.cdiv(n, block))
    bound_is_ptr = isinstance(bound, torch.Tensor)
    bound_ptr = bound if bound_is_ptr else x  # unused placeholder when the bound is a float
    bound_val = 0.0 if bound_is_ptr else float(bound)
    count = counter is not None
    counter_arg = counter if count else x
    if guard is not None:
        state, slot = guard
        scratch_nan, scratch_max = scratch(state, grid)
        rec = state["rec"]
        args = (
            scratch_nan,
            scratch_max,
            state["done"],
            state["counters"],
            state["guard_steps"],
            slot,
            state["thr_ptrs"],
            state["factors"],
            state["powers"],
            rec[0],
            rec[1],
            rec[2],
            state["value"],
            state["counters"].numel(),
        )
    else:
        args = (x, x, x, x, x, 0, x, x, x, x, x, x, x, 1)
    _clamp_kernel[(grid,)](
        x,
        n,
        bound_ptr,
        bound_val,
        counter_arg,
        *args,
        ACC=tl.float64 if x.dtype == torch.float64 else tl.float32,
        BOUND_PTR=bound_is_ptr,
        COUNT=count,
        COUNT_NONFINITE=count and counter.numel() == 2,
        GUARD=guard is not None,
        BLOCK=block,
        RBLOCK=REDUCE_BLOCK,
        num_warps=8,
    )


#: Elements per program of :func:`launch_scale_finite`.
SCALE_BLOCK = 2048


@triton.jit
def _scale_finite_kernel(ptrs, numels, block_start, block_tensor, scale, counter,
                         COUNT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """``x_t *= scale[t]``, then NaN/±Inf -> +0, over many float32 tensors (a pointer table)."""
    pid = tl.program_id(0)
    t = tl.load(block_tensor + pid)
    idx = (pid - tl.load(block_start + t)).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < tl.load(numels + t)
    ptr = tl.load(ptrs + t).to(tl.pointer_type(tl.float32))
    y = tl.load(ptr + idx, mask=mask, other=0.0) * tl.load(scale + t)
    finite = tl.abs(y) < float("inf")  # False for NaN
    tl.store(ptr + idx, tl.where(finite, y, 0.0), mask=mask)
    if COUNT:
        tl.atomic_add(counter, tl.sum((~finite & mask).to(tl.int64), axis=0))


def launch_scale_finite(
    tensors: list[torch.Tensor], scale: torch.Tensor, counter: torch.Tensor | None
) -> None:
    """One launch of :func:`trimtab.clamp.scale_finite_` (contiguous float32 tensors)."""
    table = pointer_table(tensors, SCALE_BLOCK)
    _scale_finite_kernel[(table.num_blocks,)](
        table.ptrs, table.numels, table.block_start, table.block_tensor, scale,
        scale if counter is None else counter, COUNT=counter is not None, BLOCK=SCALE_BLOCK,
    )  # fmt: skip
