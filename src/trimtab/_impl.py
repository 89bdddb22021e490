"""Choosing between the pure-PyTorch reference and a Triton kernel.

Every op with a kernel has one public entry taking ``impl``; only that entry calls
:func:`resolve_impl`. ``None`` picks silently, an explicit ``"triton"`` that cannot run raises.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterable

import torch

IMPLS = ("torch", "triton")


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """True when Triton kernels run on the CPU through ``TRITON_INTERPRET=1``."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_impl(impl: str | None, tensors: Iterable[torch.Tensor]) -> str:
    """Return ``"torch"`` or ``"triton"`` for an op over ``tensors``.

    ``None``: Triton when every tensor is on CUDA and Triton is installed, else the reference.
    ``"triton"``: raises ``RuntimeError`` if Triton is missing, or if a tensor is not on CUDA
    and the interpreter (``TRITON_INTERPRET=1``) is off.
    """
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be None, 'torch' or 'triton', got {impl!r}")
    if impl == "torch":
        return "torch"
    devices = {t.device.type for t in tensors}
    if impl is None:
        return "triton" if devices == {"cuda"} and triton_available() else "torch"
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
    return "triton"
