"""Optimizers whose stability bounds are measured: ``trimtab.optim.Adam`` (AdamW with an in-step
weight clamp, adaptive decoupled weight decay and an adaptive L1 proximal step).
"""

from __future__ import annotations

from trimtab.optim.adam import NORM_EPS, SLOT_NAMES, WEIGHT_BOUND_FLOOR, Adam, adam_slots

__all__ = ["NORM_EPS", "SLOT_NAMES", "WEIGHT_BOUND_FLOOR", "Adam", "adam_slots"]
