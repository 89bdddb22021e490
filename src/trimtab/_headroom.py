"""The one check of a headroom argument: a consumer that binds at ``h`` times its measured bound
(the gradient clip, Adam's weight clamp, the trainer's clamps) takes ``h >= 1``, finite."""

from __future__ import annotations

import math


def check_headroom(value: object, name: str, what: str) -> float:
    """``value`` as a float when it is a finite number >= 1; else a ValueError that names the
    argument ``name`` and says where ``what`` (the consumer: "clip", "clamp") then binds."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value >= 1.0)
    ):
        raise ValueError(
            f"{name} must be a finite number >= 1 (the {what} binds at {name} x the measured "
            f"bound; 1: at the bound itself, 2: at twice it), got {value!r}"
        )
    return float(value)
