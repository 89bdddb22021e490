"""The slots of :class:`trimtab.optim.Adam` and its numerical guards."""

from __future__ import annotations

import torch

#: The optimizer's slots, one value per parameter group each, in this order.
SLOT_NAMES = ("weight_bound", "decay", "l1", "p99_w", "p99_m", "p99_v", "grad_growth")
_SLOT_DOCS = {
    "weight_bound": "clamp bound of |w| per group: log-scale EMA of p99 |w|, raised by engagement",
    "decay": "decoupled weight-decay rate per group: the equilibrium rate's lower confidence bound",
    "l1": "L1 soft threshold per unit lr per group (read as max(slot, 0))",
    "p99_w": "log-scale EMA of the q-quantile of |w| per group (before the clamp)",
    "p99_m": "log-scale EMA of the q-quantile of |Adam first moment| per group",
    "p99_v": "log-scale EMA of the q-quantile of Adam second moment per group",
    "grad_growth": "lower confidence bound of the EMA of log(Σ g² / Σ v̂) per group: > 0 while "
    "the gradient scale is significantly rising (decay applies only then)",
}

#: Cold-start floor of a weight bound (design invariant 3): the smallest normal float32. Only
#: numerical: a p99 of zero is no observation (the slot is folded on a log scale), and the
#: floor keeps a bound that the estimate puts below it positive.
WEIGHT_BOUND_FLOOR = torch.finfo(torch.float32).tiny
#: Guard of ‖w‖² in the decay rate's denominator against all-zero weights (numerical only).
NORM_EPS = 1e-30
