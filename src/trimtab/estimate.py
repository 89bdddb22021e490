"""Adaptive EMA: one running estimate per slot whose rate is chosen from the signal itself.

Smooth on a stationary signal, track after a level shift, ignore outliers; batched, no host sync.
"""

from __future__ import annotations

import math

import torch

from trimtab._impl import resolve_impl
from trimtab._script import compiles, scripted
from trimtab.ema_fold import BANK_STATE as _BANK_STATE
from trimtab.ema_fold import RUN_STATE as _RUN_STATE
from trimtab.ema_fold import SLOT_STATE as _SLOT_STATE
from trimtab.ema_fold import fold_reference as _fold_reference
from trimtab.kernels.ema_layout import (
    EMA_BANK,
    EMA_FIELDS,
    FALSE_SHIFT_PROB,
    META_RATE,
    NOISE_RATE,
    OUTLIER_Z,
    R_FLOOR_LOG,
    TINY,
)

__all__ = [
    "FALSE_SHIFT_PROB",
    "GAINS",
    "META_RATE",
    "NOISE_RATE",
    "OUTLIER_Z",
    "R_FLOOR_LOG",
    "TINY",
    "AdaptiveEMA",
    "check_mask",
]

# The numerical constants (META_RATE, FALSE_SHIFT_PROB and the outlier threshold OUTLIER_Z it
# fixes, TINY, R_FLOOR_LOG) and the Student-t thresholds are defined, with their reasons, in
# ``trimtab.kernels.ema_layout``: one definition for this reference and its kernels.

# The candidates' steady-state level gains: 1/2, 1/4, ... down to ≈ META_RATE. Gains are
# dimensionless, so the grid is no magnitude. Faster than 1/2 is a level shift, handled by the
# restart; slower than META_RATE a candidate differs from its neighbour only over a memory longer
# than the scores keep. Factor 2 apart: an EMA's error grows by ~7% at √2 from its optimal gain
# (random walk, Q/R = 0.01), and the weighted mixture interpolates between neighbours.
GAINS = tuple(2.0**-k for k in range(1, round(math.log2(1.0 / META_RATE)) + 1))


def _candidate_noise(gains: tuple[float, ...]) -> tuple[list[float], list[float]]:
    """(Q_level/R, Q_slope/R) per candidate: the level family, then the trend family.

    Level candidates: the running mean (q = 0) and, per gain α, the local-level model whose
    steady-state gain is α, q = α²/(1 - α). Trend candidates: the smooth-trend model (level
    noise 0, slope noise q_ζ) whose steady-state gains are (α, α²/(2 - α)), q_ζ = k₂²/(1 - α).
    """
    level = [0.0] + [a * a / (1.0 - a) for a in gains]
    slope = [(a * a / (2.0 - a)) ** 2 / (1.0 - a) for a in gains]
    return level + [0.0] * len(slope), [0.0] * len(level) + slope


