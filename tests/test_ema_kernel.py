"""The estimator's kernels against their references (interpreter on the CPU, native on the GPU):
``AdaptiveEMA.update``/``update_log`` and ``EngagementCorrection.observe`` as one launch each,
over sequences with first observations, level shifts, outliers, NaN, ±Inf, zeros and masks."""

from __future__ import annotations

import math

import pytest
import torch

from trimtab.engagement import EngagementCorrection
from trimtab.estimate import AdaptiveEMA

# The interpreter evaluates masked-off lanes too (NaN of unset estimates): numpy warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _close(a: dict, b: dict) -> None:
    # float32 rounding in another order: z (a difference over its sd) keeps ~1e-4 of it
    # relative, as the optimizer's finalize parity test allows. Scores are log weights (sums of
    # squared standardized errors, shifted so the best is 0): they are compared as the weights
    # they give, since the shift moves a large score's rounding onto the small ones.
    for name in a:
        x, y = a[name], b[name]
        if name == "score":
            x, y = x.softmax(1), y.softmax(1)
        atol = 1e-4 if name == "prev_z" else 1e-5  # z is O(1), tested against c ≈ 2.8
        torch.testing.assert_close(y, x, rtol=1e-3, atol=atol, equal_nan=True,
                                   msg=lambda m, n=name: f"state {n!r}: {m}")  # fmt: skip


def _sequence(slots: int, steps: int, seed: int, positive: bool) -> tuple[torch.Tensor, ...]:
    """Observations per step (random walks of per-slot scale, a shift, a spike, NaN/±Inf, zeros
    and negatives where positive), and a random mask per step."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(4.0 * torch.randn(slots, generator=g))
    walk = scale * (1.0 + 0.05 * torch.randn(steps, slots, generator=g).cumsum(0))
    walk[steps // 2 :] *= 30.0  # a level shift
    walk[steps // 3, 0] *= 1e4  # a lone spike
    obs = walk.abs() if positive else walk
    hit = torch.rand(steps, slots, generator=g)
    obs[hit < 0.05] = math.nan
    obs[(hit >= 0.05) & (hit < 0.08)] = math.inf
    obs[(hit >= 0.08) & (hit < 0.10)] = -math.inf
    obs[(hit >= 0.10) & (hit < 0.13)] = 0.0
    if positive:
        obs[(hit >= 0.13) & (hit < 0.15)] = -1.0  # log of a negative: NaN
    obs[0, :] = torch.where(torch.arange(slots) % 3 == 0, math.nan, obs[0, :])  # late first obs
    masks = torch.rand(steps, slots, generator=g) < 0.8
    obs[5], masks[5] = math.inf, True  # every slot sees one, whatever the draws
    return obs, masks


@pytest.mark.slow
@pytest.mark.parametrize("slots", [1, 2, 17, 40])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_update_kernel_matches_reference(kernel_device, slots, log, masked) -> None:
    obs, masks = _sequence(slots, 24, seed=slots + 10 * log, positive=log)
    obs, masks = obs.to(kernel_device), masks.to(kernel_device)
    ref = AdaptiveEMA(slots, device=kernel_device)
    ker = AdaptiveEMA(slots, device=kernel_device)
    for t in range(obs.shape[0]):
        mask = masks[t] if masked else None
        fold = "update_log" if log else "update"
        # Each step from the reference's state: rounding carried over many steps (a log of
        # two near-equal magnitudes, then a score of v²/R with R at that difference) can put
        # a threshold test (a leader within LEAD_TOL of the best) on either side, and the
        # paths part; what is tested is that one step is the reference's step.
        ker.load_state_dict(ref.state_dict())
        a = getattr(ref, fold)(obs[t], mask, impl="torch")
        b = getattr(ker, fold)(obs[t], mask, impl="triton")
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, equal_nan=True)
        _close(ref.state_dict(), ker.state_dict())
    assert ker.nonfinite_count.sum() > 0  # the sequence did exercise the non-finite path


def test_update_kernel_follows_reset_and_load(kernel_device) -> None:
    """The kernel's pointer table stays valid: reset and load_state_dict write in place."""
    obs, _ = _sequence(5, 12, seed=3, positive=True)
    obs = obs.to(kernel_device)
    ref, ker = AdaptiveEMA(5, device=kernel_device), AdaptiveEMA(5, device=kernel_device)
    for t in range(6):
        ref.update_log(obs[t], impl="torch")
        ker.update_log(obs[t], impl="triton")
    ref.reset()
    ker.reset()
    saved = None
    for t in range(6, 12):
        ref.update_log(obs[t], impl="torch")
        ker.update_log(obs[t], impl="triton")
        if t == 8:
            saved = ker.state_dict()
    _close(ref.state_dict(), ker.state_dict())
    ker.load_state_dict(saved)
    ref.load_state_dict(saved)
    ref.update_log(obs[11], impl="torch")
    ker.update_log(obs[11], impl="triton")
    _close(ref.state_dict(), ker.state_dict())


def test_update_kernel_refuses_float64_when_asked_for(kernel_device) -> None:
    ema = AdaptiveEMA(2, device=kernel_device, dtype=torch.float64)
    with pytest.raises(ValueError, match="float32"):
        ema.update(torch.zeros(2, dtype=torch.float64, device=kernel_device), impl="triton")
    ema.update(torch.zeros(2, dtype=torch.float64, device=kernel_device))  # None: the reference


