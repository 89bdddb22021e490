"""Checkpoints of :class:`trimtab.optim.Adam`: ``torch.optim.Optimizer``'s state dict with the
optimizer's own state (slots, estimators, quantile windows, sampling phase, cadence) under
``"trimtab"``, and a load that refuses another layout before touching anything. A mixin of
``Adam``: it uses the optimizer's state vector, estimators and workspace."""

from __future__ import annotations

from typing import Any

import torch

from trimtab.optim._groups import check_group, undecorated
from trimtab.state import LayoutMismatchError


class Checkpoints:
    """``state_dict`` and ``load_state_dict``; ``Adam`` provides every attribute used here."""

    def state_dict(self) -> dict[str, Any]:
        sd = undecorated(torch.optim.Optimizer.state_dict)(self)
        sd["trimtab"] = {
            "state_vector": self.state_vector.state_dict(),
            "ema": self._ema.state_dict(),
            "engagement": self.engagement.state_dict(),
            "quantile_bins": self._sel.clone(),
            "sample_phase": self._phase.clone(),
            "cadence": self.cadence.state_dict(),
        }
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop("trimtab", None)
        if extra is None:
            raise LayoutMismatchError(
                "this state dict has no 'trimtab' entry (it was not saved by "
                "trimtab.optim.Adam.state_dict()); load the moments into torch.optim.AdamW, or "
                "start this optimizer fresh"
            )
        # Check the layout before touching anything, so a refused load changes nothing.
        saved = extra["state_vector"]
        if saved.get("fingerprint") != self.state_vector.fingerprint:
            self.state_vector.load_state_dict(saved)  # raises LayoutMismatchError with a diff
        undecorated(torch.optim.Optimizer.load_state_dict)(self, state_dict)
        self.state_vector.load_state_dict(saved)
        self._ema.load_state_dict(extra["ema"])
        self.engagement.load_state_dict(extra["engagement"])
        self._clear_workspace()
        self._check_equal_steps()
        # The window bases and the sampling phase: the quantiles continue as they would have.
        bins = extra.get("quantile_bins")
        if bins is not None and tuple(bins.shape) == tuple(self._sel.shape):
            self._sel.copy_(bins)
        if extra.get("sample_phase") is not None:
            self._phase.copy_(extra["sample_phase"])
        self.cadence.load(extra.get("cadence"))
        for group in self.param_groups:
            check_group(group)

    def _check_equal_steps(self) -> None:
        """After a load: read the counters once (outside any step) to know which groups'
        counters are equal."""
        for gi, group in enumerate(self.param_groups):
            states = [self.state.get(p, {}) for p in group["params"]]
            steps = [s["step"] for s in states if "step" in s]
            if not steps:
                self._equal_steps[gi] = True
            else:
                host = torch.stack([t.reshape(()).float().cpu() for t in steps]).tolist()
                self._equal_steps[gi] = len(steps) == len(states) and len(set(host)) == 1
