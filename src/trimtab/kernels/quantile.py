"""Triton kernels for the exact q-quantile of |x| over the finite elements of many tensors.

The reference it must match is :func:`trimtab.quantile.abs_quantiles_reference`; the passes
themselves live in :mod:`trimtab.kernels.quantile_passes`.

Algorithm: sample, bracket and compact, then a radix select on what is left
-----------------------------------------------------------------------------
For a float32 ``x``, ``bits = bitcast<int32>(x) & 0x7FFFFFFF`` is monotone in ``|x|``, and
``bits > 0x7F7FFFFF`` exactly when ``x`` is ±Inf or NaN; fp16 and bf16 are converted to float32
in registers (exact). The target is the element of rank ``k = ceil(q * n)`` (1-based, at least 1)
of the sorted finite |x|, ``n`` the finite count. Every step is counted on the device; the
result is exact, always.

* **Sample** (tensors above ``DIRECT_MAX`` elements). In each stratum of
  ``SAMPLE_STRIDE * SAMPLE_RUN`` elements, one run of ``SAMPLE_RUN`` contiguous elements at a
  hashed position (whole DRAM sectors, and periodic data cannot line up with it): ``m ~ n /
  SAMPLE_STRIDE`` elements. Pass 1 histograms their exponents (256 bins); its select takes the
  sample ranks ``q m -/+ d``, ``d = Z sqrt(m q (1-q)) + Z^2 / 2``, which bracket the target's
  rank with a miss probability of about ``2 Phi(-Z)`` (the ``Z^2 / 2`` keeps the bound safe when
  ``m q (1-q)`` is small, e.g. ``q = 1``: a rank above the sample leaves the bracket open to the
  largest finite float, one below it open to 0). Pass 2 histograms the sample again, 256 bins
  over the exponents between those two ranks (1/256 of an octave when they share one), and its
  select sets the bracket ``[lo, hi]`` to the edges of the bins holding them.
* **Bracket**: one read of the tensor counts the finite elements below ``lo`` and the
  non-finite ones (one packed register per element, reduced once per program), keeps the min
  and max of those in ``[lo, hi]`` and compacts them into the tensor's buffer: each bracket
  block hashes to one of the tensor's pools, and an element inside takes the next slot of that
  pool by an atomic that only its warp waits for (no scan, no barrier; pools spread the same-
  address atomics, and clustered or sorted data over the pools). Its select computes ``n`` and
  ``k``: when ``below < k <= below + count`` and no pool overflowed, the answer is among the
  compacted elements, at rank ``k - below`` (when min == max it *is* the min: ties cost
  nothing more, even when they overflow). Otherwise (an unlucky sample, adversarial data, an
  overflow) the tensor falls back to the radix select over all its elements: slower, exact.
* **Radix select**, ``ceil((31 - LOW) / 8)`` passes of 8-bit digits (``LOW`` = 0, 13, 16 bits
  known to be zero for float32, float16, bfloat16), over ``(bits - min) >> LOW`` of the buffer,
  or over ``bits >> LOW`` of the whole tensor for those in fallback and for tensors of at most
  ``DIRECT_MAX`` elements (no sample: they are cheap to read four times). The first digit of a
  whole tensor is its exponent, whose bin 255 counts the non-finite elements. Each pass's
  select fixes one digit; programs of finished tensors return at once.

Every pass is one launch for all tensors; each program adds a 256-bin ``tl.histogram`` (whose
cost grows with the bins, hence 8-bit digits) to its tensor's row with one atomic per non-zero
bin. The select of a pass runs in the last program of that tensor to arrive (an acq_rel arrival
counter, ``FUSED``) or, with ``FUSED = False``, in a one-program-per-tensor launch after it.

Bytes moved, ``n`` elements of ``s`` bytes: the sample reads ``2 n s / SAMPLE_STRIDE`` (whole
sectors of 32 bytes or more), the bracket pass ``n s`` plus ``4 c`` written for the ``c``
elements compacted (about ``2 d n / m + 2`` sample bins' worth, a few 1e-3 of ``n`` for
``q = 0.99``), the radix passes ``4 c`` each; about ``1.05 n s``. A fallback adds up to ``4 n s``.
The workspace (``8 * 1691`` bytes per tensor) is zeroed by one memset. Launches: memset,
2 sample passes, bracket, 4 radix passes (3 for float16, 2 for bfloat16; without the sample
and bracket when every tensor is small), plus one select per pass when ``FUSED`` is off.
Nothing is read back to the host: the sequence is sync-free and CUDA-graph capturable once the
pointer table and the plan (per-tensor grids and buffer layout) are cached.
"""

