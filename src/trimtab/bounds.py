"""Adaptive bounds: the design's central loop (measure -> fold -> slot -> clamp -> engagement
feedback) written once, for any number of named bounds, so no user wires it by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from trimtab._cadence import Cadence
from trimtab._headroom import check_headroom
from trimtab._impl import resolve_impl
from trimtab.clamp import clamp_finite_, clamped_reference, guard_, reference_bound
from trimtab.engagement import EngagementCorrection
from trimtab.estimate import AdaptiveEMA
from trimtab.lifecycle import detached, register
from trimtab.quantile import abs_quantile
from trimtab.sentinel import Rule, Sentinel
from trimtab.state import Slot, StateVector

__all__ = ["AdaptiveBounds", "BoundClamp"]

#: Cold-start floor of a bound as a consumer reads it (a numerical constant, design invariant
#: 3): before the first measurement, or when every value measured is exactly 0, a support or a
#: clamp reads 1e-3 rather than a collapsed 0. It goes on the slot value, never on a bound.
DEFAULT_FLOOR = 1e-3


class AdaptiveBounds:
    r"""``N`` named magnitude bounds, each measured online and read from a state-vector slot.

    Per bound ``b`` and training step ``t``:

    1. **measure** ``x`` before any clamp: ``y_t = Q_q(|x|)`` (the exact ``q``-quantile of the
       finite ``|x|``, :func:`trimtab.abs_quantile`), the largest finite ``M_t = max |x|`` and the
       count ``n_t``;
    2. **clamp** ``x`` (the sentinel checks it first, in the same pass: invariant 4) at
       ``h · B_t``, ``B_t = max(s_(t-1), floor)`` the slot as it stands (a slot that is unset,
       a fold's first step, reads this step's ``y_t``) and ``h >= 1`` the ``headroom``;
       ``k_t`` counts the finite elements with ``|x| > B_t``, the quantile estimate's
       exceedances, whatever ``h`` is;
    3. **fold**, once per step for every bound measured in it: the engagement test
       (:class:`~trimtab.EngagementCorrection`; ``k_t ~ Binomial(n_t, 1 - q)`` while the slot
       is the true quantile) raises a stale ``y_t`` toward ``M_t``, and an
       :class:`~trimtab.AdaptiveEMA` folds it on a log scale into the slot,
       ``s_t = exp(EMA(log y'_t))``, its first observation after a reset replacing the value.

    **Headroom.** With ``h = 1`` the clamp is the quantile itself and cuts ``1 - q`` of what it
    sees on every step: a constant change to the model, not a guard. With ``h > 1`` it binds
    only on values ``h`` times past the measured quantile (an excursion), while the test still
    counts exceedances of the quantile, so it keeps its meaning (a stale *estimate*, at the
    rate ``1 - q`` it expects); :meth:`engaged_rates` reports the clamp's own engagements.

    **Cadence.** ``measure_every = k`` measures on steps ``0, k, 2k, ...`` of those counted by
    :meth:`fold` since the last reset (a host count: choosing costs nothing): on the others
    :meth:`measure` returns at once and :meth:`fold` folds nothing, while :meth:`clamp_`
    checks and clamps at the bound in force on every step. The statistics then cost ``1/k`` of
    theirs per step, and the bound follows a change of scale ``k`` times fewer steps behind;
    a captured CUDA graph replays one step, so capture with ``k = 1``.

    A bound not measured in a step keeps its slot and statistics. Everything is computed on the
    device (no host sync; CUDA-graph capturable once warmed up). The object owns its slots (in
    ``state``, or a state vector of its own), its estimator, its engagement correction and its
    step counts, and with a ``sentinel`` one guarded slot per bound (fed by :meth:`clamp_`, firing
    on NaN/±Inf or on ``max|x| > excursion × slot``, added in ``phase``; ``add_slots=False``
    when the caller adds those slots itself, with source None), and registers one
    reset with the active :class:`~trimtab.Lifecycle`: at a fold boundary all of them are
    forgotten together.

    Example::

        bounds = trimtab.AdaptiveBounds(["act"], device="cuda", sentinel=sentinel)
        z = layer(x)
        bounds.measure("act", z)          # p99 |z| of this step, before the clamp
        bounds.clamp_("act", z)           # check into sentinel slot "act", then clamp in place
        ...
        optimizer.step()
        bounds.fold()                     # every bound measured this step, once
    """

    def __init__(
        self,
        names: Sequence[str],
        *,
        q: float = 0.99,
        floor: float = DEFAULT_FLOOR,
        headroom: float = 1.0,
        state: StateVector | None = None,
        device: torch.device | str | None = None,
        sentinel: Sentinel | None = None,
        excursion: float = 1e3,
        phase: str = "forward",
        add_slots: bool = True,
        name: str = "bounds",
        measure_every: int = 1,
    ) -> None:
        names = tuple(names)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"AdaptiveBounds needs unique bound names, got {list(names)}")
        if not 0.0 < q < 1.0:
            raise ValueError(f"q={q} must be in (0, 1): a clamp at it engages on 1 - q")
        if not (math.isfinite(floor) and floor > 0):
            raise ValueError(f"floor={floor} must be a finite number > 0")
        headroom = check_headroom(headroom, "headroom", "clamp")
        self.names, self.q, self.floor, self.name = names, float(q), float(floor), name
        self.headroom = headroom
        #: which steps measure (:meth:`fold` counts them); :attr:`measuring` on the due ones
        self.cadence = Cadence(measure_every, f"AdaptiveBounds({name!r})")
        self._measured = False  # a measure() this step (host): fold() has work
        self.sentinel = sentinel
        if state is None:
            state = StateVector(self.slots(names), device=device)
        self.state = state
        offsets = []
        for n in names:
            slot = self.slot_name(n)
            if slot not in state:
                raise KeyError(
                    f"the state vector has no slot {slot!r}; declare the bounds' slots with "
                    f"AdaptiveBounds.slots({list(names)}) in its layout"
                )
            offsets.append(state.index(slot))
        start = offsets[0][0]
        if any(o != (start + i, 1) for i, o in enumerate(offsets)):
            raise ValueError(
                f"the slots of {list(names)} must be consecutive size-1 slots of the state "
                "vector; declare them with *AdaptiveBounds.slots(names) in that order"
            )
        self.device = dev = state.tensor.device
        #: the slots' values, one view of the state vector (written by :meth:`fold`)
        self.values = state.tensor[start : start + len(names)]
        n = len(names)
        with detached():  # one registration below resets them all together
            self.ema = AdaptiveEMA(n, device=dev)
            self.engagement = EngagementCorrection(n, expected_rate=1.0 - q, device=dev)
        self._index = {b: i for i, b in enumerate(names)}
        self._obs = torch.full((n,), math.nan, device=dev)  # this step's y_t (NaN: unmeasured)
        self._max = torch.zeros(n, device=dev)  # this step's M_t
        # A step's counts per bound, one tensor (one fill clears them): n_t; the clamp's engaged
        # and non-finite counts (adjacent: the clamp kernel's counter pair); k_t, the quantile's
        # exceedances, the clamp's own count when the clamp is the quantile.
        self._ints = torch.zeros(n, 4, dtype=torch.int64, device=dev)
        self._seen = self._ints[:, 0]
        self._counts = self._ints[:, 1:3]
        self._above = self._ints[:, 1] if headroom == 1.0 else self._ints[:, 3]
        # (seen, engaged) since the last engaged_rates(): the first two columns' running sums
        # (the state dict keeps them as (engaged, seen))
        self._log = torch.zeros(n, 2, dtype=torch.int64, device=dev)
        self._floor = torch.full((), self.floor, device=dev)
        #: Every bound's readings, one row each (:data:`trimtab.kernels.bounds.ROWS`: bound,
        #: read, clamp, neg_read), derived from the slots and the step's measurements where
        #: either changes (:meth:`_derive`: a measure, a fold, a reset, a load, a write through
        #: the state vector's methods), so a read is a view, not five ops.
        self._rows = torch.empty(4, n, dtype=self.values.dtype, device=dev)
        fits = self.values.dtype == torch.float32 == self._obs.dtype
        why = f"AdaptiveBounds: the kernel derives float32 bounds, not {self.values.dtype}"
        # chosen once: the device and the dtypes are fixed
        self._derive_impl = resolve_impl(None, [self.values], fits=fits, why=why)
        #: On the CPU, the clamp row as the clamp's torch reference reads it, with the rows'
        #: version it was derived at (:meth:`_prepared`)
        self._prepared_memo: tuple[int, Tensor] | None = None
        self._derive()
        state.on_write(self._derive)
        #: Test hook: called as ``fault_hook(bound, x)`` right before a counted clamp checks
        #: ``x`` (fault-injection tests write a NaN there); None in normal use.
        self.fault_hook: Callable[[str, Tensor], None] | None = None
        #: Rank-consistent mode (:class:`trimtab.distributed.RankConsistent`): called first in
        #: :meth:`fold`, it refuses to fold measurements not reduced over the ranks; None alone.
        self.before_fold: Callable[[], None] | None = None
        if sentinel is not None and add_slots:  # the rule reads the slot when the check runs
            for i, b in enumerate(names):
                rule = Rule.above(self.values[i : i + 1], factor=excursion, name=self.slot_name(b))
                sentinel.add(b, None, rule, phase=phase)
        register(
            self,
            "reset",
            name=name,
            what=f"unset bounds {list(names)}; forget their estimator, engagement and counts",
        )

    # --- layout ------------------------------------------------------------------------------
    @staticmethod
    def slot_name(bound: str) -> str:
        return f"{bound}_bound"

    @classmethod
    def slots(cls, names: Sequence[str]) -> list[Slot]:
        """The state-vector slots of ``names``, to declare (consecutively) in a layout."""
        return [Slot(cls.slot_name(n), doc=f"measured |{n}| bound (AdaptiveBounds)") for n in names]

    def _i(self, bound: str) -> int:
        try:
            return self._index[bound]
        except KeyError:
            raise KeyError(f"no bound {bound!r}; this object has {list(self.names)}") from None

    # --- the step ------------------------------------------------------------------------------
    @property
    def measuring(self) -> bool:
        """Whether this step measures (``measure_every``'s cadence; always with 1)."""
        return self.cadence.due

    @torch.no_grad()
    def measure(self, bound: str, x: Tensor) -> None:
        """Record this step's ``q``-quantile, largest finite value and count of ``|x|`` for
        ``bound`` (call it before any clamp of ``x``; a second call in a step replaces the
        first). Nothing on a step that :attr:`measuring` says does not measure."""
        i = self._i(bound)
        if not self.cadence.due:
            return
        self._measured = True
        self._obs[i] = abs_quantile(x, self.q)
        self._derive()  # an unset slot reads this measurement
        flat = x.detach().reshape(-1).float().abs().nan_to_num_(0.0, 0.0, 0.0)
        if flat.numel():
            torch.amax(flat, 0, out=self._max[i])
        else:
            self._max[i].zero_()
        self._seen[i].fill_(x.numel())  # fill_: a kernel argument, not a host copy
        if self.headroom != 1.0:  # the clamp is not the quantile: count its exceedances here
            torch.sum(flat > self._rows[0, i], 0, out=self._above[i])

    def bound(self, bound: str) -> Tensor:
        """The bound a consumer reads now: ``max(slot, floor)``, the slot read as this step's
        measurement while it is unset; NaN (clamp nothing) when neither exists yet. A view of
        the derived rows: it follows the bound as the step goes on (clone it to keep it)."""
        return self._rows[0, self._i(bound)]

    def read(self, bound: str) -> Tensor:
        """:meth:`bound`, reading the floor instead of NaN (for a support, which cannot be
        undefined). A view, as :meth:`bound`."""
        return self._rows[1, self._i(bound)]

    def support(self, bound: str) -> tuple[Tensor, Tensor]:
        """``(-read, read)`` of ``bound`` as it stands now: one copy, kept as it is when the
        bound moves later in the step (a support spread into atoms must stay that support)."""
        i = self._i(bound)
        pair = self._rows[1::2, i].clone()  # rows read, neg_read
        return pair[1], pair[0]

    def clamp_bound(self, bound: str) -> Tensor:
        """Where :meth:`clamp_` binds: ``headroom`` × :meth:`bound` (NaN: clamp nothing). A
        view, as :meth:`bound`."""
        return self._rows[2, self._i(bound)]

    def _derive(self) -> None:
        """Refresh the read rows from the slots and the step's measurements: one launch on
        CUDA (:func:`trimtab.kernels.bounds.derive_triton`), its torch reference elsewhere."""
        if self._derive_impl == "triton":
            from trimtab.kernels.bounds import derive_triton

            derive_triton(self.values, self._obs, self._rows, self.floor, self.headroom)
        else:
            _derive_reference(self.values, self._obs, self._rows, self._floor, self.headroom)

    def _prepared(self, i: int) -> Tensor | None:
        """On the CPU, bound ``i``'s clamp as the clamp's torch reference reads it
        (:func:`trimtab.clamp.reference_bound`), derived once for every bound and again only
        after the rows change (their version counter: every write to them is :meth:`_derive`'s):
        a clamp then costs its passes over ``x``, not five more ops on its bound. None
        elsewhere (a kernel reads the row itself, and a captured CUDA graph may hold the
        read), and for rows made in inference mode (no version counter)."""
        if self.device.type != "cpu" or self._rows.is_inference():
            return None
        memo, version = self._prepared_memo, self._rows._version
        if memo is None or memo[0] != version:
            memo = self._prepared_memo = (version, reference_bound(self._rows[2]))
        return memo[1][i]

    @torch.no_grad()
    def clamped(self, bound: str, x: Tensor) -> Tensor:
        """A clamped copy of ``x`` at :meth:`clamp_bound`, neither counted nor checked:
        ``clamp_(bound, x.clone(), count=False)``, bitwise, without the clone on the CPU."""
        i = self._i(bound)
        prepared = self._prepared(i)
        if prepared is None:
            return clamp_finite_(x.detach().clone(), self._rows[2, i : i + 1])
        return clamped_reference(x.detach(), prepared)

    @torch.no_grad()
    def clamp_(self, bound: str, x: Tensor, *, count: bool = True) -> Tensor:
        """In place: check ``x`` into the sentinel slot ``bound`` (when this object has a
        sentinel), then replace NaN/±Inf by 0 and clamp to ``±clamp_bound``. ``count=True`` counts
        the clamp's engagements (the measured tensor; at ``headroom`` 1 they are also the test's
        exceedances); ``False`` applies the bound without counting or checking (another forward
        of the same step). Returns ``x``."""
        i = self._i(bound)
        b = self._rows[2, i : i + 1]
        prepared = self._prepared(i)
        if not count:
            return clamp_finite_(x, b, prepared=prepared)
        counts = self._counts[i]
        if self.fault_hook is not None:
            self.fault_hook(bound, x)
        if self.sentinel is not None:
            guard_(x, b, self.sentinel, bound, counts, prepared=prepared)
        else:
            clamp_finite_(x, b, counts, prepared=prepared)
        return x

    @torch.no_grad()
    def fold(self) -> Tensor:
        """End of step: test engagement and fold every bound measured this step into its slot
        (one estimator update for all of them), then clear the step's records and count the
        step (the cadence). A step that measured nothing folds nothing (the estimator would
        leave every slot as it is): it clears the clamps' counts. Returns the slots' values."""
        if self.before_fold is not None:
            self.before_fold()
        self.cadence.take()
        if not self._measured and self.before_fold is None:
            self._ints.zero_()  # an unmeasured step's engagements are not logged
            return self.values
        self._measured = False
        took = self._obs == self._obs  # measured this step (an unmeasured y_t is NaN)
        self._log.add_(torch.where(took[:, None], self._ints[:, :2], 0))
        self.engagement.observe(self._above, self._seen, self._max, took)
        new = self.engagement.fold(self.ema, self._obs.nan_to_num(0.0), took)
        torch.where(took, new, self.values, out=self.values)
        self._clear_step()
        self._derive()
        return self.values

    def _clear_step(self) -> None:
        self._obs.fill_(math.nan)
        self._max.zero_()
        self._ints.zero_()

    def engaged_rates(self) -> Tensor:
        """Per bound, the fraction of measured elements clamped since the last call (float64,
        NaN where nothing was measured); clears the tally."""
        rates = self._log[:, 1].double() / self._log[:, 0].double()
        self._log.zero_()
        return rates

    # --- lifecycle and checkpoints -------------------------------------------------------------
    def reset(self) -> None:
        """Unset the slots and forget the estimator, the engagement state and the step counts."""
        self.values.fill_(math.nan)
        self.ema.reset()
        self.engagement.reset()
        self._clear_step()
        self._log.zero_()
        self.cadence.reset()
        self._measured = False
        self._derive()

    def state_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "values": self.values.clone(),
            "ema": self.ema.state_dict(),
            "engagement": self.engagement.state_dict(),
            "log": self._log.flip(1),  # (engaged, seen)
            "cadence": self.cadence.state_dict(),  # steps since the reset
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["names"]) != list(self.names):
            raise ValueError(
                f"saved bounds {state['names']} do not match this object's {list(self.names)}"
            )
        self.values.copy_(state["values"])
        self.ema.load_state_dict(state["ema"])
        self.engagement.load_state_dict(state["engagement"])
        self._log.copy_(state["log"].flip(1))
        self.cadence.load(state.get("cadence"))
        self._derive()

    def __repr__(self) -> str:
        return (
            f"AdaptiveBounds({list(self.names)}, q={self.q}, floor={self.floor}, "
            f"headroom={self.headroom}, measure_every={self.cadence.every}, {self.device})"
        )


def _derive_reference(
    values: Tensor, obs: Tensor, out: Tensor, floor: Tensor, headroom: float
) -> None:
    """:func:`trimtab.kernels.bounds.derive_triton` in torch (its oracle, the CPU path);
    ``floor`` a 0-dim tensor."""
    v = torch.where(torch.isnan(values), obs, values)
    torch.maximum(v, floor, out=out[0])  # maximum keeps a NaN, max(v, floor) otherwise
    torch.fmax(out[0], floor, out=out[1])
    torch.mul(out[0], headroom, out=out[2])
    torch.neg(out[1], out=out[3])


class BoundClamp(nn.Module):
    """A layer that bounds activations with one of an :class:`AdaptiveBounds`' bounds.

    In a forward that will be back-propagated (grad enabled, input requiring grad) it measures
    its input, checks it and clamps it, counting engagements; in any other forward (acting,
    next-state and target-network passes) it applies the bound as it stands, without measuring,
    counting or checking, so every record belongs to the training forward. The gradient is
    ``clamp``'s: passed where a value was kept, zero where it was clamped or replaced. Runs in
    full precision under autocast (the input keeps its dtype).
    """

    def __init__(self, bounds: AdaptiveBounds, bound: str) -> None:
        super().__init__()
        bounds._i(bound)
        self.bounds, self.bound = bounds, bound

    def forward(self, h: Tensor) -> Tensor:
        if not (torch.is_grad_enabled() and h.requires_grad):
            # not back-propagated (acting, next-state, target passes): the bound as it stands,
            # on a copy, with no autograd node (what _BoundClampFn does here, less its cost)
            return self.bounds.clamped(self.bound, h)
        with torch.autocast(h.device.type, enabled=False):
            return _BoundClampFn.apply(h, self.bounds, self.bound)

    def extra_repr(self) -> str:
        return f"bound={self.bound!r}"


class _BoundClampFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: Tensor, bounds: AdaptiveBounds, bound: str) -> Tensor:
        y = h.detach().clone()
        training = h.requires_grad
        if training:
            bounds.measure(bound, y)
        bounds.clamp_(bound, y, count=training)
        if training:  # what backward reads; a forward that is not back-propagated needs none
            ctx.save_for_backward(y == h)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (kept,) = ctx.saved_tensors
        return grad * kept, None, None
