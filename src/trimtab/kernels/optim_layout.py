"""The declared layout of the optimizer step's workspace, and the torch code that writes and
reads it: the one definition of every statistic ``trimtab.optim.Adam`` computes, shared by its
reference (CPU) path and its Triton kernels (:mod:`trimtab.kernels.optim`,
:mod:`trimtab.kernels.optim_finalize`). Imports torch only, so the CPU path needs no Triton.

A group's step writes its workspace (:class:`Workspace`); the finalize reads it:

- ``parts`` int32 ``[R, PART_WIDTH]``: ``R`` replica rows (``REPLICAS``; the kernel's program
  ``p`` adds to row ``p % R``, the reference writes row 0) of ``Σ w·u, Σ w², Σ u², Σ|u|,
  Σ_{L1}|w|`` (float32 bits), the clamp's engagement count, the bits of the finite max ``|w|``,
  the finite count (int32), then ``Σ g², Σ v̂`` (float32 bits). Reduced by
  :func:`parts_reference`.
- ``ints`` int32 ``[INT_WIDTH]``: per quantity (``|w|`` after the update and L1 step, before the
  clamp; ``|m|``; ``|v|``) the count below its window, a 256-bin coarse histogram of the float32
  exponent (``bits >> 23``) and a 256-bin window histogram of ``2**15``-bit sub-bins from the
  window base ``sel``; over the *sampled* elements only (:func:`sampled_elements`), finite ones.
- ``sel`` int32 ``[3]``: the window bases (-1: none), set by the last finalize.
- ``phase`` int32 ``[1]`` (shared by the groups): the sampling phase, advanced by the finalize.

Quantile (:func:`window_quantiles_reference`): rank ``ceil(n q)`` of the ``n`` sampled finite
elements, read as the lower edge of the window sub-bin holding it (within ``2**-8`` below the
sampled order statistic) or of its octave when it lies outside the window (at least half of it).
Why a sample and a window, not an exact quantile: see ``kernels/optim.py`` (speed on the GPU).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import torch

BLOCK = 4096  # elements of one pointer-table block
SUB = 1024  # elements of one sampling chunk (a block is BLOCK // SUB of them)
BINS = 256
COARSE_SHIFT = 23
FINE_SHIFT = 15
WINDOW_BITS = BINS << FINE_SHIFT
MIN_SAMPLE = 1 << 17
MAX_SAMPLE_STRIDE = 64
PHASE_PERIOD = 1 << 20  # a multiple of every stride: the rotation survives the wrap
NONFINITE_BITS = 0x7F800000
# Sub-bins of 2**FINE_SHIFT bits over the non-negative int32s (``bits >> FINE_SHIFT``): the keys
# of the multi-tensor path's one histogram; keys from FINITE_KEYS up hold Inf and NaN.
FINE_KEYS = 1 << (31 - FINE_SHIFT)
FINITE_KEYS = NONFINITE_BITS >> FINE_SHIFT
# ints: the counts below the 3 windows, then 3 coarse and 3 window histograms (|w|, |m|, |v|).
INT_UNDER = 0  # 3 entries
HIST_OFFSET = 4
WINDOW_OFFSET = HIST_OFFSET + 3 * BINS
INT_WIDTH = WINDOW_OFFSET + 3 * BINS
# parts: words of one replica row.
REPLICAS = 256
NUM_SUMS = 5
PART_ENGAGED, PART_MAXBITS, PART_FINITE = 5, 6, 7
PART_GG, PART_VHAT = 8, 9
PART_WIDTH = 10
# Group flag bits for the finalize.
OBSERVED, CLAMP, AUTO, L1 = 1, 2, 4, 8


class Workspace(NamedTuple):
    """One group's workspace (see the module docstring); zero (``sel``: -1) when fresh."""

    parts: torch.Tensor  # int32 [R, PART_WIDTH]
    ints: torch.Tensor  # int32 [INT_WIDTH]
    sel: torch.Tensor  # int32 [3]
    phase: torch.Tensor  # int32 [1], shared by every group


def fold_shape(num_groups: int) -> tuple[int, int]:
    """The finalize kernel's scratch of the slot fold (float32): its observations and choices,
    one lane per slot kind (8) of each of the groups rounded up to a power of two."""
    return 2, 8 << (num_groups - 1).bit_length()


def sample_stride(numel: int) -> int:
    """The sampling stride ``S`` of a group of ``numel`` elements: the largest power of two with
    at least ``MIN_SAMPLE`` sampled elements, at most ``MAX_SAMPLE_STRIDE``."""
    s = 1
    while s < MAX_SAMPLE_STRIDE and numel >= 2 * s * MIN_SAMPLE:
        s *= 2
    return s


