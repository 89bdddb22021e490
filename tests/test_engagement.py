from __future__ import annotations

import math

import pytest
import torch

from trimtab.engagement import EngagementCorrection, normal_upper_quantile
from trimtab.lifecycle import Lifecycle

P99 = 2.5758293035489  # two-sided: P(|Z| > P99) = 0.01


def run(corr: EngagementCorrection, bound: float, steps: int, n: int, seed: int = 0) -> list[bool]:
    g = torch.Generator().manual_seed(seed)
    fired = []
    for _ in range(steps):
        a = torch.randn(n, generator=g).abs()
        corr.observe((a > bound).sum(), n, a.max())
        fired.append(bool(corr.stale.item()))
    return fired


def test_normal_upper_quantile():
    assert normal_upper_quantile(0.025) == pytest.approx(1.959963985, abs=1e-8)
    assert normal_upper_quantile(0.5) == pytest.approx(0.0, abs=1e-12)


def test_fresh_bound_never_declared_stale():
    corr = EngagementCorrection(1, expected_rate=0.01)
    fired = run(corr, P99, steps=200, n=20_000)
    assert not any(fired)
    b = torch.tensor([P99])
    assert torch.equal(corr.correct(b), b)


def test_stale_bound_fires_and_raises_by_the_rank_rule():
    corr = EngagementCorrection(1, expected_rate=0.01)
    bound = 1.6448536  # the p90 of |Z|: engages on 10%, not 1%
    fired = run(corr, bound, steps=20, n=20_000)
    assert all(fired[1:])
    f = corr.fraction.double()
    expected_rate = ((f - 0.01) / f).float()
    torch.testing.assert_close(corr.rate, expected_rate)
    assert corr.z.item() > corr.z_threshold
    b = torch.tensor([bound])
    top = corr._max
    torch.testing.assert_close(corr.correct(b), b + expected_rate * (top - b))
    assert bound < corr.correct(b).item() <= top.item()


def test_repeated_correction_climbs_from_a_stale_bound_never_past_the_max():
    corr = EngagementCorrection(1, expected_rate=0.01)
    g = torch.Generator().manual_seed(1)
    b = torch.tensor([1.0])
    top = 0.0
    for _ in range(60):
        a = torch.randn(20_000, generator=g).abs()
        top = max(top, a.max().item())
        corr.observe((a > b).sum(), a.numel(), a.max())
        b = corr.correct(b)
        assert b.item() <= top
    assert b.item() > 2.0  # from the p68 toward the p99 (2.58)


def test_consumers_are_independent_and_zero_totals_keep_state():
    corr = EngagementCorrection(2, expected_rate=0.01)
    corr.observe(torch.tensor([5000, 10]), torch.tensor([10_000, 1000]), torch.tensor([9.0, 3.0]))
    corr.observe(torch.tensor([5000, 10]), torch.tensor([10_000, 1000]), torch.tensor([9.0, 3.0]))
    assert corr.stale.tolist() == [True, False]
    before = corr.state_dict()
    corr.observe(torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([math.nan, math.nan]))
    after = corr.state_dict()
    torch.testing.assert_close(after["rate"], before["rate"])
    torch.testing.assert_close(after["max"], before["max"])
    assert corr.engaged_total.tolist() == [10_000, 20]


def test_state_dict_round_trip_and_reset():
    corr = EngagementCorrection(1)
    run(corr, 1.0, steps=5, n=1000)
    other = EngagementCorrection(1)
    other.load_state_dict(corr.state_dict())
    b = torch.tensor([1.0])
    torch.testing.assert_close(other.correct(b), corr.correct(b))
    corr.reset()
    assert corr.rate.item() == 0.0 and torch.isnan(corr.fraction).all()
    assert corr.engaged_total.item() == 0


def test_registers_with_the_active_lifecycle():
    with Lifecycle() as life:
        corr = EngagementCorrection(1, name="clamp_target")
    run(corr, 1.0, steps=3, n=1000)
    assert any("clamp_target" in line for line in life.describe())
    life.fold_boundary()
    assert corr.rate.item() == 0.0


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        (dict(num_consumers=0), ValueError, "num_consumers"),
        (dict(num_consumers=1.5), TypeError, "num_consumers"),
        (dict(num_consumers=1, expected_rate=0.0), ValueError, "expected_rate"),
        (dict(num_consumers=1, expected_rate=1.0), ValueError, "expected_rate"),
        (dict(num_consumers=1, false_alarm_prob=0.0), ValueError, "tail probability"),
    ],
)
def test_bad_arguments(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        EngagementCorrection(**kwargs)


@pytest.mark.gpu
def test_observe_and_correct_make_no_host_sync():
    corr = EngagementCorrection(1, device="cuda")
    x = torch.randn(10_000, device="cuda").abs()
    b = torch.ones(1, device="cuda")
    corr.observe((x > b).sum(), x.numel(), x.max())  # warm-up
    torch.cuda.set_sync_debug_mode("error")
    try:
        corr.observe((x > b).sum(), x.numel(), x.max())
        corr.correct(b)
    finally:
        torch.cuda.set_sync_debug_mode("default")
