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


# --- update_log_and_raise: the update and the raise of a state vector's slots, one launch ---
RAISE = {"z": 12.1, "cold_factor": 1e3}  # the sentinel's margin (EXCURSION_Z) and cold factor


def _raise_case(slots: int, steps: int, seed: int) -> tuple[torch.Tensor, ...]:
    """:func:`_sequence` (positive) with a slot unset for the first third, a drop of scale by
    1e4 after the shift up (the raise holds the largest bound), and per step and slot what the
    target element holds before it: its last value, NaN, 0 (the bound is written whole) or
    1e30 (kept), so the bounds themselves are compared, not only a running max of the first."""
    obs, masks = _sequence(slots, steps, seed=seed, positive=True)
    obs[: steps // 3, -1] = math.nan
    obs[2 * steps // 3 :] *= 1e-4
    g = torch.Generator().manual_seed(seed)
    held = torch.tensor([math.nan, math.nan, 0.0, 1e30])[torch.randint(0, 4, (steps, slots),
                                                                        generator=g)]  # fmt: skip
    held[torch.rand(steps, slots, generator=g) < 0.5] = -1.0  # -1: the last value
    return obs, masks, held


@pytest.mark.parametrize(
    ("slots", "cold_obs", "masked"),
    [
        (5, 3, True),  # cold, then measured (count >= 3) within the run
        pytest.param(1, 100, True, marks=pytest.mark.slow),  # cold throughout (the trainer's)
        pytest.param(17, 3, True, marks=pytest.mark.slow),  # two blocks of slots
        pytest.param(5, 3, False, marks=pytest.mark.slow),  # no mask: every slot written
    ],
)
def test_update_and_raise_kernel_matches_reference(kernel_device, slots, cold_obs, masked):
    """``update_log_and_raise``: the kernel's target and state against the reference's, step by
    step from the reference's state (as above). The bound is ``exp(estimate + z sd)``: its
    relative error is the exponent's absolute error, the estimate's (bounded at 1e-4 relative
    in ``exp`` by the update's test above) plus z (12) times sd's; measured under the
    interpreter, 4e-6 at most. Elements the mask does not select, and those of no slot, keep
    their bits."""
    steps = 30
    obs, masks, held = (x.to(kernel_device) for x in _raise_case(slots, steps, seed=slots))
    n = 2 * slots + 3
    index = torch.randperm(n, generator=torch.Generator().manual_seed(slots))[:slots]
    index = index.to(kernel_device)
    ref, ker = AdaptiveEMA(slots, device=kernel_device), AdaptiveEMA(slots, device=kernel_device)
    target = torch.arange(n, dtype=torch.float32, device=kernel_device) - 7.5
    seen = {"cold": False, "warm": False, "unset": False, "raised": False, "kept": False}
    for t in range(steps):
        before = target[index]
        target[index] = torch.where(held[t] == -1.0, before, held[t])
        mask = masks[t] if masked else None
        ker.load_state_dict(ref.state_dict())
        mine = target.clone()
        ref.update_log_and_raise(obs[t], mask, target, index, cold_obs=cold_obs, impl="torch",
                                 **RAISE)  # fmt: skip
        ker.update_log_and_raise(obs[t], mask, mine, index, cold_obs=cold_obs, impl="triton",
                                 **RAISE)  # fmt: skip
        torch.testing.assert_close(mine, target, rtol=1e-4, atol=0, equal_nan=True,
                                   msg=lambda m, t=t: f"step {t}: {m}")  # fmt: skip
        _close(ref.state_dict(), ker.state_dict())
        write = torch.zeros(n, dtype=torch.bool, device=kernel_device)
        write[index] = True if mask is None else mask
        start = target.clone()
        start[index] = torch.where(held[t] == -1.0, before, held[t])
        kept = mine.view(torch.int32)[~write], start.view(torch.int32)[~write]
        assert torch.equal(*kept), f"step {t}: an element no selected slot holds was written"
        bound = ref.upper_bound_log(RAISE["z"], cold_factor=1e3, cold_obs=cold_obs)
        sel = write[index]
        seen["cold"] |= bool((sel & (ref.count < cold_obs) & (ref.count > 0)).any())
        seen["warm"] |= bool((sel & (ref.count >= cold_obs)).any())
        seen["unset"] |= bool((sel & bound.isnan()).any())
        seen["raised"] |= bool((sel & (target[index] == bound)).any())
        seen["kept"] |= bool((sel & (bound < target[index])).any())
    assert all(v for k, v in seen.items() if k != "warm" or cold_obs <= steps), seen


def test_update_and_raise_kernel_refuses_a_float64_target_when_asked_for(kernel_device):
    ema = AdaptiveEMA(2, device=kernel_device)
    target = torch.zeros(4, dtype=torch.float64, device=kernel_device)
    index = torch.tensor([3, 1], device=kernel_device)
    with pytest.raises(ValueError, match="float32 target"):
        ema.update_log_and_raise(torch.ones(2, device=kernel_device), None, target, index,
                                 cold_obs=3, impl="triton", **RAISE)  # fmt: skip
    ones = torch.ones(2, device=kernel_device)
    ema.update_log_and_raise(ones, None, target, index, cold_obs=3, **RAISE)  # None: reference
    assert target[0] == 0.0 and target[2] == 0.0 and target[3] > 1.0


def test_update_and_raise_kernel_writes_a_strided_target(kernel_device):
    """A column of a table (element stride 3), as the reference writes it; the other columns
    untouched."""
    table = torch.full((5, 3), -1.0, device=kernel_device)
    table[:, 1] = math.nan
    mine = table.clone()
    index = torch.tensor([4, 0, 2], device=kernel_device)
    ref, ker = AdaptiveEMA(3, device=kernel_device), AdaptiveEMA(3, device=kernel_device)
    for step in range(4):
        obs = torch.tensor([1.0, 2.0, 3.0], device=kernel_device) * (1.0 + 0.1 * step)
        ref.update_log_and_raise(obs, None, table[:, 1], index, cold_obs=2, impl="torch", **RAISE)
        ker.update_log_and_raise(obs, None, mine[:, 1], index, cold_obs=2, impl="triton", **RAISE)
        torch.testing.assert_close(mine, table, rtol=1e-4, atol=0, equal_nan=True)
    assert (mine[:, [0, 2]] == -1.0).all() and mine[[1, 3], 1].isnan().all()
    assert (mine[[0, 2, 4], 1] > 1.0).all()


def test_update_and_raise_kernel_reads_strided_obs_mask_and_index(kernel_device):
    """Every-other-element views of obs, mask and index (the kernel reads element i at offset
    i): the same writes and state as the reference's."""
    dev = kernel_device
    target, mine = torch.full((10,), -1.0, device=dev), torch.full((10,), -1.0, device=dev)
    index = torch.tensor([4, 9, 0, 9, 2, 9], device=dev)[::2]  # [4, 0, 2]
    mask = torch.tensor([True, True, False, False, True, True], device=dev)[::2]  # [T, F, T]
    ref, ker = AdaptiveEMA(3, device=dev), AdaptiveEMA(3, device=dev)
    for step in range(4):
        obs = (torch.arange(1.0, 7.0, device=dev) * (1.0 + 0.1 * step))[::2]
        ref.update_log_and_raise(obs, mask, target, index, cold_obs=2, impl="torch", **RAISE)
        ker.update_log_and_raise(obs, mask, mine, index, cold_obs=2, impl="triton", **RAISE)
        torch.testing.assert_close(mine, target, rtol=1e-4, atol=0, equal_nan=True)
    assert (mine[[4, 2]] > 1.0).all() and (mine[[0, 1, 3, 5, 6, 7, 8, 9]] == -1.0).all()
    for (k, x), (_, y) in zip(ker.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6, equal_nan=True, msg=k)


@pytest.mark.gpu
def test_update_and_raise_is_one_launch_without_sync_and_captures_in_a_cuda_graph() -> None:
    """On CUDA: one kernel (the profiler's count), no host sync, and a CUDA graph of it replays
    the reference's values (rtol as the interpreter's test: float32 in another order)."""
    from torch.profiler import ProfilerActivity, profile

    from trimtab.benchmarking import kernel_census

    slots, n = 4, 9
    ema, ref = AdaptiveEMA(slots, device="cuda"), AdaptiveEMA(slots, device="cuda")
    target = torch.full((n,), math.nan, device="cuda")
    expected = target.clone()
    index = torch.tensor([7, 0, 3, 5], device="cuda")
    mask = torch.tensor([True, True, False, True], device="cuda")
    static = torch.ones(slots, device="cuda")
    kw = {"cold_obs": 3, **RAISE}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: the table built, both variants compiled
        ema.update_log_and_raise(static, mask, target, index, **kw)
        ema.update_log_and_raise(static, None, target, index, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ema.update_log_and_raise(static, mask, target, index, **kw)
        torch.cuda.synchronize()
    assert kernel_census(prof)["kernels"] == 1, kernel_census(prof)["by_name"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        ema.update_log_and_raise(static, mask, target, index, **kw)
        ema.update_log_and_raise(static, None, target, index, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ema.reset()
    target.fill_(math.nan)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ema.update_log_and_raise(static, mask, target, index, **kw)
    ema.reset()
    target.fill_(math.nan)
    g = torch.Generator().manual_seed(0)
    for step in range(20):
        scale = 10.0 ** (step // 5) if step < 15 else 1e-3  # up, then a drop the raise holds
        static.copy_((scale * (1.0 + 0.1 * torch.rand(slots, generator=g))).cuda())
        graph.replay()
        ref.update_log_and_raise(static, mask, expected, index, impl="torch", **kw)
        torch.testing.assert_close(target, expected, rtol=1e-4, atol=0, equal_nan=True)
    assert torch.isnan(target[[1, 2, 4, 6, 8, 3]]).all()  # of no slot, or not selected
