"""The adaptive EMA's step as one Triton launch, and the engagement correction's observe
built on it; the jit helpers here are also the slot estimator inside the gradient clip's and
the optimizer's finalize kernels (:mod:`trimtab.kernels.clip`, ``.optim_finalize``).

The references they must match are :meth:`trimtab.AdaptiveEMA.update` / ``update_log`` /
``update_log_and_raise`` (the update, then an epilogue that raises a vector's elements to the
slots' upper bounds) and :meth:`trimtab.EngagementCorrection.observe`: line for line the same
arithmetic, in float32 (float64 for the engagement z-test, as there). Each call of the torch
code is ~35-150 small device operations; here it is one launch, and no host synchronisation
either way.

State reaches the kernels as a table of int64 data pointers, in the order declared in
:mod:`trimtab.kernels.ema_layout`: an estimator's ``EMA_FIELDS + EMA_BANK``, for the engagement
kernel then ``ENG_FIELDS``, and last the tail (``q_level``, ``q_slope``, and the dof tables
``c``, ``kappa`` of :func:`dof_tables`, which the reference computes per step from the same
functions). Every state tensor is updated in place for the estimator's life (``reset`` and
``load_state_dict`` copy into it), so a table is built once per set of buffers and reused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from trimtab.kernels._table import pointer_array
from trimtab.kernels.ema_layout import (
    AGREE_FRACTION,
    DOF_MAX,
    EMA_BANK,
    EMA_FIELDS,
    EMA_WIDTH,
    ENG_FIELDS,
    LEAD_TOL,
    META_RATE,
    NOISE_RATE,
    NOISY_RUN,
    QUIET_STEPS,
    R_FLOOR_LOG,
    SHIFT_RUN,
    TINY,
    dof_tables,
)

BLOCK_SLOTS = 16  # slots per program
# R's meta-rate, a global the jit functions read (not a launch argument: the clip's and the
# optimizer's kernels call _ema_step with their own signatures).
_NOISE_RATE: tl.constexpr = tl.constexpr(NOISE_RATE)
_R_FLOOR_LOG: tl.constexpr = tl.constexpr(R_FLOOR_LOG)  # R's floor under update_log's rules
_LEAD_TOL: tl.constexpr = tl.constexpr(LEAD_TOL)
# The shift detector's counts and agreement fraction (ema_layout), as floats: runs are counted
# in float32, as in the reference.
_SHIFT_RUN: tl.constexpr = tl.constexpr(float(SHIFT_RUN))
_NOISY_RUN: tl.constexpr = tl.constexpr(float(NOISY_RUN))
_QUIET: tl.constexpr = tl.constexpr(float(QUIET_STEPS))
_AGREE: tl.constexpr = tl.constexpr(AGREE_FRACTION)


@triton.jit
def _ptr(table, j, DTYPE: tl.constexpr):
    return tl.load(table + j).to(tl.pointer_type(DTYPE))


@triton.jit
def _load_field(tab, j, off, mask, DTYPE: tl.constexpr):
    """Table entry ``j`` (a ``DTYPE`` buffer) at ``off`` where ``mask``, else 0 (``other`` is
    cast to the buffer's type: 0.0 for a float one)."""
    return tl.load(_ptr(tab, j, DTYPE) + off, mask=mask, other=0)


@triton.jit
def _ema_load(tab, BASE: tl.constexpr, slot, ok, K: tl.constexpr, KP: tl.constexpr):
    """Load one AdaptiveEMA's state of the lanes' ``slot`` s (see ``estimate.py``)."""
    mean = _load_field(tab, BASE + 0, slot, ok, tl.float32)
    r = _load_field(tab, BASE + 1, slot, ok, tl.float32)
    prev_obs = _load_field(tab, BASE + 2, slot, ok, tl.float32)
    prev_z = _load_field(tab, BASE + 3, slot, ok, tl.float32)
    alpha = _load_field(tab, BASE + 4, slot, ok, tl.float32)
    count = _load_field(tab, BASE + 5, slot, ok, tl.int64)
    nonf = _load_field(tab, BASE + 6, slot, ok, tl.int64)
    kk = tl.arange(0, KP)
    cm = ok[:, None] & (kk[None, :] < K)
    off = slot[:, None] * K + kk[None, :]
    level = _load_field(tab, BASE + 11, off, cm, tl.float32)
    slope = _load_field(tab, BASE + 12, off, cm, tl.float32)
    p_ll = _load_field(tab, BASE + 13, off, cm, tl.float32)
    p_ls = _load_field(tab, BASE + 14, off, cm, tl.float32)
    p_ss = _load_field(tab, BASE + 15, off, cm, tl.float32)
    score = _load_field(tab, BASE + 16, off, cm, tl.float32)
    return mean, r, prev_obs, prev_z, alpha, count, nonf, level, slope, p_ll, p_ls, p_ss, score


@triton.jit
def _softmax_rows(x, cm):
    x = tl.where(cm, x, -float("inf"))
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    e = tl.where(cm, e, 0.0)
    return e / tl.sum(e, axis=1)[:, None]


@triton.jit
def _ema_step(
    tab,
    BASE: tl.constexpr,
    TAIL: tl.constexpr,
    slot,
    ok,
    obs,
    chosen,
    mean,
    r_old,
    prev_obs,
    prev_z,
    alpha_old,
    count_old,
    nonf,
    level,
    slope,
    p_ll,
    p_ls,
    p_ss,
    score,
    K: tl.constexpr,
    KP: tl.constexpr,
    META: tl.constexpr,
    TINY: tl.constexpr,
    DOF_MAX: tl.constexpr,
    LOG_RULES: tl.constexpr = False,
):
    """``AdaptiveEMA.update`` of the lanes' slots (state loaded by ``_ema_load``); stores the
    new state, returns the new ``(estimate, std_error, noise_var, count)`` (the updated state a
    caller reads, from the registers that were stored: no reload after a barrier; all four are
    computed for the stores anyway, so a caller that drops some compiles to the same code).
    Line for line the torch code of
    ``estimate.py``; ``LOG_RULES``: of ``update_log`` (its ``log=True`` shift and noise-rise
    rules)."""
    finite = (obs == obs) & (tl.abs(obs) < float("inf"))
    chosen = chosen & ok
    take = chosen & finite
    nonf = nonf + (chosen & ~finite).to(tl.int64)
    count = count_old + take.to(tl.int64)
    first = take & (count == 1)
    y = tl.where(take, obs, tl.where(prev_obs == prev_obs, prev_obs, 0.0))

    n = tl.maximum(count - 1, 1).to(tl.float32)
    b = tl.maximum(1.0 / n, _NOISE_RATE)
    dof = tl.minimum(tl.maximum(count - 2, 1), DOF_MAX).to(tl.int32)  # clamp(n - 1, 1, max)
    c = tl.load(_ptr(tab, TAIL + 2, tl.float32) + dof - 1, mask=ok, other=1.0)
    kappa = tl.load(_ptr(tab, TAIL + 3, tl.float32) + dof - 1, mask=ok, other=1.0)

    d = y - prev_obs
    d2 = d * d
    has_r = (r_old == r_old) & (tl.abs(r_old) < float("inf"))
    d2c = tl.where(has_r, tl.minimum(d2, c * c * 2.0 * r_old) / kappa, d2)
    r_new = tl.where(has_r, r_old + b * (0.5 * d2c - r_old), 0.5 * d2)
    r_sel = tl.where(has_r, r_old, r_new)
    if LOG_RULES:  # update_log: a magnitude's resolution (ema_layout.R_FLOOR_LOG)
        r_use = tl.where(r_sel < _R_FLOOR_LOG, _R_FLOOR_LOG, r_sel)[:, None]  # NaN stays NaN
    else:
        r_use = tl.where(r_sel < TINY, TINY, r_sel)[:, None]  # clamp(min=TINY): NaN stays NaN

    kk = tl.arange(0, KP)
    km = kk < K
    cm = ok[:, None] & km[None, :]
    q_level = _load_field(tab, TAIL + 0, kk, km, tl.float32)[None, :]
    q_slope = _load_field(tab, TAIL + 1, kk, km, tl.float32)[None, :]
    a_ll = p_ll + 2.0 * p_ls + p_ss + q_level
    a_ls = p_ls + p_ss
    a_ss = p_ss + q_slope
    pred = level + slope
    s_norm = a_ll + 1.0
    sd = tl.sqrt(s_norm * r_use)
    cc = c[:, None]
    x = y[:, None] - pred
    v = tl.where(x < -cc * sd, -cc * sd, tl.where(x > cc * sd, cc * sd, x))
    v = tl.where(sd == sd, v, sd)  # clamp with a NaN bound is NaN, as in torch

    w = _softmax_rows(score, cm)
    pred_mix = tl.sum(tl.where(cm, w * pred, 0.0), axis=1)
    dev = pred - pred_mix[:, None]
    var_mix = tl.sum(tl.where(cm, w * (s_norm * r_use + dev * dev), 0.0), axis=1)
    z = (y - pred_mix) / tl.sqrt(var_mix)
    # The shift detector's run (estimate.py): its state, read and written here so that the
    # clip's and the optimizer's kernels, which call this step, need not carry it.
    run_n0 = _load_field(tab, BASE + 7, slot, ok, tl.float32)
    run_sum0 = _load_field(tab, BASE + 8, slot, ok, tl.float32)
    run_d20 = _load_field(tab, BASE + 9, slot, ok, tl.float32)
    quiet0 = _load_field(tab, BASE + 10, slot, ok, tl.float32)
    exceed = tl.abs(z) > c
    both = exceed & (tl.abs(prev_z) > c)
    agree = d2 <= c * c * 2.0 * r_sel  # the two observations differ as noise does
    apart = tl.minimum(tl.abs(y - pred_mix), tl.abs(prev_obs - pred_mix))
    near_d = _AGREE * apart
    near = d2 <= near_d * near_d  # or by less than a fraction of their distance from it
    if LOG_RULES:
        link = both & (z * prev_z > 0) & agree
    else:
        link = both & (z * prev_z > 0) & (agree | near)
    run_n = tl.where(link, run_n0 + 1.0, exceed.to(tl.float32))
    run_sum = tl.where(link, run_sum0, 0.0) + tl.where(exceed, y, 0.0)
    run_d2 = tl.where(link, run_d20 + tl.where(agree, 0.0, 0.5 * d2), 0.0)
    ended = (run_n0 > 0.0) & ~link
    calm = ((run_n0 == 0.0) & ~exceed).to(tl.float32)
    quiet = tl.where(ended, (~exceed).to(tl.float32), quiet0 + calm)
    quiet = tl.minimum(quiet, _QUIET)
    need = tl.where(quiet >= _QUIET, _SHIFT_RUN, _NOISY_RUN)
    shift = run_n >= need
    pending = (run_n >= 2.0) & (run_n == need - 1.0)
    if LOG_RULES:  # a rise of the noise
        rise = both & (z * prev_z < 0) & has_r
    else:
        rise = both & ~link & has_r
    r_new = tl.where(rise, tl.maximum(r_new, 0.5 * d2), r_new)
    r_run = run_d2 / tl.maximum(run_n - 1.0, 1.0)
    r_new = tl.where(shift, tl.maximum(r_new, r_run), r_new)

    k_l = a_ll / s_norm
    k_s = a_ls / s_norm
    n_level = pred + k_l * v
    n_slope = slope + k_s * v
    n_pss = a_ss - k_s * a_ls
    n_score = (1.0 - META) * score - 0.5 * (v * v) / r_use
    n_score = n_score - tl.max(tl.where(cm, n_score, -float("inf")), axis=1)[:, None]
    n_score = tl.log((1.0 - META) * tl.exp(n_score) + META / K)  # fixed share
    top = tl.max(tl.where(cm, score, -float("inf")), axis=1)[:, None]
    lead = shift[:, None] & (score >= top - _LEAD_TOL)  # leaders (before this step) keep the level
    n_score = tl.where(lead, tl.min(tl.where(cm, n_score, float("inf")), axis=1)[:, None], n_score)
    n_run = tl.maximum(run_n, 1.0)
    restart = tl.where(first, 1.0, 1.0 / n_run)[:, None]
    anew = (shift | first)[:, None] & ~lead
    start = tl.where(first, y, run_sum / n_run)[:, None]
    tk = take[:, None]
    level = tl.where(tk, tl.where(anew, start, n_level), level)
    slope = tl.where(tk, tl.where(anew, 0.0, n_slope), slope)
    p_ll = tl.where(tk, tl.where(anew, restart, k_l), p_ll)
    p_ls = tl.where(tk, tl.where(anew, 0.0, k_s), p_ls)
    p_ss = tl.where(tk, tl.where(anew, 0.0, n_pss), p_ss)
    score = tl.where(tk, tl.where(first[:, None], 0.0, n_score), score)
    off = slot[:, None] * K + kk[None, :]
    tl.store(_ptr(tab, BASE + 11, tl.float32) + off, level, mask=cm)
    tl.store(_ptr(tab, BASE + 12, tl.float32) + off, slope, mask=cm)
    tl.store(_ptr(tab, BASE + 13, tl.float32) + off, p_ll, mask=cm)
    tl.store(_ptr(tab, BASE + 14, tl.float32) + off, p_ls, mask=cm)
    tl.store(_ptr(tab, BASE + 15, tl.float32) + off, p_ss, mask=cm)
    tl.store(_ptr(tab, BASE + 16, tl.float32) + off, score, mask=cm)

    w = _softmax_rows(score, cm)
    anchor = tl.sum(tl.where(cm & (kk[None, :] == 0), level, 0.0), axis=1)
    mix = anchor + tl.sum(tl.where(cm, w * (level - anchor[:, None]), 0.0), axis=1)
    new_mean = tl.where(pending, 0.5 * (mix + run_sum / n_run), mix)
    done = first | shift
    new_alpha = tl.where(done, 1.0, tl.sum(tl.where(cm, w * k_l, 0.0), axis=1))
    mean = tl.where(take, new_mean, mean)
    r = tl.where(take, tl.where(first, r_old, r_new), r_old)
    # AdaptiveEMA.std_error: the mixture's posterior variance of the level.
    spread = level - mean[:, None]
    se = tl.sqrt(tl.sum(tl.where(cm, w * (p_ll * r[:, None] + spread * spread), 0.0), axis=1))
    tl.store(_ptr(tab, BASE + 0, tl.float32) + slot, mean, mask=ok)
    tl.store(_ptr(tab, BASE + 1, tl.float32) + slot, r, mask=ok)
    tl.store(_ptr(tab, BASE + 2, tl.float32) + slot, tl.where(take, y, prev_obs), mask=ok)
    z_new = tl.where(take, tl.where(first | shift, 0.0, z), prev_z)
    tl.store(_ptr(tab, BASE + 3, tl.float32) + slot, z_new, mask=ok)
    tl.store(_ptr(tab, BASE + 4, tl.float32) + slot, tl.where(take, new_alpha, alpha_old), mask=ok)
    tl.store(_ptr(tab, BASE + 5, tl.int64) + slot, count, mask=ok)
    tl.store(_ptr(tab, BASE + 6, tl.int64) + slot, nonf, mask=ok)
    tl.store(_ptr(tab, BASE + 7, tl.float32) + slot,
             tl.where(take, tl.where(done, 0.0, run_n), run_n0), mask=ok)  # fmt: skip
    tl.store(_ptr(tab, BASE + 8, tl.float32) + slot,
             tl.where(take, tl.where(done, 0.0, run_sum), run_sum0), mask=ok)  # fmt: skip
    tl.store(_ptr(tab, BASE + 9, tl.float32) + slot,
             tl.where(take, tl.where(done, 0.0, run_d2), run_d20), mask=ok)  # fmt: skip
    tl.store(_ptr(tab, BASE + 10, tl.float32) + slot,
             tl.where(take, tl.where(done, _QUIET, quiet), quiet0), mask=ok)  # fmt: skip
    return mean, se, r, count


@triton.jit
def _ema_update_kernel(
    tab, obs, mask, out, rate, top, num_slots, target, index, target_stride, z, cold, cold_obs,
    HAS_MASK: tl.constexpr, LOG: tl.constexpr, CORRECT: tl.constexpr, RAISE: tl.constexpr,
    TAIL: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, META: tl.constexpr,
    TINY: tl.constexpr, DOF_MAX: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``AdaptiveEMA.update`` (``LOG``: ``update_log``) of ``BLOCK`` slots per program;
    ``CORRECT``: of ``EngagementCorrection.correct(obs)`` (``rate``, ``top``: its rate, max).
    ``RAISE`` (with ``LOG``; ``out`` is not written): then ``AdaptiveEMA.update_log_and_raise``'s
    epilogue, each slot's ``upper_bound_log(z, cold, cold_obs)`` raising its element
    ``index[slot]`` of ``target`` (element stride ``target_stride``) where the mask selects it."""
    slot = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = slot < num_slots
    y = tl.load(obs + slot, mask=ok, other=0.0)
    if CORRECT:
        r = tl.load(rate + slot, mask=ok, other=0.0)
        y = _raise_toward(y, r, tl.load(top + slot, mask=ok, other=0.0))
    picked = ok
    if HAS_MASK:
        picked = picked & (tl.load(mask + slot, mask=ok, other=0) != 0)
    chosen = picked
    if LOG:  # a zero magnitude (log 0) is no observation; NaN compares false: not chosen
        y = tl.log(y)
        chosen = chosen & (y > -float("inf"))
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = _ema_load(tab, 0, slot, ok, K, KP)
    est, se, noise_var, count = _ema_step(
        tab, 0, TAIL, slot, ok, y, chosen,
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12,
        K, KP, META, TINY, DOF_MAX, LOG,
    )  # fmt: skip
    if RAISE:
        # The target is no state of the estimator (another tensor): nothing stored above is
        # read here, so no barrier. Written where the mask selects, as torch.where(mask, ...)
        # and index_copy_ write back the element read: the others are left untouched.
        at = target + tl.load(index + slot, mask=ok, other=0) * target_stride
        scale = tl.load(at, mask=picked, other=0.0)
        bound = _upper_bound_log(est, se, noise_var, count, z, cold, cold_obs)
        tl.store(at, _fmax(scale, bound), mask=picked)
    elif LOG:
        tl.store(out + slot, tl.exp(est), mask=ok)


@triton.jit
def _upper_bound_log(est, se, noise_var, count, z, cold, cold_obs):
    """``AdaptiveEMA.upper_bound_log`` of the lanes (of their updated state): ``exp(est +
    margin)``, margin ``z · sqrt(noise_var + se²)``, at least ``cold`` (the log of the cold
    factor) while ``count < cold_obs``, and ``cold`` where it is NaN (``nan_to_num(cold)``)."""
    # se squared as the reference squares std_error (on the GPU the compiler may contract the
    # product and the sum into one FMA: a rounding apart, within the tests' tolerance)
    sd = tl.sqrt(noise_var + se * se)
    margin = z * sd
    margin = tl.where((count < cold_obs) & (margin < cold), cold, margin)  # clamp: NaN stays
    margin = tl.where(margin == margin, margin, cold)
    margin = tl.where(margin == float("inf"), 3.4028234663852886e38, margin)
    margin = tl.where(margin == -float("inf"), -3.4028234663852886e38, margin)
    return tl.exp(est + margin)


@triton.jit
def _fmax(a, b):
    """``torch.fmax``: the larger, a NaN ignored (NaN only where both are): ``b`` where ``a``
    is NaN, else ``a`` unless ``b`` is larger (a NaN ``b`` compares false)."""
    return tl.where((a != a) | (b > a), b, a)


@triton.jit
def _raise_toward(bound, rate, top):
    """``EngagementCorrection.correct``: ``bound + rate * nan_to_num(clamp(top - bound, min=0))``
    (a stale bound raised toward the observed max; unchanged where rate is 0 or top unknown)."""
    gap = top - bound
    gap = tl.where(gap < 0.0, 0.0, gap)
    gap = tl.where(gap == gap, gap, 0.0)
    gap = tl.where(gap == float("inf"), 3.4028234663852886e38, gap)
    return bound + rate * gap


@triton.jit
def _engagement_step(
    tab, ENG: tl.constexpr, TAIL: tl.constexpr, c, ok, kf, nf, mx, take, p, z_threshold,
    K: tl.constexpr, KP: tl.constexpr, META: tl.constexpr, TINY: tl.constexpr,
    DOF_MAX: tl.constexpr,
):  # fmt: skip
    """``EngagementCorrection.observe`` of the lanes' consumers ``c`` (counts ``kf`` of ``nf``,
    float64; max ``mx``; ``take``: which observe), the fraction's estimator at table entry 0
    and its state at ``ENG``. Returns the new ``(rate, max)`` of the lanes."""
    e_rate = _load_field(tab, ENG + 0, c, ok, tl.float32)
    e_max = _load_field(tab, ENG + 1, c, ok, tl.float32)
    e_z = _load_field(tab, ENG + 2, c, ok, tl.float32)
    e_k = _load_field(tab, ENG + 3, c, ok, tl.int64)
    e_n = _load_field(tab, ENG + 4, c, ok, tl.int64)
    frac = tl.where(take, kf / nf, float("nan")).to(tl.float32)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = _ema_load(tab, 0, c, ok, K, KP)
    f, _, _, _ = _ema_step(
        tab, 0, TAIL, c, ok, frac, take,
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12,
        K, KP, META, TINY, DOF_MAX,
    )  # fmt: skip
    f = f.to(tl.float64)
    z = (f - p) / tl.sqrt(p * (1.0 - p) / tl.maximum(nf, 1.0))
    stale = take & (z > z_threshold)
    rate = tl.where(take, tl.where(stale, (f - p) / f, 0.0).to(tl.float32), e_rate)
    top = tl.where(take & (tl.abs(mx) < float("inf")), mx, e_max)  # NaN compares false
    tl.store(_ptr(tab, ENG + 0, tl.float32) + c, rate, mask=ok)
    tl.store(_ptr(tab, ENG + 1, tl.float32) + c, top, mask=ok)
    tl.store(_ptr(tab, ENG + 2, tl.float32) + c, tl.where(take, z.to(tl.float32), e_z), mask=ok)
    tl.store(_ptr(tab, ENG + 3, tl.int64) + c, e_k + tl.where(take, kf, 0.0).to(tl.int64), mask=ok)
    tl.store(_ptr(tab, ENG + 4, tl.int64) + c, e_n + tl.where(take, nf, 0.0).to(tl.int64), mask=ok)
    return rate, top


@triton.jit
def _engagement_kernel(
    tab, engaged, total, top, mask, k_stride, n_stride, top_stride, num_slots,
    p, z_threshold,
    HAS_MASK: tl.constexpr, ENG: tl.constexpr, TAIL: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, META: tl.constexpr, TINY: tl.constexpr,
    DOF_MAX: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``EngagementCorrection.observe`` of ``BLOCK`` consumers per program."""
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = c < num_slots
    kf = tl.load(engaged + c * k_stride, mask=ok, other=0).to(tl.float64)
    nf = tl.load(total + c * n_stride, mask=ok, other=0).to(tl.float64)
    mx = tl.load(top + c * top_stride, mask=ok, other=0.0).to(tl.float32)
    take = ok & (nf > 0)
    if HAS_MASK:
        take = take & (tl.load(mask + c, mask=ok, other=0) != 0)
    _engagement_step(
        tab, ENG, TAIL, c, ok, kf, nf, mx, take, p, z_threshold, K, KP, META, TINY, DOF_MAX
    )


# --- launchers --------------------------------------------------------------------------------
def state_table(*groups: Sequence[torch.Tensor]) -> torch.Tensor:
    """The (cached) pointer table of the state tensors ``groups``, concatenated, then the tail:
    ``q_level``, ``q_slope`` (the last group) and the dof tables of their device."""
    tensors = [t for g in groups for t in g]
    _, c, kappa = dof_tables(tensors[0].device)
    return pointer_array([*tensors, c, kappa])


def consts(num_candidates: int) -> dict:
    """The compile-time constants of an estimator of ``num_candidates`` candidates."""
    return {"K": num_candidates, "KP": triton.next_power_of_2(num_candidates),
            "META": META_RATE, "TINY": TINY, "DOF_MAX": DOF_MAX}  # fmt: skip


def _check_layout(state: Sequence[torch.Tensor], fields: tuple[str, ...], what: str) -> None:
    if len(state) != len(fields):
        raise ValueError(f"{what}: expected {len(fields)} tensors ({', '.join(fields)}), "
                         f"got {len(state)}")  # fmt: skip


def ema_update_triton(
    state: Sequence[torch.Tensor],
    q_level: torch.Tensor,
    q_slope: torch.Tensor,
    obs: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    log: bool,
    rate: torch.Tensor | None = None,
    top: torch.Tensor | None = None,
) -> torch.Tensor:
    """One launch of ``AdaptiveEMA.update(obs, mask)`` (``log``: ``update_log``) on the estimator
    whose ``state`` is ``EMA_FIELDS + EMA_BANK`` (float32, ``S`` slots, ``K = q_level.numel()``
    candidates); with ``rate`` and ``top`` (float32 ``[S]``), of
    ``EngagementCorrection.correct(obs)`` for that raise rate and max. ``obs`` float32 ``[S]``,
    ``mask`` bool ``[S]`` or None, already validated. Updates ``state`` in place; returns
    ``exp`` of the new estimate when ``log``, else ``obs`` (the estimate is ``state[0]``)."""
    _check_layout(state, EMA_FIELDS + EMA_BANK, "ema_update_triton state")
    correct = rate is not None
    if correct != (top is not None):
        raise ValueError("ema_update_triton: pass both rate and top, or neither")
    out = torch.empty_like(obs) if log else obs
    _launch_update(state, q_level, q_slope, obs, mask, out, log=log, rate=rate, top=top)
    return out


def ema_update_raise_triton(
    state: Sequence[torch.Tensor],
    q_level: torch.Tensor,
    q_slope: torch.Tensor,
    obs: torch.Tensor,
    mask: torch.Tensor | None,
    target: torch.Tensor,
    index: torch.Tensor,
    *,
    z: float,
    cold_margin: float,
    cold_obs: int,
) -> None:
    """One launch of ``AdaptiveEMA.update_log_and_raise``: ``update_log(obs, mask)`` as
    :func:`ema_update_triton`, then each slot's ``upper_bound_log`` of the updated state
    (``z``; ``cold_margin``: the log of its cold factor; ``cold_obs``) raises ``target[index]``
    where ``mask`` selects the slot: ``fmax(target[index], bound)``, nothing written elsewhere.
    ``target`` float32 1-D; ``index`` an int64 tensor ``[S]`` of distinct elements in range,
    already validated (an index out of range is a memory error here: no check without a
    sync)."""
    _check_layout(state, EMA_FIELDS + EMA_BANK, "ema_update_raise_triton state")
    if target.dtype != torch.float32:
        raise TypeError(f"ema_update_raise_triton: target must be float32, got {target.dtype}")
    if target.dim() != 1:
        raise ValueError(f"ema_update_raise_triton: target must be a vector, got shape "
                         f"{tuple(target.shape)}")  # fmt: skip
    _launch_update(
        state, q_level, q_slope, obs, mask, obs, log=True,
        raise_to=(target, index, target.stride(0), float(z), float(cold_margin), int(cold_obs)),
    )  # fmt: skip


def _launch_update(
    state: Sequence[torch.Tensor],
    q_level: torch.Tensor,
    q_slope: torch.Tensor,
    obs: torch.Tensor,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    *,
    log: bool,
    rate: torch.Tensor | None = None,
    top: torch.Tensor | None = None,
    raise_to: tuple | None = None,
) -> None:
    """``_ema_update_kernel``'s launch (the unused pointers are ``obs``, never read)."""
    table = state_table(state, (q_level, q_slope))
    n = obs.numel()
    # the kernel reads element i of obs, mask and index at offset i: contiguous copies of
    # strided ones (no copy, no kernel, for contiguous ones)
    m = mask.contiguous().view(torch.uint8) if mask is not None else obs
    correct = rate is not None
    target, index, stride, z, cold, cold_obs = raise_to or (obs, obs, 0, 0.0, 0.0, 0)
    index = index.contiguous()
    _ema_update_kernel[(triton.cdiv(n, BLOCK_SLOTS),)](
        table, obs.contiguous(), m, out, rate if correct else obs, top if correct else obs, n,
        target, index, stride, z, cold, cold_obs,
        HAS_MASK=mask is not None, LOG=log, CORRECT=correct, RAISE=raise_to is not None,
        TAIL=EMA_WIDTH, BLOCK=BLOCK_SLOTS, **consts(q_level.numel()),
    )  # fmt: skip


def _vector(x: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """``x`` (one element, or ``n`` along one dimension) and its element stride."""
    if x.numel() == 1:
        return x, 0
    if x.numel() != n:
        raise ValueError(f"expected one value or {n}, got a tensor of shape {tuple(x.shape)}")
    x = x.reshape(-1)
    return x, x.stride(0)


def engagement_observe_triton(
    fraction: Sequence[torch.Tensor],
    engagement: Sequence[torch.Tensor],
    q_level: torch.Tensor,
    q_slope: torch.Tensor,
    engaged: torch.Tensor,
    total: torch.Tensor,
    observed_max: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    expected_rate: float,
    z_threshold: float,
) -> None:
    """One launch of ``EngagementCorrection.observe(engaged, total, observed_max, mask)``:
    ``fraction`` is its fraction estimator's ``EMA_FIELDS + EMA_BANK``, ``engagement`` its
    ``ENG_FIELDS`` (``C`` consumers); each input one element or ``C``. Updates both in place."""
    _check_layout(fraction, EMA_FIELDS + EMA_BANK, "engagement_observe_triton fraction")
    _check_layout(engagement, ENG_FIELDS, "engagement_observe_triton engagement")
    table = state_table(fraction, engagement, (q_level, q_slope))
    n = engagement[0].numel()
    (k, ks), (t, ts), (top, ms) = (_vector(x, n) for x in (engaged, total, observed_max))
    m = mask.contiguous().view(torch.uint8) if mask is not None else k  # read at offset i
    _engagement_kernel[(triton.cdiv(n, BLOCK_SLOTS),)](
        table, k, t, top, m, ks, ts, ms, n, expected_rate, z_threshold,
        HAS_MASK=mask is not None, ENG=EMA_WIDTH, TAIL=EMA_WIDTH + len(ENG_FIELDS),
        BLOCK=BLOCK_SLOTS, **consts(q_level.numel()),
    )  # fmt: skip


__all__ = [
    "EMA_BANK",
    "EMA_FIELDS",
    "EMA_WIDTH",
    "ENG_FIELDS",
    "consts",
    "dof_tables",
    "ema_update_raise_triton",
    "ema_update_triton",
    "engagement_observe_triton",
    "state_table",
]
