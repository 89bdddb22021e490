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
from typing import Any, NamedTuple

import torch

from trimtab._count import count_nonzero_
from trimtab.kernels.optim_layout import (
    FINE_KEYS,
    FINE_SHIFT,
    PART_ENGAGED,
    PART_FINITE,
    PART_GG,
    PART_VHAT,
    Workspace,
    float_bits,
    histograms_from_fine,
    sample_stride,
    sampled_index_table,
)
from trimtab.optim._reference import coefficients

_MAX_LAYOUTS = 8


class _Layout:
    """The buffers and views of one group layout (shapes, dtype, device, L1 tensors, stride),
    built once and reused by every step (a step allocates only scalars): the flat ``rows``
    (the weights, ``m``, ``v``, each ``[n + 1]`` with one Inf past the end, which the sample's
    padding reads), flat ``g`` and three scratch buffers, their per-tensor views in the
    tensors' shapes, the L1 tensors' mask and the sample's index table. On the CPU the moment
    rows are the optimizer's state itself once :meth:`adopt` has pointed it there."""

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
        self.rows = [new(n + 1).fill_(math.inf) for _ in range(3)]
        self.w, self.m, self.v = (r[:n] for r in self.rows)
        self.g, self.s, self.u, self.t = new(n), new(n), new(n), new(n)
        offsets = [0]
        for k in numels:
            offsets.append(offsets[-1] + k)

        def views(flat: torch.Tensor) -> list[torch.Tensor]:
            return [flat[o : o + k].view(s) for o, k, s in zip(offsets, numels, shapes)]

        self.wv, self.mv, self.vv, self.gv = (views(x) for x in (self.w, self.m, self.v, self.g))
        self.sv, self.uv, self.tv = views(self.s), views(self.u), views(self.t)
        self.numels = list(numels)
        self.l1 = l1
        self.wv_l1 = [self.wv[i] for i in l1]
        self.l1_mask = None
        if l1 and len(l1) < len(numels):
            self.l1_mask = torch.zeros(n, dtype=dtype, device=device)
            for i in l1:
                self.l1_mask[offsets[i] : offsets[i + 1]] = 1
        # int32: a step's row is selected on the device, a copy; 4x faster than of int64
        self.table = sampled_index_table(numels, stride, device).to(torch.int32)
        width = self.table.shape[1]
        self.sample = torch.empty(3, width, dtype=torch.float32, device=device)
        self.fine = torch.zeros(3 * FINE_KEYS, dtype=torch.int32, device=device)
        self.key_offsets = (torch.arange(3, dtype=torch.int32, device=device) * FINE_KEYS)[:, None]
        self.ones = torch.ones(3 * width, dtype=torch.int32, device=device)
        self.old: tuple[torch.Tensor, ...] | None = None
        self.ptrs: list[int] | None = None  # the adopted moments' addresses (see holds)
        # the weights' and gradients' addresses in the rows (see holds_params, holds_grads)
        self.wptrs = [t.data_ptr() for t in self.wv if t.numel()]
        self.gptrs = [t.data_ptr() for t in self.gv if t.numel()]

    def holds(self, exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor]) -> bool:
        """Whether the moments are the views of the ``m`` and ``v`` rows (then a step neither
        copies them in nor out). Live storages never overlap: a tensor whose data starts
        where a view's does is that view's memory."""
        return self.ptrs == [t.data_ptr() for t in (*exp_avgs, *exp_avg_sqs) if t.numel()]

    def adopt(self, exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor]) -> None:
        """Copy the moments into the ``m`` and ``v`` rows and point the state tensors there (in
        place: the optimizer's state keeps the same tensor objects), once per layout, or again
        after a load replaced them."""
        torch._foreach_copy_(self.mv, exp_avgs)
        torch._foreach_copy_(self.vv, exp_avg_sqs)
        for t, view in zip((*exp_avgs, *exp_avg_sqs), (*self.mv, *self.vv)):
            t.set_(view)
        self.ptrs = [t.data_ptr() for t in (*self.mv, *self.vv) if t.numel()]

    def holds_params(self, params: Sequence[torch.Tensor]) -> bool:
        """Whether the parameters are the views of the ``w`` row (:meth:`adopt_params`)."""
        return self.wptrs == [t.data_ptr() for t in params if t.numel()]

    def holds_grads(self, grads: Sequence[torch.Tensor]) -> bool:
        """Whether the gradients are the views of the ``g`` row (:meth:`adopt_grads`)."""
        return self.gptrs == [t.data_ptr() for t in grads if t.numel()]

    def adopt_params(self, params: Sequence[torch.Tensor]) -> None:
        """Copy the parameters into the ``w`` row and point them there (``p.data``: the same
        parameter objects), once per layout, or again after something gave them new memory
        (as moments :meth:`adopt`, and as flat-parameter optimizers do): a step then updates
        them where they are, without copying them in and out."""
        torch._foreach_copy_(self.wv, params)
        for p, view in zip(params, self.wv):
            p.data = view

    def adopt_grads(self, params: Sequence[torch.Tensor]) -> None:
        """Point the parameters' gradients at the ``g`` row, which holds this step's gradients:
        a backward then accumulates into it (autograd adds into an existing ``.grad`` in place,
        as it does into buffers zeroed in place), and the next step reads them there. A
        gradient set to None or replaced afterwards is copied in and adopted again."""
        for p, view in zip(params, self.gv):
            p.grad = view

    def olds(self) -> tuple[torch.Tensor, ...]:
        """Flat copies of w, m, v before the step (for a skip's select), allocated on first use."""
        if self.old is None:
            self.old = tuple(torch.empty_like(t) for t in (self.w, self.m, self.v))
        return self.old


