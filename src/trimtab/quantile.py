"""Quantiles of |x| over the finite elements of one tensor or of many at once, on the device.

These are the observations behind every adaptive bound (p99 |target|, |activation|, |grad|);
the kernel path reads a sample of each tensor and then each tensor once, in one launch per pass
for all of them, with no sync, and returns the exact order statistic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from trimtab._count import count_nonzero_
from trimtab._impl import resolve_impl

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class AbsQuantile(NamedTuple):
    """What ``return_nonfinite=True`` returns: the quantile and how many elements were excluded."""

    value: torch.Tensor  # float32: 0-dim for abs_quantile, [T] for abs_quantiles
    nonfinite: torch.Tensor  # int64, same shape: the count of NaN and ±Inf elements


def _check(tensors: Sequence[torch.Tensor], q: float) -> None:
    if isinstance(q, torch.Tensor) or not isinstance(q, (int, float)) or not 0.0 < q <= 1.0:
        raise ValueError(
            f"q must be a Python number in (0, 1], got {q!r}; a tensor q would need a host sync"
        )
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{i}] is a {type(t).__name__}, not a torch.Tensor")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"abs_quantile needs a floating tensor (float16, bfloat16, float32 or float64), "
                f"got {t.dtype} for tensors[{i}]; convert it with .float() first"
            )
    if len({t.device for t in tensors}) > 1:
        raise ValueError(
            f"all tensors must be on one device, got {sorted({str(t.device) for t in tensors})}"
        )


def abs_quantile_reference(x: torch.Tensor, q: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact q-quantile of |x| over the finite elements of ``x``: ``(float32 0-dim, int64 0-dim)``.

    The value is the order statistic of rank ``k = ceil(q * n)`` (1-based, ``k`` at least 1) of
    the sorted finite |x|, ``n`` the finite count, ``q * n`` rounded in float64; 0 when ``n`` is 0.
    |x| is taken in float32 (float64 for float64 inputs, rounded to float32 at the end), so the
    answer is an element of |x| exactly.

    Bytes moved, for ``N`` elements of ``s`` bytes: read ``N*s``; write and read an |x| copy
    (``4N``, ``8N`` for float64), ``|x| - |x|`` for the non-finite count (``4N``), NaN set to
    +Inf in place (``8N``); then on CPU ``torch.kthvalue`` (quickselect, O(N), one more copy),
    on CUDA a full ``torch.sort`` (several passes of ``4N`` values and ``8N`` indices) and a
    gather, so that the rank can stay on the device: no host sync on CUDA. About
    ``N*s + 24N`` bytes on CPU.
    """
    a = x.detach().reshape(-1).abs()
    a = a.double() if x.dtype == torch.float64 else a.float()
    # |x| - |x| is NaN exactly where x is not finite: a count without a boolean mask (slow on
    # the CPU); then every non-finite |x| (NaN or +Inf) reads +Inf, above every finite one.
    nonfinite = count_nonzero_(a - a)
    n_finite = a.numel() - nonfinite
    if a.numel() == 0:
        zero = torch.zeros((), dtype=torch.float32, device=x.device)
        return zero, nonfinite
    k = torch.ceil(n_finite.double() * float(q)).long().clamp(min=1)
    a = a.nan_to_num_(nan=math.inf)
    if a.is_cuda:
        value = torch.sort(a).values.gather(0, (k - 1).reshape(1)).reshape(())
    else:
        value = torch.kthvalue(a, int(k)).values
    value = torch.where(n_finite > 0, value, torch.zeros_like(value))
    return value.float(), nonfinite


def abs_quantiles_reference(
    tensors: Sequence[torch.Tensor], q: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`abs_quantile_reference` of each tensor, stacked: ``(float32 [T], int64 [T])``."""
    pairs = [abs_quantile_reference(t, q) for t in tensors]
    device = tensors[0].device if tensors else torch.device("cpu")
    if not pairs:
        return torch.zeros(0, device=device), torch.zeros(0, dtype=torch.int64, device=device)
    return torch.stack([v for v, _ in pairs]), torch.stack([c for _, c in pairs])


def _kernel(tensors: Sequence[torch.Tensor], q: float, exact: bool):
    from trimtab.kernels.quantile import abs_quantiles_triton

    # One launch reads one dtype; a mixed list is read as float32 (a copy of the others).
    dtypes = {t.dtype for t in tensors}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    flat = [t.detach().reshape(-1).to(dtype).contiguous() for t in tensors]
    return abs_quantiles_triton(flat, q, exact=exact)


def abs_quantiles(
    tensors: Sequence[torch.Tensor],
    q: float = 0.99,
    *,
    impl: str | None = None,
    exact: bool = False,
    return_nonfinite: bool = False,
) -> torch.Tensor | AbsQuantile:
    """The q-quantile of |x| over the finite elements of each tensor: float32 ``[len(tensors)]``.

    Definition: the value of rank ``ceil(q * n)`` (1-based) of the sorted finite |x| of a tensor,
    ``n`` its count of finite elements, ``q`` a Python number in (0, 1]; 0 for a tensor with no
    finite element. NaN and ±Inf are excluded; ``return_nonfinite=True`` returns
    ``AbsQuantile(value, nonfinite)`` with their int64 counts.

    ``impl``: ``"torch"`` (the exact reference, :func:`abs_quantile_reference`), ``"triton"``
    (sample, bracket and compact, then a radix select on the float's bits, see
    :mod:`trimtab.kernels.quantile`: one launch per pass for all tensors, no host sync), or
    ``None`` (Triton for CUDA tensors). Both return the exact value; ``exact`` is accepted for
    compatibility and changes nothing (the kernel used to round float32 answers down by up to
    ``2**-15`` unless asked). Float64 tensors always go through the reference. Non-contiguous
    tensors, and every tensor of a list mixing float16/bfloat16/float32, are copied (to
    float32 when mixed) before the kernel reads them.
    """
    tensors = list(tensors)
    _check(tensors, q)
    q = float(q)
    # Float64 tensors are outside the kernel's op: the reference answers them, whatever impl.
    fast = [i for i, t in enumerate(tensors) if t.dtype in KERNEL_DTYPES]
    if resolve_impl(impl, [tensors[i] for i in fast]) == "torch" or not fast:
        values, nonfinite = abs_quantiles_reference(tensors, q)
    elif len(fast) == len(tensors):
        values, nonfinite = _kernel(tensors, q, exact)
    else:
        # float64 tensors among others: reference for them, kernel for the rest, in order.
        kv, kc = _kernel([tensors[i] for i in fast], q, exact)
        pairs = [(kv[j], kc[j]) for j in range(len(fast))]
        pairs = [
            pairs.pop(0) if i in fast else abs_quantile_reference(t, q)
            for i, t in enumerate(tensors)
        ]
        values = torch.stack([v for v, _ in pairs])
        nonfinite = torch.stack([c for _, c in pairs])
    return AbsQuantile(values, nonfinite) if return_nonfinite else values


def abs_quantile(
    x: torch.Tensor,
    q: float = 0.99,
    *,
    impl: str | None = None,
    exact: bool = False,
    return_nonfinite: bool = False,
) -> torch.Tensor | AbsQuantile:
    """The q-quantile of |x| over the finite elements of ``x``, a 0-dim float32 device tensor.

    Same definition, options and precision as :func:`abs_quantiles` (of which this is the
    one-tensor case).
    """
    result = abs_quantiles([x], q, impl=impl, exact=exact, return_nonfinite=True)
    value, nonfinite = result.value[0], result.nonfinite[0]
    return AbsQuantile(value, nonfinite) if return_nonfinite else value
