"""trimtab.Guard: the plain loop with torch's and trimtab's Adam, a NaN batch skipped bitwise,
a x1e4 change of target scale learned through, named bounds, reset, state_dict and report."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import trimtab
import trimtab.optim
from trimtab.lifecycle import detached

FEATURES = 8
TRUE_W = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0, 0.0, 1.5, -2.0])


def _batch(g: torch.Generator, scale: float = 1.0, n: int = 128) -> tuple[torch.Tensor, ...]:
    x = torch.randn(n, FEATURES, generator=g)
    return x, scale * (x @ TRUE_W + 0.05 * torch.randn(n, generator=g))


def _model(linear: bool = False) -> nn.Module:
    torch.manual_seed(0)
    if linear:
        return nn.Sequential(nn.Linear(FEATURES, 1), nn.Flatten(0))
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))


def _optimizer(which: str, model: nn.Module, lr: float = 1e-2) -> torch.optim.Optimizer:
    kind = {"torch.optim.Adam": torch.optim.Adam, "trimtab.optim.Adam": trimtab.optim.Adam}
    return kind[which](model.parameters(), lr=lr)


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in model.parameters()]
    for state in opt.state.values():
        out += [v.detach().clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return out


@pytest.mark.parametrize("which", ["torch.optim.Adam", "trimtab.optim.Adam"])
def test_the_plain_loop_learns_and_skips_a_nan_batch_bitwise(which: str) -> None:
    with detached():
        model = _model()
        opt = _optimizer(which, model)
        guard = trimtab.Guard(model, opt)
    g = torch.Generator().manual_seed(1)
    loss_fn = nn.functional.mse_loss
    first = None
    for t in range(300):
        x, y = _batch(g)
        if t == 150:  # a broken batch: NaN in the inputs, so every gradient is NaN
            x[3, 2] = math.nan
            before = _snapshot(model, opt)
        loss = loss_fn(model(x), y)
        applied = guard.step(loss)
        assert applied.dtype == torch.bool and applied.shape == () and applied.device == x.device
        if t == 150:
            assert not bool(applied)
            after = _snapshot(model, opt)
            assert len(after) == len(before)
            for a, b in zip(before, after):
                assert torch.equal(a, b)  # weights and optimizer state untouched, bitwise
        else:
            assert bool(applied)
        first = float(loss.detach()) if first is None else first
    assert float(loss.detach()) < 0.02 * first  # it learned the regression
    report = guard.report()
    assert "skipped (non-finite gradient or loss): 1" in report
    assert "'loss' first fired at step 150" in report
    fired = "'loss' fired first: phase 'loss', step 150"
    assert guard.peek() is True  # on the CPU the flag as it is now
    with pytest.raises(trimtab.NonFiniteError, match=fired):
        guard.raise_if_fired()


def test_a_1e4_change_of_target_scale_is_learned_through() -> None:
    """SGD's dynamics on a linear model's squared loss are scale-equivariant (targets x s:
    gradients and the solution x s), so a loop learns a x1e4 jump as fast as the first scale
    unless a clip holds the step back. The measured clip follows the new norms; a clip at a
    norm that was right for the first scale (torch's clip_grad_norm_ at 10) keeps the loss far
    above it over the same steps."""

    def run(hand_set: float | None) -> tuple[float, float, float]:
        with detached():
            model = _model(linear=True)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            guard = trimtab.Guard(model, opt, clip=hand_set is None)
        g = torch.Generator().manual_seed(2)
        losses = []
        for t in range(800):
            x, y = _batch(g, scale=1.0 if t < 400 else 1e4)
            loss = nn.functional.mse_loss(model(x), y)
            if hand_set is None:
                guard.step(loss)
            else:
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), hand_set)
                opt.step()
            losses.append(float(loss.detach()))
        target_var = float(TRUE_W.square().sum()) * 1e8
        return losses[399] / float(TRUE_W.square().sum()), losses[-1] / target_var, max(losses)

    before, after, _ = run(None)
    assert before < 1e-2 and after < 1e-2, (before, after)  # learned at both scales
    _, after_fixed, _ = run(hand_set=10.0)
    assert after_fixed > 10 * after, (after_fixed, after)


@pytest.mark.parametrize("which", ["torch.optim.Adam", "trimtab.optim.Adam"])
def test_adam_through_a_1e4_change_the_guard_stays_out_of_the_way(which: str) -> None:
    """Adam steps by ~lr whatever the gradient's scale, so a x1e4 target takes it many steps to
    follow, guarded or not; what the Guard must do is stay out of the way: no non-finite step,
    every step applied, the clip's bound following the norms up, and the loss 400 steps after
    the jump no higher than the unguarded loop's (within 10%)."""

    def run(guarded: bool) -> tuple[list[float], list[float], trimtab.Guard | None]:
        with detached():
            model = _model()
            opt = _optimizer(which, model, lr=3e-2)
            guard = trimtab.Guard(model, opt) if guarded else None
        g = torch.Generator().manual_seed(3)
        losses, bounds = [], []
        for t in range(600):
            x, y = _batch(g, scale=1.0 if t < 200 else 1e4)
            loss = nn.functional.mse_loss(model(x), y)
            if guard is None:
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                assert bool(guard.step(loss))
                bounds.append(float(guard.clip.bound[0]))
            losses.append(float(loss.detach()))
        return losses, bounds, guard

    plain, _, _ = run(False)
    losses, bounds, guard = run(True)
    assert guard is not None and not bool(guard.fired())
    assert bounds[-1] > 100 * bounds[199]  # the clip followed the new gradient scale
    assert losses[-1] <= 1.1 * plain[-1], (losses[-1], plain[-1])
    if which == "torch.optim.Adam":  # trimtab's Adam, guarded or not, grows its weights slower
        assert losses[-1] < 0.5 * losses[201]


def test_named_bounds_measure_clamp_and_reset() -> None:
    with detached():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        guard = trimtab.Guard(model, opt, bounds=["targets"], clamp_headroom=2.0)
    g = torch.Generator().manual_seed(4)
    for _ in range(50):
        x, y = _batch(g)
        y = guard.bound("targets", y)  # measured, checked and clamped at 2 x p99|y|
        guard.step(nn.functional.mse_loss(model(x), y))
    b = float(guard.bounds.bound("targets"))
    ref = float(torch.quantile((_batch(torch.Generator().manual_seed(9), n=20000)[1]).abs(), 0.99))
    assert 0.7 * ref < b < 1.3 * ref
    spike = torch.full((4,), 1e6)
    assert float(guard.bound("targets", spike).max()) <= 2 * b * (1 + 1e-6)
    layer = guard.clamp_layer("targets")
    assert isinstance(layer, trimtab.BoundClamp)
    guard.reset()
    assert guard.steps == 0 and math.isnan(float(guard.bounds.values[0]))
    assert math.isnan(float(guard.clip.bound[0])) and not bool(guard.fired())
    with pytest.raises(KeyError, match="no bound 'other'"):
        guard.bound("other", y)


def test_state_dict_round_trip_continues_bitwise(tmp_path) -> None:
    def build() -> tuple[nn.Module, torch.optim.Optimizer, trimtab.Guard]:
        with detached():
            model = _model()
            opt = trimtab.optim.Adam(model.parameters(), lr=1e-2)
            return model, opt, trimtab.Guard(model, opt, bounds=["targets"])

    def steps(model, guard, g, n):
        for _ in range(n):
            x, y = _batch(g)
            guard.step(nn.functional.mse_loss(model(x), guard.bound("targets", y)))

    m1, o1, g1 = build()
    gen = torch.Generator().manual_seed(5)
    steps(m1, g1, gen, 20)
    path = tmp_path / "guard.pt"
    torch.save({"model": m1.state_dict(), "opt": o1.state_dict(), "guard": g1.state_dict()}, path)
    gen_state = gen.get_state()
    steps(m1, g1, gen, 10)
    m2, o2, g2 = build()
    saved = torch.load(path, weights_only=True)  # plain tensors and numbers only
    m2.load_state_dict(saved["model"])
    o2.load_state_dict(saved["opt"])
    g2.load_state_dict(saved["guard"])
    gen.set_state(gen_state)
    steps(m2, g2, gen, 10)
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    assert g2.steps == 30


@pytest.mark.parametrize("policy,clip", [("halt", False), ("halt", True), ("sanitize", False)])
def test_halt_and_sanitize_step_on_and_report(policy: str, clip: bool) -> None:
    """``halt`` reports and protects nothing by itself (the clip zeroes a NaN gradient tensor as
    a whole, so with it the weights stay finite); "sanitize" zeroes the NaN elements."""
    with detached():
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        guard = trimtab.Guard(model, opt, on_nonfinite=policy, clip=clip)
    x, y = _batch(torch.Generator().manual_seed(6))
    x[0, 0] = math.nan
    assert bool(guard.step(nn.functional.mse_loss(model(x), y)))  # the step went on
    assert bool(guard.fired())
    finite = all(bool(p.isfinite().all()) for p in model.parameters())
    assert finite == (policy == "sanitize" or clip)


def test_skip_with_a_fused_optimizer_reads_the_flag_on_the_device() -> None:
    with detached():
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
        guard = trimtab.Guard(model, opt)
    assert not guard._host_skip  # the fused step reads found_inf itself (GradScaler's contract)
    x, y = _batch(torch.Generator().manual_seed(8))
    guard.step(nn.functional.mse_loss(model(x), y))
    before = _snapshot(model, opt)
    x[1, 1] = math.inf
    assert not bool(guard.step(nn.functional.mse_loss(model(x), y)))
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(model, opt)))


