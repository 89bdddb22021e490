"""The optimizer step's finalize in torch: reduce the step's workspace, take the quantiles and
fold the statistics into the slots. The CPU path of :class:`trimtab.optim.Adam`, and the oracle
of the finalize kernel (:mod:`trimtab.kernels.optim_finalize`), as a mixin of the optimizer.
"""

from __future__ import annotations

import math

import torch

from trimtab.kernels import optim_layout as lay
from trimtab.optim import _reference as ref
from trimtab.optim._slots import NORM_EPS, SLOT_NAMES


class ReferenceFinalize:
    """The torch finalize of :class:`trimtab.optim.Adam` (it reads the optimizer's workspace,
    estimator, engagement test and slots)."""

    def _finalize_reference(
        self, observed: list[bool], steps: list[torch.Tensor], skip: torch.Tensor | None
    ) -> None:
        """The finalize in torch (the CPU path, and the finalize kernel's oracle): reduce the
        workspace, take the quantiles, fold, step the counters, clear; the sampling phase
        steps with the statistics (a step without them leaves it, and the cleared workspace)."""
        keep = None if skip is None else skip == 0
        stats = any(observed)
        if stats:
            q, nxt = lay.window_quantiles_reference(self._ints, self._sel, self.quantile)
            parts = lay.parts_reference(self._parts)
            s = torch.cat([parts[:, :8], q, self._deficit[:, None], parts[:, 8:]], dim=1)
            l1_coef = torch.fmax(self._slot("l1"), torch.zeros((), device=self.device))
            self._fold(s, observed, l1_coef, keep)
            self._sel.copy_(nxt if keep is None else torch.where(keep, nxt, self._sel))
            self._ints.zero_()
            self._parts.zero_()
            self._deficit.fill_(math.nan)
        if keep is None:
            torch._foreach_add_(steps, 1.0)
        else:
            inc = keep.float()
            torch._foreach_add_(steps, [inc.to(s.device) for s in steps])
        if stats:
            self._phase.add_(1 if keep is None else keep.int())
            self._phase.remainder_(lay.PHASE_PERIOD)

    def _fold(
        self,
        s: torch.Tensor,
        observed: list[bool],
        l1_coef: torch.Tensor,
        keep: torch.Tensor | None = None,
    ) -> None:
        """Turn one step's statistics ``[G, NUM_STATS]`` into observations and fold them;
        ``l1_coef`` is the L1 threshold per unit lr each group used in the step; ``keep``
        (0-dim bool, False: a skipped step) masks every observation and slot write."""
        groups = self.param_groups
        seen = self._const("observed", observed, torch.bool)
        if keep is not None:
            seen = seen & keep
        clamp = seen & self._const("clamp", [g["weight_clamp"] for g in groups], torch.bool)
        auto = seen & self._const("auto", [g["weight_decay"] == "auto" for g in groups], torch.bool)
        l1 = seen & self._const("l1on", [g["l1"] for g in groups], torch.bool)
        lr = self._lr_vector()
        count = s[:, ref.COUNT]
        # Net of L1's own shrink of ‖w‖² (2ηλ₁Σ|w| per step): decay adds only what L1 lacks.
        decay_obs = (
            -s[:, ref.SUM_WU] + 0.5 * lr * s[:, ref.SUM_UU] - l1_coef * s[:, ref.SUM_L1_W]
        ) / s[:, ref.SUM_WW].clamp(min=NORM_EPS)
        l1_obs = s[:, ref.DEFICIT] * s[:, ref.SUM_ABS_U] / count  # 0/0 -> NaN: ignored
        # the reference fold: torch throughout (the finalize kernel is what runs on the GPU)
        self.engagement.observe(s[:, ref.ENGAGED], count, s[:, ref.MAX_W], mask=clamp, impl="torch")
        bound_obs = self.engagement.correct(s[:, ref.Q_W])
        growth_obs = (s[:, ref.SUM_GG] / s[:, ref.SUM_VHAT]).log()  # 0/0, log 0: ignored
        obs = torch.stack(
            [bound_obs, decay_obs, l1_obs, s[:, ref.Q_W], s[:, ref.Q_M], s[:, ref.Q_V], growth_obs]
        ).float()
        mask = torch.stack([clamp, auto, l1, seen, seen, seen, seen])
        # Magnitudes (the bound and the three quantiles) are folded as logarithms: their noise
        # is multiplicative, and exp(estimate) is positive whatever the filter extrapolates. A
        # zero magnitude (all-zero weights, a zero second moment) is no observation.
        log_kind = self._const(
            "log_kind", [True, False, False, True, True, True, False], torch.bool
        )
        obs = torch.where(log_kind[:, None], obs.log(), obs)
        # Decay applies while the gradient scale was significantly rising at the last step.
        runaway = self._slot("grad_growth") > 0.0
        mask = mask & ~(log_kind[:, None] & (obs == -math.inf))
        z = self.engagement.z_threshold
        est = self._ema.update(obs.reshape(-1), mask.reshape(-1), impl="torch")
        est = est.view(len(SLOT_NAMES), -1)
        se = self._ema.std_error.view(len(SLOT_NAMES), -1)
        value = torch.where(log_kind[:, None], est.exp(), est)
        # Decay acts on the lower confidence bound of the outward push, and never removes more
        # than the whole weight in one step (lr * decay <= 1); see the class docs.
        lcb = (est[1] - z * se[1]).clamp(min=0.0)
        value[1] = torch.where(runaway, torch.minimum(lcb, 1.0 / lr), 0.0)
        value[6] = est[6] - z * se[6]
        for i, name in enumerate(SLOT_NAMES):
            slot = self._slot(name)
            slot.copy_(value[i] if keep is None else torch.where(keep, value[i], slot))
