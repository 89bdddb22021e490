"""Fills and costs: what a decision taken on the close of bar t earns, and what it pays.

One formula serves the training env (:class:`trimtab.rl.envs.trading.BatchedTradingEnv`), its greedy
evaluation and every baseline (:mod:`trimtab.rl.backtest.baselines`), so an agent and the
strategies it is compared with are filled at the same prices and charged the same costs.

Bar ``t+1``'s close-to-close log return ``r = log(C_{t+1} / C_t)`` (adjusted close) is split at
the open into an overnight part ``g = r - i`` and an intraday part ``i = log(C_{t+1} / O_{t+1})``
(unadjusted open and close of the same bar: their ratio needs no adjustment). A decision on
the close of bar ``t`` moves the weights from ``w'`` (held) to ``w`` (chosen). Over bar
``t+1`` the position earns ``pre`` with the old weights and ``post`` with the new ones:

    ==========  ===================  =====  =====  =========================================
    execution   filled at            pre    post   in words
    ==========  ===================  =====  =====  =========================================
    next_open   open of bar t+1      g      i      default: the overnight move is missed
    next_close  close of bar t+1     r      0      a whole bar late
    same_close  close of bar t       0      r      optimistic: the close that was just seen
    ==========  ===================  =====  =====  =========================================

and the step's net log return is (``R = e^x - 1`` simple returns, ``A`` assets, ``w = l / A``)

    log(1 + sum_a w'_a R^pre_a) + log(1 + sum_a w_a R^post_a)
        + log(1 + f_cash (1 - sum_a v_a) - f_borrow sum_a max(-v_a, 0))
        - c sum_a |w_a - w'_a|,

with ``c`` = commission + half-spread per unit of turnover, ``f`` the annual cash rate and
borrow fee per bar (``/ periods_per_year``) and ``v`` the weights held over the night after
the decision (``w'`` where the fill comes later, ``w`` for ``same_close``): cash, long and
short, earns the cash rate, short proceeds included, and a short pays its borrow fee.
A growth factor at or below ``RUIN_EQUITY`` is ruin (the portfolio lost everything).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "BPS",
    "EXECUTIONS",
    "RUIN_EQUITY",
    "Costs",
    "Execution",
    "Fills",
    "fill_returns",
    "ruined",
    "step_log_return",
    "step_reward_parts",
]

BPS = 1e-4
Execution = Literal["next_open", "next_close", "same_close"]
EXECUTIONS: tuple[str, ...] = ("next_open", "next_close", "same_close")
#: executions that fill at a price nobody could trade at: every table labels them
OPTIMISTIC = ("same_close",)

#: Ruin: a bar that ends with equity at or below this fraction of its starting equity (a
#: numerical floor, not a tuned bound: float32's resolution of 1, i.e. nothing is left). A
#: portfolio cannot lose more than everything, so a simple return below -100% (a short position
#: through a bar of +A x 100% for A assets) is ruin, with the finite reward log(RUIN_EQUITY).
RUIN_EQUITY = float(torch.finfo(torch.float32).eps)


@dataclass(frozen=True)
class Costs:
    """What trading and holding cost, in a practitioner's units.

    ``commission_bps`` and ``half_spread_bps`` are paid per unit of turnover (``sum |dw|``,
    a full round trip of the whole book is 2 units); ``borrow_pct`` is the annual fee on short
    notional, ``cash_pct`` the annual rate cash earns (and the risk-free rate of every Sharpe
    ratio); both accrue per bar as ``pct / 100 / periods_per_year``.
    """

    commission_bps: float = 0.0
    half_spread_bps: float = 0.0
    borrow_pct: float = 0.0
    cash_pct: float = 0.0
    periods_per_year: float = 252.0

    def __post_init__(self) -> None:
        for name in ("commission_bps", "half_spread_bps", "borrow_pct", "cash_pct"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}={v} must be a finite number >= 0")
        if not (math.isfinite(self.periods_per_year) and self.periods_per_year > 0):
            raise ValueError(f"periods_per_year={self.periods_per_year} must be finite and > 0")

    @property
    def turnover_bps(self) -> float:
        """Commission plus half-spread: the cost of one unit of turnover, in bp."""
        return self.commission_bps + self.half_spread_bps

    @property
    def per_turnover(self) -> float:
        """The cost of one unit of turnover as a fraction (a log-return charge)."""
        return self.turnover_bps * BPS

    @property
    def cash_per_bar(self) -> float:
        return self.cash_pct / 100.0 / self.periods_per_year

    @property
    def borrow_per_bar(self) -> float:
        return self.borrow_pct / 100.0 / self.periods_per_year

    @property
    def has_carry(self) -> bool:
        """Whether holding costs or earns anything (a cash or a borrow rate per bar): the carry
        term is computed only then."""
        return bool(self.cash_per_bar or self.borrow_per_bar)

    def with_turnover_bps(self, bps: float) -> Costs:
        """The same costs with ``bps`` all in per unit of turnover (as commission)."""
        return Costs(bps, 0.0, self.borrow_pct, self.cash_pct, self.periods_per_year)


@dataclass(frozen=True, eq=False)
class Fills:
    """Per bar ``t``, the log returns ``[T, A]`` that the weights held before (``pre``) and
    after (``post``) the fill of the decision taken on bar ``t - 1`` earn; row 0 is 0."""

    pre: np.ndarray
    post: np.ndarray
    execution: str

    def __post_init__(self) -> None:
        if self.execution not in EXECUTIONS:
            raise ValueError(f"execution={self.execution!r} must be one of {list(EXECUTIONS)}")
        pre, post = np.asarray(self.pre, np.float64), np.asarray(self.post, np.float64)
        if pre.shape != post.shape or pre.ndim != 2:
            raise ValueError(f"pre {pre.shape} and post {post.shape} must be one [T, A] shape")
        object.__setattr__(self, "pre", pre)
        object.__setattr__(self, "post", post)

    @property
    def overnight_old(self) -> bool:
        """Whether the old weights are held over the night after a decision (financing)."""
        return self.execution != "same_close"

    @property
    def log_returns(self) -> np.ndarray:
        """``pre + post``: the close-to-close log return of each bar."""
        return self.pre + self.post

    def slice(self, start: int | None, end: int | None) -> Fills:
        s = slice(start, end)
        return Fills(self.pre[s], self.post[s], self.execution)

    @classmethod
    def same_close(cls, log_returns: np.ndarray) -> Fills:
        """Fills at the close just seen, of close-to-close ``log_returns [T, A]``."""
        r = np.asarray(log_returns, np.float64)
        return cls(np.zeros_like(r), r, "same_close")


def fill_returns(
    log_returns: np.ndarray, open_: np.ndarray, close: np.ndarray, execution: str
) -> Fills:
    """The :class:`Fills` of bars with close-to-close ``log_returns [T, A]`` (from the adjusted
    close; row 0 is 0) and unadjusted ``open_`` and ``close`` ``[T, A]`` (see the module
    docstring's table)."""
    r = np.asarray(log_returns, np.float64)
    if execution == "same_close":
        return Fills.same_close(r)
    if execution == "next_close":
        return Fills(r, np.zeros_like(r), execution)
    if execution != "next_open":
        raise ValueError(f"execution={execution!r} must be one of {list(EXECUTIONS)}")
    intraday = np.log(np.asarray(close, np.float64) / np.asarray(open_, np.float64))
    intraday[0] = 0.0  # row 0 earns nothing: no decision precedes it
    return Fills(r - intraday, intraday, execution)


def step_log_return(
    new_pos: Tensor,
    old_pos: Tensor,
    pre: Tensor,
    post: Tensor,
    costs: Costs,
    overnight_old: bool,
) -> Tensor:
    """The net log return of one step over the last axis (assets): target levels ``new_pos``
    and ``old_pos`` (weights ``level / A``), *simple* returns ``pre`` and ``post`` of the bar
    (see the module docstring). Finite for every finite input (ruin: :func:`ruined`)."""
    n_assets = new_pos.shape[-1]
    w, w_old = new_pos / n_assets, old_pos / n_assets
    floor = RUIN_EQUITY - 1.0
    gross = torch.log1p((w_old * pre).sum(-1).clamp_min(floor))
    gross = gross + torch.log1p((w * post).sum(-1).clamp_min(floor))
    held = w_old if overnight_old else w
    if costs.has_carry:
        carry = costs.cash_per_bar * (1.0 - held.sum(-1))
        carry = carry - costs.borrow_per_bar * (-held).clamp_min(0.0).sum(-1)
        gross = gross + torch.log1p(carry)
    return gross - costs.per_turnover * (w - w_old).abs().sum(-1)


def step_reward_parts(
    new_pos: Tensor,
    old_pos: Tensor,
    pre: Tensor,
    post: Tensor,
    costs: Costs,
    overnight_old: bool,
) -> Tensor:
    """Each asset's share of one step's net log return ``[..., A]``: what asset ``a``'s own
    position earned and paid over the bar, term by term as :func:`step_log_return` writes the
    portfolio's,

        log(1 + w'_a R^pre_a) + log(1 + w_a R^post_a)
            + log(1 + f_cash (1/A - v_a) - f_borrow max(-v_a, 0)) - c |w_a - w'_a|,

    each growth factor floored at ``RUIN_EQUITY`` as there, so a part is finite and of the
    portfolio reward's magnitude for every finite input (a bad tick included). Their sum is the
    portfolio's net log return to first order in the weights. A per-asset action branch learns
    from its own asset's part instead of the whole portfolio's return, in which the other
    assets' moves are noise to it (reward decomposition: van Seijen et al. 2017, *Hybrid Reward
    Architecture*; the branches of Tavakoli et al. 2018 share one reward)."""
    n_assets = new_pos.shape[-1]
    w, w_old = new_pos / n_assets, old_pos / n_assets
    floor = RUIN_EQUITY - 1.0
    parts = torch.log1p((w_old * pre).clamp_min(floor)) + torch.log1p((w * post).clamp_min(floor))
    if costs.has_carry:
        held = w_old if overnight_old else w
        carry = costs.cash_per_bar * (1.0 / n_assets - held)
        parts = parts + torch.log1p(carry - costs.borrow_per_bar * (-held).clamp_min(0.0))
    return parts - costs.per_turnover * (w - w_old).abs()


def ruined(new_pos: Tensor, old_pos: Tensor, pre: Tensor, post: Tensor) -> Tensor:
    """Where a part of the bar leaves at most ``RUIN_EQUITY`` of the equity (the portfolio
    cannot lose more than everything; the episode ends there)."""
    n_assets = new_pos.shape[-1]
    floor = RUIN_EQUITY - 1.0
    before = (old_pos / n_assets * pre).sum(-1) <= floor
    return before | ((new_pos / n_assets * post).sum(-1) <= floor)
