"""Pure loss functions of the distributional DQN: atom positions, the C51 projection and
cross-entropy, the IQN quantile Huber loss, and n-step return helpers. No state, no modules.

:func:`atoms` is the one function in the project that computes atom positions; every place that
needs a support (Q-values, Bellman targets, projection) calls it with the current bounds.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "atoms",
    "c51_loss",
    "c51_projection",
    "n_step_discounts",
    "n_step_returns",
    "n_step_weights",
    "quantile_huber_loss",
]


def atoms(v_min: Tensor, v_max: Tensor, n_atoms: int) -> Tensor:
    """Atom positions ``z_j = V_min + j Δz``, ``Δz = (V_max − V_min)/(N − 1)``, j = 0..N−1.

    ``v_min`` and ``v_max`` have any common shape ``S`` (``[branches]`` for one support per
    branch, ``[batch, branches]`` for one per sample and branch); the result is ``[*S, n_atoms]``.
    The end atoms equal ``v_min`` and ``v_max`` exactly (written as ``(1 − t) V_min + t V_max``),
    so a target clipped to an edge lands on an atom with no rounding.
    """
    if n_atoms < 2:
        raise ValueError(f"a C51 support needs at least 2 atoms, got n_atoms={n_atoms}")
    v_min, v_max = torch.broadcast_tensors(v_min, v_max)
    t = torch.linspace(0.0, 1.0, n_atoms, dtype=v_min.dtype, device=v_min.device)
    return (1.0 - t) * v_min.unsqueeze(-1) + t * v_max.unsqueeze(-1)


def c51_projection(tz: Tensor, probs: Tensor, v_min: Tensor, v_max: Tensor) -> Tensor:
    """Project the distribution ``Σ_j p_j δ(Tz_j)`` onto the support ``atoms(v_min, v_max, N)``.

    Bellemare, Dabney & Munos (2017), *A Distributional Perspective on RL*, Algorithm 1, for
    every sample and branch at once. ``tz`` holds the Bellman-updated atoms ``r + γ z_j``
    (already transformed by the caller), ``probs`` the next-state probabilities ``p_j``, both
    ``[..., N]``; ``v_min``/``v_max`` broadcast to ``tz.shape[:-1]`` (one support per branch, or
    per sample and branch). Returns the projected target ``m``, ``[..., N]``; it conserves mass.

    The paper's ``u = ⌈b⌉`` gives ``l == u`` when ``b_j`` is an integer, and then both of its
    weights ``(u − b_j)`` and ``(b_j − l)`` are zero: the naive code drops that mass. Line 5 adds
    the indicator ``[l = u]`` so the whole ``p_j`` goes to that atom.
    """
    n_atoms = tz.shape[-1]
    v_min = v_min.unsqueeze(-1)  # [..., 1], broadcasts against the atom dimension
    v_max = v_max.unsqueeze(-1)
    # A numerical guard, not a bound: a collapsed support (V_max == V_min) would divide by zero.
    delta_z = ((v_max - v_min) / (n_atoms - 1)).clamp_min(torch.finfo(tz.dtype).tiny)

    # 1. Tz_j ← [r + γ z_j] clipped to [V_MIN, V_MAX]
    tz = torch.maximum(torch.minimum(tz, v_max), v_min)
    # 2. b_j ← (Tz_j − V_MIN)/Δz ∈ [0, N − 1]   (the clamp absorbs rounding just past N − 1)
    b = ((tz - v_min) / delta_z).clamp(0.0, n_atoms - 1)
    # 3. l ← ⌊b_j⌋, u ← ⌈b_j⌉
    lower = b.floor()
    upper = b.ceil()
    # 4. m_l ← m_l + p_j (u − b_j + [l = u])
    # 5. m_u ← m_u + p_j (b_j − l)
    on_atom = (lower == upper).to(probs.dtype)
    # A NaN target (a NaN reward: the sentinel has recorded it) keeps its NaN mass, so the loss
    # says so, but goes to atom 0: a NaN cast to an integer is an index far out of range.
    nan = torch.isnan(b)
    m = torch.zeros_like(probs)
    m.scatter_add_(-1, _index(lower, nan).expand_as(probs), probs * (upper - b + on_atom))
    m.scatter_add_(-1, _index(upper, nan).expand_as(probs), probs * (b - lower))
    return m


def _index(x: Tensor, nan: Tensor) -> Tensor:
    """``x`` (whole numbers in ``[0, N − 1]``) as indices, 0 where ``nan``."""
    return torch.where(nan, 0.0, x).long()


def c51_loss(logits: Tensor, target_probs: Tensor) -> Tensor:
    """Cross-entropy ``−Σ_i m_i log p_i(x, a)`` of the projected target against the logits.

    ``logits`` and ``target_probs`` are ``[..., N]``; returns ``[...]``, unreduced, so that the
    caller can average over branches, weight by importance and use it as a priority. The target
    carries no gradient (the caller computes it under ``torch.no_grad``).
    """
    return -(target_probs * torch.log_softmax(logits, dim=-1)).sum(dim=-1)


def quantile_huber_loss(pred: Tensor, target: Tensor, taus: Tensor, kappa: float) -> Tensor:
    """Quantile Huber loss of Dabney et al. (2018), *Implicit Quantile Networks*, eq. (3)–(4).

    ``ρ^κ_τ(δ) = |τ − 1{δ < 0}| · L_κ(δ)/κ`` with ``L_κ(δ) = ½δ²`` if ``|δ| ≤ κ`` else
    ``κ(|δ| − ½κ)``, and ``δ_ij = θ'_j − θ_i``. The loss is ``Σ_i (1/N') Σ_j ρ^κ_{τ_i}(δ_ij)``:
    summed over the ``N`` predicted quantiles, averaged over the ``N'`` target samples.
    ``κ = 0`` is the pure quantile-regression loss ``|τ − 1{δ < 0}| · |δ|``.

    Shapes: ``pred [B, N, *R]``, ``target [B, N', *R]``, ``taus [B, N]``; returns ``[B, *R]``.
    """
    if kappa < 0:
        raise ValueError(f"kappa must be >= 0 (0 = quantile regression), got {kappa}")
    rest = (None,) * (pred.dim() - 2)
    delta = target.unsqueeze(1) - pred.unsqueeze(2)  # [B, N, N', *R]
    abs_delta = delta.abs()
    if kappa > 0:
        huber = torch.where(
            abs_delta <= kappa, 0.5 * delta.square(), kappa * (abs_delta - 0.5 * kappa)
        )
        huber = huber / kappa
    else:
        huber = abs_delta
    tau = taus[(slice(None), slice(None), None, *rest)]  # [B, N, 1, 1...]
    weight = (tau - (delta < 0).to(delta.dtype)).abs()
    return (weight * huber).mean(dim=2).sum(dim=1)


def n_step_returns(rewards: Tensor, gamma: float) -> Tensor:
    """Discounted suffix sums ``G_i = Σ_{k=i}^{n−1} γ^{k−i} r_k`` along the last dimension.

    ``rewards [..., n]`` holds the n most recent rewards of each env, oldest first; ``G_i`` is the
    n-step (or shorter) return of the transition at position ``i``. One matrix product, so an
    insertion into the replay buffer needs no loop over steps or envs.
    """
    return rewards @ n_step_weights(rewards.shape[-1], gamma, rewards.dtype, rewards.device)


def n_step_weights(n: int, gamma: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The ``[n, n]`` matrix of :func:`n_step_returns` (``rewards @ weights``): ``γ^{k−i}`` at
    ``[k, i]`` where ``k >= i``, else 0. Constant for a buffer: the replay computes it once."""
    k = torch.arange(n, device=device)
    lag = k.unsqueeze(1) - k.unsqueeze(0)  # lag[k, i] = k − i
    # torch.pow(number, tensor): γ travels as a kernel argument, no host-to-device copy
    powers = torch.pow(gamma, lag.clamp_min(0).to(dtype))
    return torch.where(lag >= 0, powers, torch.zeros((), dtype=dtype, device=device))


def n_step_discounts(n_steps: Tensor, terminated: Tensor, gamma: float) -> Tensor:
    """The bootstrap factor ``γ^k`` after ``k`` real steps, and 0 where the episode terminated.

    A truncated (time-limit) episode is not terminated: it still bootstraps from its last state.
    """
    discount = torch.pow(gamma, n_steps.to(torch.float32))
    return discount * (~terminated).to(discount.dtype)
