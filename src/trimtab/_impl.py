"""Choosing between the pure-PyTorch reference and a Triton kernel.

Every op with a kernel has one public entry taking ``impl``; that entry calls
:func:`resolve_impl` once, with the op's own condition for its kernel (``fits``), and nothing else
decides. ``None`` picks silently, an explicit ``"triton"`` that cannot run raises.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Iterable

import torch

IMPLS = ("torch", "triton")


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
    why: str = "",
) -> str:
    """Return ``"torch"`` or ``"triton"`` for an op over ``tensors``: the one rule.

    ``fits`` is the op's own condition for its kernel (dtypes, layout, sizes), a bool or a
    callable evaluated only once Triton is otherwise chosen (so it may import the kernel module).
    ``None``: Triton when Triton is installed, every tensor is on CUDA and the kernel fits, else
    the reference, silently. ``"triton"``: raises ``RuntimeError`` if Triton is missing or if a
    tensor is not on CUDA and the interpreter (``TRITON_INTERPRET=1``) is off, and
    ``ValueError(why)`` if the kernel does not fit.
    """
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be None, 'torch' or 'triton', got {impl!r}")
    if impl == "torch":
        return "torch"
    devices = {t.device.type for t in tensors}
    if impl is None:
        if devices != {"cuda"} or not triton_available():
            return "torch"
        return "triton" if (fits() if callable(fits) else fits) else "torch"
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
        raise ValueError(why or "impl='triton' cannot run these arguments; pass impl=None")
    return "triton"
