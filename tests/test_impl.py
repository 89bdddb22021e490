"""The one rule that chooses between a reference and its kernel (``trimtab._impl.resolve_impl``)."""

from __future__ import annotations

import warnings

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


class _OnCuda:
    """Stands for a CUDA tensor where resolve_impl reads only the device (no GPU here)."""

    device = torch.device("cuda")


def test_none_on_cuda_warns_once_per_cause_when_the_kernel_cannot_run(monkeypatch):
    import trimtab._impl as impl_mod
    from trimtab._impl import KernelFallbackWarning

    monkeypatch.setattr(impl_mod, "_warned", set())
    monkeypatch.setattr(impl_mod, "triton_available", lambda: True)
    x = [_OnCuda()]
    assert resolve_impl(None, x, fits=lambda: True, why=_never) == "triton"  # why: not read
    with pytest.warns(KernelFallbackWarning, match=r"op: a strided x: running the PyTorch"):
        assert resolve_impl(None, x, fits=False, why=lambda: "op: a strided x") == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_impl(None, x, fits=False, why="op: a strided x") == "torch"  # once
    with pytest.warns(KernelFallbackWarning, match="cannot run these arguments"):
        assert resolve_impl(None, x, fits=False) == "torch"
    monkeypatch.setattr(impl_mod, "triton_available", lambda: False)
    with pytest.warns(KernelFallbackWarning, match="Triton is not installed"):
        assert resolve_impl(None, x) == "torch"
    with warnings.catch_warnings():  # CPU tensors: the reference, silently
        warnings.simplefilter("error")
        assert resolve_impl(None, [torch.ones(1)], fits=False, why="unused") == "torch"
