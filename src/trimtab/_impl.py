"""Choosing between the pure-PyTorch reference and a Triton kernel.

Every op with a kernel has one public entry taking ``impl``; that entry calls
:func:`resolve_impl` once, with the op's own condition for its kernel (``fits``), and nothing else
decides. ``None`` picks the kernel for CUDA tensors and warns once (:class:`KernelFallbackWarning`)
where it cannot run them; an explicit ``"triton"`` that cannot run raises.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from collections.abc import Callable, Iterable

import torch

IMPLS = ("torch", "triton")
__all__ = [
    "IMPLS",
    "KernelFallbackWarning",
    "interpreter_enabled",
    "resolve_impl",
    "triton_available",
]


class KernelFallbackWarning(UserWarning):
    """An op on CUDA tensors ran its PyTorch reference because its Triton kernel cannot run
    those arguments (a strided tensor, another dtype, sizes past the kernel's limits) or Triton
    is not installed: the same values, from several kernel launches instead of one. Warned once
    per cause and process; pass ``impl="torch"`` to the op to choose the reference (and silence
    it), or filter the category."""


_warned: set[str] = set()


def _fallback(why: str) -> None:
    """Warn, once per ``why``, that an op on CUDA runs its reference."""
    if why in _warned:
        return
    _warned.add(why)
    warnings.warn(
        f"{why}: running the PyTorch reference on CUDA instead of the Triton kernel (the same "
        "values, more kernel launches); pass impl='torch' to choose the reference and silence "
        "this warning",
        KernelFallbackWarning,
        stacklevel=4,  # the op's caller: _fallback <- resolve_impl <- the op's entry <- caller
    )


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """True when Triton kernels run on the CPU through ``TRITON_INTERPRET=1``."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_impl(
    impl: str | None,
    tensors: Iterable[torch.Tensor],
    *,
    fits: bool | Callable[[], bool] = True,
    why: str | Callable[[], str] = "",
) -> str:
    """Return ``"torch"`` or ``"triton"`` for an op over ``tensors``: the one rule.

    ``fits`` is the op's own condition for its kernel (dtypes, layout, sizes), a bool or a
    callable evaluated only once Triton is otherwise chosen (so it may import the kernel module).
    ``why`` says why the kernel does not fit (a string, or a callable evaluated only then).
    ``None``: Triton when Triton is installed, every tensor is on CUDA and the kernel fits;
    the reference for tensors elsewhere, silently, and for CUDA tensors the kernel cannot run
    (or without Triton) with a :class:`KernelFallbackWarning` once per cause. ``"triton"``:
    raises ``RuntimeError`` if Triton is missing or if a tensor is not on CUDA and the
    interpreter (``TRITON_INTERPRET=1``) is off, and ``ValueError`` naming ``why`` if the kernel
    does not fit.
    """
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be None, 'torch' or 'triton', got {impl!r}")
    if impl == "torch":
        return "torch"
    devices = {t.device.type for t in tensors}
    if impl is None:
        if devices != {"cuda"}:
            return "torch"
        if not triton_available():
            _fallback("Triton is not installed (pip install triton)")
            return "torch"
        if fits() if callable(fits) else fits:
            return "triton"
        _fallback((why() if callable(why) else why) or "the kernel cannot run these arguments")
        return "torch"
    if not triton_available():
        raise RuntimeError(
            "impl='triton' was asked for but Triton is not installed; "
            "`pip install triton`, or pass impl=None to use the PyTorch reference"
        )
    if devices - {"cuda"} and not interpreter_enabled():
        raise RuntimeError(
            f"impl='triton' needs CUDA tensors, got tensors on {sorted(devices)}; move them to "
            "CUDA, set TRITON_INTERPRET=1 to run the kernel on the CPU, or pass impl=None"
        )
    if not (fits() if callable(fits) else fits):
        reason = (why() if callable(why) else why) or "the kernel cannot run these arguments"
        raise ValueError(f"impl='triton': {reason}; pass impl=None (the kernel where it runs)")
    return "triton"
