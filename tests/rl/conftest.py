"""Shared set-up of the trainer tests: one CPU thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny nets on a shared 2-core machine: two OpenMP threads were ~50x slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
