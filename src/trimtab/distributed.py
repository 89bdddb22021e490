"""Rank consistency under torch.distributed: every rank folds the same measured quantities into
its bounds and sees every rank's sentinel fires at the same step, through one collective a step.

A one-process run never builds a :class:`RankConsistent` and pays nothing: the parts hold
``None`` hooks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

if TYPE_CHECKING:
    from trimtab.bounds import AdaptiveBounds
    from trimtab.clip import AdaptiveGradClip
    from trimtab.optim import Adam
    from trimtab.sentinel import Sentinel

__all__ = ["RankConsistent", "consistent_ranks", "gather_rows"]


def gather_rows(row: Tensor, group: Any = None) -> Tensor:
    """``[world, n]``: every rank's ``row`` (``[n]``), by one ``all_reduce(SUM)`` of a buffer in
    which each rank wrote its own row and zeros elsewhere (x + 0 is exact, NaN and ±Inf stay in
    their row). An all-gather that every backend (gloo, NCCL, MPI) and torch version runs the
    same way; the bytes are ``world`` times the row, which for the few hundred numbers a step
    packs is noise. No host sync (an async collective on CUDA)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    buf = row.new_zeros(world, row.numel())
    buf[rank].copy_(row)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
    return buf


class RankConsistent:
    r"""Makes the state vector's producers and the sentinel agree across the ranks of a process
    group, with one ``all_reduce`` per step (:meth:`sync`).

    Each attached part contributes its step's raw measurements to one packed float64 row; the
    rows of all ranks are gathered (:func:`gather_rows`) and each field is reduced with its own
    operation, then written back, before anything folds. Per field, and why:

    - :class:`~trimtab.AdaptiveBounds`, per bound: the quantile ``y`` by the **count-weighted
      mean** ``Σ_r n_r y_r / Σ_r n_r`` over the ranks that measured it (the ranks sample one
      distribution, each its own shard: ``W`` estimates of one quantile, averaged; a MAX would
      drift upward with the number of ranks); ``M = max|x|`` by **MAX** (the union's largest);
      the count ``n`` and the engagement count ``k`` by **SUM**, so the engagement test runs on
      the union (``k ~ Binomial(Σn, 1 - q)`` while the bound is the quantile). Ranks whose
      shards differ show up there: a mean that sits too low engages too often on the union, and
      the test raises it toward the MAX.
    - :class:`~trimtab.Sentinel`: per slot the **earliest** first fire over the ranks (the
      smallest check number; the lowest rank on a tie), with its step, kind, value and rank
      (:attr:`Sentinel.ranks`): ranks run the same checks in lockstep, so every rank then holds
      the same records and its halt decision, read at the same step, is the same.
    - any extra slot views (:meth:`attach_max`, e.g. a threshold that holds the largest value
      this fold): **MAX**, NaN (unset) counting as absent.

    Sharded training (FSDP), where each rank holds a part of every tensor, also needs the parts
    that measure parameters and gradients: :meth:`attach_clip` (**SUM** of each group's squared
    norm, before the coefficient) and :meth:`attach_optimizer` (**SUM** of its histograms, sums
    and counts, **MAX** of ``max|w|``, before its finalize). Those reduce inside the clip and
    the optimizer step (the value is needed there), one collective each. Under DDP they are
    unnecessary: gradients are averaged before the clip, so norms, weights and moments are the
    same on every rank.

    Call :meth:`sync` once per step, after the last measurement and check and before any
    ``fold()``; an attached :class:`~trimtab.AdaptiveBounds` refuses to fold measurements that
    were not synced. :meth:`sync_flags` merges the sentinel alone (before a halt decision made
    outside the step). On the first step after a reset, an unset bound reads its own rank's
    measurement (nothing was folded yet); from the first fold on, every rank reads the same.
    """

    def __init__(self, group: Any = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "RankConsistent needs an initialised process group: call "
                "torch.distributed.init_process_group(...) first (torchrun sets the environment)"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._bounds: list[AdaptiveBounds] = []
        self._pending: dict[int, bool] = {}  # id(bounds) -> reduced, not folded yet (host)
        self._sentinels: list[Sentinel] = []
        self._views: list[Tensor] = []

    # --- attaching ----------------------------------------------------------------------------
    def attach(self, *parts: Any) -> RankConsistent:
        """Attach :class:`~trimtab.AdaptiveBounds` and :class:`~trimtab.Sentinel` objects (the
        parts every data-parallel run needs); returns ``self``."""
        from trimtab.bounds import AdaptiveBounds
        from trimtab.sentinel import Sentinel

        for part in parts:
            if isinstance(part, AdaptiveBounds):
                if part.before_fold is not None:
                    raise ValueError(f"{part!r} is already attached to a RankConsistent")
                self._bounds.append(part)
                self._pending[id(part)] = False
                part.before_fold = lambda b=part: self._consume(b)
            elif isinstance(part, Sentinel):
                if part.ranks is not None:
                    raise ValueError(f"{part!r} is already attached to a RankConsistent")
                part.ranks = torch.full((len(part.names),), -1, dtype=torch.int64,
                                        device=_device(part))  # fmt: skip
                self._sentinels.append(part)
            else:
                raise TypeError(
                    f"RankConsistent.attach takes AdaptiveBounds and Sentinel objects, got "
                    f"{type(part).__name__}; use attach_max for slot views, attach_clip and "
                    "attach_optimizer for sharded training"
                )
        return self

    def attach_max(self, *views: Tensor) -> RankConsistent:
        """Reduce these float tensors (state-vector slot views, written in place) by MAX at
        each :meth:`sync`; NaN on a rank counts as no value there."""
        for v in views:
            if not v.is_floating_point():
                raise TypeError(f"attach_max takes float tensors, got {v.dtype}")
        self._views.extend(views)
        return self

    def attach_clip(self, clip: AdaptiveGradClip) -> RankConsistent:
        """Sharded gradients (FSDP): the clip's squared group norms and non-finite counts are
        summed over the ranks before its coefficient (its own collective, in the clip)."""
        if clip.reduce_hook is not None:
            raise ValueError("this AdaptiveGradClip is already attached to a RankConsistent")
        group = self.group

        def reduce(values: Tensor) -> None:
            dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)

        clip.reduce_hook = reduce
        return self

    def attach_optimizer(self, optimizer: Adam) -> RankConsistent:
        """Sharded parameters (FSDP): :class:`trimtab.optim.Adam`'s step statistics (sampled
        histograms of ``|w|, |m|, |v|``, the sums and counts behind decay and engagement, and
        ``max|w|``) are reduced over the ranks before its finalize (one collective, in the
        step), so every rank folds the statistics of the whole parameters."""
        from trimtab.optim import Adam

        if not isinstance(optimizer, Adam):
            raise TypeError(
                f"attach_optimizer takes trimtab.optim.Adam, got {type(optimizer).__name__}: "
                "torch's optimizers keep no measured statistics to reduce"
            )
        if any(g["l1"] for g in optimizer.param_groups):
            raise ValueError(
                "attach_optimizer: the adaptive L1 (l1=True) measures an entropy over whole "
                "feature columns, which a shard does not hold; use l1=False under sharding"
            )
        if optimizer.reduce_hook is not None:
            raise ValueError("this optimizer is already attached to a RankConsistent")
        optimizer.reduce_hook = lambda opt: _reduce_optimizer(opt, self.group)
        return self

    # --- the step -----------------------------------------------------------------------------
    @torch.no_grad()
    def sync(self) -> None:
        """One ``all_reduce``: every attached part's measurements of this step reduced over the
        ranks and written back (module docstring), before the folds. No host sync."""
        rows: list[Tensor] = []
        for b in self._bounds:
            rows.append(_pack_bounds(b))
        for s in self._sentinels:
            rows.append(_pack_sentinel(s, self.rank))
        if self._views:
            rows.append(torch.cat([v.detach().reshape(-1).double() for v in self._views]))
        if not rows:
            return
        device = rows[0].device
        gathered = gather_rows(torch.cat([r.to(device) for r in rows]), self.group)
        at = 0
        for b in self._bounds:
            width = BOUND_WIDTH * len(b.names)
            # bounds reduced but not folded yet (sync called twice): already the ranks' result
            if not self._pending[id(b)]:
                _unpack_bounds(b, gathered[:, at : at + width])
            self._pending[id(b)] = True
            at += width
        for s in self._sentinels:
            width = SENTINEL_WIDTH * len(s.names)
            _merge_sentinel(s, gathered[:, at : at + width])
            at += width
        if self._views:
            cols = gathered[:, at:]
            best = cols.nan_to_num(nan=-math.inf).amax(dim=0)
            best = torch.where(torch.isneginf(best) & cols.isnan().all(dim=0), math.nan, best)
            offset = 0
            for v in self._views:
                n = v.numel()
                v.copy_(best[offset : offset + n].reshape(v.shape).to(v.dtype))
                offset += n

    @torch.no_grad()
    def sync_flags(self) -> None:
        """One ``all_reduce`` of the sentinels' records alone: before a halt decision taken
        outside the step (a fire in the env phase since the last :meth:`sync`)."""
        if not self._sentinels:
            return
        rows = [_pack_sentinel(s, self.rank) for s in self._sentinels]
        device = rows[0].device
        gathered = gather_rows(torch.cat([r.to(device) for r in rows]), self.group)
        at = 0
        for s in self._sentinels:
            width = SENTINEL_WIDTH * len(s.names)
            _merge_sentinel(s, gathered[:, at : at + width])
            at += width

    def _consume(self, bounds: AdaptiveBounds) -> None:
        if not self._pending[id(bounds)]:
            raise RuntimeError(
                f"{bounds!r} is rank-consistent, but fold() ran before RankConsistent.sync() "
                "this step: call sync() once per step after the last measurement, then fold()"
            )
        self._pending[id(bounds)] = False

    def __repr__(self) -> str:
        return (
            f"RankConsistent(rank {self.rank} of {self.world_size}: {len(self._bounds)} bounds, "
            f"{len(self._sentinels)} sentinels, {len(self._views)} max views)"
        )


