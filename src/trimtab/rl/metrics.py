"""Per-window performance metrics of daily net log returns, and the baselines to compare with.

Inputs are what ``env.evaluate`` returns: net daily log returns ``[L]`` and weights ``[L, A]``
held over those days. Conventions are stated once here and used everywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

TRADING_DAYS = 252
BPS = 1e-4  # one basis point, as in trimtab.rl.env (not imported: metrics needs no torch)


def sharpe(log_returns: np.ndarray, periods_per_year: int = TRADING_DAYS) -> float:
    """Annualised Sharpe ratio: ``mean(R) / std(R, ddof=1) * sqrt(252)`` of daily *simple*
    returns ``R = exp(r) - 1``, with zero risk-free rate; 0 when fewer than 2 days or std 0."""
    simple = np.expm1(np.asarray(log_returns, dtype=np.float64))
    if simple.size < 2:
        return 0.0
    sd = simple.std(ddof=1)
    return float(simple.mean() / sd * np.sqrt(periods_per_year)) if sd > 0 else 0.0


def total_return(log_returns: np.ndarray) -> float:
    """Compounded return of the window: ``exp(sum r) - 1``."""
    return float(np.expm1(np.sum(log_returns, dtype=np.float64)))


def max_drawdown(log_returns: np.ndarray) -> float:
    """Largest fall of the equity curve from a previous peak, as a positive fraction.

    The curve starts at 1 before the first day, so a loss on day one counts.
    """
    log_equity = np.concatenate([[0.0], np.cumsum(np.asarray(log_returns, dtype=np.float64))])
    return float(-np.expm1(np.min(log_equity - np.maximum.accumulate(log_equity))))


def turnover(weights: np.ndarray) -> float:
    """Mean daily ``sum_a |w_t - w_{t-1}|``, starting from flat (the entry counts)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape[0] == 0:
        return 0.0
    prev = np.vstack([np.zeros((1, w.shape[1])), w[:-1]])
    return float(np.abs(w - prev).sum(1).mean())


def hit_rate(log_returns: np.ndarray, weights: np.ndarray) -> float:
    """Fraction of days with a positive return among days holding a nonzero position (0 if none)."""
    active = np.any(np.asarray(weights) != 0, axis=1)
    if not active.any():
        return 0.0
    return float(np.mean(np.asarray(log_returns)[active] > 0))


@dataclass(frozen=True)
class WindowMetrics:
    """The metrics of one evaluation window (see each function for its convention)."""

    sharpe: float
    total_return: float
    max_drawdown: float
    turnover: float
    hit_rate: float
    n_days: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def window_metrics(
    log_returns: np.ndarray, weights: np.ndarray, daily_turnover: np.ndarray | None = None
) -> WindowMetrics:
    """All metrics of a window; ``daily_turnover`` overrides the one derived from ``weights``
    (buy & hold's weights drift without trading)."""
    r = np.asarray(log_returns, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape[0] != r.shape[0]:
        raise ValueError(f"{r.shape[0]} returns but {w.shape[0]} rows of weights")
    if daily_turnover is None:
        to = turnover(w)
    else:
        to = float(np.mean(daily_turnover)) if r.size else 0.0
    return WindowMetrics(sharpe(r), total_return(r), max_drawdown(r), to, hit_rate(r, w), r.size)


@dataclass(frozen=True, eq=False)
class Baseline:
    """A fixed strategy's daily net log returns ``[L]``, weights ``[L, A]``, turnover ``[L]``."""

    log_returns: np.ndarray
    weights: np.ndarray
    turnover: np.ndarray

    def metrics(self) -> WindowMetrics:
        return window_metrics(self.log_returns, self.weights, self.turnover)


def buy_and_hold(
    asset_log_returns: np.ndarray, cost_bps: float = 0.0, rebalance: bool = False
) -> Baseline:
    """Equal-weight long portfolio over assets' log returns ``[L, A]`` of the window.

    Pass ``Evaluation.asset_log_returns`` to compare with an agent over the same days.

    ``rebalance=False``: buy ``1/A`` of each asset on day one and hold (weights drift).
    ``rebalance=True``: weights reset to ``1/A`` daily, which is exactly the env's
    always-long action. Both pay ``cost_bps`` on the entry only (the env charges no cost to
    keep a constant target weight).
    """
    r = np.asarray(asset_log_returns, dtype=np.float64)
    n_days, n_assets = r.shape
    to = np.zeros(n_days)
    if n_days:
        to[0] = 1.0
    if rebalance:
        weights = np.full((n_days, n_assets), 1.0 / n_assets)
        daily = np.log1p(np.expm1(r).mean(1))
    else:
        growth = np.exp(np.cumsum(r, axis=0))  # value of each 1/A stake, relative
        before = np.vstack([np.ones((1, n_assets)), growth[:-1]])
        weights = before / before.sum(1, keepdims=True)
        daily = np.diff(np.log(np.concatenate([[1.0], growth.mean(1)])))
    return Baseline(daily - cost_bps * BPS * to, weights, to)


def flat(n_days: int, n_assets: int) -> Baseline:
    """Never trade: zero return, zero weights, zero turnover."""
    return Baseline(np.zeros(n_days), np.zeros((n_days, n_assets)), np.zeros(n_days))
