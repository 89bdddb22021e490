"""Sanitise-and-clamp in place, counting engagements; ``guard_`` checks into a sentinel slot first,
in the same pass, so a check can never see sanitised data (design invariant 4).
"""

from __future__ import annotations

import math

import torch

from trimtab._count import count_nonzero_
from trimtab._impl import resolve_impl
from trimtab.sentinel import Sentinel
from trimtab.sentinel_state import (
    SUPPORTED_DTYPES,
    abs_max_host,
    abs_max_reference,
    fires_on_host,
    record_reference,
)

__all__ = ["clamp_finite_", "guard_", "scale_finite_"]

Bound = torch.Tensor | float


def clamp_finite_(
    x: torch.Tensor,
    bound: Bound,
    counter: torch.Tensor | None = None,
    *,
    impl: str | None = None,
    prepared: torch.Tensor | None = None,
) -> torch.Tensor:
    """In place: NaN and ±Inf become +0, finite values are clamped to ``[-bound, bound]``.

    ``bound`` is a float or a 1-element float32 tensor on ``x``'s device (a state-vector slot
    view, read by the kernel when it runs: no sync). An unset (NaN) bound clamps nothing: only
    non-finite values are replaced. A negative tensor bound acts as 0 (a negative float raises).
    Computation is in float32 (float64 for float64 ``x``); the bound is rounded to float32.

    ``counter`` (optional, int64 on ``x``'s device) receives engagement counts:
    ``counter[0] +=`` the number of *finite* elements that were clamped (``|x| > bound``), the
    numerator of the clamp's engagement rate, which non-finite values say nothing about; if
    ``counter`` has two elements, ``counter[1] +=`` the number of non-finite elements replaced.

    ``prepared``: ``bound`` as the torch reference reads it (:func:`reference_bound`), kept by a
    caller that clamps at one bound many times (:class:`~trimtab.AdaptiveBounds`), so each call
    skips deriving it; the kernel reads ``bound`` itself.

    Bytes moved: reads and writes ``x`` once (``2 * x.numel() * x.element_size()``). Returns x.
    """
    bound = _validate(x, bound, counter)
    impl = _choose(impl, x, bound, counter)
    if impl == "triton":
        from trimtab.kernels.clamp import launch_clamp

        launch_clamp(x, bound, counter)
    else:
        _clamp_reference_(x, bound, counter, prepared)
    return x


def scale_finite_(
    tensors: list[torch.Tensor],
    scale: torch.Tensor,
    counter: torch.Tensor | None = None,
    *,
    impl: str | None = None,
    known_finite: bool = False,
) -> list[torch.Tensor]:
    """In place: ``tensors[i] *= scale[i]``, then every NaN and ±Inf becomes +0.

    The gradient clip's step over many tensors in one launch (the kernel) instead of one per
    tensor. ``scale``: float32, one element per tensor, on their device (read on the device: no
    sync). ``counter`` (optional, int64, one element): ``+=`` the number of non-finite elements
    replaced. The reference multiplies in each tensor's dtype and then runs
    :func:`clamp_finite_` with no bound per tensor; the kernel, for float32 tensors, does both
    in one read and one write of every element. ``known_finite``: the caller knows every
    element is finite (the gradient clip, from its per-tensor norms), so the reference takes
    the products alone: the same bits, without the replacing pass. Returns ``tensors``.
    """
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        raise TypeError(f"scale must be a float32 tensor, got {getattr(scale, 'dtype', scale)}")
    if scale.numel() != len(tensors):
        raise ValueError(f"scale has {scale.numel()} elements for {len(tensors)} tensors")
    if counter is not None and (counter.dtype != torch.int64 or counter.numel() != 1):
        raise TypeError("counter must be a one-element int64 tensor or None")
    if not tensors:
        return tensors
    every = [*tensors, scale, *(() if counter is None else (counter,))]
    if len({t.device for t in every}) > 1:
        raise ValueError(f"tensors, scale and counter must be on one device, got "
                         f"{sorted({str(t.device) for t in every})}")  # fmt: skip
    chosen = resolve_impl(
        impl,
        every,
        fits=all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors),
        why="scale_finite_: the kernel needs contiguous float32 tensors",
    )
    if chosen == "triton":
        from trimtab.kernels.clamp import launch_scale_finite

        launch_scale_finite(tensors, scale.contiguous(), counter)
        return tensors
    _scale_finite_reference_(tensors, scale, counter, known_finite)
    return tensors


