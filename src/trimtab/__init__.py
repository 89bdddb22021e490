"""trimtab: measured, not hand-set, stability bounds for deep Q-learning on non-stationary data.

Importing this package never imports Triton; kernels load on first use on a CUDA tensor.
Public names are loaded lazily from their modules on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Guard": "trimtab.guard",
    "StateVector": "trimtab.state",
    "Slot": "trimtab.state",
    "LayoutMismatchError": "trimtab.state",
    "Lifecycle": "trimtab.lifecycle",
    "AdaptiveEMA": "trimtab.estimate",
    "abs_quantile": "trimtab.quantile",
    "abs_quantiles": "trimtab.quantile",
    "Sentinel": "trimtab.sentinel",
    "NonFiniteError": "trimtab.sentinel",
    "Rule": "trimtab.sentinel",
    "AdaptiveGradClip": "trimtab.clip",
    "AdaptiveBounds": "trimtab.bounds",
    "BoundClamp": "trimtab.bounds",
    "NonFinitePolicy": "trimtab.nonfinite",
    "EngagementCorrection": "trimtab.engagement",
    "optim": "trimtab.optim",
    "clamp_finite_": "trimtab.clamp",
    "guard_": "trimtab.clamp",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trimtab' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module == f"trimtab.{name}" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
