"""``trimtab.Guard``: the library in one object for any PyTorch training loop.

It owns what a guarded step needs (a sentinel, a gradient clip measured online, the answer to a
non-finite gradient, named bounds measured online) and runs them in the one order that is
right, so a loop reads::

    guard = trimtab.Guard(model, optimizer)
    for x, y in loader:
        applied = guard.step(loss_fn(model(x), y))  # backward, checks, clip, step, folds

The parts are the library's own (:class:`~trimtab.Sentinel`, :class:`~trimtab.AdaptiveGradClip`,
:class:`~trimtab.NonFinitePolicy`, :class:`~trimtab.AdaptiveBounds`), built by the Guard or
passed in (:class:`GuardParts`); the Guard adds the order and nothing else. A loop with checks of
its own between the phases (the trainer's learn step) calls the phases itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from trimtab.bounds import AdaptiveBounds, BoundClamp, _BoundClampFn
from trimtab.clip import AdaptiveGradClip
from trimtab.lifecycle import Lifecycle, register
from trimtab.nonfinite import POLICIES, NonFinitePolicy, Policy, honours_found_inf
from trimtab.sentinel import Sentinel
from trimtab.state import Slot, StateVector

__all__ = ["Guard", "GuardParts", "SentinelChecks", "StepChecks"]

#: ``params -> total gradient norm``, clipping in place: :class:`AdaptiveGradClip`, or a
#: hand-set clip such as ``functools.partial(torch.nn.utils.clip_grad_norm_, max_norm=10.0)``.
Clip = Callable[[list[Tensor]], Tensor]


class StepChecks(Protocol):
    """The sentinel's checks at the Guard's phases: :meth:`loss` (:meth:`Guard.check_loss`),
    :meth:`gradients` (:meth:`Guard.check_gradients`, before anything rewrites a gradient) and
    :meth:`weights` (:meth:`Guard.check_weights`, after the optimizer step). Each is one fused
    sentinel check, no host sync. :class:`SentinelChecks` is the library's; the trainer's
    :class:`trimtab.rl.agent.checks.Checks` adds its forward-phase buffers and measured
    thresholds."""

    sentinel: Sentinel

    def loss(self, loss: Tensor) -> None: ...

    def gradients(self) -> None: ...

    def weights(self) -> None: ...


class SentinelChecks:
    """The Guard's own checks: the loss (slot ``"loss"``, phase ``"loss"``) and every gradient
    (slot ``"grad.<parameter name>"``, phase ``"backward"``); nothing after the step (with
    :class:`trimtab.optim.Adam` the weight clamp is inside the step)."""

    def __init__(self, sentinel: Sentinel, named: Sequence[tuple[str, Tensor]]) -> None:
        self.sentinel = sentinel
        self._loss = torch.full((), math.nan, device=named[0][1].device)
        sentinel.add("loss", self._loss, phase="loss")
        for name, p in named:
            sentinel.add(f"grad.{name}", lambda p=p: p.grad, phase="backward")

    def loss(self, loss: Tensor) -> None:
        with torch.no_grad():
            self._loss.copy_(loss.detach().reshape(()))
        self.sentinel.check("loss")

    def gradients(self) -> None:
        self.sentinel.check("backward")

    def weights(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class GuardParts:
    """The parts of a :class:`Guard`, built by the caller (the trainer builds them from its
    stability mode) and used as given: ``Guard(model, optimizer, parts=GuardParts(...))``.

    ``state``: the state vector the parts' slots live in. ``checks``: the sentinel's checks at
    the Guard's phases (:class:`StepChecks`). ``policy``: the non-finite answer, built over the
    Guard's optimizer. ``clip``: ``params -> norm`` (:data:`Clip`), or None. ``bounds``: the
    bounds measured online (:meth:`Guard.fold` folds them), or None. ``clamp_weights``: a
    hand-set weight clamp run after the optimizer step, or None (trimtab's Adam clamps inside
    its step). Each part registers its own fold-boundary reset where it was built."""

    state: StateVector
    checks: StepChecks
    policy: NonFinitePolicy
    clip: Clip | None = None
    bounds: AdaptiveBounds | None = None
    clamp_weights: Callable[[], None] | None = None


#: The options that build the Guard's own parts, and their defaults (``parts=`` replaces them).
_BUILD_DEFAULTS: dict[str, Any] = {
    "on_nonfinite": "skip", "clip": True, "bounds": (), "quantile": 0.99,
    "clamp_headroom": 2.0, "clip_headroom": 1.0, "measure_every": 1,
}  # fmt: skip


class Guard:
    r"""Guards the training steps of ``model`` under ``optimizer`` (any ``torch.optim``
    optimizer): :meth:`step` takes the loss and runs these phases, in this order (each a public
    method, for a loop that adds checks of its own between them):

    1. :meth:`check_loss`: check the loss into the sentinel (slot ``"loss"``);
    2. :meth:`backward`: zero the gradients, then backward (through ``scaler`` when one is
       given, then unscale);
    3. :meth:`check_gradients`: check every gradient (slot ``"grad.<parameter name>"``);
    4. :meth:`decide`: the non-finite answer on the device (``on_nonfinite``, below);
    5. :meth:`clip_gradients`: clip the gradient norm at a bound measured from past norms
       (:class:`AdaptiveGradClip`; ``clip=False``: none);
    6. :meth:`optimizer_step`: the optimizer step, which under ``"skip"`` leaves weights and
       optimizer state exactly as they were when a gradient (or the loss) was NaN or ±Inf;
    7. :meth:`fold`: with ``distributed``, reduce the step's measurements over the ranks; then
       fold this step's measurements of every named bound into its slot;
    8. :meth:`check_weights`: the checks after the step (none in the Guard's own parts).

    It returns a 0-dim bool tensor on the loss's device, True where the step was applied:
    reading it is the caller's host sync, never the Guard's.

    ``on_nonfinite``:

    - ``"skip"`` (default): a non-finite gradient skips the step. With
      :class:`trimtab.optim.Adam`, or a torch optimizer built with ``fused=True``, the optimizer
      reads the device flag itself (``torch.amp.GradScaler``'s contract): no host sync, and the
      step can be captured in a CUDA graph. Any other optimizer is stepped after one host read
      of the flag, as ``GradScaler`` does for it (free on the CPU; on a GPU, a sync per step).
    - ``"sanitize"``: non-finite gradient elements become 0 and the step goes on.
    - ``"halt"``: the step goes on; the sentinel keeps the first non-finite tensor and step,
      and :meth:`raise_if_fired` (your choice of when: it syncs) raises naming them.

    ``bounds``: names of magnitudes to bound online (:class:`AdaptiveBounds`, ``quantile`` of
    ``|x|`` folded into a slot each step). :meth:`bound` measures and clamps a tensor with one
    of them; :meth:`clamp_layer` gives an ``nn.Module`` that does so inside a model.
    ``clamp_headroom``: a clamp binds at this many times its bound (above the quantile, an
    excursion, not the tail); ``clip_headroom`` the same for the clip.

    ``measure_every = k``: the clip and the bounds measure on every ``k``-th step only (their
    statistics cost ``1/k``; a captured graph replays one step, so capture with 1).

    ``parts``: a :class:`GuardParts` built elsewhere, used as given, in place of the parts the
    options above would build (passing both is refused); their resets are registered where
    they were built, so :meth:`reset` then clears only the Guard's own counts.

    ``keep_grads``: zero the gradients in place instead of setting them to None, so their
    buffers keep their addresses from step to step (a sentinel's pointer table and a captured
    CUDA graph read them; the memory stays allocated between steps).

    ``distributed``: a :class:`trimtab.distributed.RankConsistent`; the Guard attaches its bounds
    and sentinel to it and calls its :meth:`~trimtab.distributed.RankConsistent.sync` each step,
    so every rank folds the same numbers and sees the same firings.

    With :class:`trimtab.optim.Adam` the weight clamp and the self-set weight decay are inside
    the optimizer's step: the Guard steps it and they come with it.

    The parts it builds register their reset with the Guard's own :class:`Lifecycle`;
    :meth:`reset` (a fold boundary: data of a new scale) runs them, and the Guard itself
    registers :meth:`reset` with the lifecycle active where it is built.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        on_nonfinite: Policy = "skip",
        clip: bool = True,
        bounds: Sequence[str] = (),
        quantile: float = 0.99,
        clamp_headroom: float = 2.0,
        clip_headroom: float = 1.0,
        measure_every: int = 1,
        scaler: torch.amp.GradScaler | None = None,
        distributed: Any = None,
        parts: GuardParts | None = None,
        keep_grads: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Guard(model, ...) needs an nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"Guard(model, optimizer) needs a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}"
            )
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("Guard: the model has no parameter that requires grad")
        stepped = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in named if id(p) not in stepped]
        if missing:
            raise ValueError(
                f"Guard: the optimizer does not step {missing[:3]}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                + "; build it over model.parameters() (or freeze them: requires_grad_(False))"
            )
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.device = named[0][1].device
        self.keep_grads = keep_grads
        options = {
            "on_nonfinite": on_nonfinite, "clip": clip, "bounds": tuple(bounds),
            "quantile": quantile, "clamp_headroom": clamp_headroom,
            "clip_headroom": clip_headroom, "measure_every": measure_every,
        }  # fmt: skip
        self.lifecycle: Lifecycle | None = None
        if parts is None:
            if on_nonfinite not in POLICIES:
                raise ValueError(f"on_nonfinite={on_nonfinite!r} must be one of {list(POLICIES)}")
            # the optimizer reads the flag (no sync), or one host read steps it (GradScaler's)
            self._host_skip = on_nonfinite == "skip" and not honours_found_inf(optimizer)
            self.lifecycle = Lifecycle()
            with self.lifecycle:  # every part's reset goes here, and runs in reset()
                parts = self._build_parts(named, **options)
        else:
            given = [k for k, v in options.items() if v != _BUILD_DEFAULTS[k]]
            if given:
                raise ValueError(
                    f"Guard(parts=...) uses the parts it is given; {given} would build parts "
                    "of its own: set them on the parts instead, or drop parts="
                )
            if parts.policy.optimizer is not optimizer:
                raise ValueError(
                    "Guard(parts=...): parts.policy steps another optimizer than the Guard's; "
                    "build the NonFinitePolicy over the same optimizer"
                )
            self._host_skip = False  # a "skip" NonFinitePolicy has an optimizer that reads it
            on_nonfinite = parts.policy.policy  # type: ignore[assignment]
        self.parts = parts
        self.on_nonfinite = on_nonfinite
        self.state, self.checks, self.policy = parts.state, parts.checks, parts.policy
        self.sentinel = parts.checks.sentinel
        self.clip, self.bounds = parts.clip, parts.bounds
        self.distributed = distributed
        if distributed is not None:
            distributed.attach(*(p for p in (self.bounds, self.sentinel) if p is not None))
        self.steps = 0  # host count of step() calls since the last reset
        self._skipped = torch.zeros((), dtype=torch.int64, device=self.device)
        self._false = torch.zeros((), dtype=torch.bool, device=self.device)
        if self.lifecycle is not None:
            register(self, "reset", name="guard", what="reset its bounds, clip and sentinel")

    def _build_parts(
        self,
        named: list[tuple[str, Tensor]],
        *,
        on_nonfinite: Policy,
        clip: bool,
        bounds: tuple[str, ...],
        quantile: float,
        clamp_headroom: float,
        clip_headroom: float,
        measure_every: int,
    ) -> GuardParts:
        """The Guard's own parts (built inside its Lifecycle)."""
        layout = [*AdaptiveBounds.slots(bounds), Slot("grad_clip_bound", doc="clip bound")]
        state = StateVector(layout, device=self.device)
        sentinel = Sentinel(self.device)
        checks = SentinelChecks(sentinel, named)
        adaptive = (
            AdaptiveBounds(bounds, q=quantile, state=state, sentinel=sentinel,
                           headroom=clamp_headroom, measure_every=measure_every)
            if bounds else None
        )  # fmt: skip
        grad_clip = (
            AdaptiveGradClip(self.params, quantile=quantile, state_vector=state,
                             headroom=clip_headroom, measure_every=measure_every)
            if clip else None
        )  # fmt: skip
        # "skip" with an optimizer that cannot read the flag: the policy decides as "halt"
        # does (flag only) and the Guard steps it after reading the flag on the host
        policy = NonFinitePolicy(
            "halt" if self._host_skip else on_nonfinite, self.optimizer, self.device
        )
        return GuardParts(state, checks, policy, clip=grad_clip, bounds=adaptive)

    # --- the step --------------------------------------------------------------------------
    def step(self, loss: Tensor) -> Tensor:
        """Backward ``loss`` and step the optimizer, guarded: every phase, in the class
        docstring's order. Returns a 0-dim bool device tensor, True where the step was
        applied."""
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise TypeError(
                f"Guard.step needs the loss as a one-element tensor, got "
                f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, Tensor) else ''}"
            )
        if loss.device != self.device:
            raise ValueError(
                f"Guard.step: the loss is on {loss.device}, the model's parameters on "
                f"{self.device}; compute the loss on the model's device"
            )
        self.check_loss(loss)  # stability: the loss itself, before backward
        self.backward(loss)
        self.check_gradients()  # stability: every gradient, named
        found = self.decide()  # stability: NaN/Inf flag
        self.clip_gradients()  # stability: adaptive norm clip (sanitises a NaN tensor)
        self.optimizer_step()  # stability: the optimizer honours the flag under "skip"
        self.fold()  # stability: the ranks' measurements, then every bound's fold
        self.check_weights()
        with torch.no_grad():
            self._skipped.add_(found.to(torch.int64) if self.on_nonfinite == "skip" else 0)
            applied = found == 0 if self.on_nonfinite == "skip" else ~self._false
        self.steps += 1
        return applied

    # The phases, in step()'s order. None reads anything back to the host (but the optimizer
    # step of "skip" with an optimizer that cannot read the flag: GradScaler's one host read).

    def check_loss(self, loss: Tensor) -> None:
        """Phase 1: the loss into the sentinel, before backward."""
        self.checks.loss(loss)

    def backward(self, loss: Tensor) -> None:
        """Phase 2: zero the gradients (in place with ``keep_grads``, else set to None), then
        backward; with a ``scaler``, scale the loss and unscale the gradients after, so the
        checks and the clip see true gradients."""
        if self.keep_grads:  # one multi-tensor zero; the buffers keep their addresses
            kept = [p.grad for p in self.params if p.grad is not None]
            if kept:
                torch._foreach_zero_(kept)
        else:
            self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()

    def check_gradients(self) -> None:
        """Phase 3: every gradient into the sentinel, before anything rewrites it."""
        self.checks.gradients()

    def decide(self) -> Tensor:
        """Phase 4: the step's non-finite flag from the gradients (and any input the policy
        was shown); under ``"sanitize"`` the non-finite elements are then zeroed. Returns the
        policy's ``found_inf`` (a 0-dim device tensor, 1.0 where found)."""
        return self.policy.inspect([p.grad for p in self.params])

    def clip_gradients(self) -> Tensor | None:
        """Phase 5: the clip in place; returns the total norm it measured (None: no clip)."""
        return None if self.clip is None else self.clip(self.params)

    def optimizer_step(self) -> None:
        """Phase 6: the optimizer step under the flag (the scaler's own, where one is given),
        then the hand-set weight clamp, where one was given."""
        if self.scaler is not None:  # the scaler skips on its own flag (an fp16 overflow too)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self._host_skip:
            if not bool(self.policy.found_inf):  # the one host read: the optimizer cannot
                self.optimizer.step()
        else:
            self.policy.step()  # honours found_inf under "skip"
        if self.parts.clamp_weights is not None:
            self.parts.clamp_weights()

    def fold(self) -> Tensor | None:
        """Phase 7: with ``distributed``, the ranks' one reduction of this step's measurements;
        then every bound measured this step folded into its slot, once. Returns the bounds'
        fold result (None without bounds)."""
        if self.distributed is not None:
            self.distributed.sync()  # every rank folds the same measurements
        return None if self.bounds is None else self.bounds.fold()

    def check_weights(self) -> None:
        """Phase 8: the checks after the optimizer step (weights, moments), where the checks
        have any."""
        self.checks.weights()

    def bound(self, name: str, x: Tensor) -> Tensor:
        """``x`` measured (for this step's fold), checked into the sentinel slot ``name`` and
        clamped at ``clamp_headroom`` × bound ``name``; a clamped copy (the gradient passes
        where a value was kept). Call it once per step per bound, on the tensor of the step."""
        if self.bounds is None:
            raise KeyError(f"no bound {name!r}: build the Guard with bounds=[{name!r}, ...]")
        if torch.is_grad_enabled() and x.requires_grad:
            with torch.autocast(x.device.type, enabled=False):
                return _BoundClampFn.apply(x, self.bounds, name)
        y = x.detach().clone()
        self.bounds.measure(name, y)
        return self.bounds.clamp_(name, y)

    def clamp_layer(self, name: str) -> BoundClamp:
        """An ``nn.Module`` bounding its input with bound ``name``: it measures and clamps in a
        forward that is back-propagated, and applies the bound as it stands in any other."""
        if self.bounds is None:
            raise KeyError(f"no bound {name!r}: build the Guard with bounds=[{name!r}, ...]")
        return BoundClamp(self.bounds, name)

    # --- reading -----------------------------------------------------------------------------
    def fired(self) -> Tensor:
        """0-dim device bool: has any sentinel slot fired since the last reset (no sync)."""
        return self.sentinel.fired()

    def peek(self) -> bool:
        """:meth:`trimtab.Sentinel.peek`: the flag without waiting for the device (on a GPU
        answered from a copy an earlier call queued: a fire is seen a call late), for a loop
        that asks "stop?" every N steps and then calls :meth:`raise_if_fired`."""
        return self.sentinel.peek()

    def raise_if_fired(self) -> None:
        """Raise :class:`~trimtab.NonFiniteError` naming the first non-finite tensor and its
        step, if any (a host read: call it when you choose, e.g. every N steps)."""
        self.sentinel.raise_if_fired()

    def report(self) -> str:
        """What the Guard did since its last reset, as lines of text (a host read)."""
        lines = [f"trimtab.Guard: {self.steps} steps, on_nonfinite={self.on_nonfinite!r}"]
        if self.on_nonfinite == "skip":
            lines.append(f"  skipped (non-finite gradient or loss): {int(self._skipped)}")
        firings = self.sentinel.report()
        if not firings:
            lines.append("  sentinel: nothing non-finite or out of range")
        for f in firings[:5]:
            lines.append(
                f"  sentinel: {f.name!r} first fired at step {f.step} of phase {f.phase!r} "
                f"({f.kind}, max |x| = {f.value:g})"
            )
        if len(firings) > 5:
            lines.append(f"  sentinel: {len(firings) - 5} more slots fired later")
        if isinstance(self.clip, AdaptiveGradClip):
            lines.append(f"  gradient clip: bound {float(self.clip.bound[0]):.4g}, clipped "
                         f"{int(self.clip.engaged[0])} steps")  # fmt: skip
        if self.bounds is not None:
            for i, n in enumerate(self.bounds.names):
                lines.append(f"  bound {n!r}: {float(self.bounds.values[i]):.4g}")
        return "\n".join(lines)

    # --- lifecycle and checkpoints -------------------------------------------------------------
    def reset(self) -> None:
        """A fold boundary: unset the bounds and the clip, clear the sentinel and the counts.
        The optimizer's own state is the optimizer's (trimtab's Adam registers its reset with
        the lifecycle it was built in), and so are parts passed in (``parts=``): this then
        clears the Guard's own counts only."""
        if self.lifecycle is not None:
            self.lifecycle.fold_boundary()
        self._skipped.zero_()
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain numbers only (``torch.save``-able, loadable with
        ``weights_only=True``)."""
        return {
            "names": list(self.names),
            "steps": self.steps,
            "skipped": self._skipped.clone(),
            "state": self.state.state_dict(),
            "sentinel": self.sentinel.state_dict(),
            "bounds": None if self.bounds is None else self.bounds.state_dict(),
            "clip": None if self._adaptive_clip is None else self._adaptive_clip.state_dict(),
        }

    @property
    def _adaptive_clip(self) -> AdaptiveGradClip | None:
        """The clip, where it holds state (a hand-set clip holds none)."""
        return self.clip if isinstance(self.clip, AdaptiveGradClip) else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["names"]) != self.names:
            raise ValueError(
                "Guard.load_state_dict: the state was saved for parameters "
                f"{state['names'][:3]}..., this Guard guards {self.names[:3]}...; load it into "
                "a Guard over the same model"
            )
        for part, mine in (("bounds", self.bounds), ("clip", self._adaptive_clip)):
            if (state[part] is None) != (mine is None):
                raise ValueError(
                    f"Guard.load_state_dict: the state was saved "
                    f"{'without' if state[part] is None else 'with'} {part}; build this Guard "
                    "with the same bounds and clip setting"
                )
        self.state.load_state_dict(state["state"])
        self.sentinel.load_state_dict(state["sentinel"])
        if self.bounds is not None:
            self.bounds.load_state_dict(state["bounds"])
        if self._adaptive_clip is not None:
            self._adaptive_clip.load_state_dict(state["clip"])
        self._skipped.copy_(state["skipped"])
        self.steps = int(state["steps"])

    def __repr__(self) -> str:
        parts = [f"on_nonfinite={self.on_nonfinite!r}", f"clip={self.clip is not None}"]
        if self.bounds is not None:
            parts.append(f"bounds={list(self.bounds.names)}")
        return f"Guard({type(self.optimizer).__name__}, {len(self.params)} tensors, " + (
            ", ".join(parts) + ")"
        )
