"""The adaptive gradient clip's step after the per-tensor norms, as one single-program launch:
group norms, the clip coefficients, the window of norms (each entry's sign its engagement
flag) and its exact quantile (the order statistic, found near the top of the window by walking
down from its largest value, else by a sort), the engagement test on the window's count, the
log-scale fold of the quantile, and the bound: the estimate, anchored at the bound in force,
raised where the test fires.

The reference it must match is ``AdaptiveGradClip._step_reference`` (:mod:`trimtab.clip`); the
scaling itself is then one launch of :func:`trimtab.clamp.scale_finite_`. Before, this was ~40
small device operations per step.

State reaches the kernel as tensors (``G`` bounds, window ``W``): the bound slot float32
``[G]``, the history float32 ``[G, W]``, the step count int64 ``[]``, the non-finite counts
int64 (the kernel adds to element 0: tensors), the engagement counts int64 ``[G]``; and one
pointer table of the engagement fraction's estimator, the engagement correction and the bound's
estimator, in the order of :mod:`trimtab.kernels.ema_layout` (``EMA_FIELDS + EMA_BANK``,
``ENG_FIELDS``, ``EMA_FIELDS + EMA_BANK``, then the tail).
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from trimtab.kernels.ema import (
    EMA_BANK,
    EMA_FIELDS,
    EMA_WIDTH,
    ENG_FIELDS,
    _ema_load,
    _ema_step,
    _engagement_step,
    _raise_toward,
    consts,
    state_table,
)

#: Largest window and tensor count one program sorts and reduces (powers of two); beyond, the
#: clip runs its reference.
MAX_WINDOW = 4096
MAX_TENSORS = 4096
#: Warps of the one program (``benchmarks/experiments/probe_warps.py``).
CLIP_WARPS = 4
#: The window quantile walks down from the largest norm when it is at most this many ranks
#: from the top (a p99 of 1000 norms: 11), one max and one count a rank; else it sorts the
#: window (a bitonic sort of 1024 norms: ~25 µs of the H200's step, against ~1 µs a rank).
#: When no rank of the window can be further down (:func:`walk_suffices`) the sort is not
#: compiled: it took ~19 of the kernel's ~26 s of compile time (sm_90, Triton 3.9).
TOP_MAX = 64


@triton.jit
def _walk_down(a, finite, m, rounds, GP: tl.constexpr):
    """Per row of ``a [GP, WP]``, the value ``m`` ranks from the top of its finite entries
    (counting ties), found in ``rounds`` rounds of one max and one count."""
    value = tl.zeros([GP], tl.float32)
    live = tl.where(finite, a, -float("inf"))
    cur = tl.full([GP], float("inf"), tl.float32)
    seen = tl.zeros([GP], tl.int32)
    for _ in range(rounds):
        below = tl.max(tl.where(live < cur[:, None], live, -float("inf")), axis=1)
        ties = tl.sum((live == below[:, None]).to(tl.int32), axis=1)
        on = seen < m
        value = tl.where(on, below, value)
        cur = tl.where(on, below, cur)
        seen = tl.where(on, seen + ties, seen)
    return value


@triton.jit
def _kth_smallest(
    a, finite, w, n, k, GP: tl.constexpr, TOP: tl.constexpr, SORT: tl.constexpr
):  # fmt: skip
    """Per row of ``a [GP, WP]``, the ``k``-th smallest of the ``n`` finite entries (rows with
    ``n = 0``: any value). Near the top (``n - k + 1 <= TOP`` in every row, as for a p99),
    walked down from the largest, one distinct value a round (a max and a count over the row);
    else from a sort of the row. Both give the same order statistic. Without ``SORT`` (the host
    found every rank of the window within ``TOP`` of the top: :func:`walk_suffices`) the sort
    is not compiled at all: it is most of the kernel's compile time."""
    m = tl.where(n > 0, n - k + 1, 0)  # its rank from the top
    rounds = tl.max(m, axis=0)
    if SORT:
        if rounds <= TOP:
            value = _walk_down(a, finite, m, rounds, GP)
        else:
            ordered = tl.sort(tl.where(finite, a, float("inf")), 1)
            value = tl.sum(tl.where(w[None, :] == (k - 1)[:, None], ordered, 0.0), axis=1)
    else:
        value = _walk_down(a, finite, m, rounds, GP)
    return value


