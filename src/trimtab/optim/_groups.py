"""The parameter groups of :class:`trimtab.optim.Adam` as ``torch.optim.Optimizer`` holds them:
a group's validation, and the base class's methods without their dynamo wrapper."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def undecorated(method: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.optim.Optimizer``'s ``method`` without its ``torch._disable_dynamo`` wrapper: the
    same function, minus the wrapper's first-call ``import torch._dynamo`` (1.6 s on a CPU,
    about 5 s on the H200 host: half a default GPU run's start-up), which only matters when
    torch.compile traces the call, and this optimizer is not traced (its step reads no
    ``torch._dynamo``); the method itself where no wrapper is there."""
    return getattr(method, "__wrapped__", method)


def check_group(group: Mapping[str, Any]) -> None:
    """Refuse a group's invalid lr, eps, betas, weight_decay, flags or amsgrad, naming it."""
    lr = group["lr"]
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError("a tensor lr must have one element")
    elif not lr >= 0.0:
        raise ValueError(f"invalid learning rate {lr!r}: it must be >= 0")
    if not group["eps"] >= 0.0:
        raise ValueError(f"invalid eps {group['eps']!r}: it must be >= 0")
    betas = group["betas"]
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"invalid betas {betas!r}: both must be in [0, 1)")
    wd = group["weight_decay"]
    if wd != "auto" and (isinstance(wd, (bool, str)) or not isinstance(wd, (int, float))):
        raise ValueError(f"weight_decay must be 'auto' or a number >= 0, got {wd!r}")
    if wd != "auto" and wd < 0:
        raise ValueError(f"invalid weight_decay {wd!r}: it must be >= 0 (or 'auto')")
    for key in ("weight_clamp", "l1", "capturable"):
        if not isinstance(group[key], bool):
            raise TypeError(f"{key} must be a bool, got {group[key]!r}")
    if group.get("amsgrad", False):
        raise ValueError(
            "amsgrad is not supported by trimtab.optim.Adam (its max of second moments defeats "
            "the moment statistics); use torch.optim.AdamW(amsgrad=True), or leave it False"
        )