@functools.lru_cache(maxsize=64)
def _chunk_ids(numels: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The chunk of every element of a group (see :func:`sampled_elements`); fixed per layout,
    so built once (int32: 4 bytes an element)."""
    chunks = []
    block = 0
    for n in numels:
        j = torch.arange(n, dtype=torch.int64)
        chunks.append(block * (BLOCK // SUB) + j // SUB)
        block += max(1, -(-n // BLOCK))
    c = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.int64)
    return c.to(device=device, dtype=torch.int32)


def sampled_elements(numels: Sequence[int], phase: torch.Tensor, stride: int) -> torch.Tensor:
    """Bool mask over the group's elements concatenated in order: element ``j`` of tensor ``t``
    lies in chunk ``c = block_start[t] * (BLOCK // SUB) + j // SUB`` (``block_start`` as in the
    pointer table: a tensor takes ``max(1, ceil(n / BLOCK))`` blocks) and is sampled when
    ``(c + phase) % stride == 0``. Over ``stride`` consecutive phases every chunk is sampled
    exactly once. No host sync: ``phase`` stays on its device."""
    c = _chunk_ids(tuple(numels), phase.device)
    return (c + phase) % stride == 0


@functools.lru_cache(maxsize=64)
def sampled_index_table(numels: tuple[int, ...], stride: int, device: torch.device) -> torch.Tensor:
    """int64 ``[stride, L]``: row ``r`` lists the elements :func:`sampled_elements` picks at a
    phase ``≡ r (mod stride)``, padded with ``sum(numels)`` (an index one past the group, where
    the multi-tensor path keeps an Inf: a padded slot is never counted). Row
    ``phase % stride`` is the step's sample, selected on the device (no host sync); about
    ``8 * sum(numels)`` bytes, built once per layout."""
    n = sum(numels)
    c = _chunk_ids(numels, torch.device("cpu")).long()
    rows = [torch.nonzero((c + r) % stride == 0).reshape(-1) for r in range(stride)]
    width = max((r.numel() for r in rows), default=0)
    table = torch.full((stride, width), n, dtype=torch.int64)
    for r, idx in enumerate(rows):
        table[r, : idx.numel()] = idx
    return table.to(device)


def float_bits(x: torch.Tensor) -> torch.Tensor:
    """int32 bits of ``|x|`` rounded to float32 (the kernels' dtype; float64 references too)."""
    return x.detach().float().view(torch.int32) & 0x7FFFFFFF


def histograms_reference(
    ints: torch.Tensor, values: Sequence[torch.Tensor], sampled: torch.Tensor, sel: torch.Tensor
) -> None:
    """Add the histograms of ``values`` (flat ``|w|``, ``m``, ``v`` of the group) over the
    ``sampled`` elements to the ``ints`` row, as the update kernel does (sign ignored,
    non-finite elements skipped)."""
    zeros = torch.zeros(BINS, dtype=torch.int32, device=ints.device)
    for k, x in enumerate(values):
        bits = float_bits(x.reshape(-1))
        valid = sampled & (bits < NONFINITE_BITS)
        # scatter_add of 0/1 counts, not boolean indexing: no host sync on CUDA.
        coarse = zeros.scatter_add(0, (bits >> COARSE_SHIFT).long(), valid.int())
        ints[HIST_OFFSET + k * BINS : HIST_OFFSET + (k + 1) * BINS] += coarse
        base = sel[k]
        rel = bits.long() - base.long()
        has = valid & (base >= 0)  # no window (base -1): nothing below it or in it
        ints[INT_UNDER + k] += (has & (rel < 0)).sum().int()
        inwin = has & (rel >= 0) & (rel < WINDOW_BITS)
        digit = torch.where(inwin, rel >> FINE_SHIFT, 0)
        fine = zeros.scatter_add(0, digit, inwin.int())
        ints[WINDOW_OFFSET + k * BINS : WINDOW_OFFSET + (k + 1) * BINS] += fine


def histograms_from_fine(ints: torch.Tensor, fine: torch.Tensor, sel: torch.Tensor) -> None:
    """Add to ``ints`` what :func:`histograms_reference` adds, from ``fine`` ``[3, FINE_KEYS]``:
    per quantity the count of sampled elements per key ``float_bits >> FINE_SHIFT`` (keys of
    Inf and NaN may hold anything: they are ignored). A coarse bin is 256 consecutive keys; the
    window bases ``sel`` are multiples of ``2**FINE_SHIFT`` (the finalize writes them so), so
    the window is the 256 keys from ``sel >> FINE_SHIFT`` and the count below it the coarse
    bins below the base's plus the keys of its own bin below it. The multi-tensor path's
    binning: one histogram of the sample, then only ``[3, 256]`` work.
    """
    by_bin = fine.view(3, BINS, BINS)
    coarse = by_bin.sum(-1, dtype=torch.int32)  # counts of sampled elements: int32 holds them
    coarse[:, -1] = 0  # keys from FINITE_KEYS: Inf and NaN
    ints[HIST_OFFSET:WINDOW_OFFSET] += coarse.reshape(-1).to(ints.dtype)
    has = sel >= 0
    base = (sel.to(torch.int64) >> FINE_SHIFT).clamp(0, FINITE_KEYS)
    cb = (base >> 8).clamp(max=BINS - 1)  # the coarse bin holding the base
    below = torch.arange(BINS, device=fine.device) < cb[:, None]
    own = by_bin.gather(1, cb[:, None, None].expand(3, 1, BINS)).reshape(3, BINS)
    partial = torch.arange(BINS, device=fine.device) < (base - (cb << 8))[:, None]
    under = (coarse * below).sum(-1) + (own * partial).sum(-1, dtype=torch.int32)
    ints[INT_UNDER : INT_UNDER + 3] += torch.where(has, under, 0).to(ints.dtype)
    keys = base[:, None] + torch.arange(BINS, device=fine.device)
    inside = has[:, None] & (keys < FINITE_KEYS)
    win = fine.gather(1, keys.clamp(max=FINE_KEYS - 1))
    ints[WINDOW_OFFSET:INT_WIDTH] += torch.where(inside, win, 0).reshape(-1).to(ints.dtype)


def parts_reference(parts: torch.Tensor) -> torch.Tensor:
    """``[G, NUM_SUMS + 5]`` float32 from the ``parts`` workspace ``[G, R, PART_WIDTH]``:
    ``Σ w·u, Σ w², Σ u², Σ|u|, Σ_{L1}|w|``, finite count, engagement count, max ``|w|``, then
    ``Σ g², Σ v̂``: the finalize's reduction over the replicas."""
    sums = parts[..., :NUM_SUMS].contiguous().view(torch.float32).sum(dim=1)
    counts = parts[..., [PART_FINITE, PART_ENGAGED]].to(torch.int64).sum(dim=1)
    max_bits = parts[..., PART_MAXBITS].amax(dim=1, keepdim=True)
    growth = parts[..., [PART_GG, PART_VHAT]].contiguous().view(torch.float32).sum(dim=1)
    return torch.cat([sums, counts.float(), max_bits.view(torch.float32), growth], dim=1)


def window_quantiles_reference(
    ints: torch.Tensor, sel: torch.Tensor, q: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(quantiles, next_sel)``, both ``[G, 3]`` (of |w|, |m|, |v|), from the workspace.

    The rank is ``ceil(n q)`` (float64, at least 1) of the ``n`` sampled finite elements; the
    value is the lower edge of the window sub-bin holding it, or of its octave when it lies
    outside the window; 0 (and no next window, -1) when nothing was sampled. The next window
    is centred on this quantile (on the octave itself after a coarse step).
    """
    hist = ints[:, HIST_OFFSET:WINDOW_OFFSET].reshape(-1, 3, BINS).to(torch.int64)
    win = ints[:, WINDOW_OFFSET:INT_WIDTH].reshape(-1, 3, BINS).to(torch.int64)
    under = ints[:, INT_UNDER : INT_UNDER + 3].to(torch.int64)
    base = sel.to(torch.int64)
    cum = hist.cumsum(-1)
    n = cum[..., -1]
    rank = torch.ceil(n.double() * q).long().clamp(min=1)
    chosen = torch.searchsorted(cum, rank.unsqueeze(-1)).squeeze(-1).clamp(max=BINS - 1)
    within = rank - under
    fcum = win.cumsum(-1)
    in_win = (base >= 0) & (within >= 1) & (within <= fcum[..., -1])
    fchosen = torch.searchsorted(fcum, within.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    bits = torch.where(in_win, base + (fchosen << FINE_SHIFT), chosen << COARSE_SHIFT)
    value = bits.to(torch.int32).view(torch.float32)
    value = torch.where(n > 0, value, torch.zeros_like(value))
    centred = ((bits >> FINE_SHIFT) - BINS // 2).clamp(min=0) << FINE_SHIFT
    nxt = torch.where(n > 0, torch.where(in_win, centred, chosen << COARSE_SHIFT), -1)
    return value, nxt.to(sel.dtype)
