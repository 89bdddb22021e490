"""The one rule that chooses between a reference and its kernel (``trimtab._impl.resolve_impl``)."""

from __future__ import annotations

import pytest
import torch

from trimtab._impl import interpreter_enabled, resolve_impl, triton_available


def _never() -> bool:
    raise AssertionError("fits was evaluated although the reference was already chosen")


def test_none_on_the_cpu_is_the_reference_without_evaluating_fits():
    assert resolve_impl(None, [torch.ones(2)], fits=_never) == "torch"
    assert resolve_impl("torch", [torch.ones(2)], fits=_never) == "torch"
    assert resolve_impl(None, []) == "torch"


@pytest.mark.skipif(
    not (triton_available() and interpreter_enabled()), reason="needs Triton's interpreter"
)
def test_explicit_triton_that_does_not_fit_raises_why():
    x = torch.ones(2)
    assert resolve_impl("triton", [x]) == "triton"
    assert resolve_impl("triton", [x], fits=lambda: True) == "triton"
    with pytest.raises(ValueError, match="needs contiguous"):
        resolve_impl("triton", [x], fits=False, why="needs contiguous float32; pass impl=None")
    with pytest.raises(ValueError, match="impl=None"):
        resolve_impl("triton", [x], fits=lambda: False)


@pytest.mark.gpu
def test_none_on_cuda_follows_fits():
    x = torch.ones(2, device="cuda")
    assert resolve_impl(None, [x]) == "triton"
    assert resolve_impl(None, [x], fits=False, why="unused") == "torch"
    assert resolve_impl(None, [x], fits=lambda: False) == "torch"


def test_bad_impl_raises():
    with pytest.raises(ValueError, match="impl must be None, 'torch' or 'triton'"):
        resolve_impl("cuda", [])
