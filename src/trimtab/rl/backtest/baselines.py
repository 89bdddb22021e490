"""The simple strategies every agent is compared with, and their P&L through the env's formula.

A baseline is a table of target levels ``[L, A]`` over the decision bars ``start .. end - 1``
(values from the env's ``levels``, weight ``w = level / A``); :func:`simulate` fills and
charges it with :func:`.execution.step_log_return` exactly as the env fills and charges an
agent, so the two are compared at the same prices and costs.

Index convention: ``log_returns [T, A]`` are close-to-close, row ``t`` the move from close
``t - 1`` to close ``t`` (row 0 = 0). Decision ``i`` is taken on the close of bar ``t = start
+ i`` and may use rows ``<= t`` only (no look-ahead); it is filled against bar ``t + 1``, so
the :class:`.execution.Fills` given to :func:`simulate` are ``fills.slice(start + 1, end + 1)``:
its row ``i`` is the bar that decision ``i`` is filled against. Of the levels, ``long =
max(levels)``, ``short = min(levels)`` and ``flat`` is the level nearest 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trimtab.rl.backtest.execution import Costs, Fills, ruined, step_log_return

__all__ = ["LEVELS", "Simulated", "buy_and_hold", "flat", "ma_crossover", "momentum",
           "oracle_levels", "random_levels", "reversal", "simulate"]  # fmt: skip

LEVELS: tuple[float, ...] = (-1.0, 0.0, 1.0)
#: Two moving averages closer than this fraction of the slow one are a tie (flat): cumulative
#: sums round at ~1e-16 relative, so an unchanged price must not read as a crossing.
MA_TIE = 1e-12


def _sides(levels: Sequence[float]) -> tuple[float, float, float]:
    """``(short, flat, long)``: the lowest level, the one nearest 0, the highest."""
    lv = [float(x) for x in levels]
    if not lv:
        raise ValueError("levels must be non-empty")
    return min(lv), min(lv, key=abs), max(lv)


def _window(log_returns: np.ndarray, start: int, end: int | None) -> tuple[np.ndarray, int, int]:
    r = np.asarray(log_returns, np.float64)
    if r.ndim != 2:
        raise ValueError(f"need log_returns [T, A], got shape {r.shape}")
    end = r.shape[0] - 1 if end is None else end
    if not 0 <= start <= end <= r.shape[0] - 1:
        raise ValueError(
            f"need 0 <= start <= end <= T - 1 = {r.shape[0] - 1} (bar end - 1's decision is "
            f"filled against bar end), got start={start}, end={end}"
        )
    return r, start, end


def _by_sign(signal: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """``long`` where ``signal > 0``, ``short`` where ``< 0``, ``flat`` where 0."""
    short, flat_, long = _sides(levels)
    return np.where(signal > 0, long, np.where(signal < 0, short, flat_))


def buy_and_hold(
    log_returns: np.ndarray,
    *,
    start: int = 0,
    end: int | None = None,
    levels: Sequence[float] = LEVELS,
) -> np.ndarray:
    """``long`` in every asset on every decision bar: the equal-weight book, ``[L, A]``."""
    r, start, end = _window(log_returns, start, end)
    return np.full((end - start, r.shape[1]), _sides(levels)[2])


def flat(
    log_returns: np.ndarray,
    *,
    start: int = 0,
    end: int | None = None,
    levels: Sequence[float] = LEVELS,
) -> np.ndarray:
    """``flat`` everywhere: cash, which earns the cash rate and nothing else, ``[L, A]``."""
    r, start, end = _window(log_returns, start, end)
    return np.full((end - start, r.shape[1]), _sides(levels)[1])


def momentum(
    log_returns: np.ndarray,
    k: int,
    *,
    start: int = 0,
    end: int | None = None,
    levels: Sequence[float] = LEVELS,
) -> np.ndarray:
    """Time-series momentum (Moskowitz, Ooi & Pedersen 2012, JFE 104(2)): at decision bar
    ``t`` the sign of ``r_{t-k+1} + ... + r_t`` (rows before 0 are absent), long if > 0,
    short if < 0, flat if 0, per asset ``[L, A]``."""
    if k < 1:
        raise ValueError(f"need k >= 1, got {k}")
    r, start, end = _window(log_returns, start, end)
    c = np.vstack([np.zeros((1, r.shape[1])), np.cumsum(r, axis=0)])  # c[t + 1] = sum r_0..r_t
    t = np.arange(start, end)
    return _by_sign(c[t + 1] - c[np.maximum(t + 1 - k, 0)], levels)


def reversal(
    log_returns: np.ndarray,
    *,
    start: int = 0,
    end: int | None = None,
    levels: Sequence[float] = LEVELS,
) -> np.ndarray:
    """Short-term reversal (Lehmann 1990, QJE 105(1)): against the move of decision bar
    ``t``, short if ``r_t > 0``, long if ``r_t < 0``, flat if 0, ``[L, A]``."""
    r, start, end = _window(log_returns, start, end)
    return _by_sign(-r[start:end], levels)


def ma_crossover(
    log_returns: np.ndarray,
    fast: int,
    slow: int,
    *,
    start: int = 0,
    end: int | None = None,
    levels: Sequence[float] = LEVELS,
) -> np.ndarray:
    """Moving-average crossover (Brock, Lakonishok & LeBaron 1992, JF 47(5)), ``[L, A]``.

    With the close ``P_t = exp(r_0 + ... + r_t)`` and ``MA_n(t)`` the mean of ``P`` over bars
    ``max(0, t - n + 1) .. t`` (so bars before ``start`` serve the look-back, and the first
    bars of the data average what there is): long where ``MA_fast(t) > MA_slow(t)``, short
    where below, flat where they agree to ``MA_TIE`` (relative).
    """
    if not 1 <= fast < slow:
        raise ValueError(f"need 1 <= fast < slow, got fast={fast}, slow={slow}")
    r, start, end = _window(log_returns, start, end)
    price = np.exp(np.cumsum(r, axis=0))
    q = np.vstack([np.zeros((1, r.shape[1])), np.cumsum(price, axis=0)])
    t = np.arange(start, end)

    def average(n: int) -> np.ndarray:
        first = np.maximum(t + 1 - n, 0)
        return (q[t + 1] - q[first]) / (t + 1 - first)[:, None]

    ma_fast, ma_slow = average(fast), average(slow)
    gap = ma_fast - ma_slow
    return _by_sign(np.where(np.abs(gap) <= MA_TIE * ma_slow, 0.0, gap), levels)


def random_levels(
    turnover_target: float,
    n_draws: int,
    seed: int,
    levels: Sequence[float],
    n_bars: int,
    n_assets: int,
) -> np.ndarray:
    """``n_draws`` random books ``[n_draws, L, A]`` with the agent's turnover, blind to returns.

    Each asset's first level is uniform over ``levels``; on each later bar it is re-drawn
    uniformly (possibly to the same level) with probability ``p``. With ``w = l / A``, the
    expected turnover (``sum_a |dw|``, from flat) is ``E|l|`` on the first bar and ``p D``
    after it, ``D = E|l - l'|`` over two independent uniform levels, so

        p = (L tau - E|l|) / ((L - 1) D)

    makes the expected mean turnover over the ``L`` bars equal ``tau = turnover_target``;
    ``p`` is clipped to ``[0, 1]`` where ``tau`` cannot be reached.
    """
    lv = np.asarray([float(x) for x in levels])
    if lv.size == 0 or n_bars < 0 or n_assets < 1 or n_draws < 0:
        raise ValueError("need levels, n_bars >= 0, n_assets >= 1 and n_draws >= 0")
    mean_abs = float(np.abs(lv).mean())
    spread = float(np.abs(lv[:, None] - lv[None, :]).mean())
    p = 0.0
    if n_bars > 1 and spread > 0:
        p = (n_bars * turnover_target - mean_abs) / ((n_bars - 1) * spread)
        p = min(max(p, 0.0), 1.0)
    rng = np.random.default_rng(seed)
    shape = (n_draws, n_bars, n_assets)
    drawn = rng.integers(0, lv.size, size=shape)
    redraw = rng.random(shape) < p
    redraw[:, :1] = True
    # hold the level of the last bar that re-drew (forward fill along the bars)
    bars = np.arange(n_bars)[None, :, None]
    last = np.maximum.accumulate(np.where(redraw, bars, 0), axis=1)
    return lv[np.take_along_axis(drawn, last, axis=1)]


def oracle_levels(
    edge: np.ndarray, levels: Sequence[float], cost_per_turnover: float
) -> np.ndarray:
    """The regime oracle's levels ``[L, A]``, chosen greedily bar by bar and asset by asset.

    ``edge[i, a]`` is the expected simple return that a position taken at decision ``i`` in
    asset ``a`` earns (e.g. :meth:`trimtab.rl.data.synthetic.MarketSpec.expected_return`). Per unit
    of weight (``w = l / A`` scales both terms alike) the oracle picks

        l_i = argmax_l  l edge_i - c |l - l_{i-1}|,    l_{-1} = 0 (from flat),

    ``c = cost_per_turnover`` (a fraction per unit of turnover), ties going to the smaller
    trade, then to the level nearest 0: an edge below the cost of moving does not trade.
    """
    e = np.asarray(edge, np.float64)
    if e.ndim != 2:
        raise ValueError(f"need edge [L, A], got shape {e.shape}")
    lv = np.asarray([float(x) for x in levels])
    out = np.zeros_like(e)
    prev = np.zeros(e.shape[1])
    for i in range(e.shape[0]):
        move = np.abs(lv[None, :] - prev[:, None])  # [A, K]
        score = lv[None, :] * e[i][:, None] - cost_per_turnover * move
        best = score == score.max(1, keepdims=True)
        move = np.where(best, move, np.inf)
        best &= move == move.min(1, keepdims=True)
        size = np.where(best, np.abs(lv)[None, :], np.inf)
        prev = lv[np.argmin(size, axis=1)]
        out[i] = prev
    return out


@dataclass(frozen=True, eq=False)
class Simulated:
    """The P&L of ``N`` level tables over the same ``L`` decisions (see :func:`simulate`)."""

    log_returns: np.ndarray  # [N, L] net log return of the bar each decision is filled against
    weights: np.ndarray  # [N, L, A] weights chosen at each decision (0 after ruin)
    turnover: np.ndarray  # [N, L] sum_a |w_i - w_{i-1}|, from flat before decision 0
    ruin: np.ndarray  # [N] the first ruined decision index, -1 if none


def simulate(levels: np.ndarray, fills: Fills, costs: Costs) -> Simulated:
    """Fill and charge level tables as :func:`trimtab.rl.envs.trading.evaluate` fills an agent.

    ``levels [N, L, A]`` (or ``[L, A]``, taken as ``N = 1``; level values, not indices) are
    the targets of decisions ``i = 0 .. L - 1``; ``fills`` has ``L`` rows, row ``i`` the bar
    that decision ``i`` is filled against (``fills.slice(start + 1, end + 1)`` of the full
    fills; see the module docstring). Decision ``i`` moves from ``l_{i-1}`` (flat before
    ``i = 0``) to ``l_i`` and earns :func:`.execution.step_log_return` of row ``i`` (CPU,
    float64). The first decision whose bar is :func:`.execution.ruined` keeps its (floored)
    return and weights; every later one holds nothing and earns nothing, and turnover is
    taken from the weights held (as :class:`trimtab.rl.envs.trading.Evaluation` records it).
    """
    lv = np.asarray(levels, np.float64)
    if lv.ndim == 2:
        lv = lv[None]
    if lv.ndim != 3 or lv.shape[1:] != fills.pre.shape:
        raise ValueError(
            f"levels {np.shape(levels)} must be [N, L, A] (or [L, A]) with [L, A] = fills' "
            f"{fills.pre.shape} (row i: the bar decision i is filled against)"
        )
    n_assets = lv.shape[2]
    new = torch.as_tensor(lv)
    old = torch.cat([torch.zeros_like(new[:, :1]), new[:, :-1]], dim=1)
    # every decision's old and new levels are known in advance: all bars in one call
    pre = torch.expm1(torch.as_tensor(fills.pre))
    post = torch.expm1(torch.as_tensor(fills.post))
    reward = step_log_return(new, old, pre, post, costs, fills.overnight_old).numpy()
    dead = ruined(new, old, pre, post).numpy()  # [N, L]
    hit = dead.any(1)
    ruin = np.where(hit, dead.argmax(1), -1)
    bars = np.arange(lv.shape[1])[None, :]
    alive = ~hit[:, None] | (bars <= ruin[:, None])
    log_returns = np.where(alive, reward, 0.0)
    weights = np.where(alive[..., None], lv / n_assets, 0.0)
    turnover = np.abs(np.diff(weights, axis=1, prepend=0.0)).sum(2)
    return Simulated(log_returns, weights, turnover, ruin.astype(np.int64))