def _device(sentinel: Sentinel) -> torch.device:
    return sentinel._state.materialize()["rec"].device


# --- AdaptiveBounds: [6 per bound] = (n·y, n, max, k, clamp engaged, non-finite) -------------
# n = 0 where a rank did not measure the bound; k is the quantile's exceedances (the test's
# count), which is the clamp's own count when the clamp sits at the quantile.
BOUND_WIDTH = 6


def _exceedances(b: AdaptiveBounds) -> Tensor:
    return getattr(b, "_above", b._counts[:, 0])


def _pack_bounds(b: AdaptiveBounds) -> Tensor:
    took = ~torch.isnan(b._obs)
    n = torch.where(took, b._seen, 0).double()
    y = b._obs.double().nan_to_num(0.0)
    parts = [n * y, n, b._max.double(), _exceedances(b).double(), b._counts.double().t()]
    return torch.cat([torch.stack(parts[:4]), parts[4]]).t().reshape(-1)


def _unpack_bounds(b: AdaptiveBounds, cols: Tensor) -> None:
    g = cols.reshape(cols.shape[0], len(b.names), BOUND_WIDTH)
    total = g.sum(dim=0)
    n = total[:, 1]
    # measured on some rank: its count-weighted mean; no rank measured it: NaN (no fold)
    b._obs.copy_(torch.where(n > 0, total[:, 0] / n.clamp(min=1.0), math.nan))
    b._max.copy_(g[:, :, 2].amax(dim=0))
    b._seen.copy_(n.to(torch.int64))
    b._counts.copy_(total[:, 4:6].to(torch.int64))
    _exceedances(b).copy_(total[:, 3].to(torch.int64))  # a view of _counts[:, 0]: the same
    b._derive()  # an unset slot reads the reduced measurement