@triton.jit
def _clip_kernel(
    tab, norms, index, num_tensors, slot, scale_out, total_out, nonfinite, engaged_count,
    history, count, num_bounds, window, floor, eps, q, p, z_threshold, headroom,
    ENG: tl.constexpr, BOUND: tl.constexpr, TAIL: tl.constexpr,
    TP: tl.constexpr, GP: tl.constexpr, WP: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, META: tl.constexpr, TINY: tl.constexpr,
    DOF_MAX: tl.constexpr, TOP: tl.constexpr, SORT: tl.constexpr,
):  # fmt: skip
    t = tl.arange(0, TP)
    tm = t < num_tensors
    nrm = tl.load(norms + t, mask=tm, other=0.0)
    fin = tm & (tl.abs(nrm) < float("inf"))  # NaN compares false
    tl.store(nonfinite, tl.load(nonfinite) + tl.sum((tm & ~fin).to(tl.int64), axis=0))
    sq = tl.where(fin, nrm * nrm, 0.0)
    idx = tl.load(index + t, mask=tm, other=0)
    g = tl.arange(0, GP)
    gm = g < num_bounds
    member = (idx[None, :] == g[:, None]) & tm[None, :]
    gn = tl.sqrt(tl.sum(tl.where(member, sq[None, :], 0.0), axis=1))
    tl.store(total_out, tl.sqrt(tl.sum(sq, axis=0)))

    # The bound in force: unset (NaN) clips nothing; else fmax(slot, floor).
    sv = tl.load(slot + g, mask=gm, other=0.0)
    b = tl.where(sv != sv, float("inf"), tl.maximum(sv, floor))
    clip_at = b * headroom  # exact for headroom 1
    coef = tl.minimum(clip_at / (gn + eps), 1.0)
    per = tl.sum(tl.where(member, coef[:, None], 0.0), axis=0)
    tl.store(scale_out + t, tl.where(fin, per, 0.0), mask=tm)
    engaged = gm & (gn > b)  # the test's exceedance
    ec = tl.load(engaged_count + g, mask=gm, other=0)
    tl.store(engaged_count + g, ec + (gm & (gn > clip_at)).to(tl.int64), mask=gm)

    # The window of norms, this step's entered in registers (negated where it exceeded the
    # bound: the window's engagement flag) and stored.
    cnt = tl.load(count)
    pos = cnt % window
    w = tl.arange(0, WP)
    wm = gm[:, None] & (w[None, :] < window)
    hp = history + g[:, None] * window + w[None, :]
    row = tl.load(hp, mask=wm, other=float("nan"))
    here = wm & (w[None, :] == pos)
    row = tl.where(here, tl.where(engaged, -gn, gn)[:, None], row)
    tl.store(hp, row, mask=here)
    tl.store(count, cnt + 1)
    a = tl.abs(row)
    finite = wm & (a < float("inf"))
    # The window's quantile: rank ceil(q n) (at least 1) of the n finite values, 0 when none.
    n = tl.sum(finite.to(tl.int32), axis=1)
    k = tl.maximum(tl.ceil(n.to(tl.float64) * q).to(tl.int32), 1)
    value = _kth_smallest(a, finite, w, n, k, GP, TOP, SORT)
    value = tl.where(n > 0, value, 0.0)
    # The engagement test on the window's count (k of its n steps exceeded their bound); a
    # raise goes toward the window's quantile.
    k_win = tl.sum((finite & (row < 0.0)).to(tl.float64), axis=1)
    rate, top = _engagement_step(
        tab, ENG, TAIL, g, gm, k_win, n.to(tl.float64), value, gm & (n > 0),
        p, z_threshold, K, KP, META, TINY, DOF_MAX,
    )  # fmt: skip

    # The quantile folded on a log scale; the bound is the estimate, at most the bound in force
    # (the anchoring; NaN while unset), raised where the test found it stale.
    y = tl.log(value)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = _ema_load(tab, BOUND, g, gm, K, KP)
    est, _, _, _ = _ema_step(
        tab, BOUND, TAIL, g, gm, y, gm & (y > -float("inf")),
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12,
        K, KP, META, TINY, DOF_MAX, True,  # update_log's rules
    )  # fmt: skip
    e = tl.exp(est)
    anchored = tl.where(b < e, b, e)  # NaN compares false: an unset estimate stays NaN
    tl.store(slot + g, _raise_toward(anchored, rate, top), mask=gm)


