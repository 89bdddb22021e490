from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

import trimtab.optim as topt
from trimtab.lifecycle import Lifecycle
from trimtab.optim import _reference as ref
from trimtab.state import LayoutMismatchError, StateVector

OFF = dict(weight_clamp=False, l1=False)


def make_params(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 3), (0,), (7,), (4, 2, 3), (1,)]
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def clone_params(ps):
    return [p.detach().clone().requires_grad_() for p in ps]


def set_grads(step, *param_lists, seed=0):
    """Same random gradient on each list; params 2 get none on every third step."""
    g = torch.Generator().manual_seed(1000 * seed + step)
    grads = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in param_lists[0]]
    for ps in param_lists:
        for i, (p, gr) in enumerate(zip(ps, grads)):
            p.grad = None if (i == 2 and step % 3 == 0) else gr.clone()


@pytest.mark.parametrize(
    "hyper",
    [
        dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
        dict(lr=3e-1, betas=(0.5, 0.9), eps=1e-3, weight_decay=0.0),
        dict(lr=1e-3, betas=(0.0, 0.99), eps=1e-6, weight_decay=0.5),
    ],
)
@pytest.mark.parametrize("capturable", [False, True])
def test_matches_torch_adamw_with_features_off(hyper, capturable):
    ps = make_params()
    qs = clone_params(ps)
    ours = topt.Adam(ps, capturable=capturable, **hyper, **OFF)
    theirs = torch.optim.AdamW(qs, **hyper)
    for step in range(24):
        set_grads(step, ps, qs)
        ours.step()
        theirs.step()
        if step == 11:  # save and reload both mid-run, into fresh optimizers
            sd_ours, sd_theirs = copy.deepcopy(ours.state_dict()), theirs.state_dict()
            ours = topt.Adam(ps, capturable=capturable, **hyper, **OFF)
            ours.load_state_dict(sd_ours)
            theirs = torch.optim.AdamW(qs, **hyper)
            theirs.load_state_dict(sd_theirs)
    # Same operations in the same order: identical up to float64 rounding (exact when not
    # capturable; the capturable branch folds the step size differently, as torch's does).
    tol = dict(rtol=1e-12, atol=1e-14) if capturable else dict(rtol=0, atol=0)
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, **tol)
        if p.numel():
            torch.testing.assert_close(ours.state[p]["exp_avg_sq"], theirs.state[q]["exp_avg_sq"])


def test_param_groups_and_lr_scheduler_match_torch():
    ps, qs = make_params(), None
    qs = clone_params(ps)
    groups = lambda xs: [{"params": xs[:2]}, {"params": xs[2:], "lr": 5e-2, "weight_decay": 0.1}]  # noqa: E731
    ours = topt.Adam(groups(ps), lr=1e-2, weight_decay=0.01, **OFF)
    theirs = torch.optim.AdamW(groups(qs), lr=1e-2, weight_decay=0.01)
    s1 = torch.optim.lr_scheduler.StepLR(ours, step_size=5, gamma=0.5)
    s2 = torch.optim.lr_scheduler.StepLR(theirs, step_size=5, gamma=0.5)
    for step in range(20):
        set_grads(step, ps, qs)
        ours.step(), theirs.step(), s1.step(), s2.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    ours.zero_grad()
    assert all(p.grad is None for p in ps)


def test_every_feature_on_runs_and_sets_slots():
    ps = make_params(torch.float32)
    opt = topt.Adam([{"params": ps[:1], "l1": True}, {"params": ps[1:]}], lr=1e-2)
    for step in range(5):
        set_grads(step, ps)
        opt.step()
    slots = opt.state_vector.as_dict()
    for name in ("weight_bound", "decay", "p99_w", "p99_m", "p99_v"):
        assert all(math.isfinite(v) for v in slots[f"adam_{name}"]), name
    assert math.isfinite(slots["adam_l1"][0]) and math.isnan(slots["adam_l1"][1])


def test_weight_clamp_holds_every_weight_within_the_bound_in_force():
    torch.manual_seed(0)
    w = torch.randn(2000, requires_grad=True)
    opt = topt.Adam([w], lr=0.05, weight_decay=0.0)
    for _ in range(20):
        bound = ref.coefficients(opt._slot_views[0], topt.WEIGHT_BOUND_FLOOR)[2].clone()
        w.grad = torch.randn(2000) - 0.5 * torch.sign(w.detach())  # an outward push, plus noise
        opt.step()
        assert w.detach().abs().max() <= bound
    assert opt.engagement.engaged_total.item() > 0


