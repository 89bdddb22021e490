"""The pure-PyTorch Adam(W) step with trimtab's in-step features and statistics oracle.

This is the CPU path and the test oracle of :mod:`trimtab.kernels.optim`; with every feature
off it performs exactly the operations of ``torch.optim.AdamW``'s single-tensor path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from trimtab.quantile import abs_quantile

# Columns of the per-group raw statistics row, shared by the reference and the kernel path.
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


def adam_group_step_reference(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    steps: Sequence[torch.Tensor],
    *,
    lr: float | torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float | torch.Tensor,
    l1: torch.Tensor | None,
    l1_params: Sequence[bool],
    bound: torch.Tensor | None,
    capturable: bool,
    stats: bool,
    quantile: float,
) -> torch.Tensor | None:
    r"""One Adam(W) step of one parameter group, in place; returns its raw statistics row.

    Per element, in this order (``u`` is the Adam direction, ``w`` the weight before the step):

    .. math::
        m &\leftarrow \beta_1 m + (1-\beta_1) g, \qquad v \leftarrow \beta_2 v + (1-\beta_2) g^2,
        \qquad u = \frac{m / (1-\beta_1^t)}{\sqrt{v / (1-\beta_2^t)} + \epsilon} \\
        w' &= w (1 - \eta\lambda) - \eta u \qquad \text{(decoupled decay, AdamW)} \\
        w'' &= \operatorname{sign}(w') \max(|w'| - \eta \lambda_1, 0) \qquad
        \text{(L1 prox, params in } l1\_params) \\
        w''' &= \operatorname{clamp}(w'', -b, b) \qquad \text{(weight clamp, } b = \infty
        \text{ when off)}

    ``weight_decay`` is a float (fixed, the exact ``torch.optim.AdamW`` arithmetic) or a 0-dim
    tensor (the adaptive rate read from the state vector). With ``stats`` it returns a float32
    row of ``NUM_STATS`` values (columns ``SUM_WU`` ... ``SUM_VHAT``): ``Σ w·u``, ``Σ w²``,
    ``Σ u²``, ``Σ |u|``, ``Σ |w|`` over the tensors that take the L1 step (0 without ``l1``),
    the count of finite ``|w''|``, how many of them exceed ``b``, their
    finite max, the exact ``quantile`` of ``|w''|``, ``|m|`` and ``|v|`` (before the clamp, so
    the clamp's engagements are visible), the entropy deficit of the input-feature gradient
    norms of the ``l1_params`` (NaN if none), then ``Σ g²`` and ``Σ v̂`` (``v̂`` the
    bias-corrected second moment after this step: their ratio is the gradient-growth statistic).

    Bytes moved (``N`` elements of ``s`` bytes, stats off): read w, g, m, v and write w, m, v,
    with a few temporaries, as ``torch.optim.AdamW(foreach=False)``; stats add a copy of
    ``|w''|``, ``|m|``, ``|v|`` (for the exact quantiles, about ``3 * 4N`` bytes more) and a
    temporary ``u``.
    """
    device = params[0].device if params else torch.device("cpu")
    zero = torch.zeros((), dtype=torch.float32, device=device)
    sums = [zero.clone() for _ in range(5)]
    growth = [zero.clone(), zero.clone()]  # Σ g², Σ v̂
    count = zero.clone()
    engaged = zero.clone()
    max_w = zero.clone()
    pre_clamp: list[torch.Tensor] = []
    col_sq: list[torch.Tensor] = []
    fixed_decay = not isinstance(weight_decay, torch.Tensor)

    for i, param in enumerate(params):
        grad, exp_avg, exp_avg_sq, step_t = grads[i], exp_avgs[i], exp_avg_sqs[i], steps[i]
        step_t += 1
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if capturable:
            # The step stays on the device; powers in the parameter's precision (torch uses
            # float32 here, which would cost float64 runs their last seven digits).
            step_d = step_t.to(param.dtype)
            bias_correction1 = 1 - beta1**step_d
            bias_correction2 = 1 - beta2**step_d
            step_size = lr / bias_correction1
            step_size_neg = step_size.neg()
            bias_correction2_sqrt = bias_correction2.sqrt()
            denom = (exp_avg_sq.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(
                eps / step_size_neg
            )
        else:
            step = step_t.item()  # a CPU tensor: no device sync
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
            growth[0] += grad.square().sum().float()
            growth[1] += (exp_avg_sq / bc2).sum().float()
            sums[0] += (w * u).sum().float()
            sums[1] += w.square().sum().float()
            sums[2] += u.square().sum().float()
            sums[3] += u.abs().sum().float()
            if l1_params[i]:
                col_sq.append(feature_axis_sq_norms(grad))
                if l1 is not None:
                    sums[4] += w.abs().sum().float()

        if fixed_decay:
            if weight_decay != 0:
                param.mul_(1 - lr * weight_decay)
        else:
            param.mul_(1 - lr * weight_decay)
        if capturable:
            param.addcdiv_(exp_avg, denom)
        else:
            param.addcdiv_(exp_avg, denom, value=-step_size)

        if l1 is not None and l1_params[i]:
            shrink = (param.abs() - lr * l1).clamp(min=0)
            param.copy_(param.sign() * shrink)

        if stats or bound is not None:
            a = param.detach().abs()
        if stats:
            finite = torch.isfinite(a)
            count += finite.sum().float()
            if a.numel():
                max_w = torch.maximum(max_w, torch.where(finite, a, 0).amax().float())
            pre_clamp.append(a.reshape(-1))
            if bound is not None:
                engaged += (finite & (a > bound)).sum().float()  # as clamp_finite_ counts
        if bound is not None:
            b = bound.to(param.dtype)
            param.copy_(torch.where(a > b, param.sign() * b, param))

    if not stats:
        return None
    q = [
        abs_quantile(torch.cat(xs) if xs else zero.reshape(0), quantile, impl="torch")
        for xs in (
            pre_clamp,
            [m.reshape(-1) for m in exp_avgs],
            [v.reshape(-1) for v in exp_avg_sqs],
        )
    ]
    deficit = entropy_deficit(col_sq, device).float()
    return torch.stack([*sums, count, engaged, max_w, *q, deficit, *growth])
