"""Adaptive EMA: one running estimate per slot whose rate is chosen from the signal itself.

Smooth on a stationary signal, track after a level shift, ignore outliers; batched, no host sync.
"""

from __future__ import annotations

import math

import torch

# Meta-rate of the slot statistics (noise variance, innovation autocorrelation). The statistics
# describe a regime, which lasts thousands of steps, not the level, which may move every step: an
# effective window of (2 - β)/β ≈ 2000 observations puts the standard error of the innovation
# autocorrelation near 1/√2000 ≈ 0.02, small against the gains it discriminates (0.05-1), and
# still re-learns the statistics of a new regime within a few thousand steps. R is a plain sample
# mean before 1/β observations (rate 1/n), so it needs no warm-up; the steady gain moves by
# Robbins-Monro steps of size β, so one noisy product z_t z_(t-1) moves it by at most β c².
META_RATE = 1e-3

# Probability, per step of a stationary signal, of declaring a level shift that is not there.
# A false restart costs one step of error about c·σ and a few steps of a fresh mean; at 1e-5 it
# happens about once in 10^5 steps per slot. It fixes the outlier threshold c below (≈ 2.84),
# so it is a tail probability, not a gain.
FALSE_SHIFT_PROB = 1e-5

# Absolute floor on the noise variance R: a constant signal (R = 0) divides by a tiny number rather
# than by zero. Only signals whose noise is below 1e-6 in their own units ever reach it.
TINY = 1e-12
# The gain stays below 1 - GAIN_EPS so that q = K²/(1 - K) stays finite.
GAIN_EPS = 1e-6


def _normal_quantile_upper(p: float) -> float:
    """z with P(Z > z) = p for a standard normal Z (bisection; runs once at import)."""
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(mid / math.sqrt(2.0)) > p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# A shift is declared when two consecutive standardized innovations exceed c with the same sign;
# under the model that has probability 2 Φ(-c)² per step, set equal to FALSE_SHIFT_PROB. One lone
# innovation beyond c is an outlier and is winsorized at c (Huber 1964).
OUTLIER_Z = _normal_quantile_upper(math.sqrt(FALSE_SHIFT_PROB / 2.0))


def _t_threshold(c: float, dof: torch.Tensor) -> torch.Tensor:
    """The Student-t quantile matching the normal quantile ``c`` at ``dof`` degrees of freedom.

    Cornish-Fisher expansion of the t quantile (Abramowitz & Stegun 26.7.5): while the noise
    variance rests on few observations, standardized innovations are t-distributed, and the same
    tail probability needs a wider threshold.
    """
    g1 = (c**3 + c) / 4.0
    g2 = (5 * c**5 + 16 * c**3 + 3 * c) / 96.0
    return c + g1 / dof + g2 / dof**2


def _clipped_second_moment(c: torch.Tensor) -> torch.Tensor:
    """E[min(Z², c²)] for a standard normal Z: the consistency factor of a winsorized variance."""
    tail = torch.erfc(c / math.sqrt(2.0))
    density = torch.exp(-0.5 * c * c) / math.sqrt(2.0 * math.pi)
    return (1.0 - tail) - 2.0 * c * density + c * c * tail


_STATE = ("mean", "p", "r", "prev_obs", "prev_z", "gain_ss", "lag", "alpha")


