"""Performance statistics of a series of per-bar net log returns, with bootstrap intervals.

Every function takes the net log returns ``r [L]`` that :mod:`.execution` produces (weights
``[L, A]`` where needed) and the caller's ``periods_per_year`` (ppy); nothing assumes daily bars.

Conventions (``R_t = e^{r_t} - 1`` simple returns, ``rf`` the cash rate per bar, so that a flat
book, which earns exactly ``rf``, has excess 0):

    excess          x_t = R_t - rf
    sharpe          mean(x) / std(x, ddof=1) * sqrt(ppy)
    sortino         mean(x) / sqrt(mean(min(x, 0)^2)) * sqrt(ppy)
    equity          E_0 = 1 before the first bar, E_t = exp(r_1 + ... + r_t)
    max_drawdown    max_t (1 - E_t / max_{s <= t} E_s)            (a positive fraction)
    annual_return   exp(sum(r) * ppy / L) - 1                     (CAGR)
    calmar          annual_return / max_drawdown
    turnover        mean_t sum_a |w_t,a - w_t-1,a|,  w_0 = 0      (from flat)
    exposure        mean_t sum_a |w_t,a|

Intervals resample bars with the stationary bootstrap of Politis & Romano (1994), "The
stationary bootstrap", JASA 89(428), with the mean block length of Politis & White (2004),
Econometric Reviews 23(1), as corrected by Patton, Politis & White (2009), ER 28(4).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from statistics import NormalDist

import numpy as np

__all__ = ["ZERO_STD", "annual_return", "auto_block_length", "breakeven_bps", "calmar",
           "deflated_sharpe", "excess", "exposure", "max_drawdown", "paired_difference",
           "sharpe", "sharpe_ci", "sortino", "stationary_bootstrap", "total_return", "turnover",
           "window_stats"]  # fmt: skip

#: A per-bar standard deviation at or below this is zero: the rounding of expm1/log1p on a
#: flat book that earns the cash rate (~1e-19), far below any traded series (~1e-4 a bar).
ZERO_STD = 1e-12
#: Resamples drawn at once: bounds the index array at CHUNK x L (not draws x L) integers.
CHUNK = 256
EULER_GAMMA = 0.5772156649015329


def _as_1d(r: np.ndarray | Sequence[float]) -> np.ndarray:
    x = np.asarray(r, np.float64)
    if x.ndim != 1:
        raise ValueError(f"need a series [L], got shape {x.shape}")
    return x


def _ratio(mean: np.ndarray, dev: np.ndarray, ppy: float) -> np.ndarray:
    """``mean / dev * sqrt(ppy)`` where ``dev > ZERO_STD``, else 0 (computed, not branched)."""
    ok = dev > ZERO_STD
    return np.where(ok, mean / np.where(ok, dev, 1.0), 0.0) * math.sqrt(ppy)


def excess(r: np.ndarray | Sequence[float], rf: float = 0.0) -> np.ndarray:
    """Excess simple returns ``expm1(r) - rf`` of net log returns ``r`` over the per-bar
    cash rate ``rf``."""
    return np.expm1(_as_1d(r)) - rf


def sharpe(r: np.ndarray | Sequence[float], ppy: float, rf: float = 0.0) -> float:
    """Annualised Sharpe ratio ``mean(x) / std(x, ddof=1) * sqrt(ppy)`` of the excess simple
    returns ``x = expm1(r) - rf`` (Sharpe 1994, "The Sharpe ratio", JPM 21(1)).

    0.0 when there are fewer than 2 bars or the standard deviation is zero (at most
    ``ZERO_STD``): a constant series, a flat book above all, has no risk-adjusted return."""
    x = excess(r, rf)
    if x.size < 2:
        return 0.0
    return float(_ratio(x.mean(), x.std(ddof=1), ppy))


def sortino(r: np.ndarray | Sequence[float], ppy: float, rf: float = 0.0) -> float | None:
    """Annualised Sortino ratio ``mean(x) / sqrt(mean(min(x, 0)^2)) * sqrt(ppy)`` of the
    excess simple returns (Sortino & Price 1994, "Performance measurement in a downside risk
    framework", J. Investing 3(3); target = the cash rate, the mean over all bars).

    None when no bar falls below the cash rate (downside deviation at most ``ZERO_STD``):
    the ratio is unbounded there, and None keeps the result JSON-friendly."""
    x = excess(r, rf)
    if x.size == 0:
        return None
    down = math.sqrt(float(np.mean(np.minimum(x, 0.0) ** 2)))
    if down <= ZERO_STD:
        return None
    return float(x.mean() / down * math.sqrt(ppy))


def total_return(r: np.ndarray | Sequence[float]) -> float:
    """``exp(sum r) - 1``: the growth of the equity over the series, as a fraction (inf past
    float64's range)."""
    with np.errstate(over="ignore"):
        return float(np.expm1(_as_1d(r).sum()))


def max_drawdown(r: np.ndarray | Sequence[float]) -> float:
    """``max_t (1 - E_t / max_{s <= t} E_s)`` with ``E_0 = 1`` before the first bar and
    ``E_t = exp(cumsum r)``: the worst fall from a peak, a fraction in [0, 1] (0.0 when the
    equity never falls below its running peak, and for an empty series)."""
    x = _as_1d(r)
    if x.size == 0:
        return 0.0
    log_equity = np.cumsum(x)
    peak = np.maximum.accumulate(np.maximum(log_equity, 0.0))  # E_0 = 1 is a peak
    return float(max(0.0, -np.expm1(log_equity - peak).min()))


def annual_return(r: np.ndarray | Sequence[float], ppy: float) -> float:
    """Compound annual growth ``exp(sum(r) * ppy / L) - 1`` (0.0 for an empty series, inf past
    float64's range)."""
    x = _as_1d(r)
    with np.errstate(over="ignore"):
        return float(np.expm1(x.mean() * ppy)) if x.size else 0.0


def calmar(r: np.ndarray | Sequence[float], ppy: float) -> float | None:
    """``annual_return / max_drawdown`` (Young 1991, "Calmar ratio", Futures 20(1)); None when
    the drawdown is 0 (the ratio is unbounded)."""
    dd = max_drawdown(r)
    return annual_return(r, ppy) / dd if dd > 0 else None


def _as_weights(weights: np.ndarray) -> np.ndarray:
    w = np.asarray(weights, np.float64)
    if w.ndim != 2:
        raise ValueError(f"need weights [L, A], got shape {w.shape}")
    return w


def turnover(weights: np.ndarray) -> float:
    """``mean_t sum_a |w_t,a - w_{t-1},a|`` of weights ``[L, A]``, from flat before the first
    bar (so entering a full book counts); 0.0 for no bars."""
    w = _as_weights(weights)
    if w.shape[0] == 0:
        return 0.0
    return float(np.abs(np.diff(w, axis=0, prepend=0.0)).sum(1).mean())


def exposure(weights: np.ndarray) -> float:
    """``mean_t sum_a |w_t,a|``: the gross book held, a fraction of equity; 0.0 for no bars."""
    w = _as_weights(weights)
    return float(np.abs(w).sum(1).mean()) if w.shape[0] else 0.0


def stationary_bootstrap(
    n: int, draws: int, mean_block: float, rng: np.random.Generator
) -> np.ndarray:
    """Indices ``[draws, n]`` of Politis & Romano's (1994) stationary bootstrap.

    Each resample is a chain of blocks: ``I_0 ~ U{0..n-1}``, then ``I_j = (I_{j-1} + 1) mod n``
    (wrapping around) with probability ``1 - p``, else a fresh ``U{0..n-1}``; ``p = 1 /
    mean_block``, so block lengths are geometric with mean ``mean_block`` and the resample
    is stationary.
    """
    if n < 0 or draws < 0:
        raise ValueError(f"need n >= 0 and draws >= 0, got n={n}, draws={draws}")
    if not (math.isfinite(mean_block) and mean_block >= 1):
        raise ValueError(f"mean_block={mean_block} must be finite and >= 1")
    if n == 0 or draws == 0:
        return np.zeros((draws, n), dtype=np.intp)
    fresh = rng.random((draws, n)) < 1.0 / mean_block
    fresh[:, 0] = True
    starts = rng.integers(0, n, size=(draws, n))
    pos = np.arange(n)
    # the position where the current block began, then its start value plus the offset in it
    began = np.maximum.accumulate(np.where(fresh, pos, 0), axis=1)
    first = np.take_along_axis(starts, began, axis=1)
    return ((first + pos - began) % n).astype(np.intp)


def auto_block_length(x: np.ndarray | Sequence[float]) -> float:
    """Mean block length for the stationary bootstrap of the mean of ``x`` (Politis & White
    2004, with the corrected ``D_SB`` of Patton, Politis & White 2009).

    With ``gamma_k`` the sample autocovariances (divisor ``n``) and ``rho_k`` the
    autocorrelations: ``m`` is the smallest lag after which ``K_n = max(5, sqrt(log10 n))``
    consecutive ``|rho|`` lie inside ``2 sqrt(log10(n) / n)`` (else ``m_max = ceil(sqrt n) +
    K_n``), ``M = min(2 m, m_max)``, ``lambda(t) = 1`` for ``|t| <= 1/2``, ``2 (1 - |t|)``
    to ``|t| = 1`` (the flat-top window), and

        G = sum_{|k| <= M} lambda(k/M) |k| gamma_k,    g0 = sum_{|k| <= M} lambda(k/M) gamma_k,
        D_SB = 2 g0^2,    b = (2 G^2 / D_SB)^(1/3) n^(1/3),

    clipped to ``[1, min(3 sqrt n, n / 3)]`` (the paper's ``B_max``). 1.0 for fewer than
    9 bars, a constant series, or no significant autocorrelation (``m = 0``): iid resampling.
    """
    v = _as_1d(x)
    n = v.size
    if n < 9:
        return 1.0
    eps = v - v.mean()
    gamma0 = float(eps @ eps) / n
    if gamma0 <= 0.0:
        return 1.0
    k_n = max(5, math.ceil(math.sqrt(math.log10(n))))
    m_max = min(math.ceil(math.sqrt(n)) + k_n, n - 1)
    lags = np.arange(m_max + 1)
    gamma = np.array([float(eps[k:] @ eps[: n - k]) / n for k in lags])
    small = np.abs(gamma[1:] / gamma0) < 2.0 * math.sqrt(math.log10(n) / n)  # rho_1..rho_mmax
    m_hat = None
    for m in range(0, m_max - k_n + 1):
        if small[m : m + k_n].all():  # rho_{m+1} .. rho_{m+K_n}
            m_hat = m
            break
    if m_hat == 0:
        return 1.0
    big_m = m_max if m_hat is None else min(2 * m_hat, m_max)
    k = lags[1 : big_m + 1]
    t = k / big_m
    lam = np.where(t <= 0.5, 1.0, 2.0 * (1.0 - t))
    g_big = 2.0 * float((lam * k * gamma[k]).sum())
    g0 = gamma0 + 2.0 * float((lam * gamma[k]).sum())
    b_max = math.ceil(min(3.0 * math.sqrt(n), n / 3.0))
    if g0 <= 0.0:
        return float(b_max)  # a spectral density estimate of 0 at frequency 0: strong dependence
    b = (2.0 * g_big**2 / (2.0 * g0**2)) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return float(min(max(b, 1.0), b_max))


def _resamples(n: int, draws: int, mean_block: float, seed: int) -> Iterator[np.ndarray]:
    """Stationary-bootstrap index chunks ``[<= CHUNK, n]`` of one seeded stream."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < draws:
        size = min(CHUNK, draws - done)
        yield stationary_bootstrap(n, size, mean_block, rng)
        done += size


def _mean_std(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = x[idx]
    return s.mean(1), s.std(1, ddof=1)


def _interval(values: np.ndarray, level: float) -> list[float]:
    lo, hi = np.quantile(values, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return [float(lo), float(hi)]


def sharpe_ci(
    r: np.ndarray | Sequence[float],
    ppy: float,
    rf: float = 0.0,
    draws: int = 2000,
    block: float = 0,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval at ``level`` of :func:`sharpe` over ``draws`` stationary-bootstrap
    resamples of the bars (Efron & Tibshirani 1993, ch. 13; resampling as
    :func:`stationary_bootstrap`), mean block ``block`` or, for 0, :func:`auto_block_length`
    of the excess returns. ``(0.0, 0.0)`` for fewer than 2 bars."""
    if not 0 < level < 1:
        raise ValueError(f"level={level} must lie in (0, 1)")
    x = excess(r, rf)
    if x.size < 2 or draws < 1:
        return (0.0, 0.0)
    b = block if block > 0 else auto_block_length(x)
    out = [_ratio(*_mean_std(x, idx), ppy) for idx in _resamples(x.size, draws, b, seed)]
    lo, hi = _interval(np.concatenate(out), level)
    return (lo, hi)


def paired_difference(
    r_a: np.ndarray | Sequence[float],
    r_b: np.ndarray | Sequence[float],
    ppy: float,
    draws: int = 2000,
    block: float = 0,
    seed: int = 0,
) -> dict[str, float | list[float]]:
    """Strategy ``a`` against ``b`` on the same bars: ``d_t = expm1(r_a,t) - expm1(r_b,t)``.

    Returns ``annual_return = mean(d) ppy``, ``information_ratio = mean(d) / std(d, ddof=1)
    sqrt(ppy)`` (0 for a zero spread), their 95% percentile intervals and ``p_positive``, the
    fraction of resamples with ``mean(d) > 0``. Both intervals come from the same
    stationary-bootstrap resamples of the bars (paired: a bar's two returns move together),
    mean block ``block`` or, for 0, :func:`auto_block_length` of ``d``.
    """
    a, b = _as_1d(r_a), _as_1d(r_b)
    if a.shape != b.shape:
        raise ValueError(f"r_a {a.shape} and r_b {b.shape} must cover the same bars")
    d = np.expm1(a) - np.expm1(b)
    n = d.size
    if n < 2 or draws < 1:
        mean = float(d.mean()) if n else 0.0
        return {"annual_return": mean * ppy, "annual_return_ci95": [0.0, 0.0],
                "information_ratio": 0.0, "information_ratio_ci95": [0.0, 0.0],
                "p_positive": 0.0}  # fmt: skip
    mb = block if block > 0 else auto_block_length(d)
    means, ratios = [], []
    for idx in _resamples(n, draws, mb, seed):
        m, s = _mean_std(d, idx)
        means.append(m)
        ratios.append(_ratio(m, s, ppy))
    mean_bs, ratio_bs = np.concatenate(means), np.concatenate(ratios)
    return {
        "annual_return": float(d.mean() * ppy),
        "annual_return_ci95": [v * ppy for v in _interval(mean_bs, 0.95)],
        "information_ratio": float(_ratio(d.mean(), d.std(ddof=1), ppy)),
        "information_ratio_ci95": _interval(ratio_bs, 0.95),
        "p_positive": float((mean_bs > 0).mean()),
    }


def breakeven_bps(
    r_agent: np.ndarray | Sequence[float],
    turnover_agent: np.ndarray | Sequence[float],
    r_base: np.ndarray | Sequence[float],
    turnover_base: np.ndarray | Sequence[float],
    cost_bps: float,
) -> float | None:
    """The cost ``c*`` in bp per unit of turnover (all in) at which the agent's mean net log
    return equals the baseline's, both having been charged ``cost_bps``.

    The charge is linear in log returns (:func:`.execution.step_log_return`): ``gross_t =
    net_t + c tau_t`` with ``c = cost_bps 1e-4``, so at cost ``x`` the mean net return is
    ``mean(gross) - x mean(tau)`` and

        c* = (mean(gross_agent) - mean(gross_base)) / (mean(tau_agent) - mean(tau_base)) / 1e-4.

    None when the mean turnovers are equal (the costs never separate the two). When the agent
    trades more (the usual case) it beats the baseline below ``c*``, and a negative ``c*``
    means it loses even at zero cost; when it trades less, it beats the baseline above
    ``c*``. (Ruin bars, whose reward is floored, break the linearity; they are rare.)
    """
    tau_a, tau_b = _as_1d(turnover_agent).mean(), _as_1d(turnover_base).mean()
    dtau = float(tau_a - tau_b)
    if abs(dtau) <= ZERO_STD:
        return None
    c = cost_bps * 1e-4
    gross_a = _as_1d(r_agent).mean() + c * tau_a
    gross_b = _as_1d(r_base).mean() + c * tau_b
    return float((gross_a - gross_b) / dtau / 1e-4)


def _json(v: float | None) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def window_stats(
    r: np.ndarray | Sequence[float],
    weights: np.ndarray,
    ppy: float,
    rf: float = 0.0,
    draws: int = 2000,
    block: float = 0,
    seed: int = 0,
) -> dict[str, float | int | list[float | None] | None]:
    """Every statistic of this module for one series ``r [L]`` held with ``weights [L, A]``
    (row ``t`` the weights chosen at decision ``t``, earning ``r_t``), JSON-friendly: floats
    or None, never NaN or infinity. ``hit_rate`` is the fraction of bars with ``r > 0``
    among those holding a position (``sum |w| > 0``), None when none does."""
    x, w = _as_1d(r), _as_weights(weights)
    if w.shape[0] != x.size:
        raise ValueError(f"r has {x.size} bars, weights {w.shape[0]}")
    holding = np.abs(w).sum(1) > 0
    lo, hi = sharpe_ci(x, ppy, rf, draws, block, seed)
    return {
        "sharpe": _json(sharpe(x, ppy, rf)),
        "sharpe_ci95": [_json(lo), _json(hi)],
        "sortino": _json(sortino(x, ppy, rf)),
        "calmar": _json(calmar(x, ppy)),
        "total_return": _json(total_return(x)),
        "annual_return": _json(annual_return(x, ppy)),
        "max_drawdown": _json(max_drawdown(x)),
        "turnover": _json(turnover(w)),
        "exposure": _json(exposure(w)),
        "hit_rate": _json(float((x[holding] > 0).mean())) if holding.any() else None,
        "n_days": int(x.size),
    }


def deflated_sharpe(
    best_sharpe_per_bar: float,
    sharpes_per_bar_of_trials: np.ndarray | Sequence[float],
    n_obs: int,
    skew: float,
    kurtosis: float,
) -> float:
    """Bailey & López de Prado (2014), "The Deflated Sharpe Ratio: Correcting for Selection
    Bias, Backtest Overfitting and Non-Normality", JPM 40(5): the probability that the best
    of ``N`` trials has a true Sharpe ratio above the expected maximum of ``N`` unskilled ones.

    With per-bar (not annualised) Sharpe ratios, ``Z`` the standard normal CDF, ``gamma`` the
    Euler-Mascheroni constant and ``V`` the sample variance (ddof=1) of the trials' Sharpe
    ratios, the expected maximum under the null (the paper's SR_0) and the DSR are

        SR_0 = sqrt(V) ((1 - gamma) Z^-1[1 - 1/N] + gamma Z^-1[1 - 1/(N e)]),
        DSR  = Z[(SR - SR_0) sqrt(T - 1) / sqrt(1 - skew SR + (kurtosis - 1) / 4 SR^2)],

    with ``T = n_obs`` bars of the best trial and ``skew``, ``kurtosis`` (not excess: 3 for
    a normal) of its returns. With a single trial there is no selection: ``SR_0 = 0`` and
    the DSR is the probabilistic Sharpe ratio against 0.
    """
    trials = _as_1d(sharpes_per_bar_of_trials)
    n_trials = trials.size
    if n_trials < 1 or n_obs < 2:
        raise ValueError(f"need >= 1 trial and n_obs >= 2, got {n_trials} and {n_obs}")
    z = NormalDist()
    sr0 = 0.0
    if n_trials > 1:
        expected_max = (1.0 - EULER_GAMMA) * z.inv_cdf(1.0 - 1.0 / n_trials)
        expected_max += EULER_GAMMA * z.inv_cdf(1.0 - 1.0 / (n_trials * math.e))
        sr0 = math.sqrt(float(trials.var(ddof=1))) * expected_max
    sr = float(best_sharpe_per_bar)
    var = 1.0 - skew * sr + (kurtosis - 1.0) / 4.0 * sr**2
    if var <= 0.0:
        raise ValueError(f"1 - skew SR + (kurtosis - 1) / 4 SR^2 = {var} <= 0: check the moments")
    return z.cdf((sr - sr0) * math.sqrt(n_obs - 1) / math.sqrt(var))