@functools.lru_cache(maxsize=64)
def walk_suffices(window: int, quantile: float) -> bool:
    """Whether the window quantile's rank, ``max(1, ceil(q n))`` of ``n`` finite norms, lies at
    most ``TOP_MAX`` ranks from the top for every ``n`` from 1 to ``window``: then the kernel
    never sorts, and is compiled without its sort (``SORT = False``). Computed as the kernel
    does: ``q`` rounded to float32, the product in float64."""
    q = struct.unpack("f", struct.pack("f", quantile))[0]
    return all(n - max(1, math.ceil(n * q)) + 1 <= TOP_MAX for n in range(1, window + 1))


def fits(window: int, num_tensors: int) -> bool:
    """Whether one program can run a clip step over ``num_tensors`` norms with this window."""
    return window <= MAX_WINDOW and 0 < num_tensors <= MAX_TENSORS


def clip_step_triton(
    norms: torch.Tensor,
    index: torch.Tensor,
    scale_out: torch.Tensor,
    total_out: torch.Tensor,
    *,
    bound: torch.Tensor,
    history: torch.Tensor,
    count: torch.Tensor,
    nonfinite: torch.Tensor,
    engaged: torch.Tensor,
    fraction: Sequence[torch.Tensor],
    engagement: Sequence[torch.Tensor],
    bound_ema: Sequence[torch.Tensor],
    q_level: torch.Tensor,
    q_slope: torch.Tensor,
    quantile: float,
    expected_rate: float,
    z_threshold: float,
    floor: float,
    eps: float,
    headroom: float = 1.0,
) -> None:
    """One launch of the clip's step (see the module docstring) for float32 ``norms`` ``[T]`` of
    the tensors of group ``index`` (int64 ``[T]``): writes the per-tensor scale into
    ``scale_out`` and the total norm into ``total_out``; updates the state tensors in place.
    ``floor``: the bound's cold-start floor; ``eps``: added to the norm before dividing;
    ``headroom``: the clip binds at it times the bound (the test counts norms above the bound)."""
    if not (len(fraction) == len(bound_ema) == len(EMA_FIELDS + EMA_BANK)):
        raise ValueError("clip_step_triton: each estimator is EMA_FIELDS + EMA_BANK tensors")
    if len(engagement) != len(ENG_FIELDS):
        raise ValueError(f"clip_step_triton: engagement is {ENG_FIELDS}")
    table = state_table(fraction, engagement, bound_ema, (q_level, q_slope))
    t, g = norms.numel(), bound.numel()
    window = history.shape[1]
    _clip_kernel[(1,)](
        table, norms, index, t, bound, scale_out, total_out, nonfinite,
        engaged, history, count, g, window,
        floor, eps, quantile, expected_rate, z_threshold, float(headroom),
        ENG=EMA_WIDTH, BOUND=EMA_WIDTH + len(ENG_FIELDS), TAIL=2 * EMA_WIDTH + len(ENG_FIELDS),
        TP=max(2, triton.next_power_of_2(t)), GP=max(2, triton.next_power_of_2(g)),
        WP=max(2, triton.next_power_of_2(window)), **consts(q_level.numel()), TOP=TOP_MAX,
        SORT=not walk_suffices(window, quantile),
        num_warps=CLIP_WARPS,
    )  # fmt: skip