# Per thread (two optimizers stepping in two threads must not share scratch buffers), for
# callers that pass no cache of their own.
_cache = threading.local()


def _layout(
    params: Sequence[torch.Tensor],
    l1_params: Sequence[bool],
    stride: int | None,
    cache: OrderedDict | None = None,
) -> _Layout:
    shapes = tuple(p.shape for p in params)
    if stride is None:
        stride = sample_stride(sum(p.numel() for p in params))
    l1 = tuple(i for i, f in enumerate(l1_params) if f)
    key = (shapes, params[0].dtype, params[0].device, l1, stride)
    layouts = cache if cache is not None else getattr(_cache, "layouts", None)
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


class _Coefficients(NamedTuple):
    """The bias-correction coefficients of a step: 0-dim tensors or floats shared by every
    tensor (``uniform``), else one per tensor (a device vector, or a list of host floats)."""

    uniform: bool
    bc1: Any
    bc2_sqrt: Any
    den_div: Any  # the denominator is √v / den_div + den_add
    den_add: Any
    value: Any  # the update is w += value * m / denominator


def _coefficients(steps, lr, beta1, beta2, eps, dtype, capturable, equal) -> _Coefficients:
    """As the reference computes them per tensor; when the caller knows every counter is equal
    (``equal``), computed once, from the first, exactly as the reference does for each tensor.
    Capturable counters stay on the device (nothing is read); the others are host values by
    definition (``torch.optim``'s convention: CPU tensors), read as the reference reads them."""
    if capturable:
        step_d = (steps[0] if equal else torch.stack(list(steps))).to(dtype) + 1
        bc1 = 1 - beta1**step_d
        step_size_neg = (lr / bc1).neg()
        bc2_sqrt = (1 - beta2**step_d).sqrt()
        return _Coefficients(equal, bc1, bc2_sqrt, bc2_sqrt * step_size_neg, eps / step_size_neg, 1)
    host = [t + 1 for t in torch.stack(list(steps)).tolist()]  # host counters: no sync
    uniform = all(h == host[0] for h in host)
    bc1 = [1 - beta1**t for t in host]
    bc2_sqrt = [(1 - beta2**t) ** 0.5 for t in host]
    value = [-(lr / b) for b in bc1]
    if uniform:
        return _Coefficients(True, bc1[0], bc2_sqrt[0], bc2_sqrt[0], eps, value[0])
    return _Coefficients(False, bc1, bc2_sqrt, bc2_sqrt, eps, value)


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
    equal_steps: bool = False,
    cache: OrderedDict | None = None,
    headroom: float = 1.0,
    adopt_params: bool = False,
) -> None:
    """One Adam(W) step of one parameter group and its statistics, as
    :func:`~trimtab.optim._reference.adam_group_step_reference` (the same arguments and
    results: the update's arithmetic per element is the reference's, the statistics are the
    same quantities in another order of summation). Every tensor of the group shares one dtype
    and device (:func:`fits`). No host read of a device tensor, on the CPU too: ``skip`` is a
    select, the sample's row is chosen on the device. ``equal_steps``: the caller knows every
    step counter of the group is equal (:class:`~trimtab.optim.Adam` tracks it on the host),
    so one bias correction serves every tensor; otherwise one per tensor (the same results).
    ``cache``: the caller's own dict of group layouts (one per optimizer); on the CPU its
    moments then live in the layout's flat rows (:meth:`_Layout.adopt`), not copied each step,
    and with ``adopt_params`` the parameters and their gradients too (their ``.data`` and
    ``.grad`` become views of the rows: only for parameters whose memory nothing else manages).

    Every pass is a whole-group op on a flat buffer, and none builds a boolean mask (slow on
    the CPU): the non-finite count is that of ``w - w`` (NaN exactly where ``w`` is not
    finite), the clamp's engagements those of ``w - clamp(w)`` less the non-finite ones, the
    finite max that of ``nan_to_num(w)``.

    Bytes moved (``N`` elements of ``s`` bytes): the copies into and out of the flat buffers
    (``14 sN``), about twenty flat elementwise passes, and ``3 N / stride`` gathered elements
    for the histograms.
    """
    if not params:
        return
    L = _layout(params, l1_params, stride, cache)
    if L.n == 0:  # only zero-size tensors: nothing to update, count or sample
        if stats:
            work.parts[0].zero_()
        return
    w, g, m, v, s, u, t = L.w, L.g, L.m, L.v, L.s, L.u, L.t
    dtype = w.dtype
    decay_c, l1_c, bound_c = coefficients(slots, floor)
    select = skip is not None  # decided on the device, by a select
    if select:
        skip = skip != 0
    # On the CPU with the caller's cache, the rows are the state itself: the moments, the
    # parameters and (unless a GradScaler's scale is applied to them here) the gradients.
    in_place = cache is not None and w.device.type == "cpu"
    own_params = in_place and adopt_params and all(type(p) is torch.nn.Parameter for p in params)
    if own_params and not L.holds_params(params):
        L.adopt_params(params)
    elif not own_params:
        torch._foreach_copy_(L.wv, params)
    if not (own_params and grad_scale is None and L.holds_grads(grads)):
        torch._foreach_copy_(L.gv, grads)
        if own_params and grad_scale is None:
            L.adopt_grads(params)
    if in_place and not L.holds(exp_avgs, exp_avg_sqs):
        L.adopt(exp_avgs, exp_avg_sqs)
    elif not in_place:
        torch._foreach_copy_(L.mv, exp_avgs)
        torch._foreach_copy_(L.vv, exp_avg_sqs)
    if select:
        w0, m0, v0 = L.olds()
        w0.copy_(w), m0.copy_(m), v0.copy_(v)
    if grad_scale is not None:
        g.mul_(grad_scale.float().reciprocal().to(dtype))
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    if select:
        torch.where(skip, m0, m, out=m)
        torch.where(skip, v0, v, out=v)

    c = _coefficients(steps, lr, beta1, beta2, eps, dtype, capturable, equal_steps)
    torch.sqrt(v, out=s)
    if stats:
        row = work.parts[0]
        # u = m̂ / (√v̂ + ε) = m / (bc1 (√v / √bc2 + ε)), the Adam direction
        if c.uniform:
            torch.mul(s, c.bc1 / c.bc2_sqrt, out=u).add_(c.bc1 * eps)
        else:
            u.copy_(s)
            _per_tensor("div_", L.uv, c.bc2_sqrt)
            u.add_(eps)
            _per_tensor("mul_", L.uv, c.bc1)
        torch.div(m, u, out=u)
        sums = torch.stack(
            [
                torch.inner(w, u),
                torch.inner(w, w),
                torch.inner(u, u),
                torch.abs(u, out=t).sum(),
                _l1_abs_sum(L),
                torch.inner(g, g),
                _vhat_sum(L, c),
            ]
        )
        f32 = sums.float().view(torch.int32)
        row[:5] = f32[:5]
        row[PART_GG] = f32[5]
        row[PART_VHAT] = f32[6]
    if c.uniform:
        torch.div(s, c.den_div, out=s).add_(c.den_add)
    else:
        _per_tensor("div_", L.sv, c.den_div)
        _per_tensor("add_", L.sv, c.den_add)

    if weight_decay is None:
        w.mul_(1 - lr * decay_c.to(dtype))
    elif weight_decay != 0:
        w.mul_(1 - lr * weight_decay)
    if c.uniform:
        w.addcdiv_(m, s, value=c.value)
    else:
        torch._foreach_addcdiv_(L.wv, L.mv, L.sv, c.value)
    if L.wv_l1:  # the L1 prox on its tensors: sign(w) max(|w| - η λ₁, 0)
        shrink = torch._foreach_abs(L.wv_l1)
        torch._foreach_sub_(shrink, lr * l1_c.to(dtype))
        torch._foreach_clamp_min_(shrink, 0)
        signs = torch._foreach_sign(L.wv_l1)
        torch._foreach_mul_(signs, shrink)
        torch._foreach_copy_(L.wv_l1, signs)

    # w now holds |w''|'s signed weights (after the update and L1, before the clamp).
    new = w
    if clamp:  # = the reference's where(|w| > hb, sign(w) hb, w): NaN kept, ±Inf to ±hb
        b = bound_c.to(dtype)
        cut = b if headroom == 1.0 else (bound_c * headroom).to(dtype)
        # two passes: one clamp(w, -b, b) with tensor bounds is 4x slower on the CPU; in w's
        # own row when nothing reads w'' after it (no statistics)
        new = t if stats or not own_params else w
        torch.clamp_min(w, cut.neg(), out=new).clamp_max_(cut)
    if stats:
        # the engagements are the bound's exceedances (the clamp's own at headroom 1)
        at_b = new if headroom == 1.0 or not clamp else torch.clamp_min(w, b.neg()).clamp_max_(b)
        _count_and_max(L, row, at_b if clamp else None, b if clamp else None)
        _histograms(L, work)
    if select:
        torch.where(skip, w0, new, out=new)
    if not own_params:
        torch._foreach_copy_(params, L.tv if clamp else L.wv)
    elif new is not w:
        w.copy_(new)
    if not in_place:
        torch._foreach_copy_(exp_avgs, L.mv)
        torch._foreach_copy_(exp_avg_sqs, L.vv)


