"""Triton kernel for :meth:`trimtab.rl.envs.cartpole.BatchedCartPole.step`: a whole batched
CartPole step (dynamics, flags, counters, same-step autoreset, observations) in one launch.

The torch reference is the env's own step (:func:`~trimtab.rl.envs.cartpole.cartpole_dynamics` and
the eager ops around it); this module is a leaf (it imports only torch, Triton and
:mod:`trimtab.kernels._eager`) and is imported only once :func:`trimtab._impl.resolve_impl` has
chosen ``"triton"``. Layout: ``state`` ``[N, 4]`` contiguous (float32 or float64), ``elapsed``
``[N]`` int64, ``episode_return`` ``[N]`` float32, ``u`` ``[N, 4]`` the reset draw's ``torch.rand``
in the state's dtype, and the physical constants a ``[len(CONSTANTS)]`` tensor of the state's dtype
(:func:`pack_constants`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from trimtab.kernels import _eager
from trimtab.kernels._eager import div as _div
from trimtab.kernels._eager import launch_options, torch_divides_by_reciprocal

#: The constants' slots, in order. They reach the kernel as a tensor of the state's dtype, not
#: as Python floats: a float argument or literal may be rounded to float32 before it meets a
#: float64 value. ``inv_total_mass`` is ``1 / total_mass`` rounded in that dtype: torch on CUDA
#: divides by a Python number as a multiply by its reciprocal, computed so on the host.
CONSTANTS = (
    "force_mag", "neg_force_mag", "gravity", "masspole", "total_mass", "inv_total_mass",
    "length", "polemass_length", "four_thirds", "tau", "x_threshold", "theta_threshold",
    "reset_low", "reset_span",
)  # fmt: skip
_SLOT = {name: i for i, name in enumerate(CONSTANTS)}

#: Envs per program: two rows per thread at four warps.
CARTPOLE_BLOCK = 256


def pack_constants(
    values: Mapping[str, float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The :data:`CONSTANTS` tensor from ``values`` (every slot but ``inv_total_mass``, which is
    derived here: :func:`trimtab.kernels._eager.pack_constants`)."""
    return _eager.pack_constants(CONSTANTS, values, {"inv_total_mass": "total_mass"}, dtype, device)


# CONSTANTS' slots as compile-time indices (a jitted function reads globals only as constexprs)
_FORCE = tl.constexpr(_SLOT["force_mag"])
_NEG_FORCE = tl.constexpr(_SLOT["neg_force_mag"])
_GRAVITY = tl.constexpr(_SLOT["gravity"])
_MASSPOLE = tl.constexpr(_SLOT["masspole"])
_TOTAL_MASS = tl.constexpr(_SLOT["total_mass"])
_INV_TOTAL_MASS = tl.constexpr(_SLOT["inv_total_mass"])
_LENGTH = tl.constexpr(_SLOT["length"])
_POLEMASS_LENGTH = tl.constexpr(_SLOT["polemass_length"])
_FOUR_THIRDS = tl.constexpr(_SLOT["four_thirds"])
_TAU = tl.constexpr(_SLOT["tau"])
_X_THRESHOLD = tl.constexpr(_SLOT["x_threshold"])
_THETA_THRESHOLD = tl.constexpr(_SLOT["theta_threshold"])
_RESET_LOW = tl.constexpr(_SLOT["reset_low"])
_RESET_SPAN = tl.constexpr(_SLOT["reset_span"])


@triton.jit
def _by_total_mass(a, c, RECIPROCAL: tl.constexpr):
    """``a / TOTAL_MASS`` as torch computes it on the kernel's device: on CUDA ``a`` times the
    host-rounded reciprocal, on the CPU an IEEE division."""
    if RECIPROCAL:
        return a * tl.load(c + _INV_TOTAL_MASS)
    else:
        return _div(a, tl.load(c + _TOTAL_MASS))


