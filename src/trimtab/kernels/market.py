"""Triton kernel for :meth:`trimtab.rl.envs.trading.BatchedTradingEnv.step`: a whole batched
market step (positions, reward and its per-asset parts, ruin, days, observations, autoreset).

The torch reference is the env's own step (:func:`~trimtab.rl.backtest.execution.step_log_return`,
``step_reward_parts``, ``ruined`` and the eager ops around them); this module is a leaf (it imports
only torch, Triton and :mod:`trimtab.kernels._eager`) and is imported only once
:func:`trimtab._impl.resolve_impl` has chosen ``"triton"``. Layout (``D`` the env's dtype, float32
or float64; ``N`` envs, ``A`` assets, ``F`` features, ``T`` days, ``L`` levels): :class:`Tables`
holds what a step reads and never writes (``features`` ``[T, A*F]``, ``pre`` and ``post`` ``[T, A]``
simple returns, ``levels`` ``[L]``, all contiguous ``D``, and the constants ``[len(CONSTANTS)]``
``D``, from :func:`pack_constants`); the state is ``position`` ``[N, A]`` ``D``, ``t`` and ``start``
``[N]`` int64 and ``episode_return`` ``[N]`` ``D``, contiguous, updated in place; ``fresh`` ``[N]``
int64 is the step's ``torch.randint`` draw of new starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from trimtab.kernels import _eager
from trimtab.kernels._eager import div as _div
from trimtab.kernels._eager import launch_options, torch_divides_by_reciprocal, uses_libdevice

#: The constants' slots, in order. They reach the kernel as a tensor of the env's dtype, not as
#: Python floats: a float argument or literal may be rounded to float32 before it meets a
#: float64 value. Each is the Python number the reference's op meets, rounded once to the dtype
#: as torch rounds it: ``floor`` is ``RUIN_EQUITY - 1``, ``one_over_n_assets`` the reward
#: parts' ``1.0 / A`` (a Python division), ``n_assets`` the divisor of ``level / A``, and
#: ``inv_n_assets`` ``1 / A`` rounded in the dtype: torch on CUDA divides by a Python number as
#: a multiply by its reciprocal, computed so on the host.
CONSTANTS = (
    "floor", "cash_per_bar", "borrow_per_bar", "per_turnover", "n_assets", "inv_n_assets",
    "one_over_n_assets",
)  # fmt: skip
_SLOT = {name: i for i, name in enumerate(CONSTANTS)}

#: Envs per program: one row per thread at four warps.
MARKET_BLOCK = 128
#: Feature columns copied per pass (``features[t]`` into the observations), at most.
FEATURE_CHUNK = 32


class Tables(NamedTuple):
    """What a step reads and never writes, laid out for the kernel (built once per env, on its
    device: a captured step may not copy them there)."""

    features: torch.Tensor  # [T, A*F], the env's dtype, contiguous
    pre: torch.Tensor  # [T, A] simple returns before the fill
    post: torch.Tensor  # [T, A] and after it
    levels: torch.Tensor  # [L]
    constants: torch.Tensor  # [len(CONSTANTS)]
    window_len: int
    overnight_old: bool  # the old weights are held over the night (else the new ones)
    carry: bool  # the cash and borrow term is computed (either rate is not zero)


def pack_constants(
    values: Mapping[str, float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The :data:`CONSTANTS` tensor from ``values`` (every slot but ``inv_n_assets``, which is
    derived here: :func:`trimtab.kernels._eager.pack_constants`)."""
    return _eager.pack_constants(CONSTANTS, values, {"inv_n_assets": "n_assets"}, dtype, device)


# CONSTANTS' slots as compile-time indices (a jitted function reads globals only as constexprs)
_FLOOR = tl.constexpr(_SLOT["floor"])
_CASH = tl.constexpr(_SLOT["cash_per_bar"])
_BORROW = tl.constexpr(_SLOT["borrow_per_bar"])
_PER_TURNOVER = tl.constexpr(_SLOT["per_turnover"])
_N_ASSETS = tl.constexpr(_SLOT["n_assets"])
_INV_N_ASSETS = tl.constexpr(_SLOT["inv_n_assets"])
_ONE_OVER_N_ASSETS = tl.constexpr(_SLOT["one_over_n_assets"])


@triton.jit
def _log1p(x, LIBDEVICE: tl.constexpr):
    """torch's ``log1p``: on a GPU libdevice's, the function torch's CUDA kernel calls; under
    the interpreter (no libdevice) ``log(u) * x / (u - 1)`` with ``u = 1 + x`` (``x`` where
    ``u == 1``), within a few ulp of it (Goldberg 1991, *What every computer scientist should
    know about floating-point arithmetic*, Theorem 4)."""
    if LIBDEVICE:
        return libdevice.log1p(x)
    else:
        u = 1.0 + x
        exact = u == 1.0
        return tl.where(exact, x, tl.log(u) * _div(x, tl.where(exact, 1.0, u - 1.0)))


