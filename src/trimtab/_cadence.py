"""How often a producer measures: every step, or every ``k``-th, counted on the host.

A producer (:class:`~trimtab.AdaptiveBounds`, :class:`~trimtab.AdaptiveGradClip`,
:class:`~trimtab.optim.Adam`) measures, tests and folds on the steps its cadence makes due, and
its consumers apply the bound in force on every step. The count is a host integer, so choosing
a step costs nothing and reads nothing from the device; the three producers of a training step
each count their own steps from the same reset and so stay in step. Statistics refreshed every
``k`` steps to amortise their cost are the practice of second-order optimizers (K-FAC's
curvature every ``T`` steps, Martens & Grosse 2015; Shampoo's preconditioner, Gupta et al. 2018).
"""

from __future__ import annotations

from typing import Any

import torch


def check_measure_every(value: Any, owner: str) -> int:
    """``value`` when it is an int >= 1; else a ValueError naming ``owner``'s argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{owner}: measure_every must be an int >= 1 (steps per measurement; 1: every "
            f"step), got {value!r}"
        )
    return value


class Cadence:
    """Steps since the last reset, on the host; :attr:`due` on steps ``0, k, 2k, ...``."""

    __slots__ = ("every", "owner", "step")

    def __init__(self, every: int, owner: str) -> None:
        self.every = check_measure_every(every, owner)
        self.owner = owner  # who counts: named in the errors
        self.step = 0

    @property
    def due(self) -> bool:
        return self.step % self.every == 0

    def advance(self) -> None:
        self.step += 1

    def take(self) -> bool:
        """Count one step (refused under capture when ``k > 1``); returns whether it was due."""
        due = self.due
        self.refuse_capture()
        self.advance()
        return due

    def reset(self) -> None:
        self.step = 0

    def refuse_capture(self) -> None:
        """A CUDA graph replays the step it captured, measuring or not, whatever the count
        says: refuse ``measure_every > 1`` under capture."""
        if (
            self.every > 1
            and torch.cuda.is_available()
            and torch.cuda.is_current_stream_capturing()
        ):
            raise RuntimeError(
                f"{self.owner}: measure_every={self.every} chooses on the host which steps "
                "measure, and a captured CUDA graph replays one of them every time: capture "
                "with measure_every=1, or run this step eagerly"
            )

    def state_dict(self) -> int:
        return self.step

    def load(self, step: Any) -> None:
        """A saved count (an int); a checkpoint from before the cadence counts from 0."""
        self.step = int(step) if step is not None else 0