# --- Sentinel: [5 per slot] = (check number, step, kind, value, origin rank) ----------------
# A record merged earlier keeps the rank it came from (Sentinel.ranks, -1: not from a merge);
# a fire since the last merge is this rank's own.
SENTINEL_WIDTH = 5


def _origins(s: Sentinel, rank: int) -> Tensor:
    n = len(s.names)
    if s.ranks is None or s.ranks.numel() != n:  # slots added since attach
        s.ranks = torch.full((n,), -1, dtype=torch.int64, device=_device(s))
    return torch.where(s.ranks >= 0, s.ranks, rank)


def _pack_sentinel(s: Sentinel, rank: int) -> Tensor:
    t = s._state.materialize()
    rec, value = t["rec"], t["value"]
    cols = [rec[0].double(), rec[1].double(), rec[2].double(), value, _origins(s, rank).double()]
    return torch.stack(cols, 1).reshape(-1)


def _merge_sentinel(s: Sentinel, cols: Tensor) -> None:
    t = s._state.materialize()
    world = cols.shape[0]
    g = cols.reshape(world, len(s.names), SENTINEL_WIDTH)
    fired = g[:, :, 0] > 0
    # the earliest check first, then the lowest origin rank; never fired: last
    order = torch.where(fired, g[:, :, 0] * world + g[:, :, 4], math.inf)
    first = order.argmin(dim=0)
    pick = g.gather(0, first.reshape(1, -1, 1).expand(1, -1, SENTINEL_WIDTH)).squeeze(0)
    t["rec"].copy_(pick[:, :3].t().to(torch.int64))
    t["value"].copy_(pick[:, 3])
    assert s.ranks is not None  # set by _origins when packing
    s.ranks.copy_(torch.where(pick[:, 0] > 0, pick[:, 4].to(torch.int64), -1))


