"""The state vector: every adaptive quantity of a run in one named slot of one device tensor.

The layout is declared once; its fingerprint travels with checkpoints so that a state saved under
one layout can never be loaded into another by accident.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from trimtab.lifecycle import register

__all__ = ["UNSET", "LayoutMismatchError", "Slot", "StateVector"]

#: The value of a slot that no producer has written since construction or its last reset.
#: NaN is chosen because it is inert where it matters: ``torch.fmax(slot, floor)`` returns the
#: cold-start floor, a threshold comparison ``|x| > NaN`` is False (a sentinel never fires on an
#: unset bound), and an estimator can tell "unset" from any measured value.
UNSET = float("nan")

ResetPolicy = Literal["unset", "keep"]
_POLICIES = ("unset", "keep")
_EVENTS = ("fold",)

#: Bumped whenever the meaning of a layout changes in a way that names and sizes do not show.
LAYOUT_VERSION = 1


class LayoutMismatchError(ValueError):
    """A state saved under one slot layout was loaded into a state vector of another."""


@dataclass(frozen=True)
class Slot:
    """One named slot: ``size`` float32 values that a fold boundary unsets or keeps.

    ``size`` is 1 for a scalar bound, or a small count such as one value per parameter group or
    per action branch. ``doc`` says what the slot holds, for reports.
    """

    name: str
    size: int = 1
    reset: ResetPolicy = "unset"
    doc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(
                f"slot name must be a Python identifier (letters, digits, '_'), got {self.name!r}"
            )
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"slot {self.name!r}: size must be an int >= 1, got {self.size!r}")
        if self.reset not in _POLICIES:
            raise ValueError(
                f"slot {self.name!r}: reset must be one of {_POLICIES}, got {self.reset!r}"
            )


class StateVector:
    """Named adaptive slots stored in one float32 tensor on one device.

    Reading a slot (``sv["name"]`` or :meth:`view`) returns a view into :attr:`tensor`, never a
    Python float, so producers write into it and consumers read it without a host sync. Kernels
    address a slot by :meth:`index`. Every slot starts :data:`UNSET` (NaN).

    Example::

        sv = StateVector([Slot("target_bound"), Slot("weight_bound", size=3)], device="cuda")
        sv["target_bound"].copy_(torch.tensor(2.5))
        bound = sv.read("target_bound", floor=1e-3)   # fmax(slot, floor): the floor when unset
    """

    def __init__(self, slots: Iterable[Slot], device: torch.device | str | None = None) -> None:
        self.slots: tuple[Slot, ...] = tuple(slots)
        for s in self.slots:
            if not isinstance(s, Slot):
                raise TypeError(f"StateVector takes Slot objects, got {type(s).__name__}")
        names = [s.name for s in self.slots]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"slot names must be unique; repeated: {dupes}")
        self._index: dict[str, tuple[int, int]] = {}
        offset = 0
        for s in self.slots:
            self._index[s.name] = (offset, s.size)
            offset += s.size
        self.tensor = torch.full((offset,), UNSET, dtype=torch.float32, device=device)
        self._unset_mask = torch.tensor(
            [s.reset == "unset" for s in self.slots for _ in range(s.size)],
            dtype=torch.bool,
            device=self.tensor.device,
        )
        self._watchers: list[weakref.WeakMethod | Callable[[], None]] = []
        unset = [s.name for s in self.slots if s.reset == "unset"]
        kept = [s.name for s in self.slots if s.reset == "keep"]
        register(
            self,
            "reset",
            name=f"state_vector[{self.fingerprint}]",
            what=f"unset slots {unset}; keep {kept}",
        )

    # --- layout ---------------------------------------------------------------------------
    @property
    def layout(self) -> list[dict[str, Any]]:
        """The layout as plain data: one dict per slot, in storage order."""
        return [asdict(s) for s in self.slots]

    @property
    def fingerprint(self) -> str:
        """A stable hash of (version, names, sizes, reset policies, order): 16 hex digits.

        ``doc`` strings are not part of it: rewording a description keeps checkpoints loadable.
        """
        return _fingerprint(self.layout)

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    def index(self, name: str) -> tuple[int, int]:
        """``(offset, size)`` of slot ``name`` in :attr:`tensor`, for kernels."""
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(
                f"no slot named {name!r} in this state vector; slots are {list(self.names)}"
            ) from None

    # --- access ---------------------------------------------------------------------------
    def view(self, name: str) -> torch.Tensor:
        """Slot ``name`` as a view of :attr:`tensor`: 0-dim for size 1, else shape ``[size]``."""
        offset, size = self.index(name)
        if size == 1:
            return self.tensor[offset]
        return self.tensor[offset : offset + size]

    __getitem__ = view

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def read(self, name: str, floor: float | torch.Tensor | None = None) -> torch.Tensor:
        """The slot as a consumer reads it: ``fmax(slot, floor)``.

        The cold-start floor goes on the slot value (design invariant 3), and ``fmax`` makes an
        unset (NaN) slot read as the floor. With ``floor=None`` this is :meth:`view`.
        """
        v = self.view(name)
        if floor is None:
            return v
        if not isinstance(floor, torch.Tensor):
            floors = self.__dict__.setdefault("_floors", {})
            key = (float(floor), v.dtype)
            if key not in floors:  # filled on the device once (no host copy), then reused
                floors[key] = torch.full((), float(floor), dtype=v.dtype, device=v.device)
            floor = floors[key]
        return torch.fmax(v, floor)

    def is_set(self, name: str) -> torch.Tensor:
        """A device bool tensor: which values of the slot a producer has written."""
        return ~torch.isnan(self.view(name))

    def write_(self, name: str, value: torch.Tensor | float) -> None:
        """Copy ``value`` into slot ``name`` (broadcast to its size) without a host sync."""
        v = self.view(name)
        if isinstance(value, torch.Tensor):
            v.copy_(value.to(device=v.device, dtype=v.dtype).expand_as(v))
        else:
            v.fill_(float(value))
        self._wrote()

    def on_write(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` after every write through this object's methods (:meth:`write_`,
        :meth:`reset`, :meth:`load_state_dict`): what keeps values derived from slots (the read
        rows of :class:`~trimtab.AdaptiveBounds`) refreshes them there. A bound method is held
        weakly (its object's lifetime is not extended). A producer writing its own slot view
        in place refreshes what it derives itself."""
        self._watchers.append(weakref.WeakMethod(fn) if inspect.ismethod(fn) else fn)

    def __getstate__(self) -> dict[str, Any]:
        """For ``copy.deepcopy`` and pickle: the watchers as strong references (a weak one cannot
        be copied), so a copy of an object that watches this vector watches the copy."""
        state = self.__dict__.copy()
        state["_watchers"] = self._live()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        watchers = state.pop("_watchers", [])
        self.__dict__.update(state)
        self._watchers = []
        for fn in watchers:
            self.on_write(fn)

    def _live(self) -> list[Callable[[], None]]:
        """The watchers whose objects are alive, as callables; the dead ones are dropped."""
        kept, fns = [], []
        for w in self._watchers:
            fn = w() if isinstance(w, weakref.WeakMethod) else w
            if fn is not None:
                kept.append(w)
                fns.append(fn)
        self._watchers[:] = kept
        return fns

    def _wrote(self) -> None:
        for fn in self._live():
            fn()

    # --- lifecycle ------------------------------------------------------------------------
    def reset(self, event: str = "fold") -> None:
        """Apply each slot's policy for ``event``: ``"unset"`` slots go back to NaN."""
        if event not in _EVENTS:
            raise ValueError(f"unknown reset event {event!r}; known events: {list(_EVENTS)}")
        self.tensor.masked_fill_(self._unset_mask, UNSET)
        self._wrote()

    def describe(self) -> list[str]:
        """One line per slot saying what a fold boundary does to it."""
        return [
            f"state slot {s.name}[{s.size}]: {'reset to unset' if s.reset == 'unset' else 'kept'}"
            for s in self.slots
        ]

    def as_dict(self) -> dict[str, list[float]]:
        """Every slot's current values as Python floats (this syncs: for logs and reports)."""
        host = self.tensor.detach().cpu().tolist()
        return {s.name: host[o : o + n] for s, (o, n) in zip(self.slots, self._index.values())}

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "layout": self.layout,
            "values": self.tensor.detach().clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load values saved by :meth:`state_dict`; refuse a state of another layout."""
        missing = {"fingerprint", "layout", "values"} - set(state)
        if missing:
            raise LayoutMismatchError(
                f"state vector state is missing {sorted(missing)}; it was not written by "
                "StateVector.state_dict()"
            )
        theirs = state["fingerprint"]
        if theirs != self.fingerprint:
            diff = _layout_diff(state["layout"], self.layout)
            raise LayoutMismatchError(
                f"state vector layout mismatch: checkpoint has fingerprint {theirs}, this run has "
                f"{self.fingerprint}; differing slots: {diff}. Load it with the configuration it "
                "was saved with, or start a fresh run."
            )
        values = state["values"]
        if not isinstance(values, torch.Tensor) or values.shape != self.tensor.shape:
            raise LayoutMismatchError(
                f"state vector values have shape {getattr(values, 'shape', None)}, "
                f"expected {tuple(self.tensor.shape)}"
            )
        self.tensor.copy_(values)
        self._wrote()

    def __repr__(self) -> str:
        body = ", ".join(f"{s.name}[{s.size}]" for s in self.slots)
        return f"StateVector({body}; fingerprint={self.fingerprint}, device={self.device})"


def _fingerprint(layout: list[Mapping[str, Any]]) -> str:
    key = [LAYOUT_VERSION, [[s["name"], s["size"], s["reset"]] for s in layout]]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


def _layout_diff(theirs: list[Mapping[str, Any]], ours: list[Mapping[str, Any]]) -> str:
    """Human-readable slot differences between two layouts."""

    def desc(s: Mapping[str, Any]) -> str:
        return f"{s['name']}(size={s['size']}, reset={s['reset']})"

    t = {s["name"]: s for s in theirs}
    o = {s["name"]: s for s in ours}
    parts = [f"only in checkpoint: {desc(t[n])}" for n in t if n not in o]
    parts += [f"only in this run: {desc(o[n])}" for n in o if n not in t]
    for n in t:
        if n in o and (t[n]["size"], t[n]["reset"]) != (o[n]["size"], o[n]["reset"]):
            parts.append(f"{n}: checkpoint {desc(t[n])} vs this run {desc(o[n])}")
    if not parts:
        parts.append("same slots in a different order")
    return "; ".join(parts)
