"""Shared set-up of the trainer tests (one folder per subpackage of :mod:`trimtab.rl`): one CPU
thread, and ``rl_helpers`` importable from every folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # rl_helpers, for the tests in the subfolders


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny nets on a shared 2-core machine: two OpenMP threads were ~50x slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