# --- trimtab.optim.Adam under sharding --------------------------------------------------------
def _reduce_optimizer(opt: Adam, group: Any) -> None:
    """Sum the sampled histograms, sums and counts of the step's workspace over the ranks and
    take the MAX of ``max|w|``, in the layout the finalize reads (replica 0 holds the total)."""
    from trimtab.kernels import optim_layout as lay

    ints = opt._ints
    dist.all_reduce(ints, op=dist.ReduceOp.SUM, group=group)  # counts: SUM is exact
    parts = opt._parts
    local = lay.parts_reference(parts).double()  # [G, NUM_SUMS + 5], the replicas reduced
    rows = gather_rows(local.reshape(-1), group).reshape(-1, *local.shape)
    total = rows.sum(dim=0)
    total[:, lay.NUM_SUMS + 2] = rows[:, :, lay.NUM_SUMS + 2].amax(dim=0)  # max |w|
    _write_parts(parts, total, lay)


def _write_parts(parts: Tensor, total: Tensor, lay: Any) -> None:
    """Write reduced statistics ``total`` ([G, NUM_SUMS + 5]) into replica 0 of ``parts``,
    zeroing the other replicas: :func:`parts_reference` then reads ``total`` back."""
    ns = lay.NUM_SUMS
    parts.zero_()
    head = parts[:, 0, :]
    head[:, :ns] = total[:, :ns].float().view(torch.int32).to(parts.dtype)
    head[:, lay.PART_FINITE] = total[:, ns].round().to(parts.dtype)
    head[:, lay.PART_ENGAGED] = total[:, ns + 1].round().to(parts.dtype)
    head[:, lay.PART_MAXBITS] = total[:, ns + 2].float().view(torch.int32).to(parts.dtype)
    growth = total[:, ns + 3 : ns + 5].float().view(torch.int32).to(parts.dtype)
    head[:, [lay.PART_GG, lay.PART_VHAT]] = growth


def consistent_ranks(values: Sequence[Tensor], group: Any = None) -> bool:
    """True when every rank holds the same ``values`` (bitwise); a host read, for tests and
    checks outside the step."""
    flat = torch.cat([v.detach().reshape(-1).double() for v in values])
    rows = gather_rows(flat, group)
    return bool(torch.equal(rows.nan_to_num(7.0), rows[:1].nan_to_num(7.0).expand_as(rows)))
