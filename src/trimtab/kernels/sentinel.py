"""Triton kernel for :meth:`trimtab.Sentinel.check`: one launch checks many tensors of mixed dtype.

The torch reference (the CPU path and the test oracle) is
:func:`trimtab.sentinel_state.check_reference`; both write the same sticky first-firing records.
Imported lazily: only CUDA/interpreter use.

State reaches the kernels (here and in :mod:`trimtab.kernels.clamp`) as a dict of device tensors
(``n`` slots, ``P`` phases), built by ``SentinelState.materialize``:

- ``rec`` int64 ``[3, n]``: per slot the first-fire check number (1-based, 0 = never), its step
  and its kind (``KIND_NAN``, ``KIND_INF``, ``KIND_THRESHOLD``); ``value`` float64 ``[n]``: max
  |x| at that firing.
- ``counters`` int64 ``[P + 1]``: checks per phase, then checks of any kind (the global order);
  ``guard_steps`` int64 ``[n]``: guard_ calls per slot; ``slot_phase`` int32 ``[n]``: each slot's
  counter index.
- ``thr_ptrs`` int64 ``[n]``: the address of each slot's float32 threshold (read when the check
  runs; NaN: no threshold), ``factors`` float32 ``[n]``: its factor.
- ``done`` int32 ``[n + 1]``: arrival counters of the last-program pattern, zero between
  launches; ``scratch_nan`` int32, ``scratch_max`` float64: per-program partials, grown by
  :func:`scratch` (the only key a launcher writes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from trimtab.kernels._table import DTYPE_CODES, keep, pointer_table

# float64 is checked natively (the maximum is kept in float64, so a finite double above the
# float32 range is reported as finite, as the reference does).
CHECK_DTYPE_CODES: dict[torch.dtype, int] = {**DTYPE_CODES, torch.float64: 3}

#: Elements per program. 16384 fp32 = 64 KiB per program: 44M floats are ~2700 programs, so the
#: one atomic per program and the per-slot reduction of partials cost nothing next to the reads.
CHECK_BLOCK = 16384
#: Elements per load inside a program (bounds registers; the loop is unrolled).
CHECK_TILE = 2048
#: Warps per program.
CHECK_WARPS = 4
#: Partials reduced per iteration by the last program of a tensor.
REDUCE_BLOCK = 1024

KIND_NAN, KIND_INF, KIND_THRESHOLD = 1, 2, 3


@triton.jit
def _fold_tile(x, nan, acc, ACC: tl.constexpr):
    """``(nan, acc)`` with one loaded tile ``x`` folded in: any NaN, max |x| of the others."""
    a = tl.abs(x.to(ACC))
    isnan = a != a
    return tl.maximum(nan, isnan.to(tl.int32)), tl.maximum(acc, tl.where(isnan, 0.0, a))


@triton.jit
def _abs_partial(base, start, n, DTYPE: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
                 TILE: tl.constexpr):  # fmt: skip
    """(any NaN as int32, max |x| over the non-NaN elements as float64) of the ``DTYPE``
    elements ``start .. start + BLOCK - 1`` (those below ``n``) at address ``base``. A whole
    block at a 16-byte aligned address (every block of a tensor from PyTorch's allocator but its
    last) is read without a mask, in 16-byte vector loads; any other block element by element."""
    acc = tl.zeros([TILE], dtype=ACC)
    nan = tl.zeros([TILE], dtype=tl.int32)
    if (start + BLOCK <= n) & (base % 16 == 0):
        ptr = tl.multiple_of(base.to(tl.pointer_type(DTYPE)), 16) + start
        for off in tl.static_range(0, BLOCK, TILE):
            nan, acc = _fold_tile(tl.load(ptr + off + tl.arange(0, TILE)), nan, acc, ACC)
    else:
        ptr = base.to(tl.pointer_type(DTYPE))
        for off in tl.static_range(0, BLOCK, TILE):
            idx = start + off + tl.arange(0, TILE)
            nan, acc = _fold_tile(tl.load(ptr + idx, mask=idx < n, other=0.0), nan, acc, ACC)
    return tl.max(nan, axis=0), tl.max(acc, axis=0).to(tl.float64)


@triton.jit
def reduce_partials(scratch_nan, scratch_max, first, nprog, RBLOCK: tl.constexpr):
    """(any NaN, max |x|) over partials ``first .. first + nprog - 1`` that other programs of
    this launch wrote (volatile loads: bypass L1). Used by the last program of a tensor."""
    nan_acc = tl.zeros([RBLOCK], dtype=tl.int32)
    max_acc = tl.zeros([RBLOCK], dtype=tl.float64)
    for r in range(0, nprog, RBLOCK):
        ridx = first + r + tl.arange(0, RBLOCK)
        rmask = ridx < first + nprog
        nan_acc = tl.maximum(
            nan_acc, tl.load(scratch_nan + ridx, mask=rmask, other=0, volatile=True)
        )
        max_acc = tl.maximum(
            max_acc, tl.load(scratch_max + ridx, mask=rmask, other=0.0, volatile=True)
        )
    return tl.max(nan_acc, axis=0), tl.max(max_acc, axis=0)


@triton.jit
def record_first_fire(
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
):
    """Classify one finished tensor and record it if this is its slot's first firing.

    ``amax`` is the float64 max |x| over non-NaN elements. The threshold is read *now* from the
    float32 the slot's threshold pointer names (a state-vector slot, or the sentinel's literal
    buffer) times its factor, squared where the slot's power is 2; a NaN threshold (unset)
    makes ``amax > thr`` False.
    """
    thr_ptr = tl.load(thr_ptrs + slot).to(tl.pointer_type(tl.float32))
    thr = tl.load(thr_ptr, volatile=True).to(tl.float64) * tl.load(factors + slot).to(tl.float64)
    thr = tl.where(tl.load(powers + slot) == 2, thr * thr, thr)
    has_nan = any_nan > 0
    has_inf = amax == float("inf")
    fired = has_nan | has_inf | (amax > thr)
    kind = tl.where(has_nan, 1, tl.where(has_inf, 2, 3)).to(tl.int64)
    value = tl.where(has_nan, float("nan"), amax)
    prev = tl.load(rec_seq + slot)
    first = fired & (prev == 0)
    tl.store(rec_seq + slot, tl.where(first, gseq + 1, prev))
    tl.store(rec_step + slot, tl.where(first, step, tl.load(rec_step + slot)))
    tl.store(rec_kind + slot, tl.where(first, kind, tl.load(rec_kind + slot)))
    tl.store(rec_val + slot, tl.where(first, value, tl.load(rec_val + slot)))


# Not specialised on: the record rows (views of one [3, n_slots] tensor, whose alignment follows
# n_slots), the increments' view and the counts, which vary between the sentinels of a run and
# are read or written a few times a launch, where the alignment hints buy nothing. The default
# market run compiled three variants of this kernel (about 1.7 s each on an H100,
# benchmarks/experiments/probe_compile.py); with these left general, two.
@triton.jit(
    do_not_specialize=[
        "inc", "rec_seq", "rec_step", "rec_kind", "rec_val", "n_entries", "n_slots", "n_counters",
    ]
)  # fmt: skip
def _check_kernel(
    ptrs,
    numels,
    block_start,
    block_tensor,
    entry_slot,
    entry_code,
    scratch_nan,
    scratch_max,
    done,
    counters,
    inc,
    slot_phase,
    thr_ptrs,
    factors,
    powers,
    rec_seq,
    rec_step,
    rec_kind,
    rec_val,
    n_entries,
    n_slots,
    n_counters,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
    RBLOCK: tl.constexpr,
    NC: tl.constexpr,
):
    pid = tl.program_id(0)
    e = tl.load(block_tensor + pid)
    first = tl.load(block_start + e)
    nprog = tl.load(block_start + e + 1) - first
    start = (pid - first).to(tl.int64) * BLOCK
    n = tl.load(numels + e)
    code = tl.load(entry_code + e)
    base = tl.load(ptrs + e)
    if code == 0:
        any_nan, amax = _abs_partial(base, start, n, tl.float32, tl.float32, BLOCK, TILE)
    elif code == 1:
        any_nan, amax = _abs_partial(base, start, n, tl.float16, tl.float32, BLOCK, TILE)
    elif code == 2:
        any_nan, amax = _abs_partial(base, start, n, tl.bfloat16, tl.float32, BLOCK, TILE)
    else:
        any_nan, amax = _abs_partial(base, start, n, tl.float64, tl.float64, BLOCK, TILE)
    tl.store(scratch_nan + pid, any_nan)
    tl.store(scratch_max + pid, amax)
    # Every thread's partial store must precede the release below (the last-program pattern).
    tl.debug_barrier()
    slot = tl.load(entry_slot + e)
    arrived = tl.atomic_add(done + slot, 1, sem="acq_rel")
    if arrived == nprog - 1:
        # Last program of this tensor: reduce its partials (volatile: bypass L1, they were
        # written by other programs), classify, record.
        any_nan, amax = reduce_partials(scratch_nan, scratch_max, first, nprog, RBLOCK)
        phase = tl.load(slot_phase + slot)
        step = tl.load(counters + phase, volatile=True)
        gseq = tl.load(counters + n_counters - 1, volatile=True)
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
        tl.store(done + slot, 0)
        # The last tensor to finish advances the step counters, after every other tensor has
        # read them (their reads precede their release on ``done[n_slots]``).
        tl.debug_barrier()
        finished = tl.atomic_add(done + n_slots, 1, sem="acq_rel")
        if finished == n_entries - 1:
            cidx = tl.arange(0, NC)
            cmask = cidx < n_counters
            c = tl.load(counters + cidx, mask=cmask, other=0, volatile=True)
            tl.store(counters + cidx, c + tl.load(inc + cidx, mask=cmask, other=0), mask=cmask)
            tl.store(done + n_slots, 0)


def launch_check(
    tensors: Sequence[torch.Tensor],
    entry_slot: torch.Tensor,
    entry_code: torch.Tensor,
    inc: torch.Tensor,
    state: dict[str, torch.Tensor],
    block: int | None = None,
) -> None:
    """Check ``tensors`` (contiguous, one device) in one launch and update ``state`` in place.

    ``entry_slot[i]``/``entry_code[i]``: slot index and dtype code of ``tensors[i]``; ``inc``:
    what the launch adds to ``state["counters"]``. Builds nothing on the device once the pointer
    table of these buffers is cached, so it can be captured in a CUDA graph after a warm-up.
    """
    block = CHECK_BLOCK if block is None else block
    table = pointer_table(tensors, block)
    scratch_nan, scratch_max = scratch(state, table.num_blocks)
    rec = state["rec"]
    n_slots = rec.shape[1]
    n_counters = state["counters"].numel()
    _check_kernel[(table.num_blocks,)](
        table.ptrs,
        table.numels,
        table.block_start,
        table.block_tensor,
        entry_slot,
        entry_code,
        scratch_nan,
        scratch_max,
        state["done"],
        state["counters"],
        inc,
        state["slot_phase"],
        state["thr_ptrs"],
        state["factors"],
        state["powers"],
        rec[0],
        rec[1],
        rec[2],
        state["value"],
        table.count,
        n_slots,
        n_counters,
        BLOCK=block,
        TILE=min(CHECK_TILE, block),
        RBLOCK=REDUCE_BLOCK,
        NC=triton.next_power_of_2(n_counters),
        num_warps=CHECK_WARPS,
    )


def scratch(state: dict[str, torch.Tensor], programs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-program partials (any-NaN, max |x|), grown (an allocation: warm-up only) on demand."""
    if state["scratch_max"].numel() < programs:
        device = state["scratch_max"].device
        state["scratch_nan"] = torch.zeros(programs, dtype=torch.int32, device=device)
        state["scratch_max"] = torch.zeros(programs, dtype=torch.float64, device=device)
    keep(state["scratch_nan"], state["scratch_max"])  # a graph captured now keeps its partials
    return state["scratch_nan"], state["scratch_max"]