def check_mask(mask: torch.Tensor, num: int, device: torch.device) -> None:
    """A selection mask of ``num`` slots: a bool tensor of shape ``(num,)`` on ``device``."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', mask)}")
    if tuple(mask.shape) != (num,) or mask.device != device:
        raise ValueError(
            f"mask must have shape ({num},) on {device}, got {tuple(mask.shape)} on {mask.device}"
        )


def _check_bound_args(z: float, cold_factor: float, cold_obs: int) -> None:
    """The arguments of :meth:`AdaptiveEMA.upper_bound_log`: Python numbers (a tensor ``z``
    would be read back to the host), ``z`` finite and positive (NaN, Inf or a negative ``z``
    gives thresholds that never fire or always do), ``cold_factor`` at least 1."""
    if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z <= 0:
        raise ValueError(f"z must be a finite positive number (a margin in standard "
                         f"deviations), got {z!r}")  # fmt: skip
    if (isinstance(cold_factor, bool) or not isinstance(cold_factor, (int, float))
            or not math.isfinite(cold_factor) or cold_factor < 1):  # fmt: skip
        raise ValueError(f"cold_factor must be a finite number >= 1 (the cold bound's factor "
                         f"over the estimate), got {cold_factor!r}")  # fmt: skip
    if isinstance(cold_obs, bool) or not isinstance(cold_obs, int) or cold_obs < 0:
        raise ValueError(f"cold_obs must be an int >= 0 (observations before the measured "
                         f"margin is trusted), got {cold_obs!r}")  # fmt: skip


class AdaptiveEMA:
    r"""Per-slot adaptive EMA: ``m_t = m_(t-1) + α_t (y_t - m_(t-1))``, α_t from the signal.

    **Candidates.** Each slot runs a bank of Kalman filters side by side (multiple-model
    estimation, Magill 1965), every one the exact filter of a linear-Gaussian model of
    y_t = μ_t + ε_t, ε_t ~ N(0, R), in the local-linear-trend form (Harvey 1989, ch. 2)

        μ_t = μ_(t-1) + β_(t-1) + η_t,  β_t = β_(t-1) + ζ_t,  η_t ~ N(0, q_η R),  ζ_t ~ N(0, q_ζ R).

    - *Level* candidates (β ≡ 0, the local-level model of Muth 1960): the filter is an EMA,
      ``p⁻ = p + q_η``, ``α = p⁻/(p⁻ + 1)``, ``m += α (y - m)``, ``p = (1 - α) p⁻``, with
      steady-state (Wiener) gain α for q_η = α²/(1 - α); q_η = 0 is the plain running mean.
    - *Trend* candidates (q_η = 0, the smooth-trend model): the filter is Holt's (1957)
      linear method, predicting ŷ = m + b, with level and slope gains (k₁, k₂) from the 2×2
      Riccati recursion, whose steady state is (α, α²/(2 - α)) for q_ζ = k₂²/(1 - α); a
      deterministic slope costs them no lag.

    Both families sit on the grid ``GAINS`` (1/2 … ≈ ``META_RATE``, factor 2). Running the
    recursions from p = diag(1, 0) rather than at their fixed points makes every candidate a
    plain mean after a (re)start, gain ≈ 1/n until n ≈ 1/α (exactly 1/n for q = 0): the
    first observation replaces the estimate, and the slope is zero until the data show one.

    **Weights** (exponentially weighted forecaster, Vovk 1990; Cesa-Bianchi & Lugosi 2006,
    ch. 2; with forgetting, the dynamic model averaging of Raftery, Kárný & Ettler 2010): as ε_t is
    independent of the past, the squared one-step prediction error of candidate k has
    expectation E[(y_t - ŷ_k)²] = R + E[(μ_t - ŷ_k)²], the tracking error of its prediction
    plus a constant, whatever the true dynamics. So the log weights are discounted sums of it
    (winsorized, below), ``L_k ← (1 - β) L_k - (y_t - ŷ_k)²/(2R)``, β = ``META_RATE``: a
    Gaussian likelihood of common variance R (each candidate's own variance would instead ask
    whose model fits, and none fits a sine). Then β of the weight is shared out evenly (fixed
    share, Herbster & Warmuth 1998), ``w ← (1 - β) w + β/K``: no candidate's weight falls below
    β/K, so after thousands of steps of one regime the weights still switch within a few steps
    when another candidate starts to predict better. The estimate is the weighted mean of the
    candidates' filtered levels, ``m_t = Σ_k softmax(L)_k m_k``; ``alpha`` is the weighted mean
    of their level gains. The reported value is a level, never the trend's extrapolation; a
    trend that overshoots loses weight quadratically in its error, so no damping constant is
    needed.

    **Noise variance** R from first differences, var(Δy) = 2R + Q ≈ 2R, winsorized at c and
    rescaled by the Gaussian consistency factor E[min(Z², c²)] (Huber 1964), meta-rate 1/n,
    then ``NOISE_RATE`` (faster than the scores: noise that scales with the level changes
    with it).

    **Outliers and level shifts.** Each candidate's innovation is winsorized at ±c of its
    predictive standard deviation (Huber 1964): a lone spike moves the estimate by at most α c
    √S and every score by at most c² S/(2R). The mixture's standardized innovation z_t
    (prediction Σ w ŷ_k, variance Σ w (S_k + (ŷ_k - ŷ)²)) detects shifts. A *run* is a sequence
    of consecutive exceedances (|z| > c) of one sign, each agreeing with the one before (|y_t -
    y_(t-1)| ≤ c√(2R), or less than ``AGREE_FRACTION`` of their distance from the prediction: a
    level that moved with its noise, as a magnitude's does). A run of ``SHIFT_RUN`` (3) is a
    level shift, or of ``NOISY_RUN`` (4) if it began within ``QUIET_STEPS`` of an exceedance
    that was not a shift (rising or heavy-tailed noise gives two agreeing one-signed values
    often, three rarely: a runs rule, as on control charts (Western Electric 1956), with a
    detection delay of two steps). :meth:`update_log` uses agreement by c√(2R) alone and counts
    only opposite signs as a noise rise (on the log scale a level's noise does not grow with it,
    and a gradient clip's raised bound must not ratchet on a ramp of raised observations,
    ``tests/test_clip.py``). Every candidate but the leaders (the largest weight before the
    run's last value) restarts as the mean of the run, slope 0, p = diag(1/n, 0) (``alpha``
    reads 1 at a restart); the leaders keep the old level and drop to the least weight, so a
    false shift is undone as soon as the restarted candidates err; the other weights are kept,
    as a shift changes the level, not the dynamics. One value short of a shift, the reported
    estimate is the midpoint of the old level and the run's mean (the Bayes estimate at even
    odds; the state is unchanged). Two exceedances that do not link (opposite signs, or far
    apart) are a rise of the noise: R jumps to their half squared difference (over c² R); at a
    shift whose values disagreed by R's measure, R jumps to their noise. c is the normal
    quantile with 2Φ(-c)² = ``FALSE_SHIFT_PROB`` (≈ 2.84), widened to the Student-t quantile
    while R rests on few observations.

    **Contract.** Everything is computed with ``torch.where``/``clamp`` on the device: no
    host synchronisation, CUDA-graph capturable. Non-finite observations are ignored (the
    slot keeps its value and statistics) and counted in :attr:`nonfinite_count`. Until its
    first finite observation a slot reads NaN (consumers read ``torch.fmax(slot, floor)``).

    Args:
        num_slots: number of independent signals, updated together.
        device: where the state lives (default CPU); observations must be there too.
        dtype: float32 (default) or float64 for the state and the returned estimate.
    """

    #: On the CPU, run the torch fold as compiled by TorchScript (the same values), or False:
    #: eagerly, op by op.
    compiled: bool = True

    def __init__(
        self,
        num_slots: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be an int >= 1, got {num_slots!r}")
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = torch.device("cpu") if device is None else torch.device(device)
        q_level, q_slope = _candidate_noise(GAINS)
        self._q_level = torch.tensor(q_level, dtype=dtype, device=self.device)
        self._q_slope = torch.tensor(q_slope, dtype=dtype, device=self.device)
        self._t: dict[str, torch.Tensor] = {}
        self.reset()
        self.device = self._t["mean"].device  # "cuda" becomes "cuda:0", as obs.device reads

    # -- public state --------------------------------------------------------------------------
    @property
    def estimate(self) -> torch.Tensor:
        """The current estimate per slot; NaN where the slot has had no finite observation."""
        return self._t["mean"]

    @property
    def alpha(self) -> torch.Tensor:
        """The rate each slot used at its last update (NaN before its first)."""
        return self._t["alpha"]

    @property
    def std_error(self) -> torch.Tensor:
        r"""Per slot, the standard error of :attr:`estimate` as an estimate of the level:
        ``sqrt(Σ_k w_k (P_k R + (m_k - m)²))``, each candidate's Kalman posterior variance of its
        level plus the spread of the candidates about the mixture (the mixture's posterior
        variance, Magill 1965). NaN until the noise variance R is known (two observations).
        Consumers that act only on a level confidently away from zero (the optimizer's decay)
        read ``estimate - z · std_error``."""
        t = self._t
        w = torch.softmax(t["score"], 1)
        spread = (t["level"] - t["mean"][:, None]).square()
        return (w * (t["p_ll"] * t["r"][:, None] + spread)).sum(1).sqrt()

    @property
    def noise_var(self) -> torch.Tensor:
        """Per slot, the measured noise variance R of the observations about their level (on
        the log scale for :meth:`update_log`); NaN until two observations. A consumer that
        asks how far one new observation may fall from :attr:`estimate` reads
        ``sqrt(noise_var + std_error²)`` (the sentinel's thresholds do)."""
        return self._t["r"]

    def upper_bound_log(self, z: float, *, cold_factor: float, cold_obs: int) -> torch.Tensor:
        """Per slot of a log-scale estimator (fed by :meth:`update_log`), the upper bound of one
        new observation: ``exp(estimate + margin)``, margin ``z · sqrt(noise_var +
        std_error²)`` (the spread of one new log observation about the estimated level).
        While ``count < cold_obs`` (a variance from a handful of differences can be any size)
        the margin is at least ``log(cold_factor)``, and exactly that until it is measured at
        all (NaN); NaN where the slot is unset. The sentinel's thresholds on the buffers it
        watches (:func:`trimtab.rl.agent.checks.watch_threshold`). No host sync."""
        _check_bound_args(z, cold_factor, cold_obs)
        return self._upper_bound_log(z, cold_factor, cold_obs)

    def _upper_bound_log(self, z: float, cold_factor: float, cold_obs: int) -> torch.Tensor:
        """:meth:`upper_bound_log` on validated arguments."""
        sd = (self.noise_var + self.std_error.square()).sqrt()
        cold = math.log(cold_factor)
        margin = torch.where(self.count < cold_obs, torch.clamp(z * sd, min=cold), z * sd)
        return (self.estimate + margin.nan_to_num(cold)).exp()

    @property
    def count(self) -> torch.Tensor:
        """Per slot, how many finite observations were folded since the last reset (int64)."""
        return self._t["count"]

    @property
    def nonfinite_count(self) -> torch.Tensor:
        """Per slot, how many selected observations were NaN or ±Inf and ignored (int64); of
        :meth:`update_log`, +Inf only (its NaN, like its zero, is no observation at all)."""
        return self._t["nonfinite_count"]

    def reset(self) -> None:
        """Back to unset: estimate NaN, statistics and counts cleared (a fold boundary)."""
        if not self._t:
            self._pack(self.device)
        t = self._t  # in place, so views handed out earlier (and CUDA graphs) see the reset
        for name in _SLOT_STATE:
            t[name].fill_(math.nan)
        t["prev_z"].zero_()
        for name in (*_RUN_STATE, *_BANK_STATE, "count", "nonfinite_count"):
            t[name].zero_()

    def _pack(self, device: torch.device, old: dict[str, torch.Tensor] | None = None) -> None:
        """Allocate the state on ``device`` (with ``old``'s values): the per-slot fields, in
        the order :meth:`_update_reference` writes them, as rows of one tensor, the bank fields
        as slices of another, so that an update writes each with one select instead of one
        per field (the same values: a select is exact)."""
        kw = {"dtype": self.dtype, "device": device}
        rows = torch.empty((len(_SLOT_STATE) + len(_RUN_STATE), self.num_slots), **kw)
        bank = torch.empty((len(_BANK_STATE), self.num_slots, self._q_level.numel()), **kw)
        t = dict(zip(_SLOT_STATE + _RUN_STATE, rows.unbind()))
        t.update(zip(_BANK_STATE, bank.unbind()))
        counts = torch.zeros((2, self.num_slots), dtype=torch.int64, device=device)
        t["count"], t["nonfinite_count"] = counts.unbind()
        if old:
            for name, value in old.items():
                t[name].copy_(value)
        self._rows, self._bank, self._t = rows, bank, t

    def to(self, device: torch.device | str) -> AdaptiveEMA:
        """Move every state tensor to ``device``; returns ``self``."""
        self._q_level, self._q_slope = self._q_level.to(device), self._q_slope.to(device)
        self._pack(self._q_level.device, self._t)
        self.device = self._t["mean"].device
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The complete state as a dict of tensors (clones); ``load_state_dict`` restores it."""
        return {k: v.clone() for k, v in self._t.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a state saved by :meth:`state_dict` from an EMA with as many slots."""
        missing, extra = set(self._t) - set(state), set(state) - set(self._t)
        if missing or extra:
            raise KeyError(
                f"state_dict keys do not match AdaptiveEMA: missing {sorted(missing)}, "
                f"unexpected {sorted(extra)}"
            )
        for k, v in state.items():
            if tuple(v.shape) != tuple(self._t[k].shape):
                raise ValueError(
                    f"state_dict[{k!r}] has shape {tuple(v.shape)} but this AdaptiveEMA has "
                    f"{self.num_slots} slots (shape {tuple(self._t[k].shape)}); load it into "
                    "an AdaptiveEMA of as many slots"
                )
        for k, v in state.items():
            self._t[k].copy_(v.to(self._t[k].dtype))

    # -- the step ------------------------------------------------------------------------------
    def update_log(
        self, obs: torch.Tensor, mask: torch.Tensor | None = None, *, impl: str | None = None
    ) -> torch.Tensor:
        """Fold positive magnitudes on a log scale; returns ``exp(estimate)``.

        A magnitude (a p99 of ``|x|``, a norm) moves by factors, not increments: in log space
        a tenfold move is one step of size log 10 whatever the scale, and the estimate is
        positive by construction, where on a linear scale the trend filters can extrapolate a
        tenfold drop below zero. A zero observation (log 0) is no observation, not a
        non-finite one, and so is a NaN (it compares false: not counted in
        :attr:`nonfinite_count`, where +Inf is). ``impl`` as in :meth:`update`."""
        self._check(obs, mask)
        if self._impl(impl, obs) == "triton":
            return self._update_triton(obs, mask, log=True)
        return self._update_log_reference(obs, mask)

    def _update_log_reference(self, obs: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """:meth:`update_log` in torch, on validated arguments."""
        y = obs.log()
        keep = y > -math.inf
        return self._update_reference(y, keep if mask is None else mask & keep, log=True).exp()

    @torch.no_grad()
    def update_log_and_raise(
        self,
        obs: torch.Tensor,
        mask: torch.Tensor | None,
        target: torch.Tensor,
        index: torch.Tensor,
        *,
        z: float,
        cold_factor: float,
        cold_obs: int,
        impl: str | None = None,
    ) -> None:
        """:meth:`update_log` ``(obs, mask)``, then raise ``target``'s element ``index[i]`` to
        slot ``i``'s :meth:`upper_bound_log` ``(z, cold_factor=..., cold_obs=...)`` where
        ``mask`` selects slot ``i`` (every slot where it is None): ``target[index] =
        where(mask, fmax(target[index], bound), target[index])``, a NaN bound (an unset slot)
        leaving the element as it was. A running largest bound, written into a state vector's
        slots (the sentinel's watched thresholds, :class:`trimtab.rl.agent.checks.Checks`).

        ``target``: a float vector on the estimator's device; ``index``: an int64 tensor of one
        element per slot, distinct and in range (not checked on the device: that would sync).
        ``impl`` as in :meth:`update`; the kernel (float32 estimator, ``obs`` and ``target``)
        is one launch, the update and the raise together. The reference (the CPU's path, and
        CUDA's with ``impl="torch"`` or other dtypes) is :meth:`update_log`'s, then the ops
        spelled out below; the bound is rounded to ``target``'s dtype."""
        self._check(obs, mask)
        self._check_target(target, index)
        _check_bound_args(z, cold_factor, cold_obs)
        if self._impl(impl, obs, target) == "triton":
            from trimtab.kernels.ema import ema_update_raise_triton

            ema_update_raise_triton(
                self._kernel_state(), self._q_level, self._q_slope, obs, mask, target, index,
                z=z, cold_margin=math.log(cold_factor), cold_obs=cold_obs,
            )  # fmt: skip
            return
        self._update_log_reference(obs, mask)
        held = target.index_select(0, index)
        bound = self._upper_bound_log(z, cold_factor, cold_obs)
        raised = torch.fmax(held, bound.to(target.dtype))
        target.index_copy_(0, index, raised if mask is None else torch.where(mask, raised, held))

    def _check_target(self, target: torch.Tensor, index: torch.Tensor) -> None:
        if not isinstance(target, torch.Tensor) or not target.is_floating_point():
            raise TypeError(f"target must be a floating-point tensor, got "
                            f"{getattr(target, 'dtype', type(target).__name__)}")  # fmt: skip
        if target.dim() != 1 or target.device != self.device:
            raise ValueError(f"target must be a vector on {self.device}, got shape "
                             f"{tuple(target.shape)} on {target.device}")  # fmt: skip
        if not isinstance(index, torch.Tensor) or index.dtype != torch.int64:
            raise TypeError(f"index must be an int64 tensor (as index_copy_ takes), got "
                            f"{getattr(index, 'dtype', type(index).__name__)}")  # fmt: skip
        if tuple(index.shape) != (self.num_slots,) or index.device != self.device:
            raise ValueError(
                f"index must have shape ({self.num_slots},) on {self.device}, one element of "
                f"target per slot, got {tuple(index.shape)} on {index.device}"
            )
        if index.device.type == "cpu":  # on the host, the range and distinctness cost no sync
            n = target.numel()
            if bool(((index < 0) | (index >= n)).any()) or index.unique().numel() < len(index):
                raise ValueError(f"index must hold distinct elements of target, 0 to {n - 1}, "
                                 f"got {index.tolist()}")  # fmt: skip

    def _check(self, obs: torch.Tensor, mask: torch.Tensor | None) -> None:
        if not isinstance(obs, torch.Tensor):
            raise TypeError(f"obs must be a torch.Tensor, got {type(obs).__name__}")
        if not obs.is_floating_point():
            raise TypeError(
                f"obs must be a floating-point tensor, got {obs.dtype}; "
                "convert it with obs.float() (integer observations have no NaN for 'missing')"
            )
        if tuple(obs.shape) != (self.num_slots,):
            raise ValueError(
                f"obs must have shape ({self.num_slots},), one observation per slot, "
                f"got {tuple(obs.shape)}"
            )
        if obs.device != self.device:
            raise ValueError(
                f"obs is on {obs.device} but the AdaptiveEMA is on {self.device}; "
                "move one of them (copying here would hide a host round trip)"
            )
        if mask is not None:
            check_mask(mask, self.num_slots, self.device)

    def _impl(self, impl: str | None, obs: torch.Tensor, target: torch.Tensor | None = None) -> str:
        """The implementation of a fold of ``obs`` (raising ``target``): the kernel folds
        float32 into float32 (and raises a float32 target)."""
        tensors = [obs] if target is None else [obs, target]

        def why() -> str:
            wants = "AdaptiveEMA: the kernel folds float32 observations into a float32 estimator"
            if target is None:
                return f"{wants}, got obs {obs.dtype} and state {self.dtype}"
            return (f"{wants} and raises a float32 target, got obs {obs.dtype}, state "
                    f"{self.dtype} and target {target.dtype}")  # fmt: skip

        fits = all(t.dtype == torch.float32 for t in tensors) and self.dtype == torch.float32
        return resolve_impl(impl, tensors, fits=fits, why=why)

    def _kernel_state(self) -> list[torch.Tensor]:
        """The state tensors in the kernels' order (``EMA_FIELDS + EMA_BANK``, see
        :mod:`trimtab.kernels.ema_layout`)."""
        return [self._t[n] for n in EMA_FIELDS + EMA_BANK]

    def _update_triton(
        self,
        obs: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        log: bool,
        rate: torch.Tensor | None = None,
        top: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One launch of :meth:`update` (``log``: :meth:`update_log`) on validated arguments;
        ``rate``/``top``: fold ``EngagementCorrection.correct(obs)`` with that rate and max."""
        from trimtab.kernels.ema import ema_update_triton

        out = ema_update_triton(
            self._kernel_state(), self._q_level, self._q_slope, obs, mask,
            log=log, rate=rate, top=top,
        )  # fmt: skip
        return out if log else self._t["mean"]

    @torch.no_grad()
    def update(
        self, obs: torch.Tensor, mask: torch.Tensor | None = None, *, impl: str | None = None
    ) -> torch.Tensor:
        """Fold one observation per slot into the estimate; returns :attr:`estimate`.

        ``impl``: ``None`` runs one Triton launch (:mod:`trimtab.kernels.ema`) for float32 CUDA
        tensors and this pure-PyTorch reference otherwise; ``"torch"`` or ``"triton"`` force
        one (``"triton"`` on the CPU needs ``TRITON_INTERPRET=1``)."""
        self._check(obs, mask)
        if self._impl(impl, obs) == "triton":
            return self._update_triton(obs, mask, log=False)
        return self._update_reference(obs, mask)

    @torch.no_grad()
    def _update_reference(
        self, obs: torch.Tensor, mask: torch.Tensor | None, *, log: bool = False
    ) -> torch.Tensor:
        """:meth:`update` in torch, on validated arguments (the kernel's oracle); ``log``: of
        :meth:`update_log` (on the log scale a level's noise does not grow with it, so a run
        agrees by R's measure only, and only exceedances of opposite signs are a noise rise).
        The arithmetic is :func:`trimtab.ema_fold.fold_reference`'s, on the CPU run as compiled
        by TorchScript (:func:`trimtab._script.scripted`): the same aten ops on the same
        tensors, so the same values, at a third of the eager interpreter's cost per op."""
        fold = _fold_reference
        if self.compiled and compiles(self.device):
            fold = scripted(_fold_reference)
        return fold(
            self._t, self._rows, self._bank, self._q_level, self._q_slope, obs, mask, log
        )  # fmt: skip
