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

import contextlib
import os
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

__all__ = ["Member", "ReportPool", "interleave"]

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
    # CUDA members on one device: that device is current for the whole loop, entered once (a
    # device context a turn cost more host time than a member's launches of small graphs)
    cudas = {_cuda_index(m.device) for m in members if m.device.type == "cuda"}
    one_device = len(cudas) == 1
    shared = torch.cuda.device(min(cudas)) if one_device else contextlib.nullcontext()
    try:
        with shared:
            # the stream current outside the members' turns, restored after each
            outside = torch.cuda.current_stream() if one_device else None
            while not all(m.done for m in members):
                for i, m in enumerate(members):
                    if m.done:
                        continue
                    if _turn(m, outside) and on_done is not None:
                        on_done(i, m.result)  # type: ignore[arg-type]
    except BaseException:
        for m in members:
            if m.steps is not None and not m.done:
                m.steps.close()
        raise
    return [m.result for m in members]  # type: ignore[misc]


def _turn(m: Member[T], outside: torch.cuda.Stream | None) -> bool:
    """One step of member ``m`` in its own random stream and CUDA stream; True once it is done.
    ``outside``: where the CUDA members share one device (made current by the caller), the
    stream current between turns, set again after ``m``'s; None where their devices differ
    (each turn then enters its member's device and stream the usual way)."""
    rng = torch.get_rng_state()
    torch.set_rng_state(m.rng)
    try:
        if m.device.type != "cuda":
            return _advance(m)
        if m.stream is None:
            m.stream = torch.cuda.Stream(m.device)
        if outside is None:
            with torch.cuda.device(m.device), torch.cuda.stream(m.stream):
                return _advance(m)
        torch.cuda.set_stream(m.stream)  # (a stream context costs 3 device lookups a turn)
        try:
            return _advance(m)
        finally:
            torch.cuda.set_stream(outside)
    finally:
        m.rng = torch.get_rng_state()
        torch.set_rng_state(rng)


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _advance(m: Member[T]) -> bool:
    if m.steps is None:
        m.steps = m.start()
    try:
        next(m.steps)
    except StopIteration as finished:
        m.done, m.result = True, finished.value
    return m.done


class ReportPool:
    """The members' reports (:func:`trimtab.rl.report.build.build_report`, matplotlib's plots
    and the HTML, about a second of CPU each) built by worker processes as the members finish,
    side by side, instead of one after another in the population's process. The workers start
    (``spawn``: the parent holds a CUDA context) and import the report's modules when the pool
    opens, while the members train. Leaving the ``with`` block waits for every report;
    :attr:`failed` lists ``(run_dir, error)`` of those that raised (the run directory is then
    left without ``report.html``, as a run stopped while writing it: ``trimtab report RUN_DIR``
    or ``--resume`` writes it)."""

    def __init__(self, runs: int, workers: int | None = None) -> None:
        from trimtab.rl.report.build import report_pool

        n = workers or max(1, min(runs, (os.cpu_count() or 2) - 1, 16))
        self._pool = report_pool(n)
        self._jobs: list[tuple[Path, Future[Any]]] = []
        self.failed: list[tuple[Path, str]] = []

    def submit(self, run_dir: Path) -> None:
        from trimtab.rl.report.build import build_report

        self._jobs.append((Path(run_dir), self._pool.submit(build_report, run_dir)))

    def __enter__(self) -> ReportPool:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for run_dir, job in self._jobs:
                error = job.exception()
                if error is not None:
                    self.failed.append((run_dir, f"{type(error).__name__}: {error}"))
        finally:
            self._pool.shutdown(wait=True, cancel_futures=exc[0] is not None)
