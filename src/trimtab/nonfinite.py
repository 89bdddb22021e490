"""What an optimizer step does about a non-finite gradient, decided on the device the way
``torch.amp.GradScaler`` does it: one ``found_inf`` flag that the optimizer step honours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from trimtab.clamp import scale_finite_

__all__ = ["POLICIES", "NonFinitePolicy"]

Policy = Literal["halt", "skip", "sanitize"]
POLICIES: tuple[str, ...] = ("halt", "skip", "sanitize")


def honours_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """True for an optimizer whose step can skip itself on a device flag: trimtab's Adam, or a
    torch optimizer with ``_step_supports_amp_scaling`` (the fused ones)."""
    from trimtab.optim import Adam  # lazily: the optimizer package is the heavier import

    return isinstance(optimizer, Adam) or bool(
        getattr(optimizer, "_step_supports_amp_scaling", False)
    )


class NonFinitePolicy:
    """One of three answers to a gradient holding NaN or ±Inf, with no host sync:

    - ``"halt"``: step as usual; the sentinel has recorded the first non-finite buffer and the
      host stops the run at its next read of the flags (a report, not a silent NaN);
    - ``"skip"``: :meth:`inspect` sets :attr:`found_inf` to 1 and :meth:`step` hands it to the
      optimizer, which then leaves weights, moments and step counts exactly as they were
      (GradScaler's contract; no snapshot of the parameters);
    - ``"sanitize"``: :meth:`inspect` replaces every non-finite gradient element by 0 (after
      the flag was computed from the untouched values) and the step goes on.

    The data a step consumes gets the same answer through :meth:`inputs`, called after the
    sentinel checked it and before anything reads it: under ``"skip"`` a non-finite element
    sets the ``found_inf`` that the next :meth:`inspect` starts from (the step is skipped);
    under ``"sanitize"`` it is zeroed. :meth:`source` does the same for data on its way into
    storage (an env's output): ``"sanitize"`` zeroes it, ``"skip"`` leaves it to the batches
    that hold it (skipping an env step would skip nothing).

    :meth:`inspect` must run before anything that rewrites gradients (a clip that sanitises, or
    a sentinel-guarded sanitiser), so the flag sees what backward produced. The step's
    ``found_inf`` is also useful under ``halt`` (a metric), and is computed in every policy by
    one fused op (``torch._amp_foreach_non_finite_check_and_unscale_``, scale 1).
    """

    def __init__(
        self,
        policy: Policy,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"on_nonfinite={policy!r} must be one of {list(POLICIES)}")
        if policy == "skip" and not honours_found_inf(optimizer):
            raise TypeError(
                f"on_nonfinite='skip' needs an optimizer that honours a found_inf flag "
                f"(trimtab.optim.Adam, or a torch optimizer built with fused=True); got "
                f"{type(optimizer).__name__}"
            )
        self.policy = policy
        self.optimizer = optimizer
        self.found_inf = torch.zeros((), device=device)
        self._pending = torch.zeros((), device=device)  # set by inputs() under "skip"
        self._one = torch.ones((), device=device)
        self._ones: dict[int, Tensor] = {}
        from trimtab.optim import Adam

        if policy != "skip":
            self._step = self._plain
        elif isinstance(optimizer, Adam):
            self._step = self._skip_trimtab
        else:
            self._step = self._skip_fused

    @torch.no_grad()
    def inspect(self, grads: Sequence[Tensor]) -> Tensor:
        """Set :attr:`found_inf` from ``grads`` (1.0 if any element is NaN/±Inf, else 0.0);
        under ``"sanitize"`` then zero the non-finite elements. Returns :attr:`found_inf`."""
        grads = [g for g in grads if g is not None]
        self.found_inf.copy_(self._pending)  # a non-finite input already decided "skip"
        self._pending.zero_()
        if grads:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, self._one)
        if self.policy == "sanitize" and grads:
            ones = self._ones.get(len(grads))
            if ones is None:
                ones = self._ones[len(grads)] = self._one.expand(len(grads)).contiguous()
            scale_finite_(grads, ones)
        return self.found_inf

    @torch.no_grad()
    def inputs(self, tensors: Sequence[Tensor]) -> None:
        """The step's input data (float tensors), after the sentinel's check: under ``"skip"``
        flag the step if any element is non-finite; under ``"sanitize"`` zero those elements."""
        tensors = [t for t in tensors if t.is_floating_point()]
        if self.policy == "skip" and tensors:
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, self._pending, self._one)
        elif self.policy == "sanitize":
            self.source(tensors)

    @torch.no_grad()
    def source(self, tensors: Sequence[Tensor]) -> None:
        """Data on its way into storage, after the sentinel's check: zeroed where non-finite
        under ``"sanitize"``; untouched otherwise."""
        tensors = [t for t in tensors if t.is_floating_point()]
        if self.policy == "sanitize" and tensors:
            ones = self._ones.get(len(tensors))
            if ones is None:
                ones = self._ones[len(tensors)] = self._one.expand(len(tensors)).contiguous()
            scale_finite_(tensors, ones)

    def step(self) -> None:
        """The optimizer step; under ``"skip"`` it honours :attr:`found_inf` (which form of the
        call is chosen once, at construction)."""
        self._step()

    def _plain(self) -> None:
        self.optimizer.step()

    def _skip_trimtab(self) -> None:
        self.optimizer.step(found_inf=self.found_inf)  # type: ignore[call-arg]

    def _skip_fused(self) -> None:
        # torch's fused optimizers read GradScaler's attributes during step()
        opt = self.optimizer
        opt.grad_scale, opt.found_inf = None, self.found_inf  # type: ignore[attr-defined]
        try:
            opt.step()
        finally:
            del opt.grad_scale, opt.found_inf  # type: ignore[attr-defined]
