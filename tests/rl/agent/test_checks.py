"""The trainer's sentinel wiring: the watched buffers' maxima and their one fold a step."""

from __future__ import annotations

import math

import pytest
import torch
from rl_helpers import generic, tiny

from trimtab.estimate import AdaptiveEMA
from trimtab.lifecycle import Lifecycle, detached
from trimtab.quantile import abs_quantiles
from trimtab.rl.agent.checks import WATCHED, finite_abs_max, watch_threshold
from trimtab.rl.agent.learner import build_learner


def test_finite_abs_max_is_the_q1_quantile_of_abs_quantiles():
    """The same float32 value as ``abs_quantiles(q=1)`` (the finite maximum; 0 with none) on
    every dtype and mixed lists, empty tensors, and NaN, ±Inf, -0.0 and huge values."""
    g = torch.Generator().manual_seed(0)
    specials = [math.nan, math.inf, -math.inf, -0.0]
    for trial in range(200):
        tensors = []
        for i in range(1 + trial % 4):  # one dtype or several (autocast's logits)
            n = int(torch.randint(0, 70, (1,), generator=g))
            dtype = (torch.float32, torch.float16, torch.bfloat16, torch.float64)[(trial + i) % 4]
            x = (torch.randn(n, generator=g) * 10.0 ** (trial % 9 - 4)).to(dtype)
            for k in range(min(n, trial % 3)):
                x[k * 7 % n] = specials[(trial + k) % 4]
            if n and trial % 11 == 0:
                x.fill_(math.nan)  # no finite element: 0
            if n and trial % 13 == 0:
                x[n // 2] = torch.finfo(dtype).max
            tensors.append(x)
        assert torch.equal(finite_abs_max(tensors), abs_quantiles(tensors, 1.0, impl="torch"))


def test_one_fold_a_step_is_each_buffers_fold_after_its_check(tmp_path):
    """The learn step measures obs/logits/loss (forward) and the trunk gradient (backward
    heads) and folds them once: the threshold scales and the estimator are exactly those of a
    fold right after each phase (the estimator's slots are independent), over many steps with
    shifts of scale."""
    with Lifecycle():
        checks = build_learner(
            generic(tiny(tmp_path, measure_every=1)), 5, [3], torch.device("cpu")
        ).stability.checks
    with detached():
        reference = AdaptiveEMA(len(WATCHED))
    scales = torch.full((len(WATCHED),), math.nan)
    forward, heads = torch.tensor([True, True, True, False]), torch.tensor([False] * 3 + [True])
    g = torch.Generator().manual_seed(1)
    for step in range(120):
        scale = 10.0 ** (step // 30)
        values = {n: scale * torch.randn(64, generator=g) for n in WATCHED}
        checks._measure({n: values[n] for n in WATCHED[:3]})
        checks._measure({"grad_trunk": values["grad_trunk"]})
        checks._fold()
        obs = torch.stack([v.abs().max() for v in values.values()])
        for mask in (forward, heads):  # the former order: one fold per phase
            reference.update_log(obs, mask)
            raised = torch.fmax(scales, watch_threshold(reference))
            scales = torch.where(mask, raised, scales)
        got = torch.stack([checks.state[f"{n}_scale"] for n in WATCHED])
        assert torch.equal(got, scales), step
    ours, theirs = checks.watch_ema.state_dict(), reference.state_dict()
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=0, equal_nan=True, msg=k)


@pytest.mark.gpu
def test_the_fold_on_cuda_is_its_reference_without_sync(tmp_path, monkeypatch):
    """On CUDA the fold runs the kernel of ``update_log_and_raise`` (one launch, counted in
    ``tests/test_ema_kernel.py``): its threshold scales against the reference's on the same
    device (the torch path, as on the CPU), each step from the reference's state and scales
    (float32 in another order: the kernel tests' tolerance), over shifts of scale; no host
    sync."""
    dev = torch.device("cuda")
    with Lifecycle():
        checks = build_learner(
            generic(tiny(tmp_path, measure_every=1, device="cuda")), 5, [3], dev
        ).stability.checks
    with detached():
        reference = AdaptiveEMA(len(WATCHED), device=dev)
    scales = torch.full((len(WATCHED),), math.nan, device=dev)
    g = torch.Generator().manual_seed(1)
    from trimtab.kernels import ema as ema_kernels

    launches = []  # the fold took the kernel, not a silent fallback to the torch path
    launch = ema_kernels.ema_update_raise_triton
    monkeypatch.setattr(ema_kernels, "ema_update_raise_triton",
                        lambda *a, **k: launches.append(1) or launch(*a, **k))  # fmt: skip
    for step in range(60):
        scale = 10.0 ** (step // 15) if step < 45 else 1e-3  # up, then a drop the slots hold
        values = {n: (scale * torch.randn(64, generator=g)).to(dev) for n in WATCHED}
        checks.watch_ema.load_state_dict(reference.state_dict())
        for i, n in enumerate(WATCHED):
            checks.state[f"{n}_scale"].copy_(scales[i])
        torch.cuda.synchronize()
        if step:  # the first fold builds its mask (a copy to the device) and compiles
            torch.cuda.set_sync_debug_mode("error")
        try:
            checks._measure({n: values[n] for n in WATCHED[:3]})
            checks._measure({"grad_trunk": values["grad_trunk"]})
            checks._fold()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        obs = torch.stack([v.abs().max() for v in values.values()])
        reference.update_log(obs, impl="torch")
        scales = torch.fmax(scales, watch_threshold(reference))
        got = torch.stack([checks.state[f"{n}_scale"] for n in WATCHED])
        torch.testing.assert_close(got, scales, rtol=1e-4, atol=0, equal_nan=True,
                                   msg=lambda m, step=step: f"step {step}: {m}")  # fmt: skip
    assert len(launches) == 60


def test_gradients_are_checked_against_the_largest_clip_bound_this_fold(tmp_path):
    """The clip bound follows the gradients down once a task is learned (CartPole: 0.25 early,
    1.4e-4 near the end), and a healthy 0.138 gradient then fired 1e3 x the bound (a halt at
    reward scale 1000). The threshold multiplies the largest bound this fold instead, which a
    fold boundary forgets."""
    from rl_helpers import wired_learner

    learner = wired_learner(tiny(tmp_path))
    checks, net = learner.stability.checks, learner.agent.online
    p = next(q for q in net.parameters() if q.ndim == 1)
    for q in net.parameters():
        q.grad = torch.zeros_like(q)
    checks.state["grad_clip_bound"].fill_(0.25)
    checks.weights()  # the end of a step: the largest bound this fold is 0.25
    checks.state["grad_clip_bound"].fill_(1.4e-4)  # converged: the bound has fallen
    checks.weights()
    assert checks.grad_scale.item() == 0.25
    p.grad.view(-1)[0] = 0.138  # 1e3 x 1.4e-4 = 0.14: the old rule's threshold, not passed
    checks.gradients()
    p.grad.view(-1)[0] = 0.2  # past 1e3 x the fallen bound, a healthy gradient
    checks.gradients()
    assert not bool(checks.sentinel.fired())
    p.grad.view(-1)[0] = 1e3 * 0.25 * 1.01  # an excursion over the fold's largest scale
    checks.gradients()
    [firing] = checks.sentinel.report()
    assert firing.name == f"grad.{dict((id(q), n) for n, q in net.named_parameters())[id(p)]}"
    assert firing.kind == "threshold"
    checks.reset()  # a fold boundary
    assert math.isnan(checks.grad_scale.item())
    saved = checks.state_dict()
    checks.grad_scale.fill_(3.0)
    checks.load_state_dict(saved)
    assert math.isnan(checks.grad_scale.item())


def test_adam_moments_fire_on_the_gradients_excursion_not_on_sparsity(tmp_path):
    """Adam's first moment averages clipped gradients, so its threshold is the gradients'
    (1e3 x the clip bound), not a multiple of its own group p99: a sparse gradient (C51 at a
    reward scale of 1e-3 puts it on a few atoms' rows) has max |m| far above 1e3 x the p99 in
    health, which once halted 5 of 6 market runs at x0.001. The adam_v slot checks v against
    the same threshold squared (no square root of v is taken)."""
    from rl_helpers import wired_learner

    learner = wired_learner(tiny(tmp_path))
    checks, net = learner.stability.checks, learner.agent.online
    state = checks.state
    params = [p for p in net.parameters() if p.ndim >= 2]
    p = params[-1]
    bound = 0.5
    state["grad_clip_bound"].fill_(bound)
    state["adam_p99_m"].fill_(1e-9)  # the moments' own p99: tiny, as on a sparse gradient
    state["adam_p99_v"].fill_(1e-18)
    learner.agent.optimizer.state[p]["exp_avg"] = torch.zeros_like(p)
    learner.agent.optimizer.state[p]["exp_avg_sq"] = torch.zeros_like(p)
    learner.agent.optimizer.state[p]["exp_avg"].view(-1)[0] = 0.9 * bound  # healthy: |m| <= bound
    learner.agent.optimizer.state[p]["exp_avg_sq"].view(-1)[0] = (0.9 * bound) ** 2
    checks.weights()
    assert not bool(checks.sentinel.fired())
    learner.agent.optimizer.state[p]["exp_avg"].view(-1)[1] = 2e3 * bound  # an excursion
    checks.weights()
    [firing] = checks.sentinel.report()
    assert firing.name.startswith("adam_m.") and firing.kind == "threshold"
    checks.sentinel.reset()
    learner.agent.optimizer.state[p]["exp_avg"].view(-1)[1] = 0.0
    learner.agent.optimizer.state[p]["exp_avg_sq"].view(-1)[2] = (2e3 * bound) ** 2
    checks.weights()
    [firing] = checks.sentinel.report()
    assert firing.name.startswith("adam_v.") and firing.kind == "threshold"
    assert firing.value == (2e3 * bound) ** 2  # max v, against (1e3 x the bound)²
    checks.sentinel.reset()
    learner.agent.optimizer.state[p]["exp_avg_sq"].view(-1)[2] = math.nan  # a corrupt v
    checks.weights()
    [firing] = checks.sentinel.report()
    assert firing.name.startswith("adam_v.") and firing.kind == "nan"


def test_the_watched_thresholds_are_measured_on_the_bounds_cadence(tmp_path):
    """With run.measure_every = k the watched buffers are measured and folded on steps 0, k,
    2k, ... only (as the bounds), the count survives a checkpoint and a fold boundary restarts
    it; the thresholds in force are read on every step."""
    with Lifecycle():
        checks = build_learner(
            generic(tiny(tmp_path, measure_every=4)), 5, [3], torch.device("cpu")
        ).stability.checks
    assert checks.cadence.every == 4
    g = torch.Generator().manual_seed(2)
    for step in range(10):
        checks._measure({n: torch.randn(8, generator=g) for n in WATCHED})
        checks._fold()
        assert int(checks.watch_ema.count.max()) == step // 4 + 1, step
    state = checks.state_dict()
    assert state["cadence"] == 10
    checks.reset()
    assert checks.cadence.step == 0
    checks.load_state_dict(state)
    assert checks.cadence.step == 10
    checks.load_state_dict({k: v for k, v in state.items() if k != "cadence"})  # older file
    assert checks.cadence.step == 0


def test_the_learn_step_hands_the_sentinel_contiguous_buffers(tmp_path):
    """Every buffer a learn step holds for the sentinel is contiguous, so that on a GPU the check
    runs its kernel, not its torch reference (what a strided slot does, with a
    KernelFallbackWarning): several branches' dueling logits and a branch-shared atom span are
    strided views until made contiguous."""
    with Lifecycle():
        learner = build_learner(generic(tiny(tmp_path)), 5, [3, 3], torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    batch = {"obs": torch.randn(16, 5, generator=g), "reward": torch.randn(16, generator=g),
             "action": torch.randint(0, 3, (16, 2), generator=g),
             "next_obs": torch.randn(16, 5, generator=g),
             "discount": torch.full((16,), 0.9)}  # fmt: skip
    learner.learn(batch)
    seen = {k: v for k, v in learner.stability.checks._seen.items() if isinstance(v, torch.Tensor)}
    assert {"logits", "atom_span", "obs", "grad_trunk"} <= set(seen)
    assert [k for k, v in seen.items() if not v.is_contiguous()] == []