def _scale_finite_reference_(
    tensors: list[torch.Tensor],
    scale: torch.Tensor,
    counter: torch.Tensor | None,
    known_finite: bool = False,
) -> None:
    """The torch path of :func:`scale_finite_`: the products in each tensor's dtype (one
    ``_foreach_mul_``), then every tensor's NaN and ±Inf become +0 in one flat pass (the
    result of :func:`clamp_finite_` with no bound on each tensor, whatever the tensor count).
    """
    torch._foreach_mul_(tensors, [c.to(t.dtype) for c, t in zip(scale.unbind(), tensors)])
    if known_finite:  # nothing to replace or count
        return
    # NaN * c is NaN: the non-finite elements are replaced here. A finite value survives the
    # round trip through the (widest) common dtype exactly.
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    if counter is not None:  # x - x is NaN exactly where x is not finite (no bool mask: slow)
        counter.add_(count_nonzero_(flat - flat))
    flat.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    parts = flat.split([t.numel() for t in tensors])
    torch._foreach_copy_(
        [t.detach() for t in tensors], [f.view(t.shape) for f, t in zip(parts, tensors)]
    )


def guard_(
    x: torch.Tensor,
    bound: Bound,
    sentinel: Sentinel,
    name: str,
    counter: torch.Tensor | None = None,
    *,
    impl: str | None = None,
    prepared: torch.Tensor | None = None,
) -> torch.Tensor:
    """Check ``x`` into sentinel slot ``name``, then :func:`clamp_finite_` it, in one pass.

    The slot must have been added with no tensor (``sentinel.add(name, None, rule, phase)``):
    guard_ feeds it. The check applies the slot's rule to the *unsanitised* ``x`` and records a
    first firing exactly as :meth:`Sentinel.check` does, except for the step: a guarded slot's
    step counts the earlier guard_ calls on that slot since the last reset (so for a buffer
    guarded once per training step it is the training step). Each guard_ call also advances the
    sentinel's global check number, so :meth:`Sentinel.report` orders guarded and checked slots
    together. No sync; one kernel reads x once, records, and writes x. ``prepared`` as in
    :func:`clamp_finite_`. Returns x.
    """
    if not isinstance(sentinel, Sentinel):
        raise TypeError(f"guard_: sentinel must be a Sentinel, got {type(sentinel).__name__}")
    bound = _validate(x, bound, counter)
    slot = sentinel._guard_target(name, x)
    impl = _choose(impl, x, bound, counter)
    sstate = sentinel._state
    state = sstate.materialize()
    if impl == "triton":
        from trimtab.kernels.clamp import launch_clamp

        launch_clamp(x, bound, counter, guard=(state, slot))
    else:
        step = state["guard_steps"][slot : slot + 1]
        # On the CPU a read syncs with nothing: where the slot does not fire (every guard_ of a
        # healthy run) no record changes, so the record ops are skipped (as Sentinel.check's
        # reference skips them), by the same float64 test on the host (the float32 factor as
        # the device test reads it).
        host = abs_max_host([x])
        if host is None or fires_on_host(
            host, [float(sstate.thresholds([slot])[0])], [float(state["factors"][slot])],
            [sentinel._slots[name].rule.power == 2],
        ):  # fmt: skip
            index = state["slot_index"][slot : slot + 1]
            thr = sstate.thresholds([slot])[0].reshape(1)
            factor = state["factors"][slot : slot + 1]
            squared = state["powers"][slot : slot + 1] == 2
            record_reference(state, index, abs_max_reference(x).reshape(1), step, thr, factor,
                             squared)  # fmt: skip
        step.add_(1)
        state["counters"][-1:].add_(1)
        _clamp_reference_(x, bound, counter, prepared)
    return x


def reference_bound(bound: Bound, dtype: torch.dtype = torch.float32) -> Bound:
    """``bound`` as the clamp's torch reference reads it, in ``dtype``: an unset (NaN) bound is
    +Inf (no clamp) and a negative tensor bound 0. Elementwise, so a row of bounds gives each
    bound's own value."""
    if isinstance(bound, float):
        return math.inf if math.isnan(bound) else bound
    return torch.where(bound < 0, 0.0, bound).to(dtype).nan_to_num_(nan=math.inf)