def test_bad_arguments_are_refused_in_one_line() -> None:
    model = _model()
    with pytest.raises(TypeError, match=r"needs a torch\.optim\.Optimizer"):
        trimtab.Guard(model, object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"on_nonfinite='drop' must be one of"):
        trimtab.Guard(model, torch.optim.SGD(model.parameters(), lr=0.1), on_nonfinite="drop")
    other = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="the optimizer does not step"):
        trimtab.Guard(model, torch.optim.SGD(other.parameters(), lr=0.1))
    with detached():
        guard = trimtab.Guard(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="one-element tensor"):
        guard.step(torch.ones(3))
    copy.deepcopy(model)  # the Guard leaves the model an ordinary module


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_guard_step_is_sync_free_and_captures_on_cuda() -> None:
    dev = torch.device("cuda")
    with detached():
        model = _model().to(dev)
        opt = trimtab.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
        guard = trimtab.Guard(model, opt, bounds=["targets"])
    g = torch.Generator().manual_seed(7)
    x, y = (t.to(dev) for t in _batch(g))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm-up: kernels compiled, state allocated
            guard.step(nn.functional.mse_loss(model(x), guard.bound("targets", y)))
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.set_sync_debug_mode("error")
    try:
        applied = guard.step(nn.functional.mse_loss(model(x), guard.bound("targets", y)))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        applied = guard.step(nn.functional.mse_loss(model(x), guard.bound("targets", y)))
    for _ in range(5):
        x.copy_(_batch(g)[0].to(dev))
        graph.replay()
    assert bool(applied)
    x[0, 0] = math.nan
    before = [p.detach().clone() for p in model.parameters()]
    graph.replay()
    assert not bool(applied)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("option", ["amp", "measure_every"])
def test_amp_and_measure_every_learn_and_skip_a_nan_batch(option: str) -> None:
    """The Guard's options keep its answer: with a GradScaler (the checks see unscaled
    gradients; the scaler skips on its own flag) and measuring every 4th step, a NaN batch
    moves nothing and the loop still learns."""
    with detached():
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        kwargs: dict = (
            {"scaler": torch.amp.GradScaler("cpu", init_scale=2.0**8)}
            if option == "amp"
            else {"measure_every": 4}
        )
        guard = trimtab.Guard(model, opt, **kwargs)
    g = torch.Generator().manual_seed(2)
    first = None
    for t in range(200):
        x, y = _batch(g)
        if t == 100:
            x[0, 0] = math.nan
            before = _snapshot(model, opt)
        loss = nn.functional.mse_loss(model(x), y)
        applied = guard.step(loss)
        if t == 100:
            assert not bool(applied)
            for a, b in zip(before, _snapshot(model, opt), strict=True):
                assert torch.equal(a, b)
        first = float(loss.detach()) if first is None else first
    assert float(loss.detach()) < 0.05 * first
    assert "skipped (non-finite gradient or loss): 1" in guard.report()