def _counts(consumers: int, steps: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        n = torch.randint(0, 200, (consumers,), generator=g)
        if t % 3 == 1:
            n[t % consumers] = 0  # a consumer that saw nothing this step
        rate = 0.01 if t < steps // 2 else 0.2  # stale from the middle on: raises fire
        k = torch.minimum(torch.poisson(rate * n.double(), generator=g).long(), n)
        top = 10.0 * torch.rand(consumers, generator=g)
        top[(t + 1) % consumers] = math.nan if t % 2 else math.inf
        out.append((k, n, top, torch.rand(consumers, generator=g) < 0.8))
    return out


@pytest.mark.parametrize("consumers", [1, 3, 20])
@pytest.mark.parametrize("masked", [False, True])
def test_engagement_kernel_matches_reference(kernel_device, consumers, masked) -> None:
    ref = EngagementCorrection(consumers, 0.01, device=kernel_device)
    ker = EngagementCorrection(consumers, 0.01, device=kernel_device)
    fired = False
    for k, n, top, mask in _counts(consumers, 20, seed=consumers):
        k, n, top, mask = (x.to(kernel_device) for x in (k, n, top, mask))
        m = mask if masked else None
        a = ref.observe(k, n, top, m, impl="torch")
        b = ker.observe(k, n, top, m, impl="triton")
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
        sa, sb = ref.state_dict(), ker.state_dict()
        _close(sa["fraction"], sb["fraction"])
        for key in ("rate", "max", "z", "engaged_total", "seen_total"):
            torch.testing.assert_close(sb[key], sa[key], rtol=1e-5, atol=1e-6, equal_nan=True)
        fired |= bool(ker.stale.any())
    assert fired  # the stale half did raise a bound


def test_engagement_kernel_takes_scalars_and_strided_views(kernel_device) -> None:
    """One scalar for every consumer, and a column of a counts table (stride 2), as the trainer
    passes them."""
    ref = EngagementCorrection(2, 0.01, device=kernel_device)
    ker = EngagementCorrection(2, 0.01, device=kernel_device)
    table = torch.tensor([[30, 7], [1, 9]], device=kernel_device)
    for step in range(4):
        seen = torch.tensor(100 + step, device=kernel_device)
        top = torch.tensor([3.0, 4.0], device=kernel_device)
        ref.observe(table[:, 0], seen, top, impl="torch")
        ker.observe(table[:, 0], seen, top, impl="triton")
    for key in ("rate", "max", "z", "engaged_total", "seen_total"):
        torch.testing.assert_close(ker.state_dict()[key], ref.state_dict()[key], equal_nan=True)
    assert ker.stale[0] and not ker.stale[1]


@pytest.mark.gpu
def test_kernels_make_no_host_sync_and_capture_in_a_cuda_graph() -> None:
    ema = AdaptiveEMA(8, device="cuda")
    eng = EngagementCorrection(8, 0.01, device="cuda")
    static = torch.ones(8, device="cuda")
    k = torch.zeros(8, dtype=torch.int64, device="cuda")
    n = torch.full((8,), 100, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: tables built, kernels compiled
        ema.update_log(static)
        eng.observe(k, n, static)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ema.update_log(static)
        eng.observe(k, n, static)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ema.reset()
    ref = AdaptiveEMA(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ema.update_log(static)
    ema.reset()
    for step in range(20):
        static.copy_(torch.full((8,), 1.0 + step, device="cuda"))
        graph.replay()
        torch.testing.assert_close(out, ref.update_log(static, impl="torch"), rtol=2e-5, atol=0)


@pytest.mark.parametrize("masked", [False, True])
def test_fold_kernel_matches_correct_then_update_log(kernel_device, masked) -> None:
    """EngagementCorrection.fold: the correction of a stale bound and the log-scale fold in one
    launch, against ``ema.update_log(eng.correct(bound))``."""
    eng = {i: EngagementCorrection(3, 0.01, device=kernel_device) for i in "ab"}
    ema = {i: AdaptiveEMA(3, device=kernel_device) for i in "ab"}
    g = torch.Generator().manual_seed(1)
    for step in range(16):
        n = torch.full((3,), 100, device=kernel_device)
        k = torch.tensor([1, 30 if step > 4 else 1, 0], device=kernel_device)  # 1 goes stale
        top = torch.tensor([5.0, 9.0, math.nan if step % 2 else 4.0], device=kernel_device)
        bound = (1.0 + torch.rand(3, generator=g)).to(kernel_device)
        bound[2] = math.inf if step == 7 else bound[2]
        mask = (torch.arange(3) != step % 3).to(kernel_device) if masked else None
        for i, impl in (("a", "torch"), ("b", "triton")):
            eng[i].observe(k, n, top, impl=impl)
        a = eng["a"].fold(ema["a"], bound, mask, impl="torch")
        b = eng["b"].fold(ema["b"], bound, mask, impl="triton")
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, equal_nan=True)
        _close(ema["a"].state_dict(), ema["b"].state_dict())
    assert eng["b"].stale[1]  # the raise was exercised
