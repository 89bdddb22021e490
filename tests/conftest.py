"""Test set-up: kernels run under Triton's CPU interpreter where there is no CUDA device, and
the benchmark scripts (not a package) are loaded by name for the tests that run them.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is defined, so it is set here,
before any test imports a kernel module.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; runs on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def kernel_device() -> torch.device:
    """Where kernel tests put their tensors: CUDA when present, else the CPU interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def load_bench() -> Callable[[str], ModuleType]:
    """``load_bench(name)``: ``benchmarks/<name>.py``, or ``benchmarks/experiments/<name>.py``,
    executed afresh as module ``name``. It is registered in ``sys.modules`` first, where a
    dataclass of the script looks its module up."""

    def load(name: str) -> ModuleType:
        path = BENCHMARKS / f"{name}.py"
        if not path.is_file():
            path = BENCHMARKS / "experiments" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return load
