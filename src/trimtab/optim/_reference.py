"""The pure-PyTorch Adam(W) step with trimtab's in-step features and statistics oracle.

This is the CPU path and the test oracle of :mod:`trimtab.kernels.optim`: the same signature,
the same workspace written (:mod:`trimtab.kernels.optim_layout`); with every feature off it
performs exactly the operations of ``torch.optim.AdamW``'s single-tensor path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from trimtab.kernels.optim_layout import (
    NONFINITE_BITS,
    PART_ENGAGED,
    PART_FINITE,
    PART_GG,
    PART_MAXBITS,
    PART_VHAT,
    Workspace,
    float_bits,
    histograms_reference,
    sample_stride,
    sampled_elements,
)

# Columns of the per-group statistics row the finalize folds: the reduced workspace
# (:func:`~trimtab.kernels.optim_layout.parts_reference`), the three quantiles, the deficit.
SUM_WU, SUM_WW, SUM_UU, SUM_ABS_U, SUM_L1_W, COUNT, ENGAGED = range(7)
MAX_W, Q_W, Q_M, Q_V, DEFICIT = range(7, 12)
SUM_GG, SUM_VHAT = 12, 13
NUM_STATS = 14


def feature_axis_sq_norms(g: torch.Tensor) -> torch.Tensor:
    """``‖g[:, i]‖²`` for each input feature ``i`` (dim 1) of a weight of two or more dims."""
    return g.detach().transpose(0, 1).reshape(g.shape[1], -1).float().square().sum(dim=1)


def entropy_deficit(col_sq: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    r"""``D = (log K - H) / log K`` of ``p_i = ‖g_i‖ / Σ_j ‖g_j‖`` over the K input features.

    0 when the gradient spreads evenly over the features, 1 when it sits on one; NaN (an
    observation the estimator ignores) with fewer than two features or an all-zero gradient.
    """
    if not col_sq:
        return torch.full((), math.nan, device=device)
    norms = torch.cat([c.reshape(-1) for c in col_sq]).sqrt()
    k = norms.numel()
    if k < 2:
        return torch.full((), math.nan, device=device)
    p = norms / norms.sum()  # 0/0 -> NaN for an all-zero gradient: ignored downstream
    h = -torch.special.xlogy(p, p).sum()
    return (math.log(k) - h) / math.log(k)


def coefficients(
    slots: tuple[torch.Tensor, torch.Tensor, torch.Tensor], floor: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decay rate, L1 threshold per lr and weight bound a step reads from its slots, as the
    kernel reads them: ``fmax(slot, 0)`` (NaN: 0), and the bound ``max(slot, floor)``, ``inf``
    while unset (NaN)."""
    decay, l1, bound = slots
    zero = decay.new_zeros(())
    b = torch.where(torch.isnan(bound), math.inf, torch.fmax(bound, zero.new_full((), floor)))
    return torch.fmax(decay, zero), torch.fmax(l1, zero), b


def _assign(dst: torch.Tensor, new: torch.Tensor, skip: torch.Tensor) -> None:
    """``dst = new`` unless ``skip`` (a 0-dim bool) is set: a select, so the decision stays on
    the device."""
    dst.copy_(torch.where(skip, dst, new))


