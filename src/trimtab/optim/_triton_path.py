"""The Triton path of :class:`trimtab.optim.Adam`: the finalize kernel's state table and its
launch (:mod:`trimtab.kernels.optim_finalize`). The update launch per group shares the
reference's signature and is chosen in ``Adam.step``. A mixin of ``Adam``: it uses the
optimizer's param groups, state vector, estimators and workspace."""

from __future__ import annotations

import torch

from trimtab import estimate
from trimtab.kernels import optim_layout as lay
from trimtab.optim._slots import NORM_EPS, SLOT_NAMES


class TritonPath:
    """Finalize state and launch; ``Adam`` provides every attribute used here."""

    def _init_kernel_state(self) -> None:
        from trimtab.kernels.ema import dof_tables
        from trimtab.kernels.optim_finalize import EMA_BANK, EMA_FIELDS, TABLE_LAYOUT

        dev = self.device
        self._finalize_impl = "triton"  # "torch": the reference finalize, for tests
        # The AdaptiveEMA's dof-dependent thresholds, computed by estimate.py itself (float32,
        # as its update computes them), so the kernel reads the very same numbers.
        self._dof_max, dof_c, dof_kappa = dof_tables(torch.device(dev))
        ema, frac, eng = self._ema._t, self.engagement._fraction._t, self.engagement
        named = {
            **{f"slots.{n}": ema[n] for n in EMA_FIELDS + EMA_BANK},
            **{f"engagement.fraction.{n}": frac[n] for n in EMA_FIELDS + EMA_BANK},
            "engagement.rate": eng._rate, "engagement.max": eng._max, "engagement.z": eng._z,
            "engagement.engaged_total": eng.engaged_total,
            "engagement.seen_total": eng.seen_total,
            "q_level": self._ema._q_level, "q_slope": self._ema._q_slope,
            "dof_c": dof_c, "dof_kappa": dof_kappa, "state_vector": self.state_vector.tensor,
        }  # fmt: skip
        # Every tensor above is updated in place for the optimizer's life (reset and
        # load_state_dict copy into it), so its pointer is fixed: one table, built once.
        ptrs = [named[name].data_ptr() for name in TABLE_LAYOUT]
        self._finalize_table = torch.tensor(ptrs, dtype=torch.int64).to(dev)
        offsets = [self.state_vector.index(f"{self.prefix}_{n}")[0] for n in SLOT_NAMES]
        self._slot_offsets = torch.tensor(offsets, dtype=torch.int32).to(dev)
        p = self.engagement.expected_rate
        self._kconsts = torch.tensor(
            [self.quantile, p, self.engagement.z_threshold], dtype=torch.float64
        ).to(dev)

    def _finalize_triton(
        self, observed: list[bool], steps: list[torch.Tensor], skip: torch.Tensor | None
    ) -> None:
        from trimtab.kernels._table import pointer_table
        from trimtab.kernels.optim_finalize import finalize_triton

        flags = [
            (lay.OBSERVED if observed[i] else 0)
            | (lay.CLAMP if g["weight_clamp"] else 0)
            | (lay.AUTO if g["weight_decay"] == "auto" else 0)
            | (lay.L1 if g["l1"] else 0)
            for i, g in enumerate(self.param_groups)
        ]
        finalize_triton(
            self._finalize_table, self._ints, self._parts, self._sel, self._deficit, self._fold_ws,
            self._lr_vector(), self._const("flags", flags, torch.int32), self._slot_offsets,
            self._kconsts, pointer_table(steps, 1), self._phase, skip,
            stats=any(observed), num_candidates=self._ema._q_level.numel(),
            meta_rate=estimate.META_RATE, tiny=estimate.TINY, dof_max=self._dof_max,
            norm_eps=NORM_EPS,
        )  # fmt: skip
