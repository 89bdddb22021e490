"""Selection bias in a sweep: the Sharpe ratio the best of N trials reaches by luck alone, and
the deflated Sharpe ratio of the trial picked (Bailey & López de Prado 2014).

Every Sharpe ratio here is per bar, not annualised: ``SR_bar = SR_annual / sqrt(periods per
year)`` (:func:`per_bar`), and ``n_obs`` counts bars, because the equations below are written
for the Sharpe ratio of the bars that were observed.

Reference: D. H. Bailey and M. López de Prado, "The Deflated Sharpe Ratio: Correcting for
Selection Bias, Backtest Overfitting and Non-Normality", Journal of Portfolio Management 40(5),
2014, pp. 94-107 (equations numbered as there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

__all__ = ["EULER_GAMMA", "deflated_sharpe", "expected_max_sharpe", "per_bar"]

#: the Euler-Mascheroni constant of the expected maximum's approximation
EULER_GAMMA = 0.5772156649015329
_NORMAL = NormalDist()


def per_bar(annual_sharpe: float, periods_per_year: float) -> float:
    """``SR / sqrt(periods_per_year)``: an annualised Sharpe ratio as the Sharpe of one bar."""
    return annual_sharpe / math.sqrt(periods_per_year)


def expected_max_sharpe(n_trials: int, var_sharpe: float) -> float:
    """The expected maximum Sharpe ratio of ``n_trials`` independent trials whose true Sharpe
    ratio is zero and whose estimates have variance ``var_sharpe`` (the paper's SR_0)::

        E[max_n SR_n] ~ sqrt(V[SR_n]) * ((1 - g) Z^-1(1 - 1/N) + g Z^-1(1 - 1/(N e)))

    with ``Z^-1`` the standard normal quantile, ``g`` Euler's constant and ``e`` Euler's number
    (the false strategy theorem; Bailey & López de Prado 2014, the expression for SR_0 in
    section 2). One trial is no selection: 0."""
    if type(n_trials) is not int or n_trials < 1:
        raise ValueError(f"n_trials={n_trials!r} must be an integer >= 1")
    if not (math.isfinite(var_sharpe) and var_sharpe >= 0):
        raise ValueError(f"var_sharpe={var_sharpe!r} must be finite and >= 0")
    if n_trials == 1:
        return 0.0
    z = _NORMAL.inv_cdf
    n = float(n_trials)
    spread = (1 - EULER_GAMMA) * z(1 - 1 / n) + EULER_GAMMA * z(1 - 1 / (n * math.e))
    return math.sqrt(var_sharpe) * spread


def deflated_sharpe(
    best: float,
    trials: Sequence[float],
    n_obs: int,
    skew: float | None = 0.0,
    kurtosis: float | None = 3.0,
) -> float:
    """The probability that the true Sharpe ratio of the trial selected is above the best that
    luck gives among ``len(trials)`` trials (Bailey & López de Prado 2014, eq. 2)::

        DSR = Z( (SR* - SR_0) sqrt(T - 1) / sqrt(1 - g3 SR* + (g4 - 1) / 4 SR*^2) )

    ``SR*`` is ``best`` (per bar), ``SR_0`` is :func:`expected_max_sharpe` of ``N =
    len(trials)`` and the sample variance of ``trials`` (every trial's per-bar Sharpe ratio,
    the best included), ``T`` is ``n_obs`` (bars the best was measured on), ``g3`` and ``g4``
    the skewness and (non-excess) kurtosis of its returns: None means normal, 0 and 3. With
    ``SR_0 = 0`` (one trial, or trials that do not differ) it is the probabilistic Sharpe ratio
    against zero (Bailey & López de Prado 2012). A value near 1: the best trial is unlikely to
    be luck; 0.5 or below: no better than the best of N coin-flip strategies."""
    if not trials:
        raise ValueError("deflated_sharpe needs the Sharpe ratios of the trials (at least one)")
    if type(n_obs) is not int or n_obs < 2:
        raise ValueError(f"n_obs={n_obs!r} must be an integer >= 2 (bars of the best trial)")
    values = [float(t) for t in trials]
    if not all(math.isfinite(v) for v in values) or not math.isfinite(best):
        raise ValueError(f"the Sharpe ratios must be finite: best {best!r}, trials {values}")
    g3 = 0.0 if skew is None else float(skew)
    g4 = 3.0 if kurtosis is None else float(kurtosis)
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    sr0 = expected_max_sharpe(n, var)
    # >= (1 - g3 SR/2)^2 >= 0 for any distribution (g4 >= 1 + g3^2); clamp rounding at 0
    denom = math.sqrt(max(1.0 - g3 * best + (g4 - 1.0) / 4.0 * best * best, 0.0))
    if denom == 0.0:
        return 1.0 if best > sr0 else 0.0
    return _NORMAL.cdf((best - sr0) * math.sqrt(n_obs - 1) / denom)
