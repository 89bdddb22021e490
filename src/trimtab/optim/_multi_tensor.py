"""The multi-tensor Adam(W) group step: the reference's arithmetic on one flat buffer per
quantity (``torch._foreach_*`` only where a coefficient differs per tensor), the CPU default.

Same signature, results and workspace as :func:`trimtab.optim._reference.adam_group_step_reference`
(its oracle). A step copies the group's weights, gradients and moments into flat buffers,
updates them with a few dozen whole-group torch ops, and copies the results back, so its cost
does not grow with the number of tensors; the sampled histograms are one histogram of
``bits >> FINE_SHIFT`` over the step's sample, gathered through a cached index table
(:func:`~trimtab.kernels.optim_layout.histograms_from_fine`).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from trimtab.kernels.optim_layout import (
    FINE_KEYS,
    FINE_SHIFT,
    PART_ENGAGED,
    PART_FINITE,
    PART_GG,
    PART_MAXBITS,
    PART_VHAT,
    Workspace,
    histograms_from_fine,
    sample_stride,
    sampled_index_table,
)
from trimtab.optim._reference import coefficients

_MAX_LAYOUTS = 8


class _Layout:
    """The buffers and views of one group layout (shapes, dtype, device, L1 tensors, stride),
    built once: flat buffers of ``n`` elements (``amv``: ``|w''|``, ``m``, ``v`` as rows, one
    Inf past the end for the sample's padding), their per-tensor views in the tensors' shapes,
    and the sample's index table. Reused by every step: a step allocates only scalars."""

    def __init__(
        self,
        shapes: tuple[torch.Size, ...],
        dtype: torch.dtype,
        device: torch.device,
        l1: tuple[int, ...],
        stride: int,
    ) -> None:
        numels = tuple(math.prod(s) for s in shapes)
        n = self.n = sum(numels)
        new = lambda *size: torch.empty(size, dtype=dtype, device=device)  # noqa: E731
        self.amv = new(3, n + 1)
        self.amv[:, n] = math.inf
        self.a, self.m, self.v = self.amv[0, :n], self.amv[1, :n], self.amv[2, :n]
        self.w, self.g, self.s, self.u = new(n), new(n), new(n), new(n)
        self.finite = torch.empty(n, dtype=torch.bool, device=device)
        self.over = torch.empty(n, dtype=torch.bool, device=device)
        offsets = [0]
        for k in numels:
            offsets.append(offsets[-1] + k)

        def views(flat: torch.Tensor) -> list[torch.Tensor]:
            return [flat[o : o + k].view(s) for o, k, s in zip(offsets, numels, shapes)]

        self.wv, self.gv, self.mv, self.vv = (views(t) for t in (self.w, self.g, self.m, self.v))
        self.sv, self.uv = views(self.s), views(self.u)
        self.l1 = l1
        self.wv_l1 = [self.wv[i] for i in l1]
        self.table = sampled_index_table(numels, stride, device)
        self.fine = torch.zeros(3 * FINE_KEYS, dtype=torch.int32, device=device)
        self.key_offsets = (torch.arange(3, device=device) * FINE_KEYS)[:, None]
        self.ones = torch.ones(3 * self.table.shape[1], dtype=torch.int32, device=device)
        self.old: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def olds(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Flat copies of w, m, v before the step (for a skip's select), allocated on first use."""
        if self.old is None:
            self.old = tuple(torch.empty_like(t) for t in (self.w, self.m, self.v))
        return self.old


# Per thread (two optimizers stepping in two threads must not share scratch buffers).
_cache = threading.local()


def _layout(
    params: Sequence[torch.Tensor], l1_params: Sequence[bool], stride: int | None
) -> _Layout:
    shapes = tuple(p.shape for p in params)
    numels = [p.numel() for p in params]
    if stride is None:
        stride = sample_stride(sum(numels))
    l1 = tuple(i for i, f in enumerate(l1_params) if f)
    key = (shapes, params[0].dtype, params[0].device, l1, stride)
    layouts = getattr(_cache, "layouts", None)
    if layouts is None:
        layouts = _cache.layouts = OrderedDict()
    lay = layouts.get(key)
    if lay is None:
        lay = layouts[key] = _Layout(shapes, params[0].dtype, params[0].device, l1, stride)
        while len(layouts) > _MAX_LAYOUTS:
            layouts.popitem(last=False)
    else:
        layouts.move_to_end(key)
    return lay


def fits(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> bool:
    """Whether the multi-tensor path takes this group: one floating dtype and one device for
    every parameter and gradient (else the reference runs it)."""
    if not params:
        return True
    dtype, device = params[0].dtype, params[0].device
    return dtype.is_floating_point and all(
        t.dtype == dtype and t.device == device for t in (*params, *grads)
    )


def adam_group_step_multi_tensor(
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
) -> None:
    """One Adam(W) step of one parameter group and its statistics, as
    :func:`~trimtab.optim._reference.adam_group_step_reference` (the same arguments, the same
    arithmetic per element; the sums in another order). Every tensor of the group shares one
    dtype and device (:func:`fits`). No host sync on any device (``capturable=False`` reads
    the CPU step counters, as the reference does).

    Bytes moved (``N`` elements of ``s`` bytes): the copies in and out of the flat buffers
    (read w, g, m, v, write them flat, read them back into w, m, v: ``14 sN``), about twenty
    flat elementwise passes, and ``3 N / stride`` gathered elements for the histograms.
    """
    if not params:
        return
    L = _layout(params, l1_params, stride)
    dtype = L.w.dtype
    torch._foreach_copy_(L.wv, params)
    torch._foreach_copy_(L.gv, grads)
    torch._foreach_copy_(L.mv, exp_avgs)
    torch._foreach_copy_(L.vv, exp_avg_sqs)
    w, g, m, v, s, u = L.w, L.g, L.m, L.v, L.s, L.u
    decay_c, l1_c, bound_c = coefficients(slots, floor)
    if skip is not None:
        skip = skip != 0
        w0, m0, v0 = L.olds()
        w0.copy_(w)
        m0.copy_(m)
        v0.copy_(v)
    if grad_scale is not None:
        g.mul_(grad_scale.float().reciprocal().to(dtype))
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    if skip is not None:  # the moments the rest of the step reads, as the reference's select
        torch.where(skip, m0, m, out=m)
        torch.where(skip, v0, v, out=v)

    # Per-tensor bias corrections (the step counters may differ between tensors).
    if capturable:
        step_d = torch.stack(list(steps)).to(dtype) + 1
        bc1 = 1 - beta1**step_d
        step_size_neg = (lr / bc1).neg()
        bc2_sqrt = (1 - beta2**step_d).sqrt()
        den_div, den_add = bc2_sqrt * step_size_neg, eps / step_size_neg
    else:
        host = [t + 1 for t in torch.stack(list(steps)).tolist()]  # CPU counters: no sync
        bc1 = [1 - beta1**t for t in host]
        bc2_sqrt = [(1 - beta2**t) ** 0.5 for t in host]
        step_size_neg = [-(lr / b) for b in bc1]
    torch.sqrt(v, out=s)
    if stats:  # u = m̂ / (√v̂ + ε) = m / (bc1 (√v / √bc2 + ε)), per element as the reference
        u.copy_(s)
        _per_tensor("div_", u, L.uv, bc2_sqrt)
        u.add_(eps)
        _per_tensor("mul_", u, L.uv, bc1)
        torch.div(m, u, out=u)
        row = work.parts[0]
        sums = torch.stack(
            [
                torch.dot(w, u),
                torch.dot(w, w),
                torch.dot(u, u),
                torch.linalg.vector_norm(u, 1),
                _l1_abs_sum(L, w),
                torch.dot(g, g),
                _vhat_sum(L, bc2_sqrt),
            ]
        )
        f32 = sums.float().view(torch.int32)
        row[:5] = f32[:5]
        row[PART_GG] = f32[5]
        row[PART_VHAT] = f32[6]
    # The denominator, as the reference: (√v / (√bc2 · -η/bc1)) + ε / (-η/bc1) when capturable
    # (the step then adds m / denom), else √v / √bc2 + ε (and adds -η/bc1 · m / denom).
    if capturable:
        _per_tensor("div_", s, L.sv, den_div)
        _per_tensor("add_", s, L.sv, den_add)
    else:
        _per_tensor("div_", s, L.sv, bc2_sqrt)
        s.add_(eps)

    if weight_decay is None:
        w.mul_(1 - lr * decay_c.to(dtype))
    elif weight_decay != 0:
        w.mul_(1 - lr * weight_decay)
    if capturable:
        w.addcdiv_(m, s)
    elif _uniform(step_size_neg):
        w.addcdiv_(m, s, value=step_size_neg[0])
    else:
        torch._foreach_addcdiv_(L.wv, L.mv, L.sv, step_size_neg)
    if L.wv_l1:  # the L1 prox on its tensors: sign(w) max(|w| - η λ₁, 0)
        shrink = torch._foreach_abs(L.wv_l1)
        torch._foreach_sub_(shrink, lr * l1_c.to(dtype))
        torch._foreach_clamp_min_(shrink, 0)
        signs = torch._foreach_sign(L.wv_l1)
        torch._foreach_mul_(signs, shrink)
        torch._foreach_copy_(L.wv_l1, signs)

    if stats and L.n:
        a = torch.abs(w, out=L.a)
        af = a if dtype == torch.float32 else a.float()  # the bits are float32's
        finite = torch.lt(af, math.inf, out=L.finite)
        row[PART_FINITE] = finite.sum().int()
        row[PART_MAXBITS] = torch.where(finite, af, 0).amax().view(torch.int32)
        if clamp:
            over = torch.gt(a, bound_c.to(dtype), out=L.over).logical_and_(finite)
            row[PART_ENGAGED] = over.sum().int()
        else:
            row[PART_ENGAGED] = 0
        _histograms(L, work)
    elif stats:  # an all-empty group: no element, nothing counted or sampled
        row[PART_FINITE] = row[PART_ENGAGED] = row[PART_MAXBITS] = 0
    if clamp:  # = the reference's where(|w| > b, sign(w) b, w), NaN kept
        b = bound_c.to(dtype)
        torch.clamp(w, -b, b, out=w)
    if skip is not None:
        torch.where(skip, w0, w, out=w)
    torch._foreach_copy_(params, L.wv)
    torch._foreach_copy_(exp_avgs, L.mv)
    torch._foreach_copy_(exp_avg_sqs, L.vv)


def _uniform(xs: Sequence[float]) -> bool:
    return all(x == xs[0] for x in xs)


def _per_tensor(op: str, flat: torch.Tensor, views: list[torch.Tensor], coefs) -> None:
    """``views[i].op(coefs[i])`` for every tensor: ``coefs`` a device vector (one
    ``torch._foreach_*`` call) or host floats, which when all equal (the usual case: every
    tensor at the same step) make one flat op."""
    if isinstance(coefs, torch.Tensor):
        getattr(torch, f"_foreach_{op}")(views, list(coefs.unbind()))
    elif _uniform(coefs):
        getattr(flat, op)(coefs[0])
    else:
        getattr(torch, f"_foreach_{op}")(views, coefs)


def _l1_abs_sum(L: _Layout, w: torch.Tensor) -> torch.Tensor:
    """``Σ |w|`` over the tensors that take the L1 step (before this step's update)."""
    if not L.l1:
        return w.new_zeros(())
    return torch.stack(torch._foreach_norm(L.wv_l1, 1)).sum()


def _vhat_sum(L: _Layout, bc2_sqrt: torch.Tensor | list[float]) -> torch.Tensor:
    """``Σ v̂ = Σ_t (Σ v_t) / bc2_t``, ``bc2 = (√bc2)²`` as the reference squares it."""
    per = torch.stack(torch._foreach_norm(L.vv, 1))  # v >= 0 (or NaN): its L1 norm is its sum
    b = bc2_sqrt if isinstance(bc2_sqrt, torch.Tensor) else per.new_tensor(bc2_sqrt)
    return (per / (b * b)).sum()


def _histograms(L: _Layout, work: Workspace) -> None:
    """The sampled histograms of ``|w''|``, ``|m|``, ``|v|``: gather this step's sample (row
    ``phase % stride`` of the table; padding reads the trailing Inf), one histogram of the
    keys ``bits >> FINE_SHIFT``, then the workspace's bins from it."""
    row = L.table.index_select(0, (work.phase % L.table.shape[0]).long()).reshape(-1)
    vals = L.amv.index_select(1, row)
    if vals.dtype != torch.float32:
        vals = vals.float()
    keys = (vals.view(torch.int32) & 0x7FFFFFFF).bitwise_right_shift_(FINE_SHIFT)
    keys = (keys.long() + L.key_offsets).reshape(-1)
    fine = L.fine.zero_().scatter_add_(0, keys, L.ones)
    histograms_from_fine(work.ints, fine.view(3, FINE_KEYS), work.sel)
