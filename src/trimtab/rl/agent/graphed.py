"""The guarded learn step captured whole in a CUDA graph: warmed up eagerly on a side stream,
captured once on static batch buffers, then replayed per step (one launch instead of hundreds).

What a replay does is exactly what the eager step does (the same kernels on the same buffers, the
agent's generator registered with the graph, so its random draws continue the eager sequence);
what cannot live in a graph stays on the host around it, in
:class:`trimtab.rl.agent.learner.Learner`:
the target sync every ``target_update_period`` updates, the replay's priority update, the host
read of the sentinel's flag. Follows PyTorch's whole-network capture recipe (``torch.cuda.graph``
after a side-stream warm-up; the "CUDA Graphs" notes of the CUDA semantics docs).
"""

from __future__ import annotations

import ctypes
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from trimtab.kernels._table import keep_host_copies

__all__ = ["WARMUP_STEPS", "Beside", "CapturedStep", "OwnStream", "dedicated_stream"]

#: Eager steps on a side stream before the capture: lazily built state (optimizer moments, the
#: sentinel's pointer tables of persistent buffers, Triton specialisations, the moments' slots
#: that the optimizer phase checks from its second step on) must exist before it, and PyTorch's
#: recipe warms up "a few" iterations (its example: 3). They are real training steps.
WARMUP_STEPS = 3

Step = Callable[[dict[str, Tensor]], dict[str, Tensor]]
T = TypeVar("T")