def test_weight_headroom_clamps_at_a_multiple_of_the_bound_and_counts_its_exceedances():
    torch.manual_seed(0)
    w = torch.randn(2000, requires_grad=True)
    opt = topt.Adam([w], lr=0.05, weight_decay=0.0, weight_headroom=2.0)
    past = 0
    for _ in range(20):
        bound = ref.coefficients(opt._slot_views[0], topt.WEIGHT_BOUND_FLOOR)[2].clone()
        w.grad = torch.randn(2000) - 0.5 * torch.sign(w.detach())  # an outward push, plus noise
        opt.step()
        assert w.detach().abs().max() <= 2.0 * bound
        past += int((w.detach().abs() > bound).sum())
    assert past > 0  # weights between the bound and twice it stay
    assert opt.engagement.engaged_total.item() > 0  # the test counts the bound's exceedances
    for bad in (0.5, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="weight_headroom must be a finite number >= 1"):
            topt.Adam([w], weight_headroom=bad)


def test_state_dict_carries_the_fingerprint_and_a_mismatch_refuses_to_load():
    ps = make_params(torch.float32)
    opt = topt.Adam(ps)
    set_grads(0, ps)
    opt.step()
    sd = opt.state_dict()
    assert sd["trimtab"]["state_vector"]["fingerprint"] == opt.state_vector.fingerprint
    other = topt.Adam(clone_params(ps), prefix="other")
    before = other.state_vector.tensor.clone()
    with pytest.raises(LayoutMismatchError, match="layout mismatch"):
        other.load_state_dict(sd)
    assert torch.equal(other.state_vector.tensor.isnan(), before.isnan())
    assert len(other.state) == 0
    with pytest.raises(LayoutMismatchError, match="no 'trimtab' entry"):
        other.load_state_dict(torch.optim.AdamW(ps).state_dict())


def test_identical_continuation_after_reload_with_every_feature_on():
    ps = make_params(torch.float32)
    qs = clone_params(ps)
    a = topt.Adam([{"params": ps[:1], "l1": True}, {"params": ps[1:]}], lr=1e-2)
    for step in range(6):
        set_grads(step, ps)
        a.step()
    b = topt.Adam([{"params": qs[:1], "l1": True}, {"params": qs[1:]}], lr=1e-2)
    for p, q in zip(ps, qs):
        q.data.copy_(p.data)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for step in range(6, 12):
        set_grads(step, ps, qs)
        a.step()
        b.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    torch.testing.assert_close(a.state_vector.tensor, b.state_vector.tensor, equal_nan=True)


def test_reset_equals_a_fresh_optimizer():
    ps = make_params(torch.float32)
    opt = topt.Adam(ps, lr=1e-2)
    for step in range(5):
        set_grads(step, ps)
        opt.step()
    opt.reset_state()
    qs = clone_params(ps)
    fresh = topt.Adam(qs, lr=1e-2)
    for step in range(5, 10):
        set_grads(step, ps, qs)
        opt.step()
        fresh.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_registers_reset_with_the_active_lifecycle():
    ps = make_params(torch.float32)
    with Lifecycle() as life:
        opt = topt.Adam(ps, prefix="online")
    assert any(line.startswith("optimizer[online]") for line in life.describe())
    set_grads(1, ps)
    opt.step()
    life.fold_boundary()
    assert all(s["exp_avg"].abs().sum() == 0 and s["step"] == 0 for s in opt.state.values())
    assert opt.state_vector.tensor.isnan().all()


def test_external_state_vector():
    ps = make_params(torch.float32)
    sv = StateVector(topt.adam_slots(2, prefix="net"))
    opt = topt.Adam([{"params": ps[:2]}, {"params": ps[2:]}], state_vector=sv, prefix="net")
    set_grads(1, ps)
    opt.step()
    assert opt.state_vector is sv and sv.is_set("net_p99_w").all()
    with pytest.raises(LayoutMismatchError, match="net_weight_bound"):
        topt.Adam(ps, state_vector=StateVector(topt.adam_slots(1, prefix="x")), prefix="net")


