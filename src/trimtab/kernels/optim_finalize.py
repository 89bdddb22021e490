"""The finalize of the optimizer step (:mod:`trimtab.kernels.optim` is the update): one
single-program launch per step that reduces every group's replicated partials, computes the
window quantiles, folds the observations through the slot estimator and the engagement
correction, writes the slots, steps the counters and the sampling phase, and zeroes the
workspaces. With a skip flag (``found_inf``) set it leaves all of that state unchanged.

Its reference is ``trimtab.optim.Adam``'s torch finalize over the same workspace, whose layout
and readers (:func:`~trimtab.kernels.optim_layout.parts_reference`,
:func:`~trimtab.kernels.optim_layout.window_quantiles_reference`) live in
:mod:`trimtab.kernels.optim_layout`; state reaches it as the pointer table ``TABLE_LAYOUT``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trimtab.kernels._table import PointerTable
from trimtab.kernels.ema import (
    EMA_BANK,
    EMA_FIELDS,
    EMA_WIDTH,
    ENG_FIELDS,
    _ema_load,
    _ema_step,
    _ptr,
    _raise_toward,
)
from trimtab.kernels.optim_layout import (
    BINS,
    COARSE_SHIFT,
    FINE_SHIFT,
    HIST_OFFSET,
    INT_UNDER,
    INT_WIDTH,
    PART_WIDTH,
    PHASE_PERIOD,
    WINDOW_OFFSET,
    fold_shape,
)

# The finalize's state table: int64 data pointers, in this order (``TABLE_LAYOUT``): the slot
# estimator's EMA_FIELDS + EMA_BANK, the engagement fraction's, the engagement correction's
# ENG_FIELDS, then the estimator's candidate noise (q_level, q_slope), its dof-threshold tables
# (c, kappa) and the state vector. Every tensor is updated in place for the optimizer's life,
# so the table is built once.
TABLE_LAYOUT = (
    *(f"slots.{n}" for n in EMA_FIELDS + EMA_BANK),
    *(f"engagement.fraction.{n}" for n in EMA_FIELDS + EMA_BANK),
    *(f"engagement.{n.lstrip('_')}" for n in ENG_FIELDS),
    "q_level", "q_slope", "dof_c", "dof_kappa", "state_vector",
)  # fmt: skip
ENG_BASE = 2 * EMA_WIDTH  # engagement rate, max, z, engaged_total, seen_total
TABLE_TAIL = ENG_BASE + len(ENG_FIELDS)  # q_level, q_slope, c table, kappa table, state vector
TABLE_SIZE = TABLE_TAIL + 5
assert len(TABLE_LAYOUT) == TABLE_SIZE
REDUCE_TILE = 2048  # elements of one load of the replicas: [groups, replicas]

#: Warps of the finalize's one program (``benchmarks/experiments/probe_warps.py``).
FINALIZE_WARPS = 4


@triton.jit
def _window_quantile(
    ints_row,
    sel_g,
    qk,
    need,
    qv,
    BINS: tl.constexpr,
    CSHIFT: tl.constexpr,
    FSHIFT: tl.constexpr,
    UNDER: tl.constexpr,
    HIST_OFFSET: tl.constexpr,
    WINDOW_OFFSET: tl.constexpr,
):
    """(value, next window base) of the lanes' histograms (:func:`window_quantiles_reference`)."""
    bins = tl.arange(0, BINS)
    hm = need[:, None]
    hist = tl.load(ints_row[:, None] + HIST_OFFSET + qk[:, None] * BINS + bins[None, :], hm, 0)
    win = tl.load(ints_row[:, None] + WINDOW_OFFSET + qk[:, None] * BINS + bins[None, :], hm, 0)
    under = tl.load(ints_row + UNDER + qk, mask=need, other=0)
    base = tl.load(sel_g + qk, mask=need, other=-1)
    n = tl.sum(hist, axis=1)
    rank = tl.maximum(tl.ceil(n.to(tl.float64) * qv), 1.0).to(tl.int32)
    cum = tl.cumsum(hist, axis=1)
    chosen = tl.minimum(tl.sum((cum < rank[:, None]).to(tl.int32), axis=1), BINS - 1)
    within = rank - under
    fcum = tl.cumsum(win, axis=1)
    in_win = (base >= 0) & (within >= 1) & (within <= tl.sum(win, axis=1))
    fchosen = tl.sum((fcum < within[:, None]).to(tl.int32), axis=1)
    bits = tl.where(in_win, base + (fchosen << FSHIFT), chosen << CSHIFT)
    value = tl.where(n > 0, bits.to(tl.float32, bitcast=True), 0.0)
    centred = tl.maximum((bits >> FSHIFT) - BINS // 2, 0) << FSHIFT
    nxt = tl.where(n > 0, tl.where(in_win, centred, chosen << CSHIFT), -1)
    return value, nxt


@triton.jit
def _reduce_parts(
    sums,
    parts,
    G,
    GP: tl.constexpr,
    REPLICAS: tl.constexpr,
    PART_WIDTH: tl.constexpr,
    RB: tl.constexpr,
):
    """Each group's scalar partials reduced over its ``REPLICAS`` rows, ``[GP]`` each: the five
    float32 sums, the engagement and finite counts (int64), the max ``|w|`` bits (int32) and
    the float32 ``Σ g², Σ v̂``."""
    gp = tl.arange(0, GP)
    rr = tl.arange(0, RB)
    s0 = tl.zeros([GP], tl.float32)
    s1 = tl.zeros([GP], tl.float32)
    s2 = tl.zeros([GP], tl.float32)
    s3 = tl.zeros([GP], tl.float32)
    s4 = tl.zeros([GP], tl.float32)
    engaged = tl.zeros([GP], tl.int64)
    finite = tl.zeros([GP], tl.int64)
    maxbits = tl.zeros([GP], tl.int32)
    s_gg = tl.zeros([GP], tl.float32)
    s_vh = tl.zeros([GP], tl.float32)
    for r0 in range(0, REPLICAS, RB):
        r = r0 + rr
        off = (gp[:, None] * REPLICAS + r[None, :]) * PART_WIDTH
        gm = (gp < G)[:, None] & (r < REPLICAS)[None, :]  # RB > REPLICAS only for R = 1
        s0 += tl.sum(tl.load(sums + off + 0, mask=gm, other=0.0), axis=1)
        s1 += tl.sum(tl.load(sums + off + 1, mask=gm, other=0.0), axis=1)
        s2 += tl.sum(tl.load(sums + off + 2, mask=gm, other=0.0), axis=1)
        s3 += tl.sum(tl.load(sums + off + 3, mask=gm, other=0.0), axis=1)
        s4 += tl.sum(tl.load(sums + off + 4, mask=gm, other=0.0), axis=1)
        engaged += tl.sum(tl.load(parts + off + 5, mask=gm, other=0).to(tl.int64), axis=1)
        mb = tl.max(tl.load(parts + off + 6, mask=gm, other=0), axis=1)
        maxbits = tl.maximum(maxbits, mb)
        finite += tl.sum(tl.load(parts + off + 7, mask=gm, other=0).to(tl.int64), axis=1)
        s_gg += tl.sum(tl.load(sums + off + 8, mask=gm, other=0.0), axis=1)
        s_vh += tl.sum(tl.load(sums + off + 9, mask=gm, other=0.0), axis=1)
    return s0, s1, s2, s3, s4, engaged, finite, maxbits, s_gg, s_vh


@triton.jit
def _lanes(v, g, ok, GP: tl.constexpr):
    """``v[g]`` on every lane (0 where not ``ok``): a one-hot select of a ``[GP]`` vector."""
    hit = (g[:, None] == tl.arange(0, GP)[None, :]) & ok[:, None]
    return tl.sum(tl.where(hit, v[None, :], 0), axis=1)


@triton.jit
def _fold_slots(
    tab, fold, lrs, slot_offsets, consts, skip, G, GP: tl.constexpr, SKIP: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, META: tl.constexpr, TINY: tl.constexpr,
    DOF_MAX: tl.constexpr, TAIL: tl.constexpr,
):  # fmt: skip
    """The slot estimator's fold of the observations in ``fold`` (row 0: the value, row 1:
    nonzero where chosen; lane ``i`` is slot kind ``i // GP`` of group ``i % GP``) and the
    slots it writes, with the lower confidence bound of the decay.

    It loads everything it reads itself, from the kernel's arguments and ``fold``, and shares
    no SSA value with the code before it. Triton's coalesce pass walks the def-use slice of
    every memory op, so its time grows faster than the ops connected to each other; with this
    fold connected to the rest of the body it was ~13 of the kernel's ~16 s of compile, cut
    apart ~4 of ~8 (sm_90, Triton 3.9, compiled offline; on the device
    ``benchmarks/experiments/probe_compile.py`` times every kernel a first run compiles). The
    caller stores ``fold`` and issues a barrier first; the lanes' layout here may differ from
    the writer's."""
    i = tl.arange(0, 8 * GP)
    kind = i // GP
    g = i % GP
    ok = (kind < 7) & (g < G)
    skipped = 0.0
    if SKIP:
        skipped = tl.load(skip)
    keep = (tl.zeros([8 * GP], tl.float32) + skipped) == 0.0
    obs = tl.load(fold + i, mask=ok, other=0.0)
    chosen = tl.load(fold + 8 * GP + i, mask=ok, other=0.0) != 0.0
    lr = tl.load(lrs + g, mask=ok, other=0.0)
    sv = _ptr(tab, TAIL + 4, tl.float32)
    growth_slot = tl.load(sv + tl.load(slot_offsets + 6) + g, mask=ok, other=0.0)
    slot = kind * G + g
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = _ema_load(tab, 0, slot, ok, K, KP)
    tl.debug_barrier()  # every value above is read before anything below writes
    est, se, _, _ = _ema_step(
        tab, 0, TAIL, slot, ok, obs, chosen,
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12,
        K, KP, META, TINY, DOF_MAX,
    )  # fmt: skip
    # Decay: the lower confidence bound of the outward push, at most 1 / lr, while the
    # gradient scale was significantly rising at the last step (growth slot > 0).
    bound_lo = est - tl.load(consts + 2).to(tl.float32) * se
    lcb = tl.where(bound_lo < 0.0, 0.0, bound_lo)  # clamp(min=0): NaN stays NaN
    lcb = tl.where(lcb > 1.0 / lr, 1.0 / lr, lcb)
    lcb = tl.where(growth_slot > 0.0, lcb, 0.0)
    log_kind = (kind == 0) | ((kind >= 3) & (kind <= 5))
    value = tl.where(log_kind, tl.exp(est), tl.where(kind == 1, lcb, est))
    value = tl.where(kind == 6, bound_lo, value)
    slot_at = sv + tl.load(slot_offsets + kind, mask=ok, other=0) + g
    tl.store(slot_at, value, mask=ok & keep)


@triton.jit
def _finalize_kernel(
    tab,  # int64 [TABLE_SIZE]: state pointers (see Adam._finalize_table)
    ints,  # int32 [G, INT_WIDTH]
    sums,  # float32 view of parts
    parts,  # int32 [G, REPLICAS, PART_WIDTH]
    sel,  # int32 [G, 3]
    deficit,  # float32 [G]: entropy deficit of the L1 groups' gradients (NaN: none)
    fold,  # float32 [2, 8 * GP]: the slot fold's observations and choices (see _fold_slots)
    lrs,  # float32 [G]
    flags,  # int32 [G]: OBSERVED | CLAMP | AUTO | L1 bits
    slot_offsets,  # int32 [6]: offset of each slot kind in the state vector
    consts,  # float64 [3]: quantile, expected engagement rate, z threshold
    step_ptrs,  # int64 [T]: step counters to increment
    num_steps,
    phase,  # int32 [1]
    skip,  # 0-dim float32: nonzero leaves every estimate, counter and the phase unchanged
    G,
    GP: tl.constexpr,
    GR: tl.constexpr,  # max(GP, 2): the groups of the replica reduction's tiles
    STATS: tl.constexpr,
    SKIP: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    META: tl.constexpr,
    TINY: tl.constexpr,
    DOF_MAX: tl.constexpr,
    NORM_EPS: tl.constexpr,
    EMA_WIDTH: tl.constexpr,
    ENG_BASE: tl.constexpr,
    TAIL: tl.constexpr,
    INT_WIDTH: tl.constexpr,
    REPLICAS: tl.constexpr,
    PART_WIDTH: tl.constexpr,
    RB: tl.constexpr,
    BINS: tl.constexpr,
    CSHIFT: tl.constexpr,
    FSHIFT: tl.constexpr,
    UNDER: tl.constexpr,
    HIST_OFFSET: tl.constexpr,
    WINDOW_OFFSET: tl.constexpr,
    PERIOD: tl.constexpr,
    ZBLOCK: tl.constexpr,
):
    skipped = 0.0
    if SKIP:
        skipped = tl.load(skip)
    if STATS:
        # --- load everything ----------------------------------------------------------------
        # Lane i is (slot kind i // GP, group i % GP): kinds weight_bound, decay, l1, p99_w,
        # p99_m, p99_v, grad_growth, in the slot EMA's order (kind * G + group).
        i = tl.arange(0, 8 * GP)
        kind = i // GP
        g = i % GP
        ok = (kind < 7) & (g < G)
        # A lane-wide flag, not a scalar (the interpreter cannot AND a scalar bool with lanes).
        keep = (tl.zeros([8 * GP], tl.float32) + skipped) == 0.0
        row = ints + g * INT_WIDTH
        flag = tl.load(flags + g, mask=ok, other=0)
        # The scalar partials: reduced over the replicas per group, then spread to the lanes.
        r_wu, r_ww, r_uu, r_au, r_l1w, r_eng, r_fin, r_max, r_gg, r_vh = _reduce_parts(
            sums, parts, G, GR, REPLICAS, PART_WIDTH, RB
        )
        s_wu = _lanes(r_wu, g, ok, GR)
        s_ww = _lanes(r_ww, g, ok, GR)
        s_uu = _lanes(r_uu, g, ok, GR)
        s_au = _lanes(r_au, g, ok, GR)
        s_l1w = _lanes(r_l1w, g, ok, GR)
        engaged = _lanes(r_eng, g, ok, GR)
        max_w = _lanes(r_max, g, ok, GR).to(tl.float32, bitcast=True)
        count = _lanes(r_fin, g, ok, GR)
        s_gg = _lanes(r_gg, g, ok, GR)
        s_vh = _lanes(r_vh, g, ok, GR)
        lr = tl.load(lrs + g, mask=ok, other=0.0)
        dfc = tl.load(deficit + g, mask=ok, other=0.0)
        sv = _ptr(tab, TAIL + 4, tl.float32)
        l1_slot = tl.load(sv + tl.load(slot_offsets + 2) + g, mask=ok, other=0.0)
        qk = tl.where(kind == 4, 1, tl.where(kind == 5, 2, 0))
        need = ok & ((kind == 0) | ((kind >= 3) & (kind <= 5)))
        q, nxt = _window_quantile(
            row, sel + g * 3, qk, need, tl.load(consts + 0),
            BINS, CSHIFT, FSHIFT, UNDER, HIST_OFFSET, WINDOW_OFFSET,
        )  # fmt: skip
        eng = ok & (kind == 0)
        e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12 = _ema_load(
            tab, EMA_WIDTH, g, eng, K, KP
        )
        e_rate = tl.load(_ptr(tab, ENG_BASE + 0, tl.float32) + g, mask=eng, other=0.0)
        e_max = tl.load(_ptr(tab, ENG_BASE + 1, tl.float32) + g, mask=eng, other=0.0)
        e_z = tl.load(_ptr(tab, ENG_BASE + 2, tl.float32) + g, mask=eng, other=0.0)
        e_k = tl.load(_ptr(tab, ENG_BASE + 3, tl.int64) + g, mask=eng, other=0)
        e_n = tl.load(_ptr(tab, ENG_BASE + 4, tl.int64) + g, mask=eng, other=0)
        tl.debug_barrier()  # every value above is read before anything below writes

        # --- compute and store --------------------------------------------------------------
        # A skipped step observes nothing: every estimator keeps its state exactly.
        observed = ok & ((flag & 1) != 0) & keep
        clamp_on = observed & ((flag & 2) != 0)
        auto_on = observed & ((flag & 4) != 0)
        l1_on = observed & ((flag & 8) != 0)
        # Engagement correction of the weight bound (EngagementCorrection.observe, .correct).
        p = tl.load(consts + 1)
        kf = engaged.to(tl.float64)
        nf = count.to(tl.float64)
        take_e = eng & (nf > 0) & clamp_on
        frac = tl.where(take_e, kf / nf, float("nan")).to(tl.float32)
        f, _, _, _ = _ema_step(
            tab, EMA_WIDTH, TAIL, g, eng, frac, take_e,
            e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12,
            K, KP, META, TINY, DOF_MAX,
        )  # fmt: skip
        f = f.to(tl.float64)
        z = (f - p) / tl.sqrt(p * (1.0 - p) / tl.maximum(nf, 1.0))
        stale = take_e & (z > tl.load(consts + 2))
        rate = tl.where(stale, (f - p) / f, 0.0).to(tl.float32)
        e_rate = tl.where(take_e, rate, e_rate)
        e_max = tl.where(take_e & (tl.abs(max_w) < float("inf")), max_w, e_max)
        e_z = tl.where(take_e, z.to(tl.float32), e_z)
        e_k = e_k + tl.where(take_e, kf, 0.0).to(tl.int64)
        e_n = e_n + tl.where(take_e, nf, 0.0).to(tl.int64)
        tl.store(_ptr(tab, ENG_BASE + 0, tl.float32) + g, e_rate, mask=eng & keep)
        tl.store(_ptr(tab, ENG_BASE + 1, tl.float32) + g, e_max, mask=eng & keep)
        tl.store(_ptr(tab, ENG_BASE + 2, tl.float32) + g, e_z, mask=eng & keep)
        tl.store(_ptr(tab, ENG_BASE + 3, tl.int64) + g, e_k, mask=eng & keep)
        tl.store(_ptr(tab, ENG_BASE + 4, tl.int64) + g, e_n, mask=eng & keep)
        bound_obs = _raise_toward(q, e_rate, e_max)
        # Decay: the rate that holds ||w|| in equilibrium, net of L1's own shrink.
        l1_coef = tl.where(l1_slot > 0.0, l1_slot, 0.0)
        ww = tl.where(s_ww < NORM_EPS, NORM_EPS, s_ww)
        decay_obs = (-s_wu + 0.5 * lr * s_uu - l1_coef * s_l1w) / ww
        l1_obs = dfc * s_au / count.to(tl.float32)
        growth_obs = tl.log(s_gg / s_vh)  # 0/0, log 0: not finite, ignored
        obs = tl.where(
            kind == 0, bound_obs, tl.where(kind == 1, decay_obs, tl.where(kind == 2, l1_obs, q))
        )
        obs = tl.where(kind == 6, growth_obs, obs)
        chosen = tl.where(
            kind == 0, clamp_on, tl.where(kind == 1, auto_on, tl.where(kind == 2, l1_on, observed))
        )
        # Magnitudes (bound, quantiles) are folded as logarithms; a zero one is no observation.
        log_kind = (kind == 0) | ((kind >= 3) & (kind <= 5))
        obs = tl.where(log_kind, tl.log(obs), obs)
        chosen = chosen & ~(log_kind & (obs == -float("inf")))
        tl.store(sel + g * 3 + (kind - 3), nxt, mask=ok & (kind >= 3) & (kind <= 5) & keep)
        # Zero the workspaces for the next step.
        for start in range(0, G * INT_WIDTH, ZBLOCK):
            zo = start + tl.arange(0, ZBLOCK)
            tl.store(ints + zo, tl.zeros([ZBLOCK], tl.int32), mask=zo < G * INT_WIDTH)
        for start in range(0, G * REPLICAS * PART_WIDTH, ZBLOCK):
            zo = start + tl.arange(0, ZBLOCK)
            zm = zo < G * REPLICAS * PART_WIDTH
            tl.store(parts + zo, tl.zeros([ZBLOCK], tl.int32), mask=zm)
        tl.store(deficit + g, float("nan"), mask=ok & (kind == 0))
        # The slot estimator's fold reads the observations through memory (``fold``): see
        # _fold_slots.
        tl.store(fold + i, obs, mask=ok)
        tl.store(fold + 8 * GP + i, chosen.to(tl.float32), mask=ok)
        tl.debug_barrier()
        _fold_slots(
            tab, fold, lrs, slot_offsets, consts, skip, G, GP, SKIP, K, KP, META, TINY, DOF_MAX,
            TAIL,
        )  # fmt: skip
    # Step counters (the update read step + 1) and the sampling phase.
    ph = tl.load(phase)
    st = tl.arange(0, 128)
    keep_st = (tl.zeros([128], tl.float32) + skipped) == 0.0
    for start in range(0, num_steps, 128):
        so = start + st
        sp = tl.load(step_ptrs + so, mask=so < num_steps, other=0).to(tl.pointer_type(tl.float32))
        tl.store(sp, tl.load(sp, mask=so < num_steps) + 1.0, mask=(so < num_steps) & keep_st)
    if STATS:  # the sampling phase steps with the statistics
        tl.store(phase, tl.where(skipped == 0.0, (ph + 1) % PERIOD, ph))


def finalize_triton(
    table: torch.Tensor,
    ints: torch.Tensor,
    parts: torch.Tensor,
    sel: torch.Tensor,
    deficit: torch.Tensor,
    fold: torch.Tensor,
    lrs: torch.Tensor,
    flags: torch.Tensor,
    slot_offsets: torch.Tensor,
    consts: torch.Tensor,
    steps: PointerTable,
    phase: torch.Tensor,
    skip: torch.Tensor | None = None,
    *,
    stats: bool,
    num_candidates: int,
    meta_rate: float,
    tiny: float,
    dof_max: int,
    norm_eps: float,
) -> None:
    """Launch the finalize of one step (one program; see the module docstring). ``parts``:
    int32 ``[G, R, PART_WIDTH]``, ``R`` a power of two."""
    num_groups = ints.shape[0]
    replicas = parts.shape[1]
    assert parts.dtype == torch.int32 and parts.shape == (num_groups, replicas, PART_WIDTH)
    assert replicas & (replicas - 1) == 0 and parts.is_contiguous()
    gp = triton.next_power_of_2(num_groups)
    assert fold.dtype == torch.float32 and fold.is_contiguous()
    assert fold.shape == fold_shape(num_groups) == (2, 8 * gp)
    gr = max(gp, 2)  # no tile dimension of 1
    _finalize_kernel[(1,)](
        table, ints, parts.view(torch.float32), parts, sel, deficit, fold, lrs, flags,
        slot_offsets,
        consts, steps.ptrs, steps.count, phase, phase if skip is None else skip, num_groups,
        GP=gp, GR=gr, STATS=stats, SKIP=skip is not None,
        K=num_candidates, KP=triton.next_power_of_2(num_candidates),
        META=meta_rate, TINY=tiny, DOF_MAX=dof_max, NORM_EPS=norm_eps,
        EMA_WIDTH=EMA_WIDTH, ENG_BASE=ENG_BASE, TAIL=TABLE_TAIL,
        INT_WIDTH=INT_WIDTH, REPLICAS=replicas, PART_WIDTH=PART_WIDTH,
        RB=max(2, min(replicas, REDUCE_TILE // gr)), BINS=BINS,
        CSHIFT=COARSE_SHIFT, FSHIFT=FINE_SHIFT, UNDER=INT_UNDER,
        HIST_OFFSET=HIST_OFFSET, WINDOW_OFFSET=WINDOW_OFFSET,
        PERIOD=PHASE_PERIOD, ZBLOCK=1024, num_warps=FINALIZE_WARPS,
    )  # fmt: skip