class CapturedStep:
    """``step(batch) -> info`` run eagerly ``warmup`` times on a side stream, then captured in a
    :class:`torch.cuda.CUDAGraph` on static copies of the batch and replayed for every later
    call (the batch copied into the static buffers first, one ``_foreach_copy_``; a step that
    samples its own batch takes an empty dict).

    ``generators``: the generators the step draws from, registered with the graph so a replay
    advances them as the eager step does. ``addresses()``: the data pointers of every buffer the
    step keeps between steps that an outside call could reallocate (optimizer state, gradients,
    weights); the capture records them, and :meth:`check` (which the owner calls at each fold
    boundary and after a checkpoint load) drops the graph when they moved, so a reset that
    reallocates is recaptured (after a new warm-up) instead of replaying into freed memory.
    Replays return the same ``info`` tensors each time (overwritten by the next replay): clone
    what must outlive a step. Batches must keep the captured keys, shapes and dtypes (a
    mismatch is an error naming the key).
    """

    def __init__(
        self,
        step: Step,
        generators: Sequence[torch.Generator],
        addresses: Callable[[], tuple[int, ...]],
        warmup: int = WARMUP_STEPS,
    ) -> None:
        if warmup < 1:
            raise ValueError(f"warmup={warmup}: capture needs at least one eager step before it")
        self.step, self.generators, self.addresses = step, list(generators), addresses
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, Tensor] = {}
        self.out: dict[str, Tensor] = {}
        self.warm = 0  # eager steps since the last (re)capture was due
        #: captures made, and the host seconds they took (warm-up steps not included)
        self.captures, self.capture_seconds = 0, 0.0
        self._captured_at: tuple[int, ...] = ()
        self._keep: list[Tensor] = []  # tables, workspaces, pinned copies the graph reads
        self._own = OwnStream()  # the warm-ups' and the capture's stream

    def __call__(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        if self.graph is None:
            if self.warm < self.warmup:
                self.warm += 1
                return self._eager(batch)
            self._capture(batch)
        self._load(batch)
        self.graph.replay()  # type: ignore[union-attr]
        return self.out

    def _eager(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return self._own.run(self.step, batch)

    def side_stream(self) -> torch.cuda.Stream:
        """This step's own stream (:class:`OwnStream`): its warm-ups run on it, and its graph
        is captured on it."""
        return self._own.stream

    def _capture(self, batch: dict[str, Tensor]) -> None:
        t0 = time.perf_counter()
        self.static = {k: v.detach().clone() for k, v in batch.items()}
        graph = torch.cuda.CUDAGraph()
        for g in self.generators:
            graph.register_generator_state(g)
        with keep_host_copies() as kept, self._own.capture(graph):
            self.out = self.step(self.static)
        self.graph, self._keep = graph, kept
        self._captured_at = self.addresses()
        self.captures += 1
        self.capture_seconds += time.perf_counter() - t0

    def _load(self, batch: dict[str, Tensor]) -> None:
        if batch is self.static:
            return
        if batch.keys() != self.static.keys():
            raise KeyError(
                f"the captured learn step reads batch keys {sorted(self.static)}, this batch "
                f"has {sorted(batch)}; keep one replay configuration per run"
            )
        dst, src = [], []
        for k, s in self.static.items():
            x = batch[k]
            if x.shape != s.shape or x.dtype != s.dtype or x.device != s.device:
                raise ValueError(
                    f"batch[{k!r}] is {tuple(x.shape)} {x.dtype} on {x.device}; the captured "
                    f"step reads {tuple(s.shape)} {s.dtype} on {s.device} (the batch size and "
                    "the replay's layout are fixed once captured)"
                )
            dst.append(s)
            src.append(x)
        if dst:  # a step that samples inside the graph reads no batch
            torch._foreach_copy_(dst, src)

    def check(self) -> bool:
        """Drop the graph if the buffers it was captured on moved (a reset or a load that
        reallocated them); the next calls warm up and recapture. Returns True if it dropped."""
        if self.graph is None or self.addresses() == self._captured_at:
            return False
        self.drop()
        return True

    def drop(self) -> None:
        """Forget the graph (the next :attr:`warmup` calls run eagerly, then it recaptures)."""
        self.graph, self.static, self.out, self._keep = None, {}, {}, []
        self.warm = 0


class OwnStream:
    """The CUDA stream of one captured graph's owner (a learn step, a collection, an
    evaluation), made at first use (:func:`dedicated_stream`): its eager warm-ups run on it
    (:meth:`run`) and its graph is captured on it (:meth:`capture`), never on
    ``torch.cuda.graph``'s default capture stream, which is one for the whole process, nor on a
    stream another object holds. cuBLAS's workspace is chosen per stream, and a graph records
    the workspace of the stream it was captured on: graphs captured on one stream share a
    workspace, and replayed at once on different streams (the members of a population, each on
    its own) their matrix products would write it together; destroying one of them frees the
    workspace the others still read (PyTorch clears a capture stream's workspaces when its
    graph is destroyed). The stream goes back to this module's free streams when this object
    is collected, with its owner and the owner's graph: a long sweep's trials reuse them."""

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None

    @property
    def stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            device = torch.cuda.current_device()
            free = _FREE.setdefault(device, [])
            self._stream = free.pop() if free else dedicated_stream()
            weakref.finalize(self, free.append, self._stream)
        return self._stream

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on this stream, ordered after the current stream's work and before its
        next (the streams wait on each other on the device: no host sync)."""
        current, own = torch.cuda.current_stream(), self.stream
        own.wait_stream(current)
        with torch.cuda.stream(own):
            out = fn(*args)
        current.wait_stream(own)
        return out

    def capture(self, graph: torch.cuda.CUDAGraph) -> torch.cuda.graph:
        """``torch.cuda.graph(graph)`` captured on this stream."""
        return torch.cuda.graph(graph, stream=self.stream)


#: per device, the streams of collected :class:`OwnStream` objects, whose graphs are gone too
_FREE: dict[int, list[torch.cuda.Stream]] = {}


def dedicated_stream() -> torch.cuda.Stream:
    """A CUDA stream (on the current device) that no other object of this process holds, for
    the rest of the process: made by the CUDA runtime (``cudaStreamCreate``, through
    ``torch.cuda.cudart()``) and wrapped as a ``torch.cuda.ExternalStream``. ``torch.cuda.Stream()``
    hands out the streams of a pool, 32 per device and priority, round robin: a process that
    makes more (a population of 32 runs makes 96) gets streams that other objects already
    hold. Never destroyed (an ``ExternalStream`` does not own its stream): a destroyed stream's
    handle could be a later stream's, and with it the workspaces PyTorch keys by that handle.
    A torch without that binding gets a pool stream, with a warning."""
    cudart = torch.cuda.cudart()
    create = getattr(cudart, "cudaStreamCreate", None)
    if create is None:
        warnings.warn(
            "torch.cuda.cudart() has no cudaStreamCreate: a captured graph gets a stream of "
            "torch's pool of 32, which more than 32 graphs in one process share",
            RuntimeWarning,
            stacklevel=2,
        )
        return torch.cuda.Stream()
    handle = ctypes.c_void_p(0)
    error = create(ctypes.addressof(handle))
    if int(error) != 0 or not handle.value:
        raise RuntimeError(f"cudaStreamCreate failed: {error}")
    return torch.cuda.ExternalStream(handle.value, device=torch.cuda.current_device())


class Beside:
    """Work that nothing later in the step reads, run on a second CUDA stream beside what
    follows until :meth:`join` (a fork and a join: captured, two branches of the graph that the
    GPU runs at once). On the CPU, or with ``enabled`` False, plain sequential code. No host
    sync: the streams wait on each other's events on the device.

    Use::

        with beside:
            independent_work()
        other_work()
        beside.join()
    """

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.stream = torch.cuda.Stream(device) if enabled and device.type == "cuda" else None
        self._ctx: torch.cuda.StreamContext | None = None

    def __enter__(self) -> Beside:
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
            self._ctx = torch.cuda.stream(self.stream)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(*exc)

    def join(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