@pytest.mark.slow
def test_weight_drift_is_held_at_an_equilibrium_without_any_hand_set_bound():
    """A loss whose gradient pushes every weight outward forever (loss = -Σ w²): torch AdamW's
    max |w| grows step after step, trimtab's defaults hold the weights near an equilibrium."""
    torch.manual_seed(0)
    w0 = torch.randn(1000)
    ours_w, theirs_w = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    ours = topt.Adam([ours_w], lr=1e-2)
    theirs = torch.optim.AdamW([theirs_w], lr=1e-2)
    history = []
    for step in range(600):
        for w, opt in ((ours_w, ours), (theirs_w, theirs)):
            opt.zero_grad()
            (-(w * w).sum()).backward()
            opt.step()
        if step % 100 == 99:
            history.append(
                (ours_w.detach().abs().max().item(), theirs_w.detach().abs().max().item())
            )
    start = w0.abs().max().item()
    theirs_max = [t for _, t in history]
    assert all(b > a for a, b in itertools.pairwise(theirs_max))  # AdamW keeps growing
    assert theirs_max[-1] > start + 4.0
    ours_max = [o for o, _ in history]
    assert max(ours_max) < start + 0.5  # held near where it started
    assert abs(ours_max[-1] - ours_max[-2]) < 0.1  # and settling
    assert ours.state_vector.as_dict()["adam_decay"][0] > 0
    for _ in range(2400):  # and held over a longer run, in a shallow limit cycle
        ours.zero_grad()
        (-(ours_w * ours_w).sum()).backward()
        ours.step()
    assert ours_w.detach().abs().max().item() < start + 0.5


@pytest.mark.slow
def test_adaptive_decay_does_not_ratchet_weights_down_under_noise():
    """Gradients of pure noise push ‖w‖ out and in at random. A decay that cancels every
    outward step and keeps every inward one is a ratchet (the former rule shrank ‖w‖ by a
    third here in 2000 steps); the gradient scale does not rise, so no decay applies."""
    torch.manual_seed(0)
    w0 = torch.randn(16)
    w = w0.clone().requires_grad_()
    opt = topt.Adam([w], lr=1e-2, weight_clamp=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(2000):
        w.grad = torch.randn(16, generator=g)
        opt.step()
    assert 0.9 < (w.detach().norm() / w0.norm()).item() < 1.3


def _regression_to_a_distant_solution(opt_factory, noise: float, steps: int = 2000):
    """Least squares whose solution has ~300x the norm of the initial weights."""
    g = torch.Generator().manual_seed(0)
    d = 64
    w_star = 3.0 * torch.randn(d, generator=g)
    w = (0.01 * torch.randn(d, generator=g)).requires_grad_()
    opt = opt_factory([w])
    for _ in range(steps):
        x = torch.randn(32, d, generator=g)
        y = x @ w_star + noise * torch.randn(32, generator=g)
        opt.zero_grad()
        ((x @ w - y) ** 2).mean().backward()
        opt.step()
    return (w.detach() - w_star).norm().item() / w_star.norm().item(), opt


@pytest.mark.slow
@pytest.mark.parametrize("noise", [0.1, 3.0])
def test_adaptive_decay_lets_weights_grow_to_a_distant_solution(noise):
    """Decay must cancel drift, not learning: the outward push toward a solution is as steady
    as drift's, but the gradient shrinks as the weights approach it, so decay stays off and the
    weights grow 300x as under AdamW without decay. (The equilibrium rate applied whenever the
    push was outward held ‖w‖ at 5% of the solution's norm.)"""
    theirs, _ = _regression_to_a_distant_solution(
        lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0), noise
    )
    ours, opt = _regression_to_a_distant_solution(
        lambda p: topt.Adam(p, lr=1e-2, weight_clamp=False), noise
    )
    assert theirs < 0.05
    assert ours < theirs + 0.01
    assert opt.state_vector["adam_grad_growth"].item() < 0.0