def _clamp_reference_(
    x: torch.Tensor,
    bound: Bound,
    counter: torch.Tensor | None,
    prepared: torch.Tensor | None = None,
) -> None:
    """The torch reference of the clamp: same arithmetic and dtype as the kernel, no sync.

    Written as whole-tensor passes without a boolean mask (masks are slow on the CPU):
    ``s`` = ``x`` with NaN/±Inf replaced by +0, then ``copysign(min(|s|, b), s)``; a finite
    value is engaged exactly where that differs from ``s``, and ``y - y`` is nonzero (NaN)
    exactly where ``y`` is not finite. ``prepared``: :func:`reference_bound` of ``bound``."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.detach().to(acc)
    if counter is not None and counter.numel() == 2:
        counter[1:].add_(count_nonzero_(y - y))
    s = torch.nan_to_num(y, nan=0.0, posinf=0.0, neginf=0.0)
    # NaN (unset): no clamp; a negative tensor bound: 0
    if prepared is None:
        b = reference_bound(bound.reshape(()) if isinstance(bound, torch.Tensor) else bound, acc)
    else:
        b = prepared.to(acc)
    out = torch.abs(s).clamp_max_(b).copysign_(s)
    if counter is not None:
        counter[:1].add_(count_nonzero_(s - out))
    x.detach().copy_(out)


def clamped_reference(x: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
    """A clamped copy of ``x`` (not counted, not checked): what ``clamp_finite_(x.clone(),
    bound)`` leaves in the clone, bitwise, computed into new memory instead of into a clone.
    ``prepared``: :func:`reference_bound` of the bound. Torch only (the CPU's path)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = torch.nan_to_num(x.detach().to(acc), nan=0.0, posinf=0.0, neginf=0.0)
    return torch.abs(s).clamp_max_(prepared.to(acc)).copysign_(s).to(x.dtype)


def _validate(x: torch.Tensor, bound: Bound, counter: torch.Tensor | None) -> Bound:
    """Check the arguments (host metadata only); return the bound, a float rounded to float32."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"x has dtype {x.dtype}; clamp_finite_ handles {[str(d) for d in SUPPORTED_DTYPES]}"
        )
    if isinstance(bound, torch.Tensor):
        if bound.dtype != torch.float32:
            raise TypeError(
                f"a bound tensor must be float32 (a state-vector slot), got {bound.dtype}"
            )
        if bound.numel() != 1:
            raise ValueError(f"a bound tensor must hold one element, got {tuple(bound.shape)}")
        if bound.device != x.device:
            raise ValueError(f"the bound is on {bound.device} but x is on {x.device}")
    elif isinstance(bound, (int, float)) and not isinstance(bound, bool):
        if bound < 0:
            raise ValueError(f"bound must be >= 0 (NaN = unset: no clamp), got {bound}")
        # The kernel receives a float32 scalar; the reference must use the same value.
        bound = torch.tensor(float(bound), dtype=torch.float32).item()
    else:
        raise TypeError(f"bound must be a float or a float32 tensor, got {type(bound).__name__}")
    if counter is not None:
        if not isinstance(counter, torch.Tensor) or counter.dtype != torch.int64:
            raise TypeError("counter must be an int64 tensor (1 or 2 elements) or None")
        if counter.numel() not in (1, 2) or not counter.is_contiguous():
            raise ValueError(f"counter must hold 1 or 2 elements, got {tuple(counter.shape)}")
        if counter.device != x.device:
            raise ValueError(f"the counter is on {counter.device} but x is on {x.device}")
    return bound


def _choose(impl: str | None, x: torch.Tensor, bound: Bound, counter: torch.Tensor | None) -> str:
    # The kernel writes x in place by flat index; the reference handles any layout.
    return resolve_impl(
        impl,
        [t for t in (x, bound, counter) if isinstance(t, torch.Tensor)],
        fits=x.is_contiguous(),
        why="clamp_finite_/guard_: the kernel writes x in place by flat index and needs it "
        "contiguous (pass a contiguous tensor)",
    )
