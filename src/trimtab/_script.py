"""TorchScript for the CPU's torch references of small-tensor updates: the same aten ops at a
third of the eager interpreter's cost per op, where a step's cost is the op count, not data.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["compiles", "scripted"]

_scripted: dict[Callable[..., Any], Callable[..., Any]] = {}


def compiles(device: torch.device) -> bool:
    """Whether a reference on ``device`` runs as compiled by :func:`scripted`: on the CPU, where
    TorchScript fuses nothing (unless a user turns its CPU fuser on), so it calls the same aten
    kernels on the same tensors as the eager code and the values are the eager ones, bitwise.
    On CUDA it would fuse, and the eager reference is the kernels' oracle there."""
    return device.type == "cpu" and not torch._C._jit_can_fuse_on_cpu()


def scripted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by TorchScript, once per process, and run by its plain interpreter
    (``torch.jit.optimized_execution(False)``: no profiling runs, no re-specialisation per
    input shape, no graph optimisation); ``fn`` itself where this torch has no
    ``torch.jit.script``. A scripted function reads no global number: pass them as arguments
    (defaults)."""
    got = _scripted.get(fn)
    if got is None:
        script = getattr(torch.jit, "script", None)
        if script is None:
            got = fn
        else:
            with warnings.catch_warnings():  # deprecated in favour of torch.compile, which
                warnings.simplefilter("ignore", DeprecationWarning)  # generates new kernels
                compiled = script(fn)

            def got(*args: Any) -> Any:
                with torch.jit.optimized_execution(False):
                    return compiled(*args)

        _scripted[fn] = got
    return got