def test_adaptive_decay_never_removes_more_than_the_weight():
    """The first steps from tiny weights have a huge equilibrium rate; lr * decay stays <= 1."""
    torch.manual_seed(0)
    w = (1e-4 * torch.randn(100)).requires_grad_()
    opt = topt.Adam([w], lr=0.1, weight_clamp=False)
    for _ in range(30):
        w.grad = -torch.sign(w.detach()) + 0.01 * torch.randn(100)
        opt.step()
        rate = opt.state_vector["adam_decay"].item()
        assert math.isnan(rate) or 0.0 <= 0.1 * rate <= 1.0 + 1e-6


def test_magnitude_slots_stay_positive_after_a_tenfold_drop():
    """Bounds and quantiles are folded on a log scale: a sudden 10x drop of |w| (a trend the
    filter could extrapolate below zero on a linear scale) leaves every magnitude slot > 0."""
    torch.manual_seed(0)
    w = torch.randn(4000).requires_grad_()
    opt = topt.Adam([w], lr=1e-3)
    for step in range(60):
        if step == 30:
            with torch.no_grad():
                w.mul_(0.1)
        w.grad = torch.randn(4000)
        opt.step()
        sv = opt.state_vector.as_dict()
        for name in ("adam_weight_bound", "adam_p99_w", "adam_p99_m", "adam_p99_v"):
            assert sv[name][0] > 0.0, (step, name, sv[name])
    assert opt.state_vector["adam_p99_w"].item() < 0.5  # followed the drop


def test_adaptive_decay_is_invariant_to_the_loss_scale():
    torch.manual_seed(0)
    w0 = torch.randn(500)
    rates = []
    for scale in (1.0, 100.0):
        w = w0.clone().requires_grad_()
        opt = topt.Adam([w], lr=1e-2, eps=1e-12, weight_clamp=False)
        g = torch.Generator().manual_seed(3)
        for _ in range(10):
            w.grad = scale * (torch.randn(500, generator=g) - 0.3 * torch.sign(w.detach()))
            opt.step()
        rates.append(opt.state_vector["adam_decay"].item())
    assert rates[0] == pytest.approx(rates[1], rel=1e-4)


