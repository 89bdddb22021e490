"""``trimtab.Guard``: the library in one object for any PyTorch training loop.

It owns what a guarded step needs (a sentinel, a gradient clip measured online, the answer to a
non-finite gradient, named bounds measured online) and runs them in the one order that is
right, so a loop reads::

    guard = trimtab.Guard(model, optimizer)
    for x, y in loader:
        applied = guard.step(loss_fn(model(x), y))  # backward, checks, clip, step, folds

The parts are the library's own (:class:`~trimtab.Sentinel`, :class:`~trimtab.AdaptiveGradClip`,
:class:`~trimtab.NonFinitePolicy`, :class:`~trimtab.AdaptiveBounds`); the Guard adds the order
and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from trimtab.bounds import AdaptiveBounds, BoundClamp, _BoundClampFn
from trimtab.clip import AdaptiveGradClip
from trimtab.lifecycle import Lifecycle, register
from trimtab.nonfinite import POLICIES, NonFinitePolicy, Policy, honours_found_inf
from trimtab.sentinel import Sentinel
from trimtab.state import Slot, StateVector

__all__ = ["Guard"]


class Guard:
    r"""Guards the training steps of ``model`` under ``optimizer`` (any ``torch.optim``
    optimizer): :meth:`step` takes the loss and does, in this order,

    1. check the loss into the sentinel (slot ``"loss"``);
    2. ``zero_grad``, then backward (through ``scaler`` when one is given, then unscale);
    3. check every gradient into the sentinel (slot ``"grad.<parameter name>"``);
    4. decide the non-finite answer on the device (``on_nonfinite``, below);
    5. clip the gradient norm at a bound measured from past norms (:class:`AdaptiveGradClip`;
       ``clip=False``: none);
    6. the optimizer step, which under ``"skip"`` leaves weights and optimizer state exactly as
       they were when a gradient (or the loss) was NaN or ±Inf;
    7. with ``distributed``, reduce the step's measurements over the ranks;
    8. fold this step's measurements of every named bound into its slot.

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

    ``distributed``: a :class:`trimtab.distributed.RankConsistent`; the Guard attaches its bounds
    and sentinel to it and calls its :meth:`~trimtab.distributed.RankConsistent.sync` each step,
    so every rank folds the same numbers and sees the same firings.

    With :class:`trimtab.optim.Adam` the weight clamp and the self-set weight decay are inside
    the optimizer's step: the Guard steps it and they come with it.

    Every part registers its reset with the Guard's own :class:`Lifecycle`; :meth:`reset` (a
    fold boundary: data of a new scale) runs them, and the Guard itself registers
    :meth:`reset` with the lifecycle active where it is built.
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
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Guard(model, ...) needs an nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"Guard(model, optimizer) needs a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}"
            )
        if on_nonfinite not in POLICIES:
            raise ValueError(f"on_nonfinite={on_nonfinite!r} must be one of {list(POLICIES)}")
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
        self.device = dev = self.params[0].device
        self.on_nonfinite = on_nonfinite
        # the optimizer reads the flag (no sync), or one host read steps it (GradScaler's way)
        self._host_skip = on_nonfinite == "skip" and not honours_found_inf(optimizer)
        bounds = tuple(bounds)
        layout = [*AdaptiveBounds.slots(bounds), Slot("grad_clip_bound", doc="clip bound")]
        self.lifecycle = Lifecycle()
        with self.lifecycle:  # every part's reset goes here, and runs in reset()
            self.state = StateVector(layout, device=dev)
            self.sentinel = Sentinel(dev)
            self._loss = torch.full((), math.nan, device=dev)
            self.sentinel.add("loss", self._loss, phase="loss")
            for name, p in named:
                self.sentinel.add(f"grad.{name}", lambda p=p: p.grad, phase="backward")
            self.bounds = (
                AdaptiveBounds(bounds, q=quantile, state=self.state, sentinel=self.sentinel,
                               headroom=clamp_headroom, measure_every=measure_every)
                if bounds else None
            )  # fmt: skip
            self.clip = (
                AdaptiveGradClip(self.params, quantile=quantile, state_vector=self.state,
                                 headroom=clip_headroom, measure_every=measure_every)
                if clip else None
            )  # fmt: skip
        # "skip" with an optimizer that cannot read the flag: the policy decides as "halt"
        # does (flag only) and the Guard steps it after reading the flag on the host
        self.policy = NonFinitePolicy("halt" if self._host_skip else on_nonfinite, optimizer, dev)
        self.distributed = distributed
        if distributed is not None:
            distributed.attach(*(p for p in (self.bounds, self.sentinel) if p is not None))
        self.steps = 0  # host count of step() calls since the last reset
        self._skipped = torch.zeros((), dtype=torch.int64, device=dev)
        self._false = torch.zeros((), dtype=torch.bool, device=dev)
        register(self, "reset", name="guard", what="reset its bounds, clip and sentinel")

    # --- the step --------------------------------------------------------------------------
    def step(self, loss: Tensor) -> Tensor:
        """Backward ``loss`` and step the optimizer, guarded (the class docstring's order);
        returns a 0-dim bool device tensor, True where the step was applied."""
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
        with torch.no_grad():
            self._loss.copy_(loss.detach().reshape(()))
        self.sentinel.check("loss")  # stability: the loss itself, before backward
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)  # the checks and the clip see true gradients
        else:
            loss.backward()
        self.sentinel.check("backward")  # stability: every gradient, named
        found = self.policy.inspect([p.grad for p in self.params])  # stability: NaN/Inf flag
        if self.clip is not None:
            self.clip(self.params)  # stability: adaptive norm clip (sanitises a NaN tensor)
        if self.scaler is not None:  # the scaler skips on its own flag (an fp16 overflow too)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self._host_skip:
            if not bool(found):  # the one host read, where the optimizer cannot read the flag
                self.optimizer.step()
        else:
            self.policy.step()  # stability: the optimizer honours the flag under "skip"
        if self.distributed is not None:
            self.distributed.sync()  # every rank folds the same measurements
        if self.bounds is not None:
            self.bounds.fold()  # stability: this step's measurements into the slots
        with torch.no_grad():
            self._skipped.add_(found.to(torch.int64) if self.on_nonfinite == "skip" else 0)
            applied = found == 0 if self.on_nonfinite == "skip" else ~self._false
        self.steps += 1
        return applied

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
        if self.clip is not None:
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
        the lifecycle it was built in)."""
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
            "clip": None if self.clip is None else self.clip.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["names"]) != self.names:
            raise ValueError(
                "Guard.load_state_dict: the state was saved for parameters "
                f"{state['names'][:3]}..., this Guard guards {self.names[:3]}...; load it into "
                "a Guard over the same model"
            )
        for part in ("bounds", "clip"):
            if (state[part] is None) != (getattr(self, part) is None):
                raise ValueError(
                    f"Guard.load_state_dict: the state was saved "
                    f"{'without' if state[part] is None else 'with'} {part}; build this Guard "
                    "with the same bounds and clip setting"
                )
        self.state.load_state_dict(state["state"])
        self.sentinel.load_state_dict(state["sentinel"])
        if self.bounds is not None:
            self.bounds.load_state_dict(state["bounds"])
        if self.clip is not None:
            self.clip.load_state_dict(state["clip"])
        self._skipped.copy_(state["skipped"])
        self.steps = int(state["steps"])

    def __repr__(self) -> str:
        parts = [f"on_nonfinite={self.on_nonfinite!r}", f"clip={self.clip is not None}"]
        if self.bounds is not None:
            parts.append(f"bounds={list(self.bounds.names)}")
        return f"Guard({type(self.optimizer).__name__}, {len(self.params)} tensors, " + (
            ", ".join(parts) + ")"
        )
