"""The Triton path of :class:`trimtab.optim.Adam`: one update launch per parameter group, one
finalize launch per step (:mod:`trimtab.kernels.optim`, :mod:`trimtab.kernels.optim_finalize`).
A mixin of ``Adam``: it uses the optimizer's param groups, state vector, estimators and
:meth:`~trimtab.optim.Adam._fold` (the finalize's torch reference)."""

from __future__ import annotations

import math
from typing import Any

import torch

from trimtab import estimate
from trimtab.optim import _reference as ref
from trimtab.optim._slots import NORM_EPS, SLOT_NAMES, WEIGHT_BOUND_FLOOR


class TritonPath:
    """Kernel state and the fused step; ``Adam`` provides every attribute used here."""

    def _init_kernel_state(self, num_groups: int) -> None:
        from trimtab.kernels import optim as kern
        from trimtab.kernels.ema import dof_tables

        dev = self.device
        # Scalar partials, REPLICAS rows per group (see kernels/optim.py): no atomic contention.
        self._parts = torch.zeros(
            num_groups, kern.REPLICAS, kern.PART_WIDTH, dtype=torch.int32, device=dev
        )
        self._ints = torch.zeros(num_groups, kern.INT_WIDTH, dtype=torch.int32, device=dev)
        self._sel = torch.full((num_groups, 3), -1, dtype=torch.int32, device=dev)
        self._phase = torch.zeros(1, dtype=torch.int32, device=dev)
        self._deficit = torch.full((num_groups,), math.nan, device=dev)
        self._slot_views = [
            tuple(self._slot(n)[gi] for n in ("decay", "l1", "weight_bound"))
            for gi in range(num_groups)
        ]
        self._group_cache: dict[Any, Any] = {}
        self._finalize_impl = "triton"  # "torch": the reference finalize, for tests
        # The AdaptiveEMA's dof-dependent thresholds, computed by estimate.py itself (float32,
        # as its update computes them), so the kernel reads the very same numbers.
        self._dof_max, *dof = dof_tables(torch.device(dev))
        self._dof_tables = tuple(dof)
        ema, frac, eng = self._ema._t, self.engagement._fraction._t, self.engagement
        tensors = [
            *(ema[n] for n in kern.EMA_FIELDS + kern.EMA_BANK),
            *(frac[n] for n in kern.EMA_FIELDS + kern.EMA_BANK),
            eng._rate, eng._max, eng._z, eng.engaged_total, eng.seen_total,
            self._ema._q_level, self._ema._q_slope, *self._dof_tables, self.state_vector.tensor,
        ]  # fmt: skip
        assert len(tensors) == kern.TABLE_SIZE
        # Every tensor above is updated in place for the optimizer's life (reset and
        # load_state_dict copy into it), so its pointer is fixed: one table, built once.
        self._finalize_table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
        self._finalize_table = self._finalize_table.to(dev)
        offsets = [self.state_vector.index(f"{self.prefix}_{n}")[0] for n in SLOT_NAMES]
        self._slot_offsets = torch.tensor(offsets, dtype=torch.int32).to(dev)
        p = self.engagement.expected_rate
        self._kconsts = torch.tensor(
            [self.quantile, p, self.engagement.z_threshold], dtype=torch.float64
        ).to(dev)

    def _group_plan(self, gi: int, tensors: tuple[list[torch.Tensor], ...]) -> tuple:
        """Pointer tables, L1 flags and sampling stride of a group's step (cached by the data
        pointers, so a loop over the same buffers builds nothing and copies nothing)."""
        from trimtab.kernels import optim as kern

        params, grads = tensors[0], tensors[1]
        key = (gi, tuple(p.data_ptr() for p in params), tuple(g.data_ptr() for g in grads))
        plan = self._group_cache.get(key)
        if plan is None:
            group = self.param_groups[gi]
            flags = [int(group["l1"] and p.dim() >= 2) for p in params]
            plan = (
                kern.group_tables(*tensors),
                torch.tensor(flags, dtype=torch.int32).to(self.device),
                kern.sample_stride(sum(p.numel() for p in params)),
                [i for i, f in enumerate(flags) if f],
            )
            if len(self._group_cache) > 4 * len(self.param_groups):
                self._group_cache.clear()
            self._group_cache[key] = plan
        return plan

    def _step_triton(self) -> None:
        from trimtab.kernels import optim as kern

        num_groups = len(self.param_groups)
        observed = [False] * num_groups
        all_steps: list[torch.Tensor] = []
        plans: list[int] = []
        for gi, group in enumerate(self.param_groups):
            tensors = self._group_tensors(group)
            if not tensors[0]:
                continue
            lr = group["lr"]
            if isinstance(lr, torch.Tensor):
                raise ValueError(
                    "the Triton path takes a Python float lr; use impl='torch' for a tensor lr"
                )
            tensors = (
                tensors[0],
                [g if g.is_contiguous() else g.contiguous() for g in tensors[1]],
                *tensors[2:],
            )
            plan = self._group_plan(gi, tensors)
            tables, l1_flags, stride, l1_idx = plan
            stats = self._needs_stats(group)
            observed[gi] = stats
            if group["l1"] and stats:
                cols = [ref.feature_axis_sq_norms(tensors[1][i]) for i in l1_idx]
                self._deficit[gi].copy_(ref.entropy_deficit(cols, self.device))
            wd = group["weight_decay"]
            beta1, beta2 = group["betas"]
            kern.adam_group_step_triton(
                tables, l1_flags, self._slot_views[gi],
                self._parts[gi], self._ints[gi], self._sel[gi], self._phase,
                lr=lr, beta1=beta1, beta2=beta2, eps=group["eps"],
                weight_decay=None if wd == "auto" else float(wd),
                stats=stats, l1=group["l1"], clamp=group["weight_clamp"], stride=stride,
                floor=WEIGHT_BOUND_FLOOR,
            )  # fmt: skip
            all_steps.extend(tensors[4])
            plans.append(id(plan))
        if not all_steps:
            return
        if self._finalize_impl == "torch":
            self._finalize_torch(observed, all_steps)
            return
        groups = self.param_groups
        flags = [
            (kern.OBSERVED if observed[i] else 0)
            | (kern.CLAMP if g["weight_clamp"] else 0)
            | (kern.AUTO if g["weight_decay"] == "auto" else 0)
            | (kern.L1 if g["l1"] else 0)
            for i, g in enumerate(groups)
        ]
        kern.finalize_triton(
            self._finalize_table, self._ints, self._parts, self._sel, self._deficit,
            self._lr_vector(), self._const("flags", flags, torch.int32), self._slot_offsets,
            self._kconsts, self._steps_table(tuple(plans), all_steps), self._phase,
            stats=any(observed), num_candidates=self._ema._q_level.numel(),
            meta_rate=estimate.META_RATE, tiny=estimate.TINY, dof_max=self._dof_max,
            norm_eps=NORM_EPS,
        )  # fmt: skip

    def _steps_table(self, plans: tuple[int, ...], steps: list[torch.Tensor]) -> Any:
        """The pointer table of every step counter stepped now, cached with the group plans."""
        from trimtab.kernels._table import pointer_table

        key = ("steps", plans)
        table = self._group_cache.get(key)
        if table is None:
            table = self._group_cache[key] = pointer_table(steps, 1)
        return table

    def _finalize_torch(self, observed: list[bool], steps: list[torch.Tensor]) -> None:
        """The finalize kernel's reference: the same workspace, folded by torch ops."""
        from trimtab.kernels import optim as kern

        if any(observed):
            q, nxt = kern.window_quantiles_reference(self._ints, self._sel, self.quantile)
            parts = kern.parts_reference(self._parts)
            s = torch.cat([parts[:, :8], q, self._deficit[:, None], parts[:, 8:]], dim=1)
            l1_coef = torch.fmax(self._slot("l1"), torch.zeros((), device=self.device))
            self._fold(s, observed, l1_coef)
            self._sel.copy_(nxt)
        self._ints.zero_()
        self._parts.zero_()
        self._deficit.fill_(math.nan)
        torch._foreach_add_(steps, 1.0)
        self._phase.add_(1).remainder_(kern.PHASE_PERIOD)

    def _clear_kernel_state(self) -> None:
        self._sel.fill_(-1)
        self._phase.zero_()
        self._ints.zero_()
        self._parts.zero_()
        self._deficit.fill_(math.nan)
        self._group_cache.clear()