def _count_and_max(
    L: _Layout, row: torch.Tensor, clamped: torch.Tensor | None, b: torch.Tensor | None
) -> None:
    """The finite count, the bits of the finite max of ``|w|`` (both of ``|w|`` rounded to
    float32, as :func:`~trimtab.kernels.optim_layout.float_bits`) and the clamp's engagements
    (finite ``|w| > b``) into ``row``, without a boolean mask."""
    w = L.w
    w32 = w if w.dtype == torch.float32 else w.float()
    nonfinite = count_nonzero_(torch.sub(w32, w32, out=L.u if w32 is w else None))
    top = torch.nan_to_num(w32, 0.0, 0.0, 0.0, out=L.u if w32 is w else None).abs_().amax()
    out = [torch.zeros_like(nonfinite), float_bits(top).to(nonfinite.dtype), L.n - nonfinite]
    if clamped is not None:
        # w - clamp(w) is nonzero where |w| > b and where w is not finite (NaN - x, ±Inf - x
        # and ±Inf - ±Inf are never 0): less the non-finite ones, the engagements.
        over = count_nonzero_(torch.sub(w, clamped, out=L.u))
        if w32 is w:
            out[0] = over - nonfinite
        else:  # float64: finite here but not in float32 counts as not finite (unless b = ∞)
            own = count_nonzero_(w - w)
            out[0] = over - own - (nonfinite - own) * (b < math.inf)
    row[PART_ENGAGED : PART_FINITE + 1] = torch.stack(out).to(row.dtype)


