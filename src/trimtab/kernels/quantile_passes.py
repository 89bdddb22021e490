"""The Triton passes behind :mod:`trimtab.kernels.quantile`: sample, bracket, radix, select.

Every per-tensor decision ("select") runs on the device, either in the last program of a pass to
finish for that tensor (``FUSED``) or in a separate one-program-per-tensor launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Columns of the int64 workspace ``ws[T, WS_WIDTH]``, zeroed at every call. Globals read inside
# kernels must be constexpr.
HIST_S0 = tl.constexpr(0)  # 256 bins: sample exponents (bin 255: Inf and NaN)
HIST_S1 = tl.constexpr(256)  # 256 bins: sample, inside the exponent window
HIST_R = tl.constexpr(512)  # 4 x 256 bins: radix digits, one row per pass
S_DONE = tl.constexpr(1536)  # 7 arrival counters: sample 0, sample 1, bracket, radix 0-3
S_WLO = tl.constexpr(1543)  # exponent window of the sample refinement: first exponent
S_WSHIFT = tl.constexpr(1544)  # ... and the shift of its keys
S_RLO = tl.constexpr(1545)  # sample ranks of the bracket, counted from the window's start
S_RHI = tl.constexpr(1546)
S_LO_OPEN = tl.constexpr(1547)  # the bracket's low end is 0 (its rank is below the sample)
S_HI_OPEN = tl.constexpr(1548)  # the bracket's high end is the largest finite float
S_REFINE = tl.constexpr(1549)  # the sample's second pass has work
S_LO = tl.constexpr(1550)  # the bracket [lo, hi], float32 bit patterns of |x|
S_HI = tl.constexpr(1551)
S_BELOW = tl.constexpr(1552)  # finite elements below lo
S_NONFINITE = tl.constexpr(1553)
S_COUNT = tl.constexpr(1554)  # elements in the bracket (set by the bracket's select)
S_NEG_MIN = tl.constexpr(1555)  # MAX_BITS - smallest bits in the bracket (so 0 is neutral)
S_MAX = tl.constexpr(1556)  # largest bits in the bracket
S_MODE = tl.constexpr(1557)
S_BASE = tl.constexpr(1558)  # radix select: keys are (bits - base) >> LOW
S_SHIFT = tl.constexpr(1559)  # ... the key bits at and above SHIFT are known: they are PREFIX
S_PREFIX = tl.constexpr(1560)
S_RANK = tl.constexpr(1561)  # ... and the rank still to find among the keys with that prefix
S_PATH = tl.constexpr(1562)  # how the bracket went: one of the PATH_* codes below
S_POOLS = tl.constexpr(1563)  # MAX_POOLS compaction cursors, one per buffer pool
MAX_POOLS = tl.constexpr(128)
WS_WIDTH = tl.constexpr(1691)

# Modes: FULL (the zeroed default) is a radix select over the tensor itself; BUFFER one over
# the elements compacted from the bracket; DONE: the value is written.
FULL = tl.constexpr(0)
BUFFER = tl.constexpr(1)
DONE = tl.constexpr(2)
# Paths, for tests and diagnostics: no sample (small tensor); answer in the buffer; answered by
# the bracket pass (all its elements equal, or no finite element); fallback after a bracket
# that missed rank k; fallback after a buffer overflow.
PATH_DIRECT, PATH_BUFFER, PATH_ANSWERED, PATH_MISS, PATH_OVERFLOW = 0, 1, 2, 3, 4

# Columns of the int64 plan table ``meta[T, META_WIDTH]``: per-tensor grids and buffer layout.
M_NUMEL = tl.constexpr(0)
M_SAMPLED = tl.constexpr(1)
M_S_FIRST = tl.constexpr(2)  # first program of the tensor in the sample grid, and count
M_S_PROGS = tl.constexpr(3)
M_B_FIRST = tl.constexpr(4)  # bracket grid: first program, count, elements per program
M_B_PROGS = tl.constexpr(5)
M_B_CHUNK = tl.constexpr(6)
M_F_FIRST = tl.constexpr(7)  # radix grid over the tensor itself
M_F_PROGS = tl.constexpr(8)
M_F_CHUNK = tl.constexpr(9)
M_U_FIRST = tl.constexpr(10)  # radix grid over the tensor's buffer segment
M_U_PROGS = tl.constexpr(11)
M_BUF_OFF = tl.constexpr(12)
M_POOL_CAP = tl.constexpr(13)  # elements per pool
M_POOLS = tl.constexpr(14)  # pools of the tensor's buffer segment (at most POOLS)
META_WIDTH = tl.constexpr(15)

MAX_BITS = tl.constexpr(0x7FFFFFFF)
MAX_FINITE = tl.constexpr(0x7F7FFFFF)  # bits of the largest finite float32; above: Inf, NaN


@triton.jit
def _abs_bits(addr, start, offs, mask, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """|x| at ``addr[start + offs]`` as non-negative int32 float32 bit patterns (``DTYPE``: 0
    float32, 1 float16, 2 bfloat16); ``mask=None`` reads a full block."""
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
    if mask is None:
        x = tl.load(base + offs)
    else:
        x = tl.load(base + offs, mask=mask, other=0)
    if DTYPE == 2:
        bits = x.to(tl.int32) << 16
    else:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    return bits & 0x7FFFFFFF


@triton.jit
def _rank(n_finite, q_bits):
    """k = max(1, ceil(q * n_finite)), the product rounded in float64 as the reference does."""
    kq = n_finite.to(tl.float64) * q_bits.to(tl.float64, bitcast=True)
    k = kq.to(tl.int64)
    return tl.maximum(k + (k.to(tl.float64) < kq).to(tl.int64), 1)


@triton.jit
def _bitlen(v):
    """Bits needed for ``0 <= v < 2**53`` (0 for 0), from the exponent of ``float64(v)``."""
    e = (v.to(tl.float64).to(tl.int64, bitcast=True) >> 52) - 1022
    return tl.where(v > 0, e, 0)


@triton.jit
def _flush(row, acc, w, STAGE: tl.constexpr, nprog, FUSED: tl.constexpr):
    """Add a program's 256-bin histogram to its tensor's row; with ``FUSED``, True in the last
    program of ``STAGE`` to arrive for this tensor (it then holds every program's counts)."""
    bins = tl.arange(0, 256)
    tl.atomic_add(row + bins, acc.to(tl.int64), mask=acc != 0, sem="relaxed")
    return _arrive(w, STAGE, nprog, FUSED)


@triton.jit
def _arrive(w, STAGE: tl.constexpr, nprog, FUSED: tl.constexpr):
    last = nprog < 0  # False, as a tensor
    if FUSED:
        # The barrier orders every thread's atomics before the release of the arrival (the
        # pattern of CUDA's threadfence reduction); the last program acquires them.
        tl.debug_barrier()
        last = tl.atomic_add(w + S_DONE + STAGE, 1, sem="acq_rel") == nprog - 1
    return last


# --- selects: one tensor's decision, from the counts of a finished pass ----------------------


@triton.jit
def _select_sample0(w, q_bits, Z: tl.constexpr):
    """Sample ranks ``q m -/+ d`` (``d = z sqrt(m q (1-q)) + z^2 / 2``) bracket the target with
    high probability; find their exponents: the window that the second sample pass refines."""
    bins = tl.arange(0, 256)
    h = tl.load(w + HIST_S0 + bins, volatile=True)
    h = tl.where(bins == 255, 0, h)
    q = q_bits.to(tl.float64, bitcast=True)
    m = tl.sum(h, axis=0).to(tl.float64)
    d = tl.sqrt(m * q * (1.0 - q)) * Z + 0.5 * Z * Z
    x = q * m - d
    rlo = x.to(tl.int64)
    rlo -= (rlo.to(tl.float64) > x).to(tl.int64)  # floor
    x = q * m + d
    rhi = x.to(tl.int64)
    rhi += (rhi.to(tl.float64) < x).to(tl.int64)  # ceil
    lo_open = rlo < 1
    hi_open = rhi.to(tl.float64) > m
    cum = tl.cumsum(h, axis=0)
    elo = tl.sum((cum < rlo).to(tl.int64), axis=0)
    ehi = tl.sum((cum < rhi).to(tl.int64), axis=0)
    wlo = tl.minimum(tl.where(lo_open, ehi, elo), 254)
    whi = tl.maximum(tl.minimum(tl.where(hi_open, elo, ehi), 254), wlo)
    below = tl.sum(tl.where(bins < wlo, h, 0), axis=0)
    tl.store(w + S_WLO, wlo)
    # 256 bins over whi - wlo + 1 octaves: 2**(23 - shift) bins per octave.
    tl.store(w + S_WSHIFT, 15 + _bitlen(whi - wlo))
    tl.store(w + S_RLO, rlo - below)
    tl.store(w + S_RHI, rhi - below)
    tl.store(w + S_LO_OPEN, lo_open.to(tl.int64))
    tl.store(w + S_HI_OPEN, hi_open.to(tl.int64))
    tl.store(w + S_REFINE, (~(lo_open & hi_open)).to(tl.int64))
    tl.store(w + S_LO, 0)
    tl.store(w + S_HI, MAX_FINITE)


@triton.jit
def _select_sample1(w):
    """The bracket [lo, hi]: from the low edge of the window bin holding the low rank to the
    high edge of the bin holding the high rank."""
    bins = tl.arange(0, 256)
    cum = tl.cumsum(tl.load(w + HIST_S1 + bins, volatile=True), axis=0)
    blo = tl.sum((cum < tl.load(w + S_RLO)).to(tl.int64), axis=0)
    bhi = tl.sum((cum < tl.load(w + S_RHI)).to(tl.int64), axis=0)
    wbase = tl.load(w + S_WLO) << 23
    shift = tl.load(w + S_WSHIFT)
    lo = tl.where(tl.load(w + S_LO_OPEN) != 0, 0, wbase + (blo << shift))
    hi = tl.minimum(wbase + ((bhi + 1) << shift) - 1, MAX_FINITE)
    hi = tl.where(tl.load(w + S_HI_OPEN) != 0, MAX_FINITE, hi)
    tl.store(w + S_LO, lo)
    tl.store(w + S_HI, hi)


@triton.jit
def _select_bracket(w, mrow, out_t, q_bits, LOW: tl.constexpr, POOLS: tl.constexpr):
    """Did the bracket catch rank k, and does its buffer hold it? Then the radix passes read the
    buffer (or nothing, when every element in it is equal); else they read the whole tensor."""
    n_finite = tl.load(mrow + M_NUMEL) - tl.load(w + S_NONFINITE, volatile=True)
    k = _rank(n_finite, q_bits)
    below = tl.load(w + S_BELOW, volatile=True)
    pools = tl.load(w + S_POOLS + tl.arange(0, POOLS), volatile=True)
    count = tl.sum(pools, axis=0)
    tl.store(w + S_COUNT, count)
    lo = 0x7FFFFFFF - tl.load(w + S_NEG_MIN, volatile=True)
    hi = tl.load(w + S_MAX, volatile=True)
    hit = (below < k) & (k <= below + count)
    tie = hit & (lo == hi)
    if (n_finite == 0) | tie:
        value = lo.to(tl.int32).to(tl.float32, bitcast=True)
        tl.store(out_t, tl.where(n_finite == 0, 0.0, value))
        tl.store(w + S_MODE, DONE)
        tl.store(w + S_PATH, 2)
    elif hit & (tl.max(pools, axis=0) <= tl.load(mrow + M_POOL_CAP)):
        tl.store(w + S_MODE, BUFFER)
        tl.store(w + S_BASE, lo)
        tl.store(w + S_SHIFT, _bitlen((hi - lo) >> LOW))
        tl.store(w + S_RANK, k - below)
        tl.store(w + S_PATH, 1)
    else:
        tl.store(w + S_PATH, tl.where(hit, 4, 3))


@triton.jit
def _select_radix(w, mrow, out_t, q_bits, PASS: tl.constexpr, LOW: tl.constexpr):
    """Fix the next digit (at most 8 bits) of the key of rank RANK; write the value when the
    last digit is known. The first pass over a whole tensor also counts its Inf and NaN (the
    exponent digit 255) and sets the rank."""
    bins = tl.arange(0, 256)
    h = tl.load(w + HIST_R + PASS * 256 + bins, volatile=True)
    n_finite = tl.full([], 1, tl.int64)
    shift = tl.load(w + S_SHIFT)
    prefix = tl.load(w + S_PREFIX)
    rank = tl.load(w + S_RANK)
    base = tl.load(w + S_BASE)
    if PASS == 0:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if tl.load(w + S_MODE) == FULL:
            nonfinite = tl.sum(tl.where(bins == 255, h, 0), axis=0)
            h = tl.where(bins == 255, 0, h)
            n_finite = tl.load(mrow + M_NUMEL) - nonfinite
            tl.store(w + S_NONFINITE, nonfinite)
            rank = _rank(n_finite, q_bits)
            shift = tl.full([], 31 - LOW, tl.int64)
            prefix = tl.zeros([], tl.int64)
            base = tl.zeros([], tl.int64)
    nshift = tl.maximum(shift - 8, 0)
    cum = tl.cumsum(h, axis=0)
    digit = tl.sum((cum < rank).to(tl.int64), axis=0)
    rank -= tl.sum(tl.where(bins < digit, h, 0), axis=0)
    prefix = (prefix << (shift - nshift)) | digit
    tl.store(w + S_SHIFT, nshift)
    tl.store(w + S_PREFIX, prefix)
    tl.store(w + S_RANK, rank)
    if (nshift == 0) | (n_finite == 0):
        value = (base + (prefix << LOW)).to(tl.int32).to(tl.float32, bitcast=True)
        tl.store(out_t, tl.where(n_finite == 0, 0.0, value))
        tl.store(w + S_MODE, DONE)


# --- passes ----------------------------------------------------------------------------------


@triton.jit
def sample_kernel(
    ptrs, meta, prog_tensor, ws, q_bits, Z: tl.constexpr, LEVEL: tl.constexpr,
    DTYPE: tl.constexpr, ROWS: tl.constexpr, STRIDE: tl.constexpr, RUN: tl.constexpr,
    FUSED: tl.constexpr,
):  # fmt: skip
    """Histogram of a stratified sample: in each stratum of ``STRIDE * RUN`` elements, the run
    of ``RUN`` at a hashed position; a program takes ``ROWS`` strata. Level 0 keys the exponent,
    level 1 the bits inside the window that level 0 chose."""
    p = tl.program_id(0)
    t = tl.load(prog_tensor + p)
    mrow = meta + t * META_WIDTH
    w = ws + t * WS_WIDTH
    active = tl.load(mrow + M_SAMPLED) != 0
    if LEVEL == 1:
        active = active & (tl.load(w + S_REFINE) != 0)
    if active:
        CHUNK: tl.constexpr = ROWS * STRIDE * RUN
        stratum = (p - tl.load(mrow + M_S_FIRST)) * ROWS
        count = tl.minimum(tl.load(mrow + M_NUMEL) - stratum * (STRIDE * RUN), CHUNK)
        # A multiplicative hash of the stratum picks its run: periodic data cannot line up
        # with the sample. Offsets are int32, from the program's first stratum.
        rows = tl.arange(0, ROWS)
        run = (((stratum + rows) * 2654435761) >> 16) & (STRIDE - 1)
        offs = ((rows * STRIDE + run.to(tl.int32)) * RUN)[:, None] + tl.arange(0, RUN)[None, :]
        offs = tl.reshape(offs, [ROWS * RUN])
        mask = offs < count.to(tl.int32)
        start = stratum * (STRIDE * RUN)
        bits = _abs_bits(tl.load(ptrs + t), start, offs, mask, DTYPE, False)
        if LEVEL == 0:
            key = bits >> 23
        else:
            wlo = tl.load(w + S_WLO).to(tl.int32)
            shift = tl.load(w + S_WSHIFT).to(tl.int32)
            key = (bits - (wlo << 23)) >> shift
            # Bins past the window's last exponent hold higher ranks: harmless, counted.
            mask = mask & (bits >= (wlo << 23)) & (key < 256) & (bits <= MAX_FINITE)
            key = tl.where(mask, key, 0)
        acc = tl.histogram(key, 256, mask=mask)
        row = w + HIST_S0 + LEVEL * 256
        if _flush(row, acc, w, LEVEL, tl.load(mrow + M_S_PROGS), FUSED):
            if LEVEL == 0:
                _select_sample0(w, q_bits, Z)
            else:
                _select_sample1(w)


@triton.jit
def _bracket_block(
    tally, lo_in, hi_in, addr, start, first, mask, lo, hi, w, seg, pools, pool_cap,
    DTYPE: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    idx = tl.arange(0, BLOCK)
    bits = _abs_bits(addr, start, first + idx, mask, DTYPE, ALIGNED)
    inside = (bits >= lo) & (bits <= hi)
    # One register per element counts both: below lo in the low half, non-finite in the high
    # half (a lane adds at most one per block).
    if mask is None:
        tally += (bits < lo).to(tl.int32)
    else:
        tally += ((bits < lo) & mask).to(tl.int32)
        inside = inside & mask
    tally += (bits > MAX_FINITE).to(tl.int32) << 16
    # Compaction: an element inside takes the next slot of its block's pool by an atomic that
    # only its warp waits for (no block-wide scan or barrier). The pool is a hash of the
    # block's index: consecutive blocks spread their atomics, and clustered data its elements.
    pool = ((((start + first) // BLOCK) * 2654435761) >> 16) % pools
    cursor = w + S_POOLS + pool + tl.zeros([BLOCK], tl.int32)
    slot = tl.atomic_add(cursor, 1, mask=inside, sem="relaxed").to(tl.int32)
    tl.store(seg + pool * pool_cap + slot, bits, mask=inside & (slot < pool_cap))
    lo_in = tl.minimum(lo_in, tl.where(inside, bits, MAX_BITS))
    hi_in = tl.maximum(hi_in, tl.where(inside, bits, 0))
    return tally, lo_in, hi_in


@triton.jit
def bracket_kernel(
    ptrs, meta, prog_tensor, ws, buf, out, q_bits,
    DTYPE: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr, LOW: tl.constexpr,
    POOLS: tl.constexpr, FUSED: tl.constexpr,
):  # fmt: skip
    """One read of a sampled tensor: count the finite elements below the bracket and the
    non-finite ones, and compact the elements inside it into the tensor's buffer segment."""
    p = tl.program_id(0)
    t = tl.load(prog_tensor + p)
    mrow = meta + t * META_WIDTH
    w = ws + t * WS_WIDTH
    if tl.load(mrow + M_SAMPLED) != 0:
        chunk = tl.load(mrow + M_B_CHUNK)
        start = tl.multiple_of((p - tl.load(mrow + M_B_FIRST)) * chunk, BLOCK)
        count = tl.minimum(tl.load(mrow + M_NUMEL) - start, chunk).to(tl.int32)
        addr = tl.load(ptrs + t)
        lo = tl.load(w + S_LO).to(tl.int32)
        hi = tl.load(w + S_HI).to(tl.int32)
        pool_cap = tl.load(mrow + M_POOL_CAP).to(tl.int32)
        pools = tl.load(mrow + M_POOLS)
        idx = tl.arange(0, BLOCK)
        seg = buf + tl.load(mrow + M_BUF_OFF)
        tally = tl.zeros([BLOCK], tl.int32)
        lo_in = tl.full([BLOCK], MAX_BITS, tl.int32)
        hi_in = tl.zeros([BLOCK], tl.int32)
        full = count - count % BLOCK
        for i in range(0, full, BLOCK):
            tally, lo_in, hi_in = _bracket_block(
                tally, lo_in, hi_in, addr, start, i, None, lo, hi, w, seg, pools, pool_cap,
                DTYPE, ALIGNED, BLOCK,
            )  # fmt: skip
        if full < count:
            tally, lo_in, hi_in = _bracket_block(
                tally, lo_in, hi_in, addr, start, full, full + idx < count, lo, hi, w, seg,
                pools, pool_cap, DTYPE, ALIGNED, BLOCK,
            )  # fmt: skip
        below = tl.sum(tally & 0xFFFF, axis=0).to(tl.int64)
        tl.atomic_add(w + S_BELOW, below, sem="relaxed")
        tl.atomic_add(w + S_NONFINITE, tl.sum(tally >> 16, axis=0).to(tl.int64), sem="relaxed")
        neg_min = 0x7FFFFFFF - tl.min(lo_in, axis=0)
        tl.atomic_max(w + S_NEG_MIN, neg_min.to(tl.int64), sem="relaxed")
        tl.atomic_max(w + S_MAX, tl.max(hi_in, axis=0).to(tl.int64), sem="relaxed")
        if _arrive(w, 2, tl.load(mrow + M_B_PROGS), FUSED):
            _select_bracket(w, mrow, out + t, q_bits, LOW, POOLS)


@triton.jit
def _digit_hist(acc, bits, valid, base, shift, nshift, prefix, LOW: tl.constexpr):
    """Add the digit ``key[nshift:shift]`` of the keys whose bits above ``shift`` are
    ``prefix``."""
    key = (bits - base) >> LOW
    valid = valid & ((key >> shift) == prefix)
    digit = tl.where(valid, (key >> nshift) & ((1 << (shift - nshift)) - 1), 0)
    return acc + tl.histogram(digit, 256, mask=valid)


@triton.jit
def radix_kernel(
    ptrs, meta, full_tensor, buf_tensor, ws, buf, out, q_bits, num_full, num_buf,
    PASS: tl.constexpr, DTYPE: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr,
    BUF_BLOCK: tl.constexpr, LOW: tl.constexpr, FUSED: tl.constexpr,
):  # fmt: skip
    """One 8-bit digit of an MSB radix select, for every unfinished tensor: program ``p`` reads
    chunk ``p`` of the tensors in FULL mode and block ``p`` of the buffers in BUFFER mode."""
    p = tl.program_id(0)
    if p < num_full:
        t = tl.load(full_tensor + p)
        mrow = meta + t * META_WIDTH
        w = ws + t * WS_WIDTH
        if tl.load(w + S_MODE) == FULL:
            if PASS == 0:
                shift = tl.full([], 31 - LOW, tl.int32)
                prefix = tl.zeros([], tl.int32)
            else:
                shift = tl.load(w + S_SHIFT).to(tl.int32)
                prefix = tl.load(w + S_PREFIX).to(tl.int32)
            nshift = tl.maximum(shift - 8, 0)
            chunk = tl.load(mrow + M_F_CHUNK)
            start = tl.multiple_of((p - tl.load(mrow + M_F_FIRST)) * chunk, BLOCK)
            count = tl.minimum(tl.load(mrow + M_NUMEL) - start, chunk).to(tl.int32)
            addr = tl.load(ptrs + t)
            idx = tl.arange(0, BLOCK)
            acc = tl.zeros([256], tl.int32)
            full = count - count % BLOCK
            for i in range(0, full, BLOCK):
                bits = _abs_bits(addr, start, i + idx, None, DTYPE, ALIGNED)
                acc = _digit_hist(acc, bits, idx >= 0, 0, shift, nshift, prefix, LOW)
            if full < count:
                mask = full + idx < count
                bits = _abs_bits(addr, start, full + idx, mask, DTYPE, ALIGNED)
                acc = _digit_hist(acc, bits, mask, 0, shift, nshift, prefix, LOW)
            row = w + HIST_R + PASS * 256
            if _flush(row, acc, w, 3 + PASS, tl.load(mrow + M_F_PROGS), FUSED):
                _select_radix(w, mrow, out + t, q_bits, PASS, LOW)
    if p < num_buf:
        t = tl.load(buf_tensor + p)
        mrow = meta + t * META_WIDTH
        w = ws + t * WS_WIDTH
        if tl.load(w + S_MODE) == BUFFER:
            shift = tl.load(w + S_SHIFT).to(tl.int32)
            nshift = tl.maximum(shift - 8, 0)
            # Block u of the segment lies in pool u // (pool_cap / BUF_BLOCK).
            u = p - tl.load(mrow + M_U_FIRST)
            pool_cap = tl.load(mrow + M_POOL_CAP)
            pool = (u * BUF_BLOCK) // pool_cap
            offs = (u * BUF_BLOCK - pool * pool_cap) + tl.arange(0, BUF_BLOCK)
            mask = offs < tl.load(w + S_POOLS + pool)
            seg = buf + tl.load(mrow + M_BUF_OFF) + u * BUF_BLOCK
            bits = tl.load(seg + tl.arange(0, BUF_BLOCK), mask=mask, other=0)
            base = tl.load(w + S_BASE).to(tl.int32)
            prefix = tl.load(w + S_PREFIX).to(tl.int32)
            acc = _digit_hist(
                tl.zeros([256], tl.int32), bits, mask, base, shift, nshift, prefix, LOW
            )
            row = w + HIST_R + PASS * 256
            if _flush(row, acc, w, 3 + PASS, tl.load(mrow + M_U_PROGS), FUSED):
                _select_radix(w, mrow, out + t, q_bits, PASS, LOW)


@triton.jit
def select_kernel(
    meta,
    ws,
    out,
    q_bits,
    Z: tl.constexpr,
    STAGE: tl.constexpr,
    PASS: tl.constexpr,
    LOW: tl.constexpr,
    POOLS: tl.constexpr,
):
    """Unfused selects (``FUSED=False``): one program per tensor after each pass."""
    t = tl.program_id(0)
    mrow = meta + t * META_WIDTH
    w = ws + t * WS_WIDTH
    sampled = tl.load(mrow + M_SAMPLED) != 0
    if STAGE == 0:
        if sampled:
            _select_sample0(w, q_bits, Z)
    elif STAGE == 1:
        if sampled & (tl.load(w + S_REFINE) != 0):
            _select_sample1(w)
    elif STAGE == 2:
        if sampled:
            _select_bracket(w, mrow, out + t, q_bits, LOW, POOLS)
    else:
        mode = tl.load(w + S_MODE)
        active = (mode != DONE) & (tl.load(w + S_SHIFT) > 0)
        if PASS == 0:
            active = active | (mode == FULL)
        if active:
            _select_radix(w, mrow, out + t, q_bits, PASS, LOW)


# --- small tensors: the whole select in one program per tensor --------------------------------


@triton.jit
def small_kernel(
    ptrs, numels, out, nonfinite, q_bits,
    DTYPE: tl.constexpr, LOW: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The MSB radix select of ``radix_kernel`` and ``_select_radix``, every pass over tensor
    ``program_id`` in one program (its histograms in registers, its selects in between): one
    launch for tensors small enough that reading them ``PASSES`` times from one program is
    cheaper than a launch per pass."""
    t = tl.program_id(0)
    n = tl.load(numels + t).to(tl.int32)
    addr = tl.load(ptrs + t)
    idx = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)
    shift = tl.full([], 31 - LOW, tl.int32)
    prefix = tl.zeros([], tl.int32)
    rank = tl.zeros([], tl.int64)
    n_finite = tl.zeros([], tl.int64)
    for p in tl.static_range(PASSES):
        nshift = tl.maximum(shift - 8, 0)
        acc = tl.zeros([256], tl.int32)
        for i in range(0, n, BLOCK):
            mask = i + idx < n
            bits = _abs_bits(addr, 0, i + idx, mask, DTYPE, False)
            acc = _digit_hist(acc, bits, mask, 0, shift, nshift, prefix, LOW)
        h = acc.to(tl.int64)
        if p == 0:  # the first digit is the exponent: its bin 255 counts Inf and NaN
            nonf = tl.sum(tl.where(bins == 255, h, 0), axis=0)
            h = tl.where(bins == 255, 0, h)
            n_finite = n.to(tl.int64) - nonf
            rank = _rank(n_finite, q_bits)
            tl.store(nonfinite + t, nonf)
        cum = tl.cumsum(h, axis=0)
        digit = tl.sum((cum < rank).to(tl.int64), axis=0)
        rank -= tl.sum(tl.where(bins < digit, h, 0), axis=0)
        prefix = (prefix << (shift - nshift)) | digit.to(tl.int32)
        shift = nshift
    value = (prefix << LOW).to(tl.float32, bitcast=True)
    tl.store(out + t, tl.where(n_finite == 0, 0.0, value))