def adam_group_step_reference(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    steps: Sequence[torch.Tensor],
    work: Workspace,
    *,
    lr: float | torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float | None,
    slots: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    l1_params: Sequence[bool],
    clamp: bool,
    stats: bool,
    floor: float,
    skip: torch.Tensor | None = None,
    grad_scale: torch.Tensor | None = None,
    capturable: bool = True,
    stride: int | None = None,
    headroom: float = 1.0,
) -> None:
    r"""One Adam(W) step of one parameter group, in place, and its statistics into ``work``.

    Per element, in this order (``u`` is the Adam direction, ``w`` the weight before the step,
    ``t`` the step counter plus one: ``steps`` are read, not written; the finalize steps them):

    .. math::
        m &\leftarrow \beta_1 m + (1-\beta_1) g, \qquad v \leftarrow \beta_2 v + (1-\beta_2) g^2,
        \qquad u = \frac{m / (1-\beta_1^t)}{\sqrt{v / (1-\beta_2^t)} + \epsilon} \\
        w' &= w (1 - \eta\lambda) - \eta u \qquad \text{(decoupled decay, AdamW)} \\
        w'' &= \operatorname{sign}(w') \max(|w'| - \eta \lambda_1, 0) \qquad
        \text{(L1 prox, params in } l1\_params) \\
        w''' &= \operatorname{clamp}(w'', -h b, h b) \qquad \text{(weight clamp, } b = \infty
        \text{ when off; } h \text{ the headroom)}

    The signature and the results of the kernel launcher
    :func:`trimtab.kernels.optim.adam_group_step_triton`. ``weight_decay`` is a float (fixed,
    the exact ``torch.optim.AdamW`` arithmetic) or ``None`` (the adaptive rate, read from the
    decay slot); ``slots`` are the group's decay, L1 and weight-bound slot views, read as
    :func:`coefficients`. ``skip`` (0-dim, bool or float, nonzero: ``found_inf``) leaves
    parameters and moments unchanged, by a select. ``grad_scale`` (0-dim): the gradients are
    multiplied by its reciprocal first. ``capturable``: the bias corrections are computed on
    the device (else from the CPU step counter, as ``torch.optim.AdamW``). ``stride``: the
    sampling stride (default :func:`~trimtab.kernels.optim_layout.sample_stride`).
    ``headroom`` (>= 1): the clamp binds at ``headroom`` times the bound ``b``, while the
    engagement count stays that of ``|w''| > b``, the bound's exceedances (what the engagement
    test expects at the rate ``1 - q``).

    With ``stats`` it writes the workspace (:mod:`trimtab.kernels.optim_layout`) as the kernel
    does: row 0 of ``parts`` holds ``Σ w·u``, ``Σ w²``, ``Σ u²``, ``Σ |u|``, ``Σ |w|`` over the
    tensors that take the L1 step, the clamp's engagement count (finite ``|w''| > b``), the
    finite max and count of ``|w''|``, ``Σ g²`` and ``Σ v̂`` (``v̂`` the bias-corrected second
    moment after this step); ``ints`` gets the sampled histograms of ``|w''|`` (before the
    clamp, so the clamp's engagements are visible), ``|m|`` and ``|v|``.

    Bytes moved (``N`` elements of ``s`` bytes, stats off): read w, g, m, v and write w, m, v,
    with a few temporaries, as ``torch.optim.AdamW(foreach=False)``; stats add a temporary
    ``u`` and the bit patterns of ``|w''|``, ``|m|``, ``|v|`` (about ``3 * 8N`` bytes);
    ``skip`` adds a temporary and a select per tensor (no copy of the parameters is kept).
    """
    device = params[0].device if params else torch.device("cpu")
    acc_dtype = params[0].dtype if params else torch.float32
    zero = torch.zeros((), dtype=acc_dtype, device=device)
    sums = [zero.clone() for _ in range(5)]
    growth = [zero.clone(), zero.clone()]  # Σ g², Σ v̂
    count = torch.zeros((), dtype=torch.int64, device=device)
    engaged = count.clone()
    max_bits = torch.zeros((), dtype=torch.int32, device=device)
    pre_clamp: list[torch.Tensor] = []
    decay_c, l1_c, bound_c = coefficients(slots, floor)
    skip = None if skip is None else skip != 0

    for i, param in enumerate(params):
        grad, exp_avg, exp_avg_sq, step_t = grads[i], exp_avgs[i], exp_avg_sqs[i], steps[i]
        if grad_scale is not None:
            grad = grad * grad_scale.float().reciprocal().to(grad.dtype)
        if skip is None:
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        else:
            _assign(exp_avg, exp_avg.lerp(grad, 1 - beta1), skip)
            _assign(exp_avg_sq, exp_avg_sq.mul(beta2).addcmul_(grad, grad, value=1 - beta2), skip)
        if capturable:
            # The step stays on the device; powers in the parameter's precision (torch uses
            # float32 here, which would cost float64 runs their last seven digits).
            step_d = step_t.to(param.dtype) + 1
            bias_correction1 = 1 - beta1**step_d
            bias_correction2 = 1 - beta2**step_d
            step_size = lr / bias_correction1
            step_size_neg = step_size.neg()
            bias_correction2_sqrt = bias_correction2.sqrt()
            denom = (exp_avg_sq.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(
                eps / step_size_neg
            )
        else:
            step = step_t.item() + 1  # a CPU tensor: no device sync
            bias_correction1 = 1 - beta1**step
            step_size = lr / bias_correction1
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)

        if stats:
            # The Adam direction u = m̂ / (√v̂ + ε), the step actually taken per unit of lr.
            if capturable:
                u = exp_avg / (bias_correction1 * (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps))
            else:
                u = exp_avg / (bias_correction1 * denom)
            w = param.detach()
            bc2 = bias_correction2_sqrt * bias_correction2_sqrt
            growth[0] += grad.square().sum()
            growth[1] += (exp_avg_sq / bc2).sum()
            sums[0] += (w * u).sum()
            sums[1] += w.square().sum()
            sums[2] += u.square().sum()
            sums[3] += u.abs().sum()
            if l1_params[i]:
                sums[4] += w.abs().sum()

        if weight_decay is None:
            factor = 1 - lr * decay_c.to(param.dtype)
        else:
            factor = None if weight_decay == 0 else 1 - lr * weight_decay
        value = 1 if capturable else -step_size
        if skip is None:  # in place, torch.optim.AdamW's operations
            new = param
            if factor is not None:
                new.mul_(factor)
            new.addcdiv_(exp_avg, denom, value=value)
        else:  # the same operations out of place, selected into param at the end
            new = param if factor is None else param.mul(factor)
            new = new.addcdiv(exp_avg, denom, value=value)
        if l1_params[i]:
            shrink = (new.abs() - lr * l1_c.to(param.dtype)).clamp(min=0)
            new.copy_(new.sign() * shrink)

        if stats or clamp:
            a = new.detach().abs()
        if stats:
            bits = float_bits(a)
            finite = bits < NONFINITE_BITS
            count += finite.sum()
            if bits.numel():
                max_bits = torch.maximum(max_bits, torch.where(finite, bits, 0).amax())
            pre_clamp.append(a.reshape(-1))
            if clamp:
                engaged += (finite & (a > bound_c.to(a.dtype))).sum()
        if clamp:
            b = (bound_c * headroom).to(param.dtype)
            new.copy_(torch.where(a > b, new.sign() * b, new))
        if skip is not None:
            _assign(param, new, skip)

    if not stats:
        return
    row = work.parts[0]
    f32 = torch.stack([*sums, *growth]).float().view(torch.int32)
    row[: len(sums)] = f32[: len(sums)]  # a fresh workspace: one writer, the bits of the sums
    row[PART_GG] = f32[5]
    row[PART_VHAT] = f32[6]
    row[PART_ENGAGED] = engaged.int()
    row[PART_FINITE] = count.int()
    row[PART_MAXBITS] = max_bits
    numels = [p.numel() for p in params]
    if stride is None:
        stride = sample_stride(sum(numels))
    sampled = sampled_elements(numels, work.phase, stride)
    values = [
        torch.cat(xs) if xs else zero.reshape(0)
        for xs in (
            pre_clamp,
            [m.reshape(-1) for m in exp_avgs],
            [v.reshape(-1) for v in exp_avg_sqs],
        )
    ]
    histograms_reference(work.ints, values, sampled, work.sel)
