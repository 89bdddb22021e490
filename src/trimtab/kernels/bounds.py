"""Triton kernel for :class:`trimtab.AdaptiveBounds`' read rows: every bound's four readings
(the bound, the support's read, the clamp's bound, the negated read) in one launch, refreshed
where the slots or the step's measurements change, so a consumer reads a row instead of
running the five-op read itself (on a captured step: one launch instead of about 25).

The torch reference is ``trimtab.bounds._derive_reference``; the rows' order is
:data:`ROWS`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: The read rows, in order: ``bound`` = max(slot, or this step's measurement while the slot is
#: unset; floor), NaN kept; ``read`` = fmax(bound, floor); ``clamp`` = headroom × bound;
#: ``neg_read`` = -read (the support's lower end).
ROWS = ("bound", "read", "clamp", "neg_read")


@triton.jit
def _derive_kernel(values, obs, out, n, floor, headroom, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(values + i, mask=m, other=0.0)
    o = tl.load(obs + i, mask=m, other=0.0)
    v = tl.where(v != v, o, v)  # an unset slot reads this step's measurement (or NaN)
    b = tl.where(v != v, v, tl.maximum(v, floor))  # torch.maximum: NaN propagates
    r = tl.where(b != b, floor, b)  # torch.fmax(b, floor): b >= floor when it is a number
    tl.store(out + i, b, mask=m)
    tl.store(out + n + i, r, mask=m)
    tl.store(out + 2 * n + i, b * headroom, mask=m)
    # ``r * -1.0``, not ``-r``: Triton lowers unary minus to ``0 - r``, which turns -0.0 into +0.0
    tl.store(out + 3 * n + i, r * -1.0, mask=m)


def derive_triton(
    values: torch.Tensor, obs: torch.Tensor, out: torch.Tensor, floor: float, headroom: float
) -> None:
    """Write the :data:`ROWS` of ``n`` bounds into ``out`` (``[4, n]``, contiguous float32)
    from the slots ``values`` and the step's measurements ``obs`` (``[n]`` float32 each), in
    one launch, on the device: no host read."""
    n = values.numel()
    block = max(triton.next_power_of_2(n), 16)
    _derive_kernel[(1,)](values, obs, out, n, float(floor), float(headroom), BLOCK=block)