class AdaptiveEMA:
    r"""Per-slot adaptive EMA: ``m_t = m_(t-1) + α_t (y_t - m_(t-1))``, α_t from the signal.

    **Model.** Each slot follows the local-level model (Muth 1960; Harvey 1989, §2.3.1)

        y_t = μ_t + ε_t,  ε_t ~ N(0, R);   μ_t = μ_(t-1) + η_t,  η_t ~ N(0, Q).

    Its Kalman filter *is* an EMA: with p = P/R the variance of the level estimate and
    q = Q/R the signal-to-noise ratio, one step is ``p⁻ = p + q``, ``α = p⁻/(p⁻ + 1)``,
    ``m += α (y - m)``, ``p = (1 - α) p⁻``. The Riccati recursion converges to the
    steady-state (Wiener) gain α* = (√(q² + 4q) - q)/2, so q ≈ 0 gives α ≈ √q → 0 (smooth)
    and q ≫ 1 gives α → 1 (track); conversely q = α*²/(1 - α*). Running the recursion
    rather than the fixed point gives α = 1/n after a (re)start: a plain mean until the
    statistics have spoken. The first observation replaces the estimate (p = 1).

    **Statistics, estimated online** (meta-rate 1/n, then ``META_RATE``):

    - R from first differences, var(Δy) = 2R + Q ≈ 2R, winsorized at c and rescaled by the
      Gaussian consistency factor E[min(Z², c²)] (Huber 1964), so spikes barely move it.
    - q from the innovations: with the optimal gain the standardized innovations
      z_t = (y_t - m_(t-1))/√((p⁻ + 1)R) are white; for a steady gain K, Mehra (1970) gives
      the optimal gain as K + E[z_t z_(t-1)]. The steady gain α* is moved by a Robbins-Monro
      step of size ``META_RATE`` along z_t z_(t-1) (winsorized), i.e. towards whiteness, and
      q = α*²/(1 - α*) enters the recursion.
    - Lag (covariance matching, Jazwinski 1969): u, the EMA of z at the filter's own rate α,
      has variance α/(2 - α) when the innovations are white; any excess ``u² - α/(2 - α)`` is
      a systematic lag (drift) that the model has not budgeted, and p⁻ is kept at least as
      large as it, which raises α while the lag lasts.

    **Outliers and level shifts.** An innovation with |z| > c is winsorized at ±c (a lone
    spike moves the estimate by at most α c √S). Two consecutive exceedances of one sign that
    agree with each other (|z_t - z_(t-1)| ≤ c√2) are a level shift that began at t-1: the
    slot restarts from those two observations, m = (y_(t-1) + y_t)/2, p = 1/2, so α follows
    1/n again (``alpha`` reads 1 at a restart). c is the normal quantile with 2Φ(-c)² =
    ``FALSE_SHIFT_PROB`` (≈ 2.84), widened to the Student-t quantile while R rests on few
    observations.

    **Contract.** Everything is computed with ``torch.where``/``clamp`` on the device: no
    host synchronisation, CUDA-graph capturable. Non-finite observations are ignored (the
    slot keeps its value and statistics) and counted in :attr:`nonfinite_count`. Until its
    first finite observation a slot reads NaN (consumers read ``torch.fmax(slot, floor)``).

    Args:
        num_slots: number of independent signals, updated together.
        device: where the state lives (default CPU); observations must be there too.
        dtype: float32 (default) or float64 for the state and the returned estimate.
    """

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
    def nonfinite_count(self) -> torch.Tensor:
        """Per slot, how many selected observations were NaN or ±Inf and ignored (int64)."""
        return self._t["nonfinite_count"]

    def reset(self) -> None:
        """Back to unset: estimate NaN, statistics and counts cleared (a fold boundary)."""
        nan = torch.full((self.num_slots,), math.nan, dtype=self.dtype, device=self.device)
        zero = torch.zeros((self.num_slots,), dtype=self.dtype, device=self.device)
        t = {name: zero.clone() for name in _STATE}
        for name in ("mean", "r", "prev_obs", "alpha"):
            t[name] = nan.clone()
        t["count"] = torch.zeros((self.num_slots,), dtype=torch.int64, device=self.device)
        t["nonfinite_count"] = torch.zeros_like(t["count"])
        if self._t:  # in place, so views handed out earlier (and CUDA graphs) see the reset
            for name, value in t.items():
                self._t[name].copy_(value)
        else:
            self._t = t

    def to(self, device: torch.device | str) -> AdaptiveEMA:
        """Move every state tensor to ``device``; returns ``self``."""
        self._t = {k: v.to(device) for k, v in self._t.items()}
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
            if tuple(v.shape) != (self.num_slots,):
                raise ValueError(
                    f"state_dict[{k!r}] has shape {tuple(v.shape)} but this AdaptiveEMA has "
                    f"{self.num_slots} slots; load it into an AdaptiveEMA of as many slots"
                )
        for k, v in state.items():
            self._t[k].copy_(v.to(self._t[k].dtype))

    # -- the step ------------------------------------------------------------------------------
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
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise TypeError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', mask)}")
            if tuple(mask.shape) != (self.num_slots,) or mask.device != self.device:
                raise ValueError(
                    f"mask must have shape ({self.num_slots},) on {self.device}, "
                    f"got {tuple(mask.shape)} on {mask.device}"
                )

    @torch.no_grad()
    def update(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Fold one observation per slot into the estimate; returns :attr:`estimate`."""
        self._check(obs, mask)
        s = self._t
        # No branch on values anywhere below: every case is a torch.where, so nothing syncs.
        y = obs.to(self.dtype)
        finite = torch.isfinite(y)
        chosen = torch.ones_like(finite) if mask is None else mask
        take = chosen & finite
        s["nonfinite_count"].add_((chosen & ~finite).to(torch.int64))
        count = s["count"] + take.to(torch.int64)
        first = take & (count == 1)
        y = torch.where(take, y, s["prev_obs"].nan_to_num(0.0))  # keep NaN/Inf out of the maths

        # Differences seen so far (including this one) and the meta-rate: 1/n, then META_RATE.
        n = (count - 1).clamp(min=1).to(self.dtype)
        b = torch.clamp(1.0 / n, min=META_RATE)
        dof = torch.clamp(n - 1.0, min=1.0, max=(2.0 - META_RATE) / META_RATE)
        c = _t_threshold(OUTLIER_Z, dof)
        kappa = _clipped_second_moment(c)

        # Noise variance R from first differences (var Δy = 2R + Q ≈ 2R), winsorized at c.
        d2 = (y - s["prev_obs"]).square()
        r_old = s["r"]
        has_r = torch.isfinite(r_old)
        d2c = torch.where(has_r, torch.minimum(d2, c * c * 2.0 * r_old) / kappa, d2)
        r_new = torch.where(has_r, r_old + b * (0.5 * d2c - r_old), 0.5 * d2)
        r_use = torch.where(has_r, r_old, r_new).clamp(min=TINY)

        # Random-walk variance q = Q/R from the innovation whiteness test (Mehra 1970).
        k_ss = s["gain_ss"]
        q = k_ss * k_ss / (1.0 - k_ss)

        # Lag (Jazwinski 1969): the mean standardized innovation u over the filter's own memory,
        # beyond the K/(2-K) that white innovations give, is prediction error the model has not
        # budgeted; the prediction variance is matched to at least that much.
        k_prev = s["alpha"].nan_to_num(1.0)
        u = s["lag"]
        lag = (u * u - k_prev / (2.0 - k_prev)).clamp(min=0.0)
        p_pred = torch.maximum(s["p"] + q, lag)
        var_innov = (p_pred + 1.0) * r_use
        v = y - s["mean"]
        z = v / var_innov.sqrt()
        out = z.abs() > c
        prev_z = s["prev_z"]
        # Two exceedances of one sign that agree (their difference is within the √2 c a pair of
        # innovations about one shifted level spans) are a shift; a lone one is an outlier.
        agree = (z - prev_z).abs() <= c * math.sqrt(2.0)
        shift = out & (prev_z.abs() > c) & (z * prev_z > 0) & agree
        gain = p_pred / (p_pred + 1.0)
        mean = s["mean"] + gain * z.clamp(-c, c) * var_innov.sqrt()
        p_new = (1.0 - gain) * p_pred
        # A shift restarts the slot from the two observations of the new level.
        mean = torch.where(shift, 0.5 * (s["prev_obs"] + y), mean)
        p_new = torch.where(shift, 0.5, p_new)
        gain = torch.where(shift, 1.0, gain)

        # Robbins-Monro step towards Mehra's whiteness condition E[z_t z_(t-1)] = 0.
        zw = z.clamp(-c, c)
        lag_new = torch.where(shift, 0.0, u + gain * (zw - u))  # a shift absorbs the lag
        k_ss = k_ss + META_RATE * zw * prev_z.clamp(-c, c) / kappa
        k_ss = k_ss.clamp(0.0, 1.0 - GAIN_EPS)

        new = {
            "mean": torch.where(first, y, mean),
            "p": torch.where(first, 1.0, p_new),  # one observation: posterior variance R
            "r": torch.where(first, r_old, r_new),
            "prev_obs": y,
            "prev_z": torch.where(first, 0.0, z),
            "gain_ss": torch.where(first, 0.0, k_ss),
            "lag": torch.where(first, 0.0, lag_new),
            "alpha": torch.where(first, 1.0, gain),
        }
        for name, value in new.items():
            s[name].copy_(torch.where(take, value, s[name]))
        s["count"].copy_(count)
        return s["mean"]