from __future__ import annotations

import functools
import math
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trimtab.kernels import quantile_passes as qp
from trimtab.kernels._table import DTYPE_CODES, keep, pointer_table

# Tunables, read at each call (benchmarks/bench_quantile.py --sweep times alternatives).
BRACKET_BLOCK = 2048  # elements per block of the bracket pass
BRACKET_WARPS = 8
# Vector loads in the bracket pass: fewer load instructions, but a layout conversion before
# the scattered atomics and stores (more registers and shared memory).
BRACKET_VECTOR = False
POOLS = 32  # compaction pools of a large tensor (at most 128): they spread the atomics
BLOCKS_PER_POOL = 8  # ... a smaller tensor has one pool per this many bracket blocks
BLOCK = 8192  # elements per block of radix passes over whole tensors
NUM_WARPS = 16  # warps of the radix passes
BUF_BLOCK = 1024  # buffer elements per program of a radix pass
MAX_BLOCKS_PER_PROGRAM = 32  # a bracket or whole-tensor radix program reads at most 32 blocks
PROGRAMS_PER_SM = 4  # aim for about this many programs per SM for each large tensor
SAMPLE_STRIDE = 64  # one run of SAMPLE_RUN elements sampled per SAMPLE_STRIDE runs
SAMPLE_RUN = 16  # contiguous elements per sampled run (64 bytes of float32)
SAMPLE_ROWS = 256  # runs per sample program
SAMPLE_WARPS = 8  # 16 elements a thread: about 48 registers (4 warps: over 100)
Z = 5.0  # bracket half-width in standard deviations of the sample rank (miss ~ 6e-7)
CAP_MULT = 4.0  # buffer capacity: this many times the expected count between the sample ranks
CAP_ADD = 4096  # ... plus this many elements (room for the bins' own width)
DIRECT_MAX = 1 << 15  # tensors up to this size skip the sample: radix select over them
# Calls whose every tensor has at most this many elements run the whole select in one launch,
# one program per tensor (``small_kernel``): the trainer's clamps measure a few thousand
# elements a step, where a launch per pass costs more host time than the passes take.
SMALL_MAX = 1 << 14
SMALL_BLOCK = 2048
SMALL_WARPS = 8  # warps of each small_kernel program (benchmarks/experiments/probe_warps.py)
FUSED = True  # selects run in the last program of each pass (False: separate launches)

LOW_BITS = {torch.float32: 0, torch.float16: 13, torch.bfloat16: 16}
_PLAN_CACHE_SIZE = 64


@dataclass(frozen=True)
class _Plan:
    """Per-tensor grids and buffer layout (``meta``, see ``quantile_passes.M_*``) and the
    program-to-tensor maps of the sample, bracket, whole-tensor and buffer grids."""

    meta: torch.Tensor
    sample_tensor: torch.Tensor
    bracket_tensor: torch.Tensor
    full_tensor: torch.Tensor
    buf_tensor: torch.Tensor
    buf_size: int
    any_sampled: bool


