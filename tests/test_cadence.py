"""measure_every: the producers (AdaptiveBounds, AdaptiveGradClip, trimtab.optim.Adam) measure on
steps 0, k, 2k, ... and their consumers bind at the bound in force on every step."""

from __future__ import annotations

import copy

import pytest
import torch

from trimtab import AdaptiveBounds, AdaptiveGradClip
from trimtab._cadence import Cadence
from trimtab.optim import Adam


def _x(step: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    return scale * (1.0 + step) * torch.randn(500, generator=g)


def test_bad_measure_every_is_refused_with_its_owner_named():
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="measure_every must be an int >= 1"):
            AdaptiveBounds(["a"], measure_every=bad)
    with pytest.raises(ValueError, match="AdaptiveGradClip"):
        AdaptiveGradClip([torch.zeros(2, requires_grad=True)], measure_every=0)
    with pytest.raises(ValueError, match=r"trimtab\.optim\.Adam"):
        Adam([torch.zeros(2, requires_grad=True)], measure_every=0)


def test_cadence_is_due_on_multiples_and_restarts_at_a_reset():
    c = Cadence(3, "test")
    due = []
    for _ in range(7):
        due.append(c.due)
        c.advance()
    assert due == [True, False, False, True, False, False, True]
    c.reset()
    assert c.due and c.step == 0
    c.load(None)  # a checkpoint from before the cadence
    assert c.step == 0


def test_bounds_measuring_every_k_steps_fold_what_a_k1_object_fed_those_steps_folds():
    """Bitwise: k = 3 over 10 steps gives the slot, estimator and counts that k = 1 gives when
    it is fed steps 0, 3, 6, 9 only; the clamp binds at the bound in force on every step."""
    every = AdaptiveBounds(["a"], measure_every=3)
    fed = AdaptiveBounds(["a"])
    for step in range(10):
        x = _x(step)
        in_force = every.clamp_bound("a").clone()
        every.measure("a", x)
        y = every.clamp_("a", x.clone())
        every.fold()
        if step % 3 == 0:
            fed.measure("a", x)
            fed.clamp_("a", x.clone())
            fed.fold()
        else:  # not measured: the bound in force clamps, and the slot does not move
            assert torch.equal(every.clamp_bound("a"), in_force)
            bound = float(in_force)
            assert float(y.abs().max()) <= bound
            assert torch.equal(y, x.clamp(-bound, bound))
        assert torch.equal(every.values, fed.values)
    for key, value in every.ema.state_dict().items():
        assert torch.equal(value.nan_to_num(7.0), fed.ema.state_dict()[key].nan_to_num(7.0)), key
    assert torch.equal(every.engaged_rates(), fed.engaged_rates())


def test_bounds_cadence_survives_a_checkpoint_and_restarts_at_reset():
    b = AdaptiveBounds(["a"], measure_every=4)
    for step in range(5):
        b.measure("a", _x(step))
        b.fold()
    assert not b.measuring  # step 5 of 4: not due
    other = AdaptiveBounds(["a"], measure_every=4)
    other.load_state_dict(copy.deepcopy(b.state_dict()))
    assert other.cadence.step == 5 and not other.measuring
    other.reset()
    assert other.measuring and other.cadence.step == 0


def test_clip_window_takes_every_norm_and_the_bound_moves_only_on_due_steps():
    p = torch.zeros(10, requires_grad=True)
    clip = AdaptiveGradClip([p], measure_every=4)
    ref = AdaptiveGradClip([torch.zeros(10, requires_grad=True)])
    bounds = []
    for step in range(12):
        p.grad = _x(step)[:10].clone()
        before = clip.bound.clone()
        clip()
        bounds.append(clip.bound.clone())
        if step % 4:
            assert torch.equal(clip.bound, before)
        if step == 0:  # the first step refits exactly as k = 1 does
            ref.groups[0][0].grad = _x(0)[:10].clone()
            ref()
            assert torch.equal(clip.bound, ref.bound)
    assert int(clip._count) == 12  # the window took every norm
    assert int(torch.isfinite(clip._history).sum()) == 12
    assert len({float(b) for b in bounds}) <= 3  # refits at steps 0, 4, 8 only


def test_clip_clips_at_the_bound_in_force_between_refits():
    p = torch.zeros(100, requires_grad=True)
    clip = AdaptiveGradClip([p], measure_every=5)
    for _ in range(5):
        p.grad = torch.full((100,), 1.0)
        clip()
    bound = float(clip.bound)
    p.grad = torch.full((100,), 50.0)  # a norm far above the bound, on a step that refits none
    norm = clip()
    assert float(norm) == pytest.approx(500.0)
    assert float(p.grad.norm()) == pytest.approx(bound, rel=1e-5)
    assert float(clip.bound) == bound


