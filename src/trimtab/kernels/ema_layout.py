"""The adaptive EMA's numbers and state layout, shared by its reference (:mod:`trimtab.estimate`)
and its kernels (:mod:`trimtab.kernels.ema`, ``.clip``, ``.optim_finalize``). Imports torch only.

Numerical constants, the dof-dependent outlier thresholds (one definition: the reference computes
them per step, the kernels read them from :func:`dof_tables`), and the order in which the kernels
read an estimator's state tensors:

- an estimator (``EMA_FIELDS + EMA_BANK``, ``EMA_WIDTH`` tensors): float32 ``[S]`` ``mean``,
  ``r``, ``prev_obs``, ``prev_z``, ``alpha``; int64 ``[S]`` ``count``, ``nonfinite_count``;
  float32 ``[S]`` ``run_n``, ``run_sum``, ``run_d2``, ``quiet`` (the shift detector's run of
  exceedances: its length, sum, the half squared differences its links disagreed by, and the
  quiet steps before it); float32 ``[S, K]`` ``level``, ``slope``, ``p_ll``, ``p_ls``,
  ``p_ss``, ``score`` (``S`` slots, ``K`` candidates). The names are the keys of
  ``AdaptiveEMA.state_dict()``.
- an engagement correction (``ENG_FIELDS``): float32 ``[C]`` ``rate``, ``max``, ``z``; int64
  ``[C]`` ``engaged_total``, ``seen_total`` (its fraction's estimator comes first, as above).
- the tail after them (``TAIL_FIELDS``): float32 ``[K]`` ``q_level``, ``q_slope`` (the
  candidates' noise over R), float32 ``[DOF_MAX]`` ``c``, ``kappa`` (:func:`dof_tables`).
"""

from __future__ import annotations

import math

import torch

# Meta-rate of the slot statistics (noise variance R, the candidates' scores). The statistics
# describe a regime, which lasts thousands of steps, not the level, which may move every step: an
# effective memory of 1/β ≈ 1000 observations lets a squared-error gap of 1% of R per step (about
# the gap between neighbouring candidate gains near the optimum) add up to ~5 units of log weight,
# odds of ~150:1, and still re-learns a new regime within a few thousand steps.
# R is a plain sample mean before 1/β observations (rate 1/n), so it needs no warm-up.
META_RATE = 1e-3

# Meta-rate of the noise variance R (after its first 1/NOISE_RATE differences, a plain mean). R
# describes the noise, which may change with the level (a p99's noise scales with it): a memory of
# ~100 differences re-learns a tenfold change of the noise within a few hundred steps, and still
# estimates R to ~10% (relative sd √NOISE_RATE), which moves the outlier threshold by ~5%.
NOISE_RATE = 1e-2

# Log weight within which candidates tie for the lead (the leaders keep the old level through a
# shift): a tolerance against rounding, so the reference and the kernels, which round the scores
# in another order, pick the same leaders; far below any gap that decides between candidates.
LEAD_TOL = 1e-3

# Probability, per step of a stationary signal, of declaring a level shift that is not there.
# A false restart costs one step of error about c·σ and a few steps of a fresh mean; at 1e-5 it
# happens about once in 10^5 steps per slot. It fixes the outlier threshold c below (≈ 2.84),
# so it is a tail probability, not a gain.
FALSE_SHIFT_PROB = 1e-5

# A level shift is a run of SHIFT_RUN consecutive exceedances of one sign that agree with each
# other (each within c √(2R) of the one before, or closer to it than AGREE_FRACTION of their
# distance from the prediction: a shift whose noise grew with the level). Two exceedances, the
# old rule, are as often a rise of the noise (an ×8 noise gives two agreeing exceedances of one
# sign within a few steps); a third agreeing one of the same sign is ~10× rarer there, and costs
# a true shift one more step of error. A run that starts fewer than QUIET_STEPS steps after an
# exceedance that was not a shift (noise is rising, or heavy-tailed) needs NOISY_RUN: under
# noise each further value halves its odds. Counts of observations, not magnitudes.
SHIFT_RUN = 3
NOISY_RUN = 4
QUIET_STEPS = 5
AGREE_FRACTION = 0.5

