"""Pointer tables: one int64 tensor of data pointers so one launch can read many tensors.

Building a table copies host integers to the device, so tables are cached by the tensors'
(pointer, numel, dtype) signature: after a warm-up call, a loop over the same buffers builds
nothing. A table built while a CUDA graph is captured (the graph's own temporaries have new
addresses) is a pinned host-to-device copy that every replay repeats: build it inside
:func:`keep_host_copies`, which hands the pinned arrays to the graph's owner to keep alive.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

# Element dtype codes understood by the kernels (see ``load_as_f32`` in each kernel file).
DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

_CACHE_SIZE = 64

#: Where the tensors used under :func:`keep_host_copies` go (else None).
_kept: list[torch.Tensor] | None = None


@contextmanager
def keep_host_copies() -> Iterator[list[torch.Tensor]]:
    """Collect every cached table (device arrays, and the pinned host arrays of those built
    inside) and every grown workspace (:func:`keep`) that a capture inside uses.

    A captured graph reads them at the addresses it was captured with: a table evicted from its
    cache, a workspace replaced by a larger one, or a pinned host array freed (the caching host
    allocator may hand the block to another copy, whose pointers a replay would then load) would
    leave it reading or writing freed memory. Hold the list as long as the graph lives."""
    global _kept
    outer, _kept = _kept, []
    try:
        yield _kept
    finally:
        kept, _kept = _kept, outer
        if outer is not None:
            outer.extend(kept)


def keep(*tensors: torch.Tensor) -> None:
    """Hand ``tensors`` to the graph being captured under :func:`keep_host_copies`, if any."""
    if _kept is not None:
        _kept.extend(tensors)


@dataclass(frozen=True)
class PointerTable:
    """Device arrays describing ``len(tensors)`` contiguous tensors for one launch.

    ``ptrs[i]`` is tensor i's data pointer, ``numels[i]`` its element count and ``block_start``
    the prefix sum of blocks per tensor (``block_start[i]`` is the first program of tensor i,
    ``block_start[-1]`` the grid size) for a grid of ``block``-element programs, and
    ``block_tensor[p]`` the tensor that program ``p`` reads (its element offset inside that
    tensor is ``(p - block_start[block_tensor[p]]) * block``). An empty tensor still gets one
    program, so per-tensor outputs are always written.
    """

    ptrs: torch.Tensor
    numels: torch.Tensor
    block_start: torch.Tensor
    block_tensor: torch.Tensor
    num_blocks: int
    block: int
    count: int


_cache: OrderedDict[tuple, PointerTable] = OrderedDict()


def pointer_table(tensors: Sequence[torch.Tensor], block: int) -> PointerTable:
    """The (cached) pointer table of ``tensors``, which must be contiguous and on one device."""
    key = (block, *((t.data_ptr(), t.numel(), t.dtype, t.device) for t in tensors))
    table = _cache.get(key)
    if table is not None:
        _cache.move_to_end(key)
        keep(table.ptrs, table.numels, table.block_start, table.block_tensor)
        return table
    device = tensors[0].device
    numels = [t.numel() for t in tensors]
    blocks = [max(1, -(-n // block)) for n in numels]
    starts = [0]
    for b in blocks:
        starts.append(starts[-1] + b)
    blocks_t = torch.tensor(blocks, dtype=torch.int64)
    host = torch.cat(
        [
            torch.tensor(
                [[t.data_ptr() for t in tensors], numels, starts[:-1]], dtype=torch.int64
            ).reshape(-1),
            torch.tensor(starts, dtype=torch.int64),
            torch.repeat_interleave(torch.arange(len(tensors), dtype=torch.int64), blocks_t),
        ]
    )
    if device.type == "cuda":
        # pinned + non_blocking: an asynchronous copy, not a host sync (the caching host
        # allocator keeps the pinned block alive until the copy has run)
        host = host.pin_memory()
    dev = host.to(device, non_blocking=True)
    n = len(tensors)
    table = PointerTable(
        ptrs=dev[0:n],
        numels=dev[n : 2 * n],
        block_start=dev[3 * n : 4 * n + 1],
        block_tensor=dev[4 * n + 1 :].to(torch.int32),
        num_blocks=starts[-1],
        block=block,
        count=n,
    )
    keep(host, dev, table.block_tensor)
    _cache[key] = table
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return table


_arrays: OrderedDict[tuple, torch.Tensor] = OrderedDict()
_ARRAY_CACHE_SIZE = 256


def pointer_array(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The (cached) int64 device array of the tensors' data pointers, in order: the state table
    of a kernel that reads a fixed set of buffers updated in place (one device)."""
    device = tensors[0].device
    key = (device, *(t.data_ptr() for t in tensors))
    array = _arrays.get(key)
    if array is not None:
        _arrays.move_to_end(key)
        keep(array)
        return array
    host = torch.tensor(key[1:], dtype=torch.int64)
    if device.type == "cuda":  # pinned + non_blocking: an asynchronous copy, not a host sync
        host = host.pin_memory()
    array = host.to(device, non_blocking=True)
    keep(host, array)
    _arrays[key] = array
    if len(_arrays) > _ARRAY_CACHE_SIZE:
        _arrays.popitem(last=False)
    return array
