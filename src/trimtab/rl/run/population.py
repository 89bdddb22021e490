"""Several training runs in one process, as one population: each run's loop
(:func:`trimtab.rl.run.runner.train_steps`) stepped in turn, one batched env step (and its
gradient steps) at a time.

Every member is a whole run of its own: its agent, replay, envs, bounds, sentinel, checkpoints,
run directory and report, built and written by the same code as a run alone. What the members
share is the process (one interpreter, one CUDA context, Triton's compiled kernels) and, on a
GPU, the device: each member's work goes to a CUDA stream of its own, so while the host queues
one member's step (a replay of its captured collection and learn graphs) the device still runs
the others'. Small networks leave most of a GPU idle in one run's chain of short kernels; the
streams fill it with the other members' chains.

What would leak between runs stepped in one process is kept apart per member: the torch CPU
random stream (a member's seeding and any draw from it) is swapped in and out with the member,
so a member's numbers are those of the same run alone (on the CPU, bitwise: tested).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

__all__ = ["Member", "interleave"]

T = TypeVar("T")

#: hardware queues CUDA gives a process's streams (its default, 8, would queue the members'
#: streams behind each other past 8); set before CUDA starts, unless the user set it
CUDA_CONNECTIONS = "32"


@dataclass
class Member(Generic[T]):
    """One run of a population: how to start it, and its state between its turns."""

    start: Callable[[], Generator[None, None, T]]
    device: torch.device
    steps: Generator[None, None, T] | None = None
    stream: torch.cuda.Stream | None = None
    rng: torch.Tensor = field(default_factory=torch.get_rng_state)
    done: bool = False
    result: T | None = None


def interleave(
    starts: Sequence[Callable[[], Generator[None, None, T]]],
    devices: Sequence[torch.device],
    on_done: Callable[[int, T], None] | None = None,
) -> list[T]:
    """Run the generators ``starts[i]()`` (each yields after every step of its run and returns
    its result) in turn until every one has returned; ``devices[i]`` is member ``i``'s torch
    device (a CUDA member runs on a stream of its own). A generator is started at its first
    turn, inside its member's context, so its set-up (seeding, building, capturing) is its own.
    ``on_done(i, result)`` is called as each finishes. A generator that raises stops the
    population: the others are closed (their clean-up runs, as an interrupted run's does) and
    the error propagates; wrap a run whose failure is a result (a sweep's trial) so that it
    returns it instead."""
    if len(starts) != len(devices):
        raise ValueError(f"{len(starts)} runs but {len(devices)} devices")
    if any(d.type == "cuda" for d in devices):
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", CUDA_CONNECTIONS)
    members = [Member(start, torch.device(d)) for start, d in zip(starts, devices)]
    try:
        while not all(m.done for m in members):
            for i, m in enumerate(members):
                if m.done:
                    continue
                if _turn(m) and on_done is not None:
                    on_done(i, m.result)  # type: ignore[arg-type]
    except BaseException:
        for m in members:
            if m.steps is not None and not m.done:
                m.steps.close()
        raise
    return [m.result for m in members]  # type: ignore[misc]


def _turn(m: Member[T]) -> bool:
    """One step of member ``m`` in its own random stream and CUDA stream; True once it is done."""
    outside = torch.get_rng_state()
    torch.set_rng_state(m.rng)
    try:
        if m.device.type == "cuda":
            if m.stream is None:
                m.stream = torch.cuda.Stream(m.device)
            with torch.cuda.device(m.device), torch.cuda.stream(m.stream):
                return _advance(m)
        return _advance(m)
    finally:
        m.rng = torch.get_rng_state()
        torch.set_rng_state(outside)


def _advance(m: Member[T]) -> bool:
    if m.steps is None:
        m.steps = m.start()
    try:
        next(m.steps)
    except StopIteration as finished:
        m.done, m.result = True, finished.value
    return m.done
