"""On a CUDA device: the guarded learn step makes no host synchronisation in any mode or
policy (invariant 1), with the sentinel, the bounds' fold and the non-finite flag inside."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_helpers import tiny

from trimtab.lifecycle import Lifecycle
from trimtab.rl.learner import build_learner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _batch(n: int = 16) -> dict[str, torch.Tensor]:
    dev = torch.device("cuda")
    return {"obs": torch.randn(n, 5, device=dev), "action": torch.randint(0, 3, (n, 2), device=dev),
            "reward": torch.randn(n, device=dev), "next_obs": torch.randn(n, 5, device=dev),
            "discount": torch.full((n,), 0.9, device=dev)}  # fmt: skip


@pytest.mark.parametrize("policy", ["halt", "skip", "sanitize"])
@pytest.mark.parametrize("mode", ["adaptive", "fixed", "off"])
def test_learn_step_makes_no_host_sync(mode, policy):
    cfg = tiny(Path("unused"), stability=mode, on_nonfinite=policy)
    with Lifecycle():
        learner = build_learner(cfg, 5, [3, 3], torch.device("cuda"))
    batches = [_batch() for _ in range(6)]
    for b in batches[:3]:  # warm-up: lazy state, kernels compiled
        learner.learn(b)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for b in batches[3:]:
            info = learner.learn(b)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(info["loss"]) and learner.nonfinite_count() == 0
