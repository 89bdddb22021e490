"""Adaptive gradient-norm clipping: the bound is a high quantile of recent norms, folded by the
adaptive EMA and anchored so that a run of large norms cannot ratchet it up; no host sync.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from trimtab._cadence import Cadence
from trimtab._headroom import check_headroom
from trimtab._impl import resolve_impl
from trimtab.clamp import scale_finite_
from trimtab.engagement import EngagementCorrection
from trimtab.estimate import AdaptiveEMA
from trimtab.lifecycle import register
from trimtab.quantile import abs_quantiles
from trimtab.state import LayoutMismatchError, Slot, StateVector

__all__ = ["CLIP_BOUND_FLOOR", "NORM_EPS", "AdaptiveGradClip"]

#: Cold-start floor of the norm bound (design invariant 3): the smallest normal float32, so a
#: bound measured on all-zero gradients stays positive. Numerical only.
CLIP_BOUND_FLOOR = torch.finfo(torch.float32).tiny
#: Added to the norm in ``bound / (norm + eps)``, as ``torch.nn.utils.clip_grad_norm_`` does.
NORM_EPS = 1e-6

ParamsOrGroups = Iterable[torch.Tensor] | Iterable[Iterable[torch.Tensor]]


class AdaptiveGradClip:
    r"""Clip the gradient norm (global, or per group) at a bound measured from past norms.

    Per step, with ``n_t`` the norm of the finite gradient tensors and ``b_t`` the bound:

    1. **Sanitise.** A gradient tensor holding any NaN or ±Inf is zeroed as a whole (its finite
       elements came out of the same broken backward): the per-tensor norms that the clip
       computes anyway tell which ones, and its clip coefficient is set to 0; the scaling pass,
       :func:`trimtab.clamp.scale_finite_` (one launch for every tensor on the GPU), replaces
       the NaN/±Inf themselves. :attr:`nonfinite` counts ``[tensors, elements]`` zeroed for
       that reason.
    2. **Clip.** Every gradient is multiplied by ``min(1, h b_t / (n_t + ε))``: a coefficient,
       never a host-side branch (``torch.nn.utils.clip_grad_norm_``'s rule), ``h >= 1`` the
       ``headroom`` (1, the default: at the bound itself, so the clip binds on about ``1 - q``
       of steps by construction; ``h > 1``: on excursions only). Unset bound (the first step
       after construction or reset): no clip.
    3. **Measure.** The norm enters a window of the last ``window`` steps, negated where
       ``n_t > b_t`` (the window's engagement flag, whatever ``h`` is; the quantile reads
       magnitudes). The window's ``q``-quantile (:func:`trimtab.abs_quantiles`, an exact order
       statistic) is folded into an :class:`~trimtab.AdaptiveEMA` on a log scale (scale-free,
       and positive whatever the filter extrapolates after a tenfold drop; a zero norm is no
       observation). The new bound is that estimate, at most ``b_t`` (the anchoring below),
       raised where the engagement test finds ``b_t`` stale. :attr:`engaged` counts the steps
       the clip bound (above ``h b_t``).

    **Anchoring.** An EMA of raw norms ratchets: a run of large norms raises the bound, which
    lets larger updates through, which grow the weights and the next norms (the failure that
    AutoClip, Seetharaman et al. 2020, avoids with a percentile of the whole history, and ZClip,
    2025, with z-scores whose EMA is fed the *clipped* norm). Here the bound may fall with the
    estimate but never rise above the bound in force by itself: elevated norms cannot lift it.
    Growth must instead pass the :class:`~trimtab.EngagementCorrection` test: a clip at the
    ``q``-quantile should engage on ``1 - q`` of steps. The test is fed the window's count,
    ``k`` of its ``n`` steps above their bound (``n = window`` once full), a
    Binomial(``n``, ``1 - q``) count while the bound is right; only when the smoothed rate is
    significantly above ``1 - q`` (at :data:`~trimtab.engagement.FALSE_ALARM_PROB`; for
    ``q = 0.99`` and a full window of 1000, above about 2%) is the bound raised toward the
    window's quantile, by the fraction ``(f - p) / f`` derived there. A sustained change of
    scale is therefore followed within tens of steps; a burst on at most ``1 - q`` of the
    window is not (past about 2% it is, by the quantile's definition, the new quantile); and
    the bound never exceeds the largest norm actually seen.

    The former rule clipped 5-18% of CartPole's steps, not 1%
    (docs: guides/stability.md#where-a-clamp-binds; ``tests/test_clip.py`` has both of its
    failures). Fed one 0/1 flag a step, the test's
    estimator took a rare isolated 1 for an outlier (it read a clip rate of 15% as 1%), and a
    raise went toward one step's norm, not a tail's. Folding the anchored quantile, which sits
    at ``b_t`` whenever it is held, gave the estimator a constant input whose noise it measured
    as zero, so it then rejected a raise. On log-normal norms the clip now binds on 1.0-1.2% of
    steps at a stationary scale (was 13-85%) and 3% through a steady tenfold rise (was 31-100%).

    **Cadence.** ``measure_every = k``: the window takes every step's norm and the clip binds
    on every step, but the window's quantile, the test and the fold (step 3 after the window)
    run on steps ``0, k, 2k, ...`` since the last reset only (a host count); in between the
    bound stays as it is. A captured CUDA graph replays one step: capture with ``k = 1``.

    The bound lives in slot ``{prefix}_bound`` (one value per group) of a
    :class:`~trimtab.StateVector`, its own or one passed in. Registers :meth:`reset` with the
    active :class:`~trimtab.Lifecycle`. Nothing is read back to the host on a GPU (on the CPU,
    where a read waits for nothing, one says whether any gradient needs its non-finite elements
    replaced).

    Example::

        clip = trimtab.AdaptiveGradClip(model.parameters())
        loss.backward()
        norm = clip()          # like torch.nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
    """

    def __init__(
        self,
        params_or_groups: ParamsOrGroups,
        *,
        quantile: float = 0.99,
        window: int = 1000,
        per_group: bool = False,
        state_vector: StateVector | None = None,
        prefix: str = "grad_clip",
        headroom: float = 1.0,
        measure_every: int = 1,
    ) -> None:
        groups = self._as_groups(params_or_groups)
        headroom = check_headroom(headroom, "headroom", "clip")
        if isinstance(quantile, bool) or not isinstance(quantile, float) or not 0 < quantile < 1:
            raise ValueError(f"quantile must be a float in (0, 1), got {quantile!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.groups = groups
        self.per_group = per_group
        self.quantile = quantile
        self.headroom = headroom
        self.window = window
        self.prefix = prefix
        #: which steps refit the bound (each call counts one)
        self.cadence = Cadence(measure_every, f"AdaptiveGradClip({prefix!r})")
        params = [p for g in groups for p in g]
        if not params:
            raise ValueError("AdaptiveGradClip got an empty parameter list")
        self.device = params[0].device
        if any(p.device != self.device for p in params):
            raise ValueError("all parameters must be on one device")
        self.num_bounds = len(groups) if per_group else 1
        slot = Slot(f"{prefix}_bound", size=self.num_bounds, doc="gradient-norm clip bound")
        if state_vector is None:
            state_vector = StateVector([slot], device=self.device)
        elif slot.name not in state_vector or state_vector.index(slot.name)[1] != slot.size:
            raise LayoutMismatchError(
                f"state_vector needs a slot {slot.name!r} of size {slot.size}; include "
                f"Slot({slot.name!r}, size={slot.size}) in its layout"
            )
        self.state_vector = state_vector
        self._ema = AdaptiveEMA(self.num_bounds, device=self.device)
        self.engagement = EngagementCorrection(
            self.num_bounds, expected_rate=1.0 - quantile, device=self.device, name=f"{prefix}"
        )
        self._history = torch.full((self.num_bounds, window), math.nan, device=self.device)
        self._count = torch.zeros((), dtype=torch.int64, device=self.device)
        #: ``[tensors, elements]`` of gradient that held NaN or ±Inf, zeroed (int64, device).
        self.nonfinite = torch.zeros(2, dtype=torch.int64, device=self.device)
        #: Steps on which each bound clipped (the norm above headroom x the bound; int64
        #: [num_bounds], on the device).
        self.engaged = torch.zeros(self.num_bounds, dtype=torch.int64, device=self.device)
        # [clipped per bound..., steps] at the last engaged_rate() (zero after a reset, as the
        # counts are)
        self._logged = torch.zeros(self.num_bounds + 1, dtype=torch.int64, device=self.device)
        self._group_index: dict[tuple[int, ...], torch.Tensor] = {}
        #: Sharded gradients (:meth:`trimtab.distributed.RankConsistent.attach_clip`): sums the
        #: squared group norms over the ranks in place, before the coefficient; None alone.
        self.reduce_hook: Callable[[torch.Tensor], None] | None = None
        register(self, "reset", name=f"clip[{prefix}]", what="forget norm history and bound")

    @staticmethod
    def _as_groups(params_or_groups: Any) -> list[list[torch.Tensor]]:
        if isinstance(params_or_groups, torch.Tensor):
            return [[params_or_groups]]
        items = list(params_or_groups)
        if items and all(isinstance(x, dict) for x in items):  # optimizer-style param groups
            return [list(x["params"]) for x in items]
        if items and all(isinstance(x, torch.Tensor) for x in items):
            return [items]
        if all(not isinstance(x, torch.Tensor) for x in items):
            return [list(g) for g in items]
        raise TypeError("pass tensors, or groups of tensors (lists or optimizer param groups)")

    @property
    def bound(self) -> torch.Tensor:
        """The bound slot as consumers read it (NaN while unset)."""
        return self.state_vector.view(f"{self.prefix}_bound").reshape(-1)

    def reset(self) -> None:
        """Forget history, bound and counts (a fold boundary); in place."""
        self._ema.reset()
        self.engagement.reset()
        self._history.fill_(math.nan)
        self._count.zero_()
        self.bound.fill_(math.nan)
        self.nonfinite.zero_()
        self.engaged.zero_()
        self._logged.zero_()
        self.cadence.reset()

    def _counts(self) -> torch.Tensor:
        return torch.cat([self.engaged, self._count.reshape(1)])

    def engaged_rate(self) -> torch.Tensor:
        """Per bound, the fraction of steps since the last call (or the last reset) on which the
        clip bound (float64 ``[num_bounds]``, on the device: no host read; NaN with no step)."""
        now = self._counts()
        since = (now - self._logged).double()
        self._logged.copy_(now)
        return since[:-1] / since[-1]

    @torch.no_grad()
    def __call__(
        self, params: Iterable[torch.Tensor] | None = None, *, impl: str | None = None
    ) -> torch.Tensor:
        """Sanitise and clip the gradients; returns the total norm of the finite gradients
        before clipping (a 0-dim device tensor, as ``clip_grad_norm_``). ``params`` defaults
        to the parameters given at construction (then grouped as given).

        ``impl``: ``None`` runs the step after the norms as one Triton launch
        (:mod:`trimtab.kernels.clip`) and the scaling as another on CUDA, the pure-PyTorch
        reference elsewhere; ``"torch"``/``"triton"`` force one."""
        if params is None:
            pairs = [(gi, p) for gi, g in enumerate(self.groups) for p in g]
        else:
            pairs = [(0, p) for p in params]
        pairs = [(gi if self.per_group else 0, p) for gi, p in pairs if p.grad is not None]
        if not pairs:
            return torch.zeros((), device=self.device)
        grads = [p.grad for _, p in pairs]
        norms = torch.stack(torch._foreach_norm(grads)).float()
        key = tuple(gi for gi, _ in pairs)
        index = self._group_index.get(key)
        if index is None:
            index = torch.tensor(key, dtype=torch.int64).to(self.device)
            self._group_index[key] = index
        step_impl = impl
        if self.reduce_hook is not None:  # the reduction sits in the torch step only
            if impl == "triton":
                raise ValueError(
                    "impl='triton' cannot reduce sharded norms over ranks; pass impl=None"
                )
            step_impl = "torch"
        refit = self.cadence.take()
        if not refit:  # the window takes the norm; the bound stays until the next refit
            scale, total = self._record_reference(norms, index)
        elif self._impl(step_impl, norms, len(grads)) == "triton":
            from trimtab.kernels.clip import clip_step_triton

            scale = torch.empty_like(norms)
            total = torch.empty((), device=self.device)
            eng, frac = self.engagement, self.engagement._fraction
            clip_step_triton(
                norms, index, scale, total,
                bound=self.bound, history=self._history, count=self._count,
                nonfinite=self.nonfinite, engaged=self.engaged,
                fraction=frac._kernel_state(), engagement=eng._kernel_state(),
                bound_ema=self._ema._kernel_state(),
                q_level=self._ema._q_level, q_slope=self._ema._q_slope,
                quantile=self.quantile, expected_rate=eng.expected_rate,
                z_threshold=eng.z_threshold, floor=CLIP_BOUND_FLOOR, eps=NORM_EPS,
                headroom=self.headroom,
            )  # fmt: skip
        else:
            scale, total = self._step_reference(norms, index)
        # NaN * 0 is NaN: the non-finite elements themselves are replaced (and counted) too. On
        # the CPU a host read waits for nothing: every norm finite, every element is (a NaN or
        # ±Inf makes its tensor's norm NaN or Inf), and there is nothing to replace or count.
        finite = norms.device.type == "cpu" and bool(norms.isfinite().all())
        scale_finite_(grads, scale, self.nonfinite[1:], impl=impl, known_finite=finite)
        return total

    def _impl(self, impl: str | None, norms: torch.Tensor, num_tensors: int) -> str:
        def fits() -> bool:  # the kernel's limits live with it, imported once CUDA is in play
            from trimtab.kernels import clip as kernel

            return kernel.fits(self.window, num_tensors)

        return resolve_impl(
            impl,
            [norms],
            fits=fits,
            why=lambda: (
                f"AdaptiveGradClip: the kernel runs a window of at most 4096 norms over at "
                f"most 4096 tensors, got window={self.window}, {num_tensors} tensors"
            ),
        )

    def _step_reference(
        self, norms: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step after the per-tensor norms (the kernel's reference): returns the per-tensor
        scale (0 for a non-finite tensor) and the total norm of the finite ones."""
        scale, total = self._record_reference(norms, index)
        self._refit_reference()
        return scale, total

    def _in_force(self) -> torch.Tensor:
        """The bound in force: the slot, floored; +Inf (no clip) while unset."""
        floor = torch.full((), CLIP_BOUND_FLOOR, device=self.device)
        slot = self.bound
        return torch.where(torch.isnan(slot), math.inf, torch.fmax(slot, floor))

    def _record_reference(
        self, norms: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every step's part: the group norms, the clip's coefficients, the engaged count and
        the window's new entry (negated above the bound in force). Returns as
        :meth:`_step_reference`."""
        finite = torch.isfinite(norms)
        self.nonfinite[0].add_((~finite).sum())
        sq = torch.where(finite, norms, 0.0).square()
        group_norm = torch.zeros(self.num_bounds, device=self.device).index_add_(0, index, sq)
        if self.reduce_hook is not None:  # each rank holds a shard: the norm of the whole
            self.reduce_hook(group_norm)
            total = group_norm.sum().sqrt()
        else:
            total = sq.sum().sqrt()
        group_norm = group_norm.sqrt()

        bound = self._in_force()
        clip_at = bound if self.headroom == 1.0 else bound * self.headroom
        coef = (clip_at / (group_norm + NORM_EPS)).clamp(max=1.0)
        per_tensor = torch.where(finite, coef[index], 0.0)

        engaged = group_norm > bound  # the test's exceedance: the norm above the bound
        clipped = engaged if self.headroom == 1.0 else group_norm > clip_at
        self.engaged.add_(clipped.to(torch.int64))
        # The window holds the norms, negated where they exceeded the bound in force.
        newest = torch.where(engaged, -group_norm, group_norm)
        position = (self._count % self.window).reshape(1, 1).expand(self.num_bounds, 1)
        self._history.scatter_(1, position, newest[:, None])
        self._count.add_(1)
        return per_tensor, total

    def _refit_reference(self) -> None:
        """A due step's part: the window's quantile and engagement count, the test and the
        fold; the new bound into the slot."""
        bound = self._in_force()
        magnitude = self._history.abs()
        seen = magnitude.isfinite()
        # The engagement test on the window's count (k of its n steps exceeded their bound);
        # a raise goes toward the window's quantile.
        k = (seen & (self._history < 0)).sum(1)
        quantile = abs_quantiles(list(self._history.unbind()), self.quantile, impl="torch")
        self.engagement.observe(k, seen.sum(1), quantile, impl="torch")
        estimate = self._ema.update_log(quantile, impl="torch")
        self.bound.copy_(self.engagement.correct(torch.minimum(estimate, bound)))

    def state_dict(self) -> dict[str, Any]:
        return {
            "state_vector": self.state_vector.state_dict(),
            "ema": self._ema.state_dict(),
            "engagement": self.engagement.state_dict(),
            "history": self._history.clone(),
            "count": self._count.clone(),
            "nonfinite": self.nonfinite.clone(),
            "engaged": self.engaged.clone(),
            "logged": self._logged.clone(),
            "cadence": self.cadence.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["history"].shape) != tuple(self._history.shape):
            raise ValueError(
                f"clip history has shape {tuple(state['history'].shape)}, this clip "
                f"{tuple(self._history.shape)} (window, per_group must match the saved run)"
            )
        self.state_vector.load_state_dict(state["state_vector"])
        self._ema.load_state_dict(state["ema"])
        self.engagement.load_state_dict(state["engagement"])
        self._history.copy_(state["history"])
        self._count.copy_(state["count"])
        self.nonfinite.copy_(state["nonfinite"])
        self.engaged.copy_(state["engaged"])
        # a checkpoint from before engaged_rate(): its next interval starts at the load
        self._logged.copy_(state["logged"] if "logged" in state else self._counts())
        self.cadence.load(state.get("cadence"))