_plans: OrderedDict[tuple, _Plan] = OrderedDict()


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def buffer_layout(n: int, q: float) -> tuple[int, int]:
    """``(pools, elements per pool)`` of the buffer of a sampled tensor of ``n`` elements.

    Capacity: ``CAP_MULT`` times the expected count between the bracket's sample ranks, plus
    ``CAP_ADD``, at most ``n``; a bracket block sends its elements to one pool, so a tensor
    has at most one pool per ``BLOCKS_PER_POOL`` blocks (up to ``POOLS``), each rounded up to
    whole ``BUF_BLOCK``s."""
    m = n / SAMPLE_STRIDE
    d = Z * math.sqrt(m * q * (1.0 - q)) + 0.5 * Z * Z
    cap = min(n, math.ceil(CAP_MULT * 2.0 * d * SAMPLE_STRIDE) + CAP_ADD)
    pools = max(1, min(POOLS, n // (BLOCKS_PER_POOL * BRACKET_BLOCK)))
    return pools, BUF_BLOCK * -(-cap // (pools * BUF_BLOCK))


def _plan(numels: Sequence[int], q: float, device: torch.device) -> _Plan:
    if not 1 <= POOLS <= qp.MAX_POOLS.value:
        raise ValueError(f"POOLS must be in [1, {qp.MAX_POOLS.value}], got {POOLS}")
    tunables = (BLOCK, BRACKET_BLOCK, BUF_BLOCK, MAX_BLOCKS_PER_PROGRAM, PROGRAMS_PER_SM)
    tunables += (POOLS, BLOCKS_PER_POOL)
    tunables += (SAMPLE_STRIDE, SAMPLE_RUN, SAMPLE_ROWS, Z, CAP_MULT, CAP_ADD, DIRECT_MAX)
    key = (tuple(numels), q, device, tunables)
    plan = _plans.get(key)
    if plan is not None:
        _plans.move_to_end(key)
        _keep_plan(plan)
        return plan
    target = PROGRAMS_PER_SM * _num_sms(device)
    rows, maps = [], ([], [], [], [])
    buf_size = 0
    for t, n in enumerate(numels):
        sampled = n > DIRECT_MAX

        def chunk(block: int, n: int = n) -> int:
            blocks = max(1, -(-n // block))
            return block * max(1, min(MAX_BLOCKS_PER_PROGRAM, -(-blocks // target)))

        b_chunk, f_chunk = chunk(BRACKET_BLOCK), chunk(BLOCK)
        pools, pool_cap = buffer_layout(n, q) if sampled else (0, 0)
        progs = (
            -(-n // (SAMPLE_ROWS * SAMPLE_STRIDE * SAMPLE_RUN)) if sampled else 0,
            -(-n // b_chunk) if sampled else 0,
            max(1, -(-n // f_chunk)),
            pools * pool_cap // BUF_BLOCK,
        )
        firsts = [len(m) for m in maps]
        for m, c in zip(maps, progs):
            m.extend([t] * c)
        rows.append(
            [n, int(sampled), firsts[0], progs[0], firsts[1], progs[1], b_chunk, firsts[2],
             progs[2], f_chunk, firsts[3], progs[3], buf_size, pool_cap, pools]
        )  # fmt: skip
        buf_size += pools * pool_cap
    as_int32 = [torch.tensor(m or [0], dtype=torch.int32).to(device) for m in maps]
    plan = _Plan(
        torch.tensor(rows, dtype=torch.int64).reshape(-1, qp.META_WIDTH.value).to(device),
        *as_int32,
        buf_size=buf_size,
        any_sampled=any(r[1] for r in rows),
    )
    _plans[key] = plan
    if len(_plans) > _PLAN_CACHE_SIZE:
        _plans.popitem(last=False)
    _keep_plan(plan)
    return plan


def _keep_plan(plan: _Plan) -> None:
    """A graph captured now reads the plan's arrays: it keeps them (an eviction would free them)."""
    keep(plan.meta, plan.sample_tensor, plan.bracket_tensor, plan.full_tensor, plan.buf_tensor)


def abs_quantiles_triton(
    tensors: Sequence[torch.Tensor], q: float, exact: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel path of :func:`trimtab.abs_quantiles`: ``(values float32 [T], nonfinite int64 [T])``.

    ``tensors`` must be non-empty, contiguous, on one device and share one dtype among
    float32, float16, bfloat16 (the public entry arranges that). The values are exact, so
    ``exact`` changes nothing (it is kept for the signature).
    """
    if max(t.numel() for t in tensors) <= SMALL_MAX:
        return _run_small(tensors, q)
    out, ws = run(tensors, q)
    return out, ws[:, qp.S_NONFINITE.value]


def _q_bits(q: float) -> int:
    """float64 bits of q (at least 1e-300: same k, and the bits stay a 64-bit kernel argument)."""
    return struct.unpack("<q", struct.pack("<d", max(float(q), 1e-300)))[0]


def _run_small(tensors: Sequence[torch.Tensor], q: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch, one program per tensor (``qp.small_kernel``): ``(values, nonfinite)``."""
    dtype, device, num = tensors[0].dtype, tensors[0].device, len(tensors)
    table = pointer_table(tensors, SMALL_BLOCK)
    out = torch.empty(num, dtype=torch.float32, device=device)
    nonfinite = torch.empty(num, dtype=torch.int64, device=device)
    low = LOW_BITS[dtype]
    qp.small_kernel[(num,)](
        table.ptrs, table.numels, out, nonfinite, _q_bits(q),
        DTYPE=DTYPE_CODES[dtype], LOW=low, PASSES=-(-(31 - low) // 8), BLOCK=SMALL_BLOCK,
        num_warps=SMALL_WARPS,
    )  # fmt: skip
    return out, nonfinite


def paths(ws: torch.Tensor) -> list[str]:
    """How each tensor's answer was found, from the workspace returned by :func:`run`."""
    names = ("direct", "buffer", "answered", "miss", "overflow")
    return [names[i] for i in ws[:, qp.S_PATH.value].tolist()]


def run(tensors: Sequence[torch.Tensor], q: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`abs_quantiles_triton`, returning the values and the whole workspace."""
    dtype = tensors[0].dtype
    device = tensors[0].device
    num = len(tensors)
    plan = _plan([t.numel() for t in tensors], float(q), device)
    ptrs = pointer_table(tensors, BLOCK).ptrs
    ws = torch.zeros((num, qp.WS_WIDTH.value), dtype=torch.int64, device=device)
    buf = torch.empty(max(1, plan.buf_size), dtype=torch.int32, device=device)
    out = torch.empty(num, dtype=torch.float32, device=device)
    aligned = all(t.data_ptr() % 16 == 0 for t in tensors)
    q_bits = _q_bits(q)
    code, low = DTYPE_CODES[dtype], LOW_BITS[dtype]
    meta = plan.meta

    def select(stage: int, pass_: int = 0) -> None:
        if not FUSED:
            qp.select_kernel[(num,)](
                meta, ws, out, q_bits, Z, stage, pass_, low, POOLS, num_warps=4
            )

    if plan.any_sampled:
        for level in (0, 1):
            qp.sample_kernel[(plan.sample_tensor.numel(),)](
                ptrs, meta, plan.sample_tensor, ws, q_bits,
                Z=Z, LEVEL=level, DTYPE=code, ROWS=SAMPLE_ROWS, STRIDE=SAMPLE_STRIDE,
                RUN=SAMPLE_RUN, FUSED=FUSED, num_warps=SAMPLE_WARPS,
            )  # fmt: skip
            select(level)
        qp.bracket_kernel[(plan.bracket_tensor.numel(),)](
            ptrs, meta, plan.bracket_tensor, ws, buf, out, q_bits,
            DTYPE=code, ALIGNED=aligned and BRACKET_VECTOR, BLOCK=BRACKET_BLOCK, LOW=low,
            POOLS=POOLS,
            FUSED=FUSED, num_warps=BRACKET_WARPS,
        )  # fmt: skip
        select(2)
    num_full, num_buf = plan.full_tensor.numel(), plan.buf_tensor.numel()
    num_buf = num_buf if plan.buf_size else 0
    for pass_ in range(-(-(31 - low) // 8)):
        qp.radix_kernel[(max(num_full, num_buf),)](
            ptrs, meta, plan.full_tensor, plan.buf_tensor, ws, buf, out, q_bits, num_full,
            num_buf, PASS=pass_, DTYPE=code, ALIGNED=aligned, BLOCK=BLOCK,
            BUF_BLOCK=BUF_BLOCK, LOW=low, FUSED=FUSED, num_warps=NUM_WARPS,
        )  # fmt: skip
        select(3, pass_)
    return out, ws
