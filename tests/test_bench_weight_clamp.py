"""benchmarks/weight_clamp_binding.py's count: weights left at the clamp, and above the bound."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import trimtab.optim as topt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import weight_clamp_binding as wcb


def _tally(headroom: float) -> dict[str, list[int]]:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(2000))
    b = torch.nn.Parameter(torch.randn(50))
    opt = topt.Adam([{"params": [w]}, {"params": [b], "weight_decay": 0.0}], lr=0.05,
                    weight_headroom=headroom)  # fmt: skip
    tally = {k: [0, 0] for k in ("clamped", "above", "seen")}
    wcb.counter(opt, headroom, tally)
    for _ in range(20):
        for p in (w, b):  # an outward push, plus noise
            p.grad = torch.randn_like(p) - 0.5 * torch.sign(p.detach())
        opt.step()
    return tally


def test_the_count_sees_the_clamp_bind_at_its_headroom():
    h1, h2 = _tally(1.0), _tally(2.0)
    assert h1["seen"] == h2["seen"] and h1["seen"][0] == 19 * 2000  # no bound before step 1
    assert h1["clamped"][0] > 0  # at the p99, the clamp holds about 1% of the weights
    assert h2["clamped"][0] < h1["clamped"][0]  # at twice it, fewer
    assert h2["above"][0] > h2["clamped"][0]  # past the bound, not cut: the test counts them
