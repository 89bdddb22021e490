"""The sentinel: named check points whose sticky, on-device flags say which buffer went
non-finite (or above a measured bound) first, at which step, without a host sync per step.

Rules and reports live here; the device bookkeeping and torch reference, in
:mod:`trimtab.sentinel_state`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from trimtab._impl import IMPLS, resolve_impl
from trimtab.lifecycle import register
from trimtab.sentinel_state import (
    KIND_NAMES,
    SUPPORTED_DTYPES,
    SentinelState,
    check_reference,
)

__all__ = ["DEFAULT_PHASE", "Firing", "NonFiniteError", "Rule", "Sentinel"]

#: The phase of a slot added without one.
DEFAULT_PHASE = "step"

Source = torch.Tensor | Callable[[], torch.Tensor | None] | None


class NonFiniteError(RuntimeError):
    """A sentinel slot fired; ``firings`` lists every fired slot in order of first firing."""

    def __init__(self, message: str, firings: list[Firing]) -> None:
        super().__init__(message)
        self.firings = firings


@dataclass(frozen=True, eq=False)
class Rule:
    """When a slot fires. Build with :meth:`nonfinite` or :meth:`above`.

    ``nonfinite``: any NaN or ±Inf. ``above``: any NaN or ±Inf, or ``max|x| > threshold * factor``
    where ``threshold`` is a float or a 1-element float32 device tensor (a state-vector slot view)
    that the check reads *when it runs*, so a bound updated between checks is honoured. An unset
    (NaN) threshold never fires the bound part (``|x| > NaN`` is False); non-finite still fires.
    ``power`` 2: ``max|x| > (threshold * factor)²``, for a tensor in squared units checked
    against a bound in the units of its root (Adam's ``v`` against a bound on the gradient).
    """

    kind: Literal["nonfinite", "above"]
    threshold: torch.Tensor | float = math.nan
    factor: float = 1.0
    name: str = ""
    power: int = 1

    @classmethod
    def nonfinite(cls) -> Rule:
        """Fire on NaN or ±Inf (the default rule)."""
        return cls("nonfinite")

    @classmethod
    def above(
        cls,
        threshold: torch.Tensor | float,
        *,
        factor: float = 1.0,
        name: str | None = None,
        power: int = 1,
    ) -> Rule:
        """Fire on non-finite values or on ``max|x| > (threshold * factor) ** power``.

        ``factor`` is the named multiple of the measured bound that counts as an excursion
        (e.g. ``factor=4.0`` on a p99 slot: four times the running p99). ``name`` labels the
        threshold in reports (e.g. the state-vector slot's name). ``power`` is 1, or 2 for a
        tensor of squares (no square root of the tensor is taken: the threshold is squared,
        in float64).
        """
        if isinstance(threshold, torch.Tensor):
            if threshold.dtype != torch.float32:
                raise TypeError(
                    f"Rule.above: a threshold tensor must be float32 (a state-vector slot), "
                    f"got {threshold.dtype}"
                )
            if threshold.numel() != 1:
                raise ValueError(
                    f"Rule.above: a threshold tensor must hold one element, got shape "
                    f"{tuple(threshold.shape)}; pass sv.view(name) of a size-1 slot"
                )
            label = name or "tensor"
        elif isinstance(threshold, (int, float)) and not isinstance(threshold, bool):
            if threshold < 0:
                raise ValueError(f"Rule.above: threshold must be >= 0 (or NaN), got {threshold}")
            threshold = float(threshold)
            label = name or repr(threshold)
        else:
            raise TypeError(
                f"Rule.above: threshold must be a float or a float32 tensor, "
                f"got {type(threshold).__name__}"
            )
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"Rule.above: factor must be a float, got {type(factor).__name__}")
        if not (math.isfinite(factor) and factor >= 0):
            raise ValueError(f"Rule.above: factor must be finite and >= 0, got {factor}")
        if type(power) is not int or power not in (1, 2):
            raise ValueError(f"Rule.above: power must be 1 or 2, got {power!r}")
        return cls("above", threshold, float(factor), label, power)

    def describe(self) -> str:
        if self.kind == "nonfinite":
            return "non-finite"
        if self.power == 2:
            return f"non-finite or |x| > ({self.factor:g} * {self.name})²"
        return f"non-finite or |x| > {self.factor:g} * {self.name}"


@dataclass(frozen=True)
class Firing:
    """One fired slot: its first firing's step, kind (``nan``/``inf``/``threshold``) and max |x|.

    ``step`` counts the checks of ``phase`` made before the firing one (0-based), or for a slot
    fed by :func:`trimtab.guard_`, the earlier guard_ calls on it. ``value`` is max |x| at that
    moment: NaN when any element was NaN, Inf when any was infinite, else the finite maximum.
    ``rank``: the process that fired first, under :class:`trimtab.distributed.RankConsistent`
    (None in a one-process run).
    """

    name: str
    phase: str
    step: int
    kind: str
    value: float
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.rank is None:
            del d["rank"]
        if not math.isfinite(self.value):  # strict JSON has no NaN/Infinity
            d["value"] = str(self.value)
        return d


@dataclass
class _Slot:
    name: str
    source: Source
    rule: Rule
    phase: str
    index: int


class Sentinel:
    """Named check points with sticky, on-device first-fire records.

    For each slot ``i`` a check computes ``m_i = max|x_i|`` (NaN if any element is NaN) and fires
    when ``m_i`` is NaN or Inf, or ``m_i > t_i * f_i`` for a threshold rule. The first firing of a
    slot records ``(s, step, kind, m_i)`` where ``s`` numbers the checks (all phases, and guard_
    calls) since the last :meth:`reset`, so :meth:`report` orders slots by the check that first
    saw them fire (ties: order of :meth:`add`). Everything stays on the device; ``check`` is one
    launch for all slots of a phase (one program per ``CHECK_BLOCK`` elements, a last-program
    reduction per slot), makes no host sync and can be captured in a CUDA graph after one warm-up
    call with the same buffers. Idea: the per-tensor ``found_inf`` of
    ``torch.amp.GradScaler``, made sticky, named and phase-aware.

    ``device=None``: the device of the first tensor the sentinel sees. ``impl``: ``None`` = the
    kernel for CUDA tensors, the reference when one of them is not contiguous; ``"torch"`` or
    ``"triton"`` force one (``"triton"`` on the CPU needs ``TRITON_INTERPRET=1``). Checks and
    guard_ calls of one sentinel must run on one stream at a time (they share per-slot arrival
    counters and scratch).
    """

    def __init__(self, device: torch.device | str | None = None, *, impl: str | None = None):
        if impl is not None and impl not in IMPLS:
            raise ValueError(f"impl must be None, 'torch' or 'triton', got {impl!r}")
        self._state = SentinelState(torch.device(device) if device is not None else None)
        self._impl = impl
        self._slots: dict[str, _Slot] = {}
        self._checked: dict[str | None, list[_Slot]] = {}  # per phase, cleared by add()
        #: Per slot, the rank whose record it holds (int64 device tensor; -1: a record not
        #: merged yet), written by :class:`trimtab.distributed.RankConsistent` when it merges
        #: the ranks' records.
        self.ranks: torch.Tensor | None = None
        #: :meth:`peek`'s pinned copy of the flag and the event recorded after it (made at its
        #: first call on CUDA), and whether a copy is on its way
        self._peek_copy: tuple[torch.Tensor, torch.cuda.Event] | None = None
        self._peek_pending = False
        register(self, "reset", name="sentinel", what="clear first-fire records and step counters")

    # --- building ----------------------------------------------------------------------------
    def add(
        self,
        name: str,
        tensor_or_callable: Source,
        rule: Rule | None = None,
        phase: str = DEFAULT_PHASE,
    ) -> None:
        """Add slot ``name`` checking a tensor, or ``callable()`` at each check (e.g.
        ``lambda: p.grad``; a None result skips the slot for that check), or ``None`` for a slot
        fed only by :func:`trimtab.guard_`. ``rule`` defaults to :meth:`Rule.nonfinite`.

        Add every slot before capturing a CUDA graph: adding one reallocates the device state.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"slot name must be a non-empty str, got {name!r}")
        if name in self._slots:
            raise ValueError(f"the sentinel already has a slot named {name!r}; names are unique")
        if not isinstance(phase, str) or not phase:
            raise TypeError(f"phase must be a non-empty str, got {phase!r}")
        rule = Rule.nonfinite() if rule is None else rule
        if not isinstance(rule, Rule):
            raise TypeError(
                f"rule must be a Rule (Rule.nonfinite() or Rule.above(...)), got "
                f"{type(rule).__name__}"
            )
        src = tensor_or_callable
        if isinstance(src, torch.Tensor):
            self._validate_tensor(name, src)
        elif src is not None and not callable(src):
            raise TypeError(
                f"slot {name!r}: expected a tensor, a callable returning one, or None, "
                f"got {type(src).__name__}"
            )
        if isinstance(rule.threshold, torch.Tensor):
            self._state.adopt_device(rule.threshold.device, f"slot {name!r} threshold")
        self._slots[name] = _Slot(name, src, rule, phase, len(self._slots))
        self._checked.clear()
        self._state.add_slot(rule.threshold, rule.factor, phase, rule.power)

    def _validate_tensor(self, name: str, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"slot {name!r}: its callable returned {type(t).__name__}, not a tensor"
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"slot {name!r}: dtype {t.dtype} is not checked; supported: "
                f"{[str(d) for d in SUPPORTED_DTYPES]}"
            )
        self._state.adopt_device(t.device, f"slot {name!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._slots)

    @property
    def phases(self) -> tuple[str, ...]:
        return tuple(self._state.phases)

    # --- checking ----------------------------------------------------------------------------
    def check(self, phase: str | None = None) -> None:
        """Check every slot of ``phase`` (every slot when None) in one launch; no host sync.

        Advances the step counter of ``phase`` (of every phase when None) and the global check
        counter, even when every slot was skipped.
        """
        if phase is not None and phase not in self._state.phases:
            raise ValueError(
                f"unknown phase {phase!r}; this sentinel's phases are {list(self._state.phases)}"
            )
        slots = self._checked.get(phase)
        if slots is None:  # the slots a check of this phase reads, listed once per layout
            slots = self._checked[phase] = [
                s for s in self._slots.values()
                if s.source is not None and (phase is None or s.phase == phase)
            ]  # fmt: skip
        tensors: list[torch.Tensor] = []
        ids: list[int] = []
        device = self._state.device
        for s in slots:
            t = s.source if isinstance(s.source, torch.Tensor) else s.source()
            if t is None:
                continue
            # the common case in one test; _validate_tensor names what is wrong, or adopts
            # the first device the sentinel sees
            if not (
                isinstance(t, torch.Tensor) and t.dtype in SUPPORTED_DTYPES and t.device == device
            ):
                self._validate_tensor(s.name, t)
                device = self._state.device
            tensors.append(t)  # read without autograd (the reference under no_grad, the kernel)
            ids.append(s.index)

        # The kernel reads contiguous tensors only (the reference reads any layout): asked only
        # where the kernel would otherwise run, the strided slot named only where it does not.
        # The tensors are all on the sentinel's device (checked above): the first stands for
        # them all.
        def why() -> str:
            strided = [self.names[i] for t, i in zip(tensors, ids) if not t.is_contiguous()]
            return (
                f"Sentinel.check: slot {(strided or [''])[0]!r}: the kernel reads contiguous "
                "tensors only (pass a contiguous tensor, or use Sentinel(impl='torch'))"
            )

        impl = resolve_impl(
            self._impl,
            tensors[:1],
            fits=lambda: all(t.is_contiguous() for t in tensors),
            why=why,
        )
        state = self._state.materialize()
        launch = self._state.launch(phase, ids, [t.dtype for t in tensors])
        if not tensors:
            state["counters"].add_(launch.inc)
        elif impl == "triton":
            from trimtab.kernels.sentinel import launch_check

            launch_check(tensors, launch.entry_slot, launch.entry_code, launch.inc, state)
        else:
            check_reference(tensors, launch, state, self._state.thresholds(ids))

    def _guard_target(self, name: str, x: torch.Tensor) -> int:
        """The slot index ``guard_`` records ``x`` into (validated; used by trimtab.clamp)."""
        slot = self._slots.get(name)
        if slot is None:
            raise KeyError(f"the sentinel has no slot named {name!r}; add(name, None) it first")
        if slot.source is not None:
            raise ValueError(
                f"slot {name!r} is checked by check() (it has a tensor or callable); guard_ needs "
                "its own slot, added with add(name, None, ...)"
            )
        self._validate_tensor(name, x)
        return slot.index

    # --- reading -----------------------------------------------------------------------------
    def fired(self) -> torch.Tensor:
        """A 0-dim device bool: has any slot fired since the last reset (no sync)."""
        return self._state.fired()

    def peek(self) -> bool:
        """:meth:`fired` read without waiting for the device: a loop's cheap "stop?" question.

        On a CUDA device each call queues a copy of the flag into pinned host memory behind
        the work queued so far on the current stream, and answers from the copy an earlier
        call queued, once the device has made it (False until then; a call that finds its copy
        not made yet queues none). A fire is seen one call late or later, never lost: a loop
        that halts on it reads :meth:`fired` or :meth:`report` before it ends or saves. On the
        CPU: :meth:`fired`, read now (nothing to wait for). A :meth:`reset` forgets a copy
        still on its way."""
        flag = self.fired()
        if flag.device.type != "cuda":
            return bool(flag)
        if self._peek_copy is None:
            pinned = torch.zeros((), dtype=torch.bool, pin_memory=True)
            self._peek_copy = (pinned, torch.cuda.Event())
        pinned, made = self._peek_copy
        seen = False
        if self._peek_pending and made.query():
            seen, self._peek_pending = bool(pinned), False
        if not self._peek_pending:
            pinned.copy_(flag, non_blocking=True)
            made.record()
            self._peek_pending = True
        return seen

    def report(self) -> list[Firing]:
        """The fired slots in order of first firing (syncs: reads the records to the host)."""
        records = self._state.records()
        slots = list(self._slots.values())
        ranks = None if self.ranks is None else self.ranks.cpu().tolist()
        out = []
        for _, index, step, kind, value in sorted(records, key=lambda r: r[:2]):
            s = slots[index]
            rank = None if ranks is None or ranks[index] < 0 else ranks[index]
            out.append(Firing(s.name, s.phase, step, KIND_NAMES[kind], value, rank))
        return out

    def steps(self) -> dict[str, int]:
        """Checks made per phase since the last reset (syncs)."""
        return self._state.steps()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: the firings, the per-phase steps, the slots and their rules."""
        return {
            "fired": [f.to_dict() for f in self.report()],
            "steps": self.steps(),
            "slots": [
                {"name": s.name, "phase": s.phase, "rule": s.rule.describe()}
                for s in self._slots.values()
            ],
        }

    def raise_if_fired(self) -> None:
        """Raise :class:`NonFiniteError` naming the first slot to fire, if any did (syncs)."""
        firings = self.report()
        if not firings:
            return
        f = firings[0]
        others = ", ".join(f"{g.name} ({g.phase}, step {g.step}, {g.kind})" for g in firings[1:])
        where = "" if f.rank is None else f" on rank {f.rank}"
        raise NonFiniteError(
            f"sentinel slot {f.name!r} fired first{where}: phase {f.phase!r}, step {f.step}, "
            f"kind {f.kind} (max |x| = {f.value:g})"
            + (f"; also fired later: {others}" if others else "")
            + ". Call reset() to clear the flags and continue.",
            firings,
        )

    def reset(self) -> None:
        """Clear every record and step counter (a fold boundary); no sync, capturable."""
        self._state.reset()
        if self.ranks is not None:
            self.ranks.fill_(-1)
        self._peek_pending = False  # a copy of the flag before the reset is not a fire

    #: The device tensors that hold what the sentinel has seen (the rest is its wiring).
    _RECORDS = ("rec", "value", "counters", "guard_steps")

    def state_dict(self) -> dict[str, Any]:
        """First-fire records and step counters, with the slot and phase names they index (so
        a resumed run reports the steps an uninterrupted one would)."""
        t = self._state.materialize()
        out: dict[str, Any] = {"names": list(self.names), "phases": list(self.phases)}
        out.update({k: t[k].clone() for k in self._RECORDS})
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["names"] != list(self.names) or state["phases"] != list(self.phases):
            raise ValueError(
                "sentinel state was saved with other slots or phases; build the sentinel with "
                "the slots of the run that saved it"
            )
        t = self._state.materialize()
        for k in self._RECORDS:
            t[k].copy_(state[k])

    def __repr__(self) -> str:
        return f"Sentinel({len(self._slots)} slots, phases={list(self._state.phases)})"