# Absolute floor on the noise variance R: a constant signal (R = 0) divides by a tiny number rather
# than by zero. Only signals whose noise is below 1e-6 in their own units ever reach it.
TINY = 1e-12
# Floor on R in update_log's units (log of a magnitude): a magnitude is not known to better than
# 0.1% (sd 1e-3 in log units). A loop that feeds a bound back into its own measurement (the C51
# support: every target reaches G + γ·bound) gives an input with no noise at all; with R at TINY
# every later deviation is an outlier, the winsorised candidates freeze off the input and one
# trend candidate runs away (support_loop.py: CartPole's support wandered 1.9 .. 16,765 and sat
# below half its fixed point 100 for 7,520 of 19,000 updates; with this floor 0, held at 99.5).
R_FLOOR_LOG = 1e-6

EMA_FIELDS = (
    "mean", "r", "prev_obs", "prev_z", "alpha", "count", "nonfinite_count",
    "run_n", "run_sum", "run_d2", "quiet",
)  # fmt: skip
EMA_BANK = ("level", "slope", "p_ll", "p_ls", "p_ss", "score")
EMA_WIDTH = len(EMA_FIELDS) + len(EMA_BANK)
ENG_FIELDS = ("rate", "max", "z", "engaged_total", "seen_total")
TAIL_FIELDS = ("q_level", "q_slope", "c", "kappa")


def normal_upper_quantile(p: float) -> float:
    """``z`` with ``P(Z > z) = p`` for a standard normal ``Z`` (``0 < p < 1``)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"tail probability must be in (0, 1), got {p!r}")
    lo, hi = -40.0, 40.0
    for _ in range(200):  # bisection on erfc: exact to double precision, runs once
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(mid / math.sqrt(2.0)) > p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# c is set so that two consecutive standardized innovations exceed it with the same sign with
# probability 2 Φ(-c)² = FALSE_SHIFT_PROB per step under the model; a shift needs a run of
# SHIFT_RUN such exceedances that agree, rarer still. One lone innovation beyond c is an outlier
# and is winsorized at c (Huber 1964).
OUTLIER_Z = normal_upper_quantile(math.sqrt(FALSE_SHIFT_PROB / 2.0))


def t_threshold(c: float, dof: torch.Tensor) -> torch.Tensor:
    """The Student-t quantile matching the normal quantile ``c`` at ``dof`` degrees of freedom.

    Cornish-Fisher expansion of the t quantile (Abramowitz & Stegun 26.7.5): while the noise
    variance rests on few observations, standardized innovations are t-distributed, and the same
    tail probability needs a wider threshold.
    """
    g1 = (c**3 + c) / 4.0
    g2 = (5 * c**5 + 16 * c**3 + 3 * c) / 96.0
    return c + g1 / dof + g2 / dof**2


def clipped_second_moment(c: torch.Tensor) -> torch.Tensor:
    """E[min(Z², c²)] for a standard normal Z: the consistency factor of a winsorized variance."""
    tail = torch.erfc(c / math.sqrt(2.0))
    density = torch.exp(-0.5 * c * c) / math.sqrt(2.0 * math.pi)
    return (1.0 - tail) - 2.0 * c * density + c * c * tail


#: Largest degree of freedom of the thresholds: the reference clamps ``n - 1`` to
#: ``(2 - NOISE_RATE) / NOISE_RATE`` (in float32 there, so the same rounding here).
DOF_MAX = int(torch.tensor((2.0 - NOISE_RATE) / NOISE_RATE).item())

_dof_tables: dict[torch.device, tuple[int, torch.Tensor, torch.Tensor]] = {}


def dof_tables(device: torch.device) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(DOF_MAX, c, kappa)``: the outlier threshold and its consistency factor per degree of
    freedom 1..DOF_MAX, float32 on ``device`` (as the reference's update computes them), built
    once per device."""
    got = _dof_tables.get(device)
    if got is None:
        dof = torch.arange(1, DOF_MAX + 1, dtype=torch.float32, device=device)
        c = t_threshold(OUTLIER_Z, dof)
        got = (DOF_MAX, c, clipped_second_moment(c))
        _dof_tables[device] = got
    return got
