"""Engagement-rate correction: a clamp at a p-quantile bound should cut about 1 - p of what it
sees; a significant, sustained excess means the bound is stale, and it is raised toward the max.

One class serves every consumer (the optimizer's weight clamp, the gradient clip, the trainer's
target and activation clamps): design invariant 5, one implementation per mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from trimtab._impl import resolve_impl
from trimtab._script import compiles, scripted
from trimtab.ema_fold import fold_reference
from trimtab.estimate import AdaptiveEMA, check_mask
from trimtab.kernels.ema_layout import normal_upper_quantile
from trimtab.lifecycle import register

__all__ = ["FALSE_ALARM_PROB", "EngagementCorrection", "normal_upper_quantile"]

#: Probability, per consumer and step, of declaring a fresh bound stale: the significance level
#: of the one-sided binomial test below. A statistical tail probability, not a gain: it fixes the
#: z threshold (about 3.09), and a false alarm costs one small raise that the next observations
#: undo.
FALSE_ALARM_PROB = 1e-3


class EngagementCorrection:
    r"""Detects a stale clamp bound from its engagement counts and raises it toward the max.

    A consumer that clamps at the ``q``-quantile of what it sees should engage on a fraction
    ``p = 1 - q`` (``expected_rate``) of the elements. Each step, consumer ``c`` reports
    ``k_c`` engaged elements out of ``n_c`` and the largest finite magnitude it saw, ``M_c``.

    **Rate.** The engaged fraction ``k_c / n_c`` is smoothed by an :class:`~trimtab.AdaptiveEMA`
    (its rate is chosen from the signal: a one-step burst is smoothed away, a persistent excess
    is tracked), giving :math:`\hat f_c`.

    **Test.** Under the hypothesis that the bound is the true ``q``-quantile, ``k_c`` is
    Binomial(``n_c``, ``p``). The bound is declared stale when

    .. math:: z_c = \frac{\hat f_c - p}{\sqrt{p (1 - p) / n_c}} > z_\alpha,

    ``z_α`` the upper normal quantile of :data:`FALSE_ALARM_PROB`. Using one step's ``n_c`` is
    conservative: the smoothed fraction averages at least one step, so its variance is at most
    the one-step binomial variance. Report counts over many elements, or over a window of
    steps: a consumer that sees one value a step should not report its 0/1 flag, for two
    reasons. The test would fire only once :math:`\hat f` exceeded ``p + z_α \sqrt{p(1-p)}``
    (about 0.32 for ``p = 0.01``), and the fraction's estimator, which takes a rare isolated
    1 for an outlier, reads such a stream low (a 15% rate as about 1%, measured). The
    gradient clip reports its window's count instead.

    **Raise.** A stale bound ``b`` sits at the :math:`1 - \hat f` quantile of the data instead of
    the ``1 - p`` one; the largest value ``M`` sits at quantile 1. Interpolating linearly in rank
    between those two points puts the ``1 - p`` quantile a fraction

    .. math:: r_c = \frac{\hat f_c - p}{\hat f_c} \in (0, 1)

    of the way from ``b`` to ``M``, so :meth:`correct` returns :math:`b + r_c \, (M_c - b)`
    while the test fires, and ``b`` unchanged otherwise. Linear interpolation overestimates the
    quantile of a thin tail, and that is the safe side for a bound that was too tight; it never
    goes past ``M``, and the consumer's estimator (which sees the corrected value as an
    observation) smooths the step. Everything is computed on the device: no host sync.

    Example::

        corr = EngagementCorrection(1, expected_rate=0.01, device="cuda")
        engaged = (x.abs() > bound).sum()
        corr.observe(engaged, x.numel(), x.abs().amax())
        obs = corr.correct(trimtab.abs_quantile(x, 0.99))   # then fold obs into the bound's EMA
    """

    def __init__(
        self,
        num_consumers: int,
        expected_rate: float = 0.01,
        device: torch.device | str | None = None,
        *,
        false_alarm_prob: float = FALSE_ALARM_PROB,
        name: str = "engagement",
    ) -> None:
        if isinstance(num_consumers, bool) or not isinstance(num_consumers, int):
            raise TypeError(f"num_consumers must be an int, got {type(num_consumers).__name__}")
        if num_consumers < 1:
            raise ValueError(f"num_consumers must be >= 1, got {num_consumers}")
        if not isinstance(expected_rate, (int, float)) or not 0.0 < expected_rate < 1.0:
            raise ValueError(
                f"expected_rate must be a number in (0, 1) (1 - the bound's quantile), "
                f"got {expected_rate!r}"
            )
        self.num_consumers = num_consumers
        self.expected_rate = float(expected_rate)
        self.z_threshold = normal_upper_quantile(false_alarm_prob)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._fraction = AdaptiveEMA(num_consumers, device=self.device)
        self._rate = torch.zeros(num_consumers, device=self.device)
        self.device = self._rate.device  # "cuda" becomes "cuda:0", as an input's .device reads
        self._max = torch.full((num_consumers,), math.nan, device=self.device)
        self._z = torch.full((num_consumers,), math.nan, device=self.device)
        self.engaged_total = torch.zeros(num_consumers, dtype=torch.int64, device=self.device)
        self.seen_total = torch.zeros(num_consumers, dtype=torch.int64, device=self.device)
        register(
            self,
            "reset",
            name=f"{name}[{num_consumers}]",
            what="forget engagement rates, raises and totals",
        )

    # --- state ----------------------------------------------------------------------------
    @property
    def fraction(self) -> torch.Tensor:
        """The smoothed engaged fraction per consumer (NaN before the first observation)."""
        return self._fraction.estimate

    @property
    def z(self) -> torch.Tensor:
        """The last binomial z-score per consumer (NaN before the first observation)."""
        return self._z

    @property
    def rate(self) -> torch.Tensor:
        """The raise fraction :meth:`correct` applies now: 0 where the bound is not stale."""
        return self._rate

    @property
    def stale(self) -> torch.Tensor:
        """Bool per consumer: the last test declared the bound stale."""
        return self._rate > 0

    def reset(self) -> None:
        """Forget everything (a fold boundary); tensors are reset in place for CUDA graphs."""
        self._fraction.reset()
        self._rate.zero_()
        self._max.fill_(math.nan)
        self._z.fill_(math.nan)
        self.engaged_total.zero_()
        self.seen_total.zero_()

    def _kernel_state(self) -> list[torch.Tensor]:
        """The state tensors in the kernels' order (``ENG_FIELDS``, see
        :mod:`trimtab.kernels.ema_layout`); the fraction's estimator has its own."""
        return [self._rate, self._max, self._z, self.engaged_total, self.seen_total]

    # --- the step -------------------------------------------------------------------------
    def _as_vector(self, value: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            value = torch.full((), float(value), device=self.device)  # a fill, not a copy
        if value.device != self.device:
            raise ValueError(
                f"engagement inputs must be on {self.device}, got {value.device}; copying here "
                "would hide a host round trip"
            )
        return value.to(dtype).reshape(-1).expand(self.num_consumers)

    @torch.no_grad()
    def observe(
        self,
        engaged: torch.Tensor | int,
        total: torch.Tensor | int,
        observed_max: torch.Tensor | float,
        mask: torch.Tensor | None = None,
        *,
        impl: str | None = None,
    ) -> torch.Tensor:
        """Fold one step's counts: ``engaged`` of ``total`` elements, largest finite magnitude
        ``observed_max`` (each a scalar or ``[num_consumers]``). Consumers with ``total == 0``,
        or off in the optional bool ``mask``, keep their state. Returns :attr:`rate`.

        ``impl``: ``None`` runs one Triton launch (:mod:`trimtab.kernels.ema`) when every input
        is a CUDA tensor, this pure-PyTorch reference otherwise; ``"torch"``/``"triton"`` force
        one (``"triton"`` on the CPU needs ``TRITON_INTERPRET=1``)."""
        inputs = (engaged, total, observed_max)
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        if mask is not None:
            check_mask(mask, self.num_consumers, self.device)
        chosen = resolve_impl(
            impl,
            tensors,
            fits=len(tensors) == len(inputs),
            why="EngagementCorrection.observe: the kernel needs engaged, total and observed_max "
            "as tensors",
        )
        if chosen == "triton":
            from trimtab.kernels.ema import engagement_observe_triton

            for x in tensors:
                self._as_vector(x, x.dtype)  # the reference's device and shape checks
            engagement_observe_triton(
                self._fraction._kernel_state(), self._kernel_state(),
                self._fraction._q_level, self._fraction._q_slope,
                engaged, total, observed_max, mask,
                expected_rate=self.expected_rate, z_threshold=self.z_threshold,
            )  # fmt: skip
            return self._rate
        k = self._as_vector(engaged, torch.float64)
        n = self._as_vector(total, torch.float64)
        top = self._as_vector(observed_max, torch.float32)
        ema = self._fraction
        observe = _observe_reference  # on the CPU as compiled (the same ops: trimtab._script)
        if ema.compiled and compiles(self.device):
            observe = scripted(_observe_reference)
        observe(
            ema._t, ema._rows, ema._bank, ema._q_level, ema._q_slope,
            self._rate, self._max, self._z, self.engaged_total, self.seen_total,
            k, n, top, mask, self.expected_rate, self.z_threshold,
        )  # fmt: skip
        return self._rate

    def correct(self, bound: torch.Tensor) -> torch.Tensor:
        """``bound + rate * (max - bound)`` per consumer: raised toward the last observed max
        where the last test declared it stale, unchanged elsewhere (and where it is NaN)."""
        gap = (self._max - bound).clamp(min=0.0).nan_to_num(0.0)
        return bound + self._rate.to(bound.dtype) * gap.to(bound.dtype)

    def fold(
        self,
        ema: AdaptiveEMA,
        bound: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        impl: str | None = None,
    ) -> torch.Tensor:
        """``ema.update_log(self.correct(bound), mask)``: a measured bound, raised where stale,
        folded into its slots' estimator on a log scale (one launch on the GPU). ``ema`` has
        one slot per consumer. Returns the new estimate, ``exp`` of the log-scale one."""
        if ema.num_slots != self.num_consumers:
            raise ValueError(
                f"the estimator has {ema.num_slots} slots for {self.num_consumers} consumers"
            )
        ema._check(bound, mask)
        if ema._impl(impl, bound) == "triton":
            return ema._update_triton(bound, mask, log=True, rate=self._rate, top=self._max)
        return ema._update_log_reference(self.correct(bound), mask)

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "fraction": self._fraction.state_dict(),
            "rate": self._rate.clone(),
            "max": self._max.clone(),
            "z": self._z.clone(),
            "engaged_total": self.engaged_total.clone(),
            "seen_total": self.seen_total.clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._fraction.load_state_dict(state["fraction"])
        for key, t in (
            ("rate", self._rate),
            ("max", self._max),
            ("z", self._z),
            ("engaged_total", self.engaged_total),
            ("seen_total", self.seen_total),
        ):
            value = state[key]
            if tuple(value.shape) != tuple(t.shape):
                raise ValueError(
                    f"engagement state {key!r} has shape {tuple(value.shape)}, expected "
                    f"{tuple(t.shape)} ({self.num_consumers} consumers)"
                )
            t.copy_(value)

    def __repr__(self) -> str:
        return (
            f"EngagementCorrection({self.num_consumers}, expected_rate={self.expected_rate}, "
            f"z_threshold={self.z_threshold:.3f}, device={self.device})"
        )


def _observe_reference(
    s: dict[str, torch.Tensor],
    rows: torch.Tensor,
    bank: torch.Tensor,
    q_level: torch.Tensor,
    q_slope: torch.Tensor,
    rate_state: torch.Tensor,
    max_state: torch.Tensor,
    z_state: torch.Tensor,
    engaged_total: torch.Tensor,
    seen_total: torch.Tensor,
    k: torch.Tensor,
    n: torch.Tensor,
    top: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    z_threshold: float,
) -> None:
    """:meth:`EngagementCorrection.observe` in torch (the kernel's oracle), in place: ``k`` and
    ``n`` float64, ``top`` float32 ``[num_consumers]``; the smoothed fraction's estimator is
    given by its state (``s``, ``rows``, ``bank``, its candidates' noise ``q_level``,
    ``q_slope``: :func:`trimtab.ema_fold.fold_reference`)."""
    take = n > 0
    if mask is not None:
        take = take & mask
    # 0/0 -> NaN, which the EMA ignores (consumers that saw nothing keep their estimate).
    frac = torch.where(take, k / n, torch.full_like(n, math.nan)).float()
    f = fold_reference(s, rows, bank, q_level, q_slope, frac, take, False).double()
    z = (f - p) / torch.sqrt(p * (1.0 - p) / n.clamp(min=1.0))
    stale = take & (z > z_threshold)
    rate = torch.where(stale, (f - p) / f, torch.zeros_like(f)).float()
    rate_state.copy_(torch.where(take, rate, rate_state))
    z_state.copy_(torch.where(take, z.float(), z_state))
    max_state.copy_(torch.where(take & torch.isfinite(top), top, max_state))
    engaged_total.add_(torch.where(take, k, 0.0).to(torch.int64))
    seen_total.add_(torch.where(take, n, 0.0).to(torch.int64))