def _adam(every: int) -> tuple[torch.nn.Parameter, Adam]:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 32))
    return w, Adam([w], lr=1e-2, measure_every=every)


def _grad(step: int) -> torch.Tensor:
    return torch.randn(64, 32, generator=torch.Generator().manual_seed(100 + step))


def test_adam_takes_statistics_on_due_steps_and_updates_weights_on_every_step():
    w3, a3 = _adam(3)
    w1, a1 = _adam(1)
    sv3, sv1 = a3.state_vector.tensor, a1.state_vector.tensor
    for step in range(7):
        before = sv3.clone()
        phase = int(a3._phase)
        w3.grad, w1.grad = _grad(step), _grad(step)
        w0 = w3.detach().clone()
        a3.step()
        a1.step()
        assert not torch.equal(w3.detach(), w0)  # every step updates the weights
        if step % 3:  # not due: every slot as the last measurement left it
            assert torch.equal(sv3.nan_to_num(123.0), before.nan_to_num(123.0))
            assert int(a3._phase) == phase  # the sample rotates with the measurements
        else:
            assert int(a3._phase) == phase + 1
        if step == 0:  # the same first step: the same statistics
            assert torch.equal(sv3.nan_to_num(123.0), sv1.nan_to_num(123.0))
        if step <= 1:  # steps 0 and 1 use the slots of step 0 in both: the same weights
            assert torch.equal(w3.detach(), w1.detach())
    assert int(a3.state[w3]["step"]) == 7


def test_adam_cadence_is_checkpointed_and_reset():
    w, a = _adam(4)
    for step in range(6):
        w.grad = _grad(step)
        a.step()
    sd = a.state_dict()
    assert sd["trimtab"]["cadence"] == 6
    w2, b = _adam(4)
    w2.grad = _grad(0)
    b.step()
    b.load_state_dict(sd)
    assert b.cadence.step == 6
    b.reset_state()
    assert b.cadence.step == 0 and b.cadence.due
    del sd["trimtab"]["cadence"]  # a checkpoint from before the cadence counts from 0
    b.load_state_dict(sd)
    assert b.cadence.step == 0


def test_capture_with_measure_every_above_one_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    b = AdaptiveBounds(["a"], measure_every=2)
    with pytest.raises(RuntimeError, match="captured CUDA graph"):
        b.fold()
    Cadence(1, "k=1").refuse_capture()  # every step measures: nothing to refuse


@pytest.mark.gpu
def test_every_k_on_cuda_gives_the_cpu_numbers():
    """measure_every = 3 on CUDA (the Triton paths: derive, folds, the clip's refit launch,
    Adam's update and finalize kernels, the finalize stepping its phase with the statistics
    only) against the same on the CPU (the torch references), over 7 steps."""

    def run(device: str) -> dict[str, torch.Tensor]:
        dev = torch.device(device)
        start = torch.randn(300, 40, generator=torch.Generator().manual_seed(0))
        w = torch.nn.Parameter(start.to(dev))
        adam = Adam([w], lr=1e-2, measure_every=3, capturable=True)
        clip = AdaptiveGradClip([w], measure_every=3)
        bounds = AdaptiveBounds(["a"], measure_every=3, device=dev)
        for step in range(7):
            g = torch.Generator().manual_seed(200 + step)
            w.grad = (torch.randn(300, 40, generator=g) * (1 + step)).to(dev)
            x = _x(step).to(dev)
            bounds.measure("a", x)
            bounds.clamp_("a", x)
            clip()
            adam.step()
            bounds.fold()
        return {"w": w.detach().cpu(), "adam": adam.state_vector.tensor.cpu(),
                "phase": adam._phase.cpu(), "clip": clip.bound.cpu(),
                "bounds": bounds.values.cpu()}  # fmt: skip

    cpu, cuda = run("cpu"), run("cuda")
    assert int(cpu["phase"]) == int(cuda["phase"]) == 3  # steps 0, 3, 6
    # float32: the kernels sum in another order, and 7 steps feed the slots back into the update.
    # grad_growth (the last slot) is a lower confidence bound from 3 observations of log(Σg²/Σv̂),
    # the first of them log 1 = 0 up to rounding: the estimator's tests on a degenerate start
    # amplify the rounding (3.6e-4 apart on the H200), so it is compared to 1e-3 on its own.
    torch.testing.assert_close(cuda["adam"][-1:], cpu["adam"][-1:], rtol=0, atol=1e-3)
    cpu["adam"], cuda["adam"] = cpu["adam"][:-1], cuda["adam"][:-1]
    for key in cpu:
        torch.testing.assert_close(
            cuda[key],
            cpu[key],
            rtol=1e-4,
            atol=1e-5,
            equal_nan=True,
            msg=lambda m, k=key: f"{k}: {m}",
        )