def test_l1_prunes_only_when_gradients_concentrate_on_few_features():
    torch.manual_seed(0)
    results = {}
    for case in ("spread", "concentrated"):
        w = (0.01 * torch.randn(8, 16)).requires_grad_()
        opt = topt.Adam([w], lr=1e-2, l1=True, weight_clamp=False, weight_decay=0.0)
        for _ in range(200):
            g = torch.randn(8, 16)
            if case == "concentrated":
                g[:, :2] += 1.0  # a consistent signal on two of sixteen input features,
                g[:, 2:] *= 0.01  # faint noise on the others
            w.grad = g
            opt.step()
        results[case] = (
            opt.state_vector["adam_l1"].item(),
            (w.detach() == 0).float().mean().item(),
        )
    l1_spread, zeros_spread = results["spread"]
    l1_conc, zeros_conc = results["concentrated"]
    assert l1_spread < 0.1 * l1_conc
    assert zeros_spread < 0.05
    assert zeros_conc > 0.2  # exact zeros among the faint features (noise re-moves some each step)
    assert (w.detach()[:, :2] != 0).all()  # the features that carry signal survive


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        (dict(lr=-1.0), ValueError, "learning rate"),
        (dict(eps=-1e-8), ValueError, "eps"),
        (dict(betas=(1.0, 0.9)), ValueError, "betas"),
        (dict(betas=(0.9,)), ValueError, "betas"),
        (dict(weight_decay=-0.1), ValueError, "weight_decay"),
        (dict(weight_decay="sometimes"), ValueError, "weight_decay"),
        (dict(amsgrad=True), ValueError, "amsgrad is not supported"),
        (dict(weight_clamp=1), TypeError, "weight_clamp"),
        (dict(quantile=1.0), ValueError, "quantile"),
        (dict(impl="cuda"), ValueError, "impl"),
    ],
)
def test_bad_arguments(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        topt.Adam(make_params(torch.float32), **kwargs)


def test_bad_usage():
    with pytest.raises(ValueError, match="empty parameter list"):
        topt.Adam([])
    opt = topt.Adam(make_params(torch.float32))
    with pytest.raises(RuntimeError, match="pass every group to the constructor"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})
    p = torch.zeros(3, 3, requires_grad=True)
    sparse = topt.Adam([p])
    p.grad = torch.eye(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        sparse.step()


# --- GPU ------------------------------------------------------------------------------------
def _gpu_setup(capturable=True):
    torch.manual_seed(0)
    ps = [torch.randn(s, device="cuda", requires_grad=True) for s in [(300, 70), (70,), (0,), (5,)]]
    opt = topt.Adam([{"params": ps[:1], "l1": True}, {"params": ps[1:]}], capturable=capturable)
    for p in ps:
        p.grad = torch.randn_like(p)
    return ps, opt


@pytest.mark.gpu
def test_gpu_step_makes_no_host_sync():
    _ps, opt = _gpu_setup()
    opt.step()  # warm-up: lazy state, pointer tables, constants
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_gpu_step_captures_in_a_cuda_graph():
    ps, opt = _gpu_setup()
    ref_ps = [p.detach().clone().requires_grad_() for p in ps]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    before = [p.detach().clone() for p in ps]
    graph.replay()
    torch.cuda.synchronize()
    assert any(not torch.equal(b, p) for b, p in zip(before, ps))
    assert all(torch.isfinite(p).all() for p in ps)
    del ref_ps


@pytest.mark.gpu
@pytest.mark.parametrize("capturable", [False, True])
def test_gpu_kernel_matches_torch_fused_adamw_with_features_off(capturable):
    torch.manual_seed(0)
    ps = [torch.randn(s, device="cuda", requires_grad=True) for s in [(1000, 33), (4097,), (0,)]]
    qs = [p.detach().clone().requires_grad_() for p in ps]
    ours = topt.Adam(ps, lr=1e-3, weight_decay=0.01, capturable=capturable, **OFF)
    assert ours.impl == "triton"
    theirs = torch.optim.AdamW(qs, lr=1e-3, weight_decay=0.01, fused=True)
    for _ in range(20):
        for p, q in zip(ps, qs):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        ours.step()
        theirs.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


# --- found_inf and GradScaler ---------------------------------------------------------------
def _amp_run(use_scaler, inf_at=None, steps=6):
    torch.manual_seed(0)
    ps = make_params(torch.float32)
    opt = topt.Adam([{"params": ps[:1], "l1": True}, {"params": ps[1:]}], lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if use_scaler else None
    x = torch.linspace(-1, 1, 7)
    for step in range(steps):
        opt.zero_grad()
        loss = sum((p * p).sum() * (1 + step) for p in ps) + (ps[2] * x).sum()
        if step == inf_at:
            loss = loss * math.inf
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)  # hands opt its scale and found_inf: no unscale, no host check
            scaler.update()
    return ps, opt, scaler


def test_grad_scaler_hands_its_scale_and_found_inf_to_the_step():
    """A power-of-two scale unscales exactly, so GradScaler + Adam steps exactly as plain
    Adam; an Inf loss is skipped on the device (the step count stays) and the scale halves."""
    plain, plain_opt, _ = _amp_run(False)
    scaled, scaled_opt, _ = _amp_run(True)
    assert scaled_opt._step_supports_amp_scaling
    for p, q in zip(plain, scaled):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    torch.testing.assert_close(
        plain_opt.state_vector.tensor, scaled_opt.state_vector.tensor, rtol=0, atol=0,
        equal_nan=True,
    )  # fmt: skip
    skipped, opt, scaler = _amp_run(True, inf_at=3)
    assert opt.state[skipped[0]]["step"].item() == 5
    assert scaler.get_scale() == 2.0**9
    assert all(torch.isfinite(p).all() for p in skipped)
    assert not hasattr(opt, "found_inf") and not hasattr(opt, "grad_scale")


@pytest.mark.parametrize(
    ("found_inf", "exc", "pattern"),
    [
        (1.0, TypeError, "one-element tensor"),
        (torch.zeros(2), TypeError, "one-element tensor"),
        (torch.zeros((), device="meta"), ValueError, "decided on the parameters' device"),
    ],
)
def test_bad_found_inf(found_inf, exc, pattern):
    ps = make_params(torch.float32)
    opt = topt.Adam(ps)
    set_grads(0, ps)
    with pytest.raises(exc, match=pattern):
        opt.step(found_inf=found_inf)