def _uniform(xs: Sequence[float]) -> bool:
    return all(x == xs[0] for x in xs)


def _per_tensor(op: str, views: list[torch.Tensor], coefs: torch.Tensor | list[float]) -> None:
    """``views[i].op(coefs[i])`` for every tensor in one ``torch._foreach_*`` call; ``coefs``
    a device vector or host floats."""
    if isinstance(coefs, torch.Tensor):
        coefs = list(coefs.unbind())
    getattr(torch, f"_foreach_{op}")(views, coefs)


def _l1_abs_sum(L: _Layout) -> torch.Tensor:
    """``Σ |w|`` over the tensors that take the L1 step (before this step's update)."""
    if not L.l1:
        return L.w.new_zeros(())
    a = torch.abs(L.w, out=L.t)
    return a.sum() if L.l1_mask is None else torch.inner(a, L.l1_mask)


def _vhat_sum(L: _Layout, c: _Coefficients) -> torch.Tensor:
    """``Σ v̂ = Σ_t (Σ v_t) / bc2_t``, ``bc2 = (√bc2)²`` as the reference squares it."""
    if c.uniform:
        return L.v.sum() / (c.bc2_sqrt * c.bc2_sqrt)
    per = torch.stack([x.sum() for x in L.vv]) if L.vv else L.v.new_zeros(0)
    b = c.bc2_sqrt if isinstance(c.bc2_sqrt, torch.Tensor) else per.new_tensor(c.bc2_sqrt)
    return (per / (b * b)).sum()