@triton.jit
def _clamp_min(x, low):
    # torch's clamp_min: ``low`` where ``x < low``, else ``x`` (NaN passes through, as torch's)
    return tl.where(x < low, low, x)


@triton.jit
def _weight(level, c, RECIPROCAL: tl.constexpr):
    """``level / A`` as torch computes it on the kernel's device: on CUDA ``level`` times the
    host-rounded reciprocal, on the CPU an IEEE division."""
    if RECIPROCAL:
        return level * tl.load(c + _INV_N_ASSETS)
    else:
        return _div(level, tl.load(c + _N_ASSETS))


@triton.jit
def _level(action, act_s0, act_s1, levels, n_levels, row, a, m):
    """``levels[action[row, a]]``; a negative index counts from the end, as torch's does. An
    index out of ``[-L, L)``, which the reference refuses, is a NaN level (no host check: that
    would sync): the position, reward and observation turn NaN, which the sentinel's env
    checks name."""
    idx = tl.load(action + row * act_s0 + a * act_s1, mask=m, other=0).to(tl.int64)
    idx = tl.where(idx < 0, idx + n_levels, idx)
    inside = (idx >= 0) & (idx < n_levels)
    level = tl.load(levels + idx, mask=m & inside, other=0.0)
    return tl.where(inside, level, float("nan"))


