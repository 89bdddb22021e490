"""The sentinel's device bookkeeping and its pure-PyTorch reference check: the oracle of the
check and guard_ kernels (:mod:`trimtab.kernels.sentinel`, ``.clamp``), which write exactly the
records the reference writes, into the tensors of :meth:`SentinelState.materialize`.

Shared by :mod:`trimtab.sentinel` (check) and :mod:`trimtab.clamp` (guard_). A slot is a
threshold (a float, or a 1-element float32 tensor read when the check runs) and a factor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "KIND_NAMES",
    "SUPPORTED_DTYPES",
    "Launch",
    "SentinelState",
    "abs_max_reference",
    "check_reference",
    "record_reference",
]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
KIND_NAMES = {1: "nan", 2: "inf", 3: "threshold"}


@dataclass(frozen=True)
class Launch:
    """Cached per-launch device metadata (building it copies host data: warm-up only)."""

    entry_slot: torch.Tensor  # int32 [k]: slot of each checked tensor
    entry_index: torch.Tensor  # int64 [k]: the same, for index_select/index_copy_
    entry_code: torch.Tensor  # int32 [k]: dtype code
    entry_phase: torch.Tensor  # int64 [k]: counter index of each tensor's phase
    inc: torch.Tensor  # int64 [phases + 1]: added to the counters by this launch
    factor: torch.Tensor  # float64 [k]: each tensor's slot factor (the reference's arithmetic)
    squared: torch.Tensor  # bool [k]: each tensor's slot compares against its threshold squared
    #: ``(a, b)`` when the checked slots are ``a, ..., b - 1`` in order (the reference then
    #: reads and writes their records as slices, not by index); None otherwise.
    span: tuple[int, int] | None
    #: The counter index of every entry when they share one phase (a check of one phase), so
    #: the reference reads the step as a view; None for a check of every phase.
    phase_index: int | None
    #: Views the reference reads and writes, made once (the state's tensors are only ever
    #: written in place; adding a slot rebuilds them and drops every launch): the step (the
    #: phase's counter, or None), the global check counter, and with a span the records
    #: ``rec[:, a:b]`` and ``value[a:b]``.
    step: torch.Tensor | None
    gseq: torch.Tensor
    rec: torch.Tensor | None
    value: torch.Tensor | None
    #: ``factor`` as host floats (the same float64 values), for :func:`fires_on_host`.
    factors: tuple[float, ...] = ()
    #: ``squared`` as host bools, for :func:`fires_on_host`.
    squares: tuple[bool, ...] = ()


class SentinelState:
    """Device tensors of a sentinel with ``n`` slots and ``P`` phases.

    ``rec`` int64 [3, n]: (first-fire check number, 1-based, 0 = never; step; kind code);
    ``value`` float64 [n]: max |x| at the first firing; ``counters`` int64 [P + 1]: checks per
    phase, then checks of any kind (the global order); ``guard_steps`` int64 [n]: guard_ calls
    per slot; ``thr_ptrs``/``factors``/``powers``: where each slot's float32 threshold lives, its
    factor, and the power (int32, 1 or 2) the threshold is raised to; ``done`` int32 [n + 1]:
    arrival counters of the last-program pattern (zero between launches); ``scratch_*``:
    per-program partials.
    """

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.phases: list[str] = []
        self.slot_thresholds: list[torch.Tensor | float] = []  # per slot: a tensor or a float
        self.slot_factors: list[float] = []
        self.slot_powers: list[int] = []
        self.slot_phase: list[int] = []
        self.tensors: dict[str, torch.Tensor] | None = None
        self._launches: dict[tuple, Launch] = {}
        self._thr_views: list[torch.Tensor] = []
        self._stale = True

    def adopt_device(self, device: torch.device, what: str) -> None:
        if self.device is None:
            self.device = device
        elif device != self.device and not _same_device(device, self.device):
            raise ValueError(f"{what} is on {device}, but the sentinel is on {self.device}")

    def add_slot(
        self, threshold: torch.Tensor | float, factor: float, phase: str, power: int = 1
    ) -> None:
        """A slot firing on non-finite values or ``max|x| > (threshold * factor) ** power`` (a
        NaN threshold: non-finite only)."""
        if phase not in self.phases:
            self.phases.append(phase)
        self.slot_thresholds.append(threshold)
        self.slot_factors.append(factor)
        self.slot_powers.append(power)
        self.slot_phase.append(self.phases.index(phase))
        self._launches.clear()
        self._stale = True

    def materialize(self) -> dict[str, torch.Tensor]:
        """The device tensors, (re)built after slots were added, keeping every record."""
        if self.tensors is not None and not self._stale:
            return self.tensors
        if self.device is None:
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dev, n, p = self.device, len(self.slot_factors), len(self.phases)
        old = self.tensors
        t = {
            "rec": torch.zeros(3, n, dtype=torch.int64, device=dev),
            "value": torch.zeros(n, dtype=torch.float64, device=dev),
            "counters": torch.zeros(p + 1, dtype=torch.int64, device=dev),
            "guard_steps": torch.zeros(n, dtype=torch.int64, device=dev),
            "done": torch.zeros(n + 1, dtype=torch.int32, device=dev),
            "slot_phase": torch.tensor(self.slot_phase, dtype=torch.int32, device=dev),
            "slot_index": torch.arange(n, dtype=torch.int64, device=dev),
            "scratch_nan": torch.zeros(1, dtype=torch.int32, device=dev),
            "scratch_max": torch.zeros(1, dtype=torch.float64, device=dev),
        }
        if old is not None:
            k, q = old["value"].numel(), old["counters"].numel() - 1
            t["rec"][:, :k].copy_(old["rec"])
            t["value"][:k].copy_(old["value"])
            t["guard_steps"][:k].copy_(old["guard_steps"])
            t["counters"][:q].copy_(old["counters"][:q])
            t["counters"][-1:].copy_(old["counters"][-1:])
        literals = [math.nan if isinstance(r, torch.Tensor) else r for r in self.slot_thresholds]
        t["literals"] = torch.tensor(literals, dtype=torch.float32, device=dev)
        t["factors"] = torch.tensor(self.slot_factors, dtype=torch.float32, device=dev)
        t["powers"] = torch.tensor(self.slot_powers, dtype=torch.int32, device=dev)
        self._thr_views = [
            r.reshape(()) if isinstance(r, torch.Tensor) else t["literals"][i]
            for i, r in enumerate(self.slot_thresholds)
        ]
        t["thr_ptrs"] = torch.tensor(
            [v.data_ptr() for v in self._thr_views], dtype=torch.int64, device=dev
        )
        self.tensors = t
        self._stale = False
        return t

    def launch(
        self, phase: str | None, ids: Sequence[int], dtypes: Sequence[torch.dtype]
    ) -> Launch:
        key = (phase, tuple(ids), tuple(dtypes))
        cached = self._launches.get(key)
        if cached is not None:
            return cached
        t = self.materialize()
        dev = self.device
        inc = [0] * (len(self.phases) + 1)
        for i, name in enumerate(self.phases):
            inc[i] = int(phase is None or name == phase)
        inc[-1] = 1
        phase_idx = [self.slot_phase[i] for i in ids]
        ids = list(ids)
        contiguous = bool(ids) and ids == list(range(ids[0], ids[0] + len(ids)))
        span = (ids[0], ids[0] + len(ids)) if contiguous else None
        phase_index = phase_idx[0] if len(set(phase_idx)) == 1 else None
        factor = torch.tensor(
            [self.slot_factors[i] for i in ids], dtype=torch.float32, device=dev
        ).double()
        squared = [self.slot_powers[i] == 2 for i in ids]
        launch = Launch(
            entry_slot=torch.tensor(ids, dtype=torch.int32, device=dev),
            entry_index=torch.tensor(ids, dtype=torch.int64, device=dev),
            entry_code=torch.tensor([_CODES[d] for d in dtypes], dtype=torch.int32, device=dev),
            entry_phase=torch.tensor(phase_idx, dtype=torch.int64, device=dev),
            inc=torch.tensor(inc, dtype=torch.int64, device=dev),
            factor=factor,
            squared=torch.tensor(squared, device=dev),
            span=span,
            phase_index=phase_index,
            step=None if phase_index is None else t["counters"][phase_index],
            gseq=t["counters"][-1],
            rec=None if span is None else t["rec"][:, span[0] : span[1]],
            value=None if span is None else t["value"][span[0] : span[1]],
            factors=tuple(factor.tolist()),
            squares=tuple(squared),
        )
        self._launches[key] = launch
        return launch

    def thresholds(self, ids: Sequence[int]) -> list[torch.Tensor]:
        """0-dim float32 views of the slots' thresholds (read when the check runs)."""
        return [self._thr_views[i] for i in ids]

    # --- reading -----------------------------------------------------------------------------
    def fired(self) -> torch.Tensor:
        if self.tensors is None:
            return torch.zeros((), dtype=torch.bool, device=self.device)
        return (self.tensors["rec"][0] > 0).any()

    def records(self) -> list[tuple[int, int, int, int, float]]:
        """(check number, slot, step, kind, value) of every fired slot; syncs."""
        if self.tensors is None:
            return []
        rec = self.tensors["rec"].cpu().tolist()
        value = self.tensors["value"].cpu().tolist()
        return [
            (rec[0][i], i, rec[1][i], rec[2][i], value[i])
            for i in range(len(value))
            if rec[0][i] > 0
        ]

    def steps(self) -> dict[str, int]:
        if self.tensors is None:
            return dict.fromkeys(self.phases, 0)
        c = self.tensors["counters"].cpu().tolist()
        return {name: c[i] for i, name in enumerate(self.phases)}

    def reset(self) -> None:
        if self.tensors is not None:
            for key in ("rec", "value", "counters", "guard_steps"):
                self.tensors[key].zero_()


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` name the same device when 0 is the current one."""
    if a.type != b.type:
        return False
    current = torch.cuda.current_device() if a.type == "cuda" else 0
    return (a.index if a.index is not None else current) == (
        b.index if b.index is not None else current
    )


def abs_max_reference(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a float64 0-dim tensor, NaN if any element is NaN, 0 for an empty tensor.

    Reads ``x`` once (``x.numel() * x.element_size()`` bytes), like the kernel; no sync.
    """
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=x.device)
    return x.detach().abs().amax().to(torch.float64)


def abs_max_many(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """:func:`abs_max_reference` of every tensor, float64 ``[k]``: ``torch._foreach_abs`` and
    ``torch._foreach_max`` over the non-empty ones (max |x| exactly, NaN propagated; an empty
    tensor 0) instead of an abs and an amax per tensor. (``_foreach_norm(inf)`` computes the
    same several times slower on the CPU.) No sync."""
    nonempty = [t for t in tensors if t.numel()]
    device = tensors[0].device if tensors else torch.device("cpu")
    if not nonempty:
        return torch.zeros(len(tensors), dtype=torch.float64, device=device)
    with torch.no_grad():
        amax = torch._foreach_max(torch._foreach_abs(nonempty))
    if len({t.dtype for t in amax}) > 1:
        amax = [t.double() for t in amax]
    if len(nonempty) < len(tensors):
        found = iter(amax)  # an empty tensor's max is 0 (no host-to-device index)
        zero = torch.zeros((), dtype=amax[0].dtype, device=device)
        amax = [next(found) if t.numel() else zero for t in tensors]
    return torch.stack(amax).double()


def abs_max_host(tensors: Sequence[torch.Tensor]) -> list[float] | None:
    """:func:`abs_max_reference` of every tensor as host floats, read through NumPy (a few
    microseconds a tensor, against tens for the torch ops on CartPole's small tensors): the
    same values (max |x| is exact in any order; NaN propagates; an empty tensor 0). None
    unless every tensor is on the CPU in a dtype NumPy has (not bfloat16): then the torch ops."""
    out = []
    for t in tensors:
        if t.device.type != "cpu" or t.dtype == torch.bfloat16:
            return None
        if not t.numel():
            out.append(0.0)
            continue
        a = t.detach().numpy()
        out.append(float(np.maximum.reduce(np.abs(a), axis=None)))
    return out


def _first_firings(
    amax: torch.Tensor,
    step: torch.Tensor,
    thr: torch.Tensor,
    factor: torch.Tensor,
    squared: torch.Tensor,
    prev_seq: torch.Tensor,
    gseq: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, fresh)`` of ``k`` slots: bool ``[k]``, do they fire now for the first time, and
    int64 ``[3, k]``, the records they would get (check number ``gseq + 1``, ``step``, kind).
    A slot fires on a non-finite ``amax`` (a max |x|: >= 0, +Inf or NaN) or on
    ``amax > t`` in float64, ``t = thr * factor``, squared where ``squared`` (a NaN threshold
    never fires)."""
    finite = amax < math.inf  # isfinite for a max |x|, in one comparison instead of four
    t = thr.to(torch.float64) * factor.to(torch.float64)
    fired = (amax > torch.where(squared, t * t, t)) | ~finite
    first = fired & (prev_seq == 0)
    kind = torch.where(finite, 3, torch.where(torch.isnan(amax), 1, 2))
    fresh = torch.stack([(gseq + 1).expand_as(kind), step.expand_as(kind), kind])
    return first, fresh


def fires_on_host(
    amax: torch.Tensor | list[float],
    thr: torch.Tensor | list[float],
    factors: Sequence[float],
    squares: Sequence[bool],
) -> bool:
    """Whether any of ``k`` slots fires (:func:`_first_firings`' rule, the same float64
    arithmetic: a float32 threshold and a max |x| are exact as Python floats, and a squared
    slot's threshold is squared as ``t * t``), read on the host. For CPU tensors only, where a
    read waits for nothing: a check where nothing fires (every check of a healthy run) then
    skips the record ops, which would write nothing."""

    def fires(x: float, t: float, f: float, sq: bool) -> bool:
        b = t * f
        return not x < math.inf or x > (b * b if sq else b)

    a = amax if isinstance(amax, list) else amax.tolist()
    t = thr if isinstance(thr, list) else thr.tolist()
    return any(fires(*row) for row in zip(a, t, factors, squares, strict=True))


def record_reference(
    state: dict[str, torch.Tensor],
    index: torch.Tensor,
    amax: torch.Tensor,
    step: torch.Tensor,
    thr: torch.Tensor,
    factor: torch.Tensor,
    squared: torch.Tensor,
) -> None:
    """Record first firings of slots ``index`` (int64 [k], distinct) from their ``amax``
    (float64 [k]) at ``step`` (int64 [k], or 0-dim for all); the check number is
    ``counters[-1] + 1``. ``factor``/``squared``: the slots' (see :func:`_first_firings`).
    No sync."""
    rec, value = state["rec"], state["value"]
    if rec.device.type == "cpu" and not fires_on_host(
        amax, thr.expand_as(amax), factor.tolist(), squared.tolist()
    ):
        return  # nothing fires: no record changes (the CPU reads it without a sync)
    prev = rec.index_select(1, index)
    first, fresh = _first_firings(amax, step, thr, factor, squared, prev[0],
                                  state["counters"][-1])  # fmt: skip
    rec.index_copy_(1, index, torch.where(first, fresh, prev))
    value.index_copy_(0, index, torch.where(first, amax, value.index_select(0, index)))


def check_reference(
    tensors: Sequence[torch.Tensor],
    launch: Launch,
    state: dict[str, torch.Tensor],
    thresholds: Sequence[torch.Tensor],
) -> None:
    """The torch reference of one check launch: the abs-max of every tensor (on the CPU read
    through NumPy, :func:`abs_max_host`; elsewhere two multi-tensor ops), then every record of
    the launch at once (as slices of the records when its slots are consecutive: a check of one
    phase of slots added phase by phase)."""
    host = abs_max_host(tensors)
    if host is not None:
        # On the CPU a read syncs with nothing: a check where no slot fires (every check of a
        # healthy run) writes no record, so it skips the ~15 record ops (identities then).
        thr_host = [float(t) for t in thresholds]
        if not fires_on_host(host, thr_host, launch.factors, launch.squares):
            state["counters"].add_(launch.inc)
            return
        amax = torch.tensor(host, dtype=torch.float64)
    else:
        amax = abs_max_many(tensors)
    thr = torch.stack(list(thresholds))
    quiet = host is None and amax.device.type == "cpu"  # bfloat16 on the CPU: the same skip
    if quiet and not fires_on_host(amax, thr, launch.factors, launch.squares):
        state["counters"].add_(launch.inc)
        return
    step = launch.step
    if step is None:
        step = state["counters"].index_select(0, launch.entry_phase)
    if launch.rec is None or launch.value is None:
        record_reference(state, launch.entry_index, amax, step, thr, launch.factor,
                         launch.squared)  # fmt: skip
    else:
        prev, prev_value = launch.rec, launch.value
        first, fresh = _first_firings(amax, step, thr, launch.factor, launch.squared, prev[0],
                                      launch.gseq)  # fmt: skip
        torch.where(first, fresh, prev, out=prev)  # in place: out is exactly the input prev
        torch.where(first, amax, prev_value, out=prev_value)
    state["counters"].add_(launch.inc)