def _histograms(L: _Layout, work: Workspace) -> None:
    """The sampled histograms of ``|w''|``, ``|m|``, ``|v|``: this step's sample (row
    ``phase % stride`` of the table, chosen on the device; padding reads the trailing Inf;
    with stride 1 the row is every element in order, read in place), one histogram of the
    keys ``bits >> FINE_SHIFT``, then the workspace's bins."""
    stride, n = L.table.shape[0], L.n
    vals = L.sample
    if stride == 1 and vals.dtype == L.w.dtype:  # float32: the sample is the whole group
        for k, r in enumerate(L.rows):
            torch.bitwise_and(r[:n].view(torch.int32), 0x7FFFFFFF, out=vals[k].view(torch.int32))
    else:
        row = L.table[0] if stride == 1 else L.table.index_select(0, work.phase % stride)[0]
        for k in range(3):  # three 1-D gathers: faster than one along dim 1 on the CPU
            if L.w.dtype == torch.float32:
                torch.index_select(L.rows[k], 0, row, out=vals[k])
            else:
                vals[k].copy_(L.rows[k].index_select(0, row))
        vals.view(torch.int32).bitwise_and_(0x7FFFFFFF)
    keys = vals.view(torch.int32).bitwise_right_shift_(FINE_SHIFT)
    keys.add_(L.key_offsets)
    fine = L.fine.zero_().index_add_(0, keys.reshape(-1), L.ones)
    histograms_from_fine(work.ints, fine.view(3, FINE_KEYS), work.sel)