@triton.jit
def _market_step_kernel(
    action,
    act_s0,
    act_s1,
    levels,
    n_levels,
    features,
    pre,
    post,
    c,
    position,
    t,
    start,
    episode_return,
    fresh,
    obs,
    final_obs,
    reward,
    terminated,
    truncated,
    ep_return,
    parts,
    n,
    window_len,
    A: tl.constexpr,
    AF: tl.constexpr,
    CHUNK: tl.constexpr,
    PARTS: tl.constexpr,
    CARRY: tl.constexpr,
    OVERNIGHT_OLD: tl.constexpr,
    RECIPROCAL: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = row < n
    day = tl.load(t + row, mask=m, other=0) + 1  # the bar the decision earns over, t + 1
    floor = tl.load(c + _FLOOR)
    cash = tl.load(c + _CASH)
    borrow = tl.load(c + _BORROW)
    per_turnover = tl.load(c + _PER_TURNOVER)

    # step_log_return and ruined: every sum over assets from 0, asset after asset (torch's CPU
    # order for up to 4 assets; a GPU's reduction may associate otherwise), one rounding per
    # torch op (no FMA contraction: launched with enable_fp_fusion=False)
    zero = tl.zeros([BLOCK], dtype=c.dtype.element_ty)
    s_pre, s_post, s_held, s_short, s_turnover = zero, zero, zero, zero, zero
    for a in range(A):
        w = _weight(_level(action, act_s0, act_s1, levels, n_levels, row, a, m), c, RECIPROCAL)
        w_old = _weight(tl.load(position + row * A + a, mask=m, other=0.0), c, RECIPROCAL)
        x_pre = w_old * tl.load(pre + day * A + a, mask=m, other=0.0)
        x_post = w * tl.load(post + day * A + a, mask=m, other=0.0)
        if OVERNIGHT_OLD:
            held = w_old
        else:
            held = w
        short = _clamp_min(-held, 0.0)
        dw = tl.abs(w - w_old)
        s_pre += x_pre
        s_post += x_post
        s_held += held
        s_short += short
        s_turnover += dw
        if PARTS:  # step_reward_parts, this asset's
            part = _log1p(_clamp_min(x_pre, floor), LIBDEVICE) + _log1p(
                _clamp_min(x_post, floor), LIBDEVICE
            )
            if CARRY:
                carry_a = cash * (tl.load(c + _ONE_OVER_N_ASSETS) - held)
                part = part + _log1p(carry_a - borrow * short, LIBDEVICE)
            tl.store(parts + row * A + a, part - per_turnover * dw, mask=m)
    gross = _log1p(_clamp_min(s_pre, floor), LIBDEVICE)
    gross = gross + _log1p(_clamp_min(s_post, floor), LIBDEVICE)
    if CARRY:
        carry = cash * (1.0 - s_held)
        carry = carry - borrow * s_short
        gross = gross + _log1p(carry, LIBDEVICE)
    r = gross - per_turnover * s_turnover
    fell = (s_pre <= floor) | (s_post <= floor)

    ret = tl.load(episode_return + row, mask=m, other=0.0) + r
    start0 = tl.load(start + row, mask=m, other=0)
    cut = (day - start0 >= window_len) & ~fell
    done = fell | cut
    # same-step autoreset from the reference's draw; (~done) as 1 or 0 multiplies, as there
    new_day = tl.where(done, tl.load(fresh + row, mask=m, other=0), day)
    keep = tl.where(done, 0.0, 1.0)
    tl.store(t + row, new_day, mask=m)
    tl.store(start + row, tl.where(done, new_day, start0), mask=m)
    tl.store(episode_return + row, ret * keep, mask=m)
    tl.store(reward + row, r, mask=m)
    tl.store(terminated + row, fell, mask=m)
    tl.store(truncated + row, cut, mask=m)
    tl.store(ep_return + row, ret, mask=m)

    # observations: features[day] flattened, then the position levels
    for a in range(A):
        lvl = _level(action, act_s0, act_s1, levels, n_levels, row, a, m)
        tl.store(final_obs + row * (AF + A) + AF + a, lvl, mask=m)
        lvl = lvl * keep
        tl.store(position + row * A + a, lvl, mask=m)
        tl.store(obs + row * (AF + A) + AF + a, lvl, mask=m)
    rows, mr = row[:, None], m[:, None]
    for k in range(0, AF, CHUNK):
        col = k + tl.arange(0, CHUNK)[None, :]
        mk = mr & (col < AF)
        seen = tl.load(features + day[:, None] * AF + col, mask=mk, other=0.0)
        tl.store(final_obs + rows * (AF + A) + col, seen, mask=mk)
        first = tl.load(features + new_day[:, None] * AF + col, mask=mk, other=0.0)
        tl.store(obs + rows * (AF + A) + col, first, mask=mk)


def launch_step(
    tables: Tables,
    action: torch.Tensor,
    position: torch.Tensor,
    t: torch.Tensor,
    start: torch.Tensor,
    episode_return: torch.Tensor,
    fresh: torch.Tensor,
    with_parts: bool,
) -> tuple[torch.Tensor, ...]:
    """One step of ``N = len(position)`` envs in place; returns ``(obs, reward, terminated,
    truncated, final_obs, episode_return, parts)`` as the reference's step does (``parts``
    ``None`` unless ``with_parts``). ``action`` ``[N, A]`` integer indices into the levels, any
    strides. Reads nothing back to the host.

    Bytes moved per env, ``s`` the dtype's size and int64 actions: reads ``8A`` (actions),
    ``3A s`` (position, pre, post), ``2AF s`` (two feature rows), ``24 + s`` (t, start, fresh,
    return); writes ``2(AF + A) s`` (obs, final_obs), ``A s`` (position), ``16 + 3s + 2`` (t,
    start, return, reward, its copy, the two flags) and ``A s`` more with parts; besides the
    levels and constants (a few values for all envs) and ``torch.randint``'s write of ``fresh``.
    """
    n, n_assets = position.shape
    if action.dtype.is_floating_point or action.dtype.is_complex or action.dtype == torch.bool:
        raise TypeError(f"actions index the levels: need an integer dtype, got {action.dtype}")
    n_feat = tables.features.shape[1]
    dev, dtype = position.device, position.dtype
    obs = torch.empty(n, n_feat + n_assets, dtype=dtype, device=dev)
    final_obs = torch.empty_like(obs)
    reward, ep_return = torch.empty(n, dtype=dtype, device=dev), torch.empty_like(episode_return)
    terminated = torch.empty(n, dtype=torch.bool, device=dev)
    truncated = torch.empty(n, dtype=torch.bool, device=dev)
    parts = torch.empty(n, n_assets, dtype=dtype, device=dev) if with_parts else None
    block = MARKET_BLOCK
    chunk = max(1, min(FEATURE_CHUNK, triton.next_power_of_2(n_feat)))
    _market_step_kernel[(triton.cdiv(n, block),)](
        action, action.stride(0), action.stride(1), tables.levels, tables.levels.shape[0],
        tables.features, tables.pre, tables.post, tables.constants,
        position, t, start, episode_return, fresh,
        obs, final_obs, reward, terminated, truncated, ep_return,
        parts if parts is not None else reward, n, tables.window_len,
        A=n_assets, AF=n_feat, CHUNK=chunk, PARTS=with_parts, CARRY=tables.carry,
        OVERNIGHT_OLD=tables.overnight_old, RECIPROCAL=torch_divides_by_reciprocal(dev),
        LIBDEVICE=uses_libdevice(dev), BLOCK=block, **launch_options(),
    )  # fmt: skip
    return obs, reward, terminated, truncated, final_obs, ep_return, parts
