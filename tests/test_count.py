"""count_nonzero_: torch.count_nonzero's integers on every float dtype and awkward value."""

from __future__ import annotations

import math

import pytest
import torch

from trimtab._count import count_nonzero_


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 33, 4097])
def test_matches_torch_count_nonzero(dtype: torch.dtype, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g).to(dtype)
    awkward = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 1e-40, -1e-45, 3e38])
    if n:
        idx = torch.randint(0, n, (n // 2 + 1,), generator=g)
        x[idx] = awkward[torch.randint(0, len(awkward), idx.shape, generator=g)].to(dtype)
    expected = torch.count_nonzero(x)
    got = count_nonzero_(x.clone())
    assert got.dtype == torch.int64 and got.shape == ()
    assert int(got) == int(expected)


def test_signed_zeros_are_zeros() -> None:
    x = torch.tensor([-0.0, 0.0, -0.0, 2.0])
    assert int(count_nonzero_(x)) == 1
