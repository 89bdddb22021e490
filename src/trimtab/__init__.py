"""trimtab: measured, not hand-set, stability bounds for deep Q-learning on non-stationary data.

Importing this package imports nothing heavy: ``trimtab --help`` answers without torch, Triton
loads on a first kernel use on a CUDA tensor, and the trainer's dependencies (pandas, Ray) come
only with ``trimtab.rl``. Public names load from their modules on first access; type checkers
and IDEs read the same names from the ``TYPE_CHECKING`` imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, typed, for type checkers and IDEs
    from trimtab import optim
    from trimtab._impl import KernelFallbackWarning
    from trimtab.bounds import AdaptiveBounds, BoundClamp
    from trimtab.clamp import clamp_finite_, guard_
    from trimtab.clip import AdaptiveGradClip
    from trimtab.engagement import EngagementCorrection
    from trimtab.estimate import AdaptiveEMA
    from trimtab.guard import Guard, GuardParts
    from trimtab.lifecycle import Lifecycle
    from trimtab.nonfinite import NonFinitePolicy
    from trimtab.quantile import abs_quantile, abs_quantiles
    from trimtab.sentinel import NonFiniteError, Rule, Sentinel
    from trimtab.state import LayoutMismatchError, Slot, StateVector

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Guard": "trimtab.guard",
    "GuardParts": "trimtab.guard",
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
    "KernelFallbackWarning": "trimtab._impl",
}

#: a literal list, so that type checkers read it (a test holds it to ``_EXPORTS``)
__all__ = [
    "AdaptiveBounds",
    "AdaptiveEMA",
    "AdaptiveGradClip",
    "BoundClamp",
    "EngagementCorrection",
    "Guard",
    "GuardParts",
    "KernelFallbackWarning",
    "LayoutMismatchError",
    "Lifecycle",
    "NonFiniteError",
    "NonFinitePolicy",
    "Rule",
    "Sentinel",
    "Slot",
    "StateVector",
    "__version__",
    "abs_quantile",
    "abs_quantiles",
    "clamp_finite_",
    "guard_",
    "optim",
]


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