@triton.jit
def _cartpole_step_kernel(
    state,
    action,
    action_stride,
    elapsed,
    episode_return,
    u,
    c,
    obs,
    final_obs,
    reward,
    terminated,
    truncated,
    ep_return,
    n,
    max_steps,
    WRITE_OBS: tl.constexpr,
    RECIPROCAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = row < n
    x = tl.load(state + 4 * row, mask=m, other=0.0)
    x_dot = tl.load(state + 4 * row + 1, mask=m, other=0.0)
    theta = tl.load(state + 4 * row + 2, mask=m, other=0.0)
    theta_dot = tl.load(state + 4 * row + 3, mask=m, other=0.0)
    act = tl.load(action + action_stride * row, mask=m, other=0)

    # cartpole_dynamics: one rounding per torch op, in its order (no FMA contraction: launched
    # with enable_fp_fusion=False); tl.cos and tl.sin are libdevice's on NVIDIA GPUs, as torch's.
    pml = tl.load(c + _POLEMASS_LENGTH)
    force = tl.where(act == 1, tl.load(c + _FORCE), tl.load(c + _NEG_FORCE))
    costheta = tl.cos(theta)
    sintheta = tl.sin(theta)
    temp = _by_total_mass(force + pml * (theta_dot * theta_dot) * sintheta, c, RECIPROCAL)
    ratio = _by_total_mass(tl.load(c + _MASSPOLE) * (costheta * costheta), c, RECIPROCAL)
    thetaacc = _div(
        tl.load(c + _GRAVITY) * sintheta - costheta * temp,
        tl.load(c + _LENGTH) * (tl.load(c + _FOUR_THIRDS) - ratio),
    )
    xacc = temp - _by_total_mass(pml * thetaacc * costheta, c, RECIPROCAL)
    tau = tl.load(c + _TAU)
    nx = x + tau * x_dot
    nx_dot = x_dot + tau * xacc
    ntheta = theta + tau * theta_dot
    ntheta_dot = theta_dot + tau * thetaacc
    fell = (tl.abs(nx) > tl.load(c + _X_THRESHOLD)) | (
        tl.abs(ntheta) > tl.load(c + _THETA_THRESHOLD)
    )
    tl.store(final_obs + 4 * row, nx.to(tl.float32), mask=m)
    tl.store(final_obs + 4 * row + 1, nx_dot.to(tl.float32), mask=m)
    tl.store(final_obs + 4 * row + 2, ntheta.to(tl.float32), mask=m)
    tl.store(final_obs + 4 * row + 3, ntheta_dot.to(tl.float32), mask=m)

    steps = tl.load(elapsed + row, mask=m, other=0) + 1
    cut = steps >= max_steps
    ret = tl.load(episode_return + row, mask=m, other=0.0) + 1.0  # float32, as the reward
    done = fell | cut

    # same-step autoreset to reset_low + reset_span * u, as _initial_states computes it
    low, span = tl.load(c + _RESET_LOW), tl.load(c + _RESET_SPAN)
    nx = tl.where(done, low + span * tl.load(u + 4 * row, mask=m, other=0.0), nx)
    nx_dot = tl.where(done, low + span * tl.load(u + 4 * row + 1, mask=m, other=0.0), nx_dot)
    ntheta = tl.where(done, low + span * tl.load(u + 4 * row + 2, mask=m, other=0.0), ntheta)
    ntheta_dot = tl.where(
        done, low + span * tl.load(u + 4 * row + 3, mask=m, other=0.0), ntheta_dot
    )
    tl.store(state + 4 * row, nx, mask=m)
    tl.store(state + 4 * row + 1, nx_dot, mask=m)
    tl.store(state + 4 * row + 2, ntheta, mask=m)
    tl.store(state + 4 * row + 3, ntheta_dot, mask=m)
    if WRITE_OBS:
        tl.store(obs + 4 * row, nx.to(tl.float32), mask=m)
        tl.store(obs + 4 * row + 1, nx_dot.to(tl.float32), mask=m)
        tl.store(obs + 4 * row + 2, ntheta.to(tl.float32), mask=m)
        tl.store(obs + 4 * row + 3, ntheta_dot.to(tl.float32), mask=m)
    tl.store(elapsed + row, tl.where(done, 0, steps), mask=m)
    tl.store(episode_return + row, tl.where(done, 0.0, ret), mask=m)
    tl.store(reward + row, tl.full([BLOCK], 1.0, tl.float32), mask=m)
    tl.store(terminated + row, fell, mask=m)
    tl.store(truncated + row, cut, mask=m)
    tl.store(ep_return + row, ret, mask=m)


def launch_step(
    state: torch.Tensor,
    action: torch.Tensor,
    elapsed: torch.Tensor,
    episode_return: torch.Tensor,
    u: torch.Tensor,
    constants: torch.Tensor,
    max_episode_steps: int,
) -> tuple[torch.Tensor, ...]:
    """One step of ``N = len(state)`` envs in place; returns ``(obs, reward, terminated,
    truncated, final_obs, episode_return)`` as the reference's step does, ``obs`` being
    ``state`` itself when the state is float32 (as ``state.float()`` is). ``action`` ``[N]``,
    any stride (1 pushes right, anything else left). Reads nothing back to the host.

    Bytes moved per env with an int64 action: 170 for a float64 state (reads 84: state, u,
    action, elapsed, return; writes 86: state, obs, final_obs, elapsed, return, the five
    outputs' rest), 106 for float32 (no separate obs), besides ``torch.rand``'s write of ``u``.
    """
    n = state.shape[0]
    if action.dtype == torch.bool:
        action = action.view(torch.uint8)  # True == 1, as torch compares a bool with 1
    f32 = dict(dtype=torch.float32, device=state.device)
    write_obs = state.dtype != torch.float32
    obs = torch.empty(n, 4, **f32) if write_obs else state
    final_obs = torch.empty(n, 4, **f32)
    reward, ep_return = torch.empty(n, **f32), torch.empty(n, **f32)
    terminated = torch.empty(n, dtype=torch.bool, device=state.device)
    truncated = torch.empty(n, dtype=torch.bool, device=state.device)
    block = CARTPOLE_BLOCK
    _cartpole_step_kernel[(triton.cdiv(n, block),)](
        state, action, action.stride(0), elapsed, episode_return, u, constants,
        obs, final_obs, reward, terminated, truncated, ep_return, n, max_episode_steps,
        WRITE_OBS=write_obs, RECIPROCAL=torch_divides_by_reciprocal(state.device), BLOCK=block,
        **launch_options(),
    )  # fmt: skip
    return obs, reward, terminated, truncated, final_obs, ep_return
