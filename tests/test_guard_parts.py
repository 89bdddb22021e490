"""trimtab.Guard's phases and its parts passed in: the phases called one by one are ``step``,
bit for bit; parts built outside (the trainer's way) are used as given and give the numbers of
the parts the Guard builds itself; a hand-set clip and weight clamp are parts too."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import pytest
import torch
from torch import nn

import trimtab
import trimtab.optim
from trimtab.bounds import AdaptiveBounds
from trimtab.clip import AdaptiveGradClip
from trimtab.guard import GuardParts, SentinelChecks
from trimtab.lifecycle import Lifecycle, detached
from trimtab.state import Slot, StateVector

FEATURES = 8
NAN_STEP = 7


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))


def _batches(n: int = 12) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for t in range(n):
        x = torch.randn(64, FEATURES, generator=g)
        y = x.sum(1) * 3.0 + torch.randn(64, generator=g)
        if t == NAN_STEP:
            x[2, 1] = math.nan  # every gradient NaN: skipped under "skip"
        out.append((x, y))
    return out


def _run(guard: trimtab.Guard, model: nn.Module, by_phase: bool) -> list[torch.Tensor]:
    """Losses and the applied flags of a short loop, by ``step`` or by its phases."""
    seen = []
    for x, y in _batches():
        loss = nn.functional.mse_loss(model(x), guard.bound("targets", y))
        if by_phase:
            guard.check_loss(loss)
            guard.backward(loss)
            guard.check_gradients()
            found = guard.decide()
            norm = guard.clip_gradients()
            assert norm is not None and norm.shape == ()
            guard.optimizer_step()
            guard.fold()
            guard.check_weights()
            seen.append(found.clone())
        else:
            seen.append((~guard.step(loss)).float())
    return seen


def _state(model: nn.Module, opt: torch.optim.Optimizer, guard: trimtab.Guard) -> list:
    out = [p.detach().clone() for p in model.parameters()]
    for st in opt.state.values():
        out += [v.clone() for v in st.values() if isinstance(v, torch.Tensor)]
    return [*out, guard.state.tensor.clone()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=0, equal_nan=True)


def _built(keep_grads: bool = False) -> tuple[nn.Module, torch.optim.Optimizer, trimtab.Guard]:
    with detached():
        model = _model()
        opt = trimtab.optim.Adam(model.parameters(), lr=1e-2)
        return model, opt, trimtab.Guard(model, opt, bounds=["targets"], keep_grads=keep_grads)


def _passed_in() -> tuple[nn.Module, torch.optim.Optimizer, trimtab.Guard, GuardParts, Lifecycle]:
    """The parts the Guard would build, built outside it, in a lifecycle of the caller's."""
    with Lifecycle() as life:
        model = _model()
        opt = trimtab.optim.Adam(model.parameters(), lr=1e-2)
        named = list(model.named_parameters())
        layout = [*AdaptiveBounds.slots(["targets"]), Slot("grad_clip_bound")]
        state = StateVector(layout)
        sentinel = trimtab.Sentinel()
        checks = SentinelChecks(sentinel, named)
        bounds = AdaptiveBounds(["targets"], state=state, sentinel=sentinel, headroom=2.0)
        clip = AdaptiveGradClip([p for _, p in named], state_vector=state)
        policy = trimtab.NonFinitePolicy("skip", opt)
        parts = GuardParts(state, checks, policy, clip=clip, bounds=bounds)
        guard = trimtab.Guard(model, opt, parts=parts)
    return model, opt, guard, parts, life


def test_the_phases_one_by_one_are_step_bit_for_bit() -> None:
    m1, o1, g1 = _built()
    m2, o2, g2 = _built()
    flags1, flags2 = _run(g1, m1, by_phase=False), _run(g2, m2, by_phase=True)
    assert [float(f) for f in flags1] == [float(f) for f in flags2]
    assert [i for i, f in enumerate(flags1) if float(f)] == [NAN_STEP]  # skipped
    _same(_state(m1, o1, g1), _state(m2, o2, g2))


def test_passed_in_parts_are_used_as_given_and_give_the_built_numbers() -> None:
    model, opt, guard, parts, life = _passed_in()
    assert guard.parts is parts
    assert guard.clip is parts.clip and guard.bounds is parts.bounds
    assert guard.policy is parts.policy and guard.sentinel is parts.checks.sentinel
    assert guard.state is parts.state and guard.on_nonfinite == "skip"
    m1, o1, g1 = _built()
    _run(g1, m1, by_phase=False)
    _run(guard, model, by_phase=False)
    _same(_state(m1, o1, g1), _state(model, opt, guard))
    assert "skipped (non-finite gradient or loss): 1" in guard.report()
    # their resets are the caller's lifecycle's, not the Guard's
    assert guard.lifecycle is None
    life.fold_boundary()
    assert math.isnan(float(guard.clip.bound[0]))  # type: ignore[union-attr]
    guard.reset()
    assert guard.steps == 0 and "skipped (non-finite gradient or loss): 0" in guard.report()


def test_a_hand_set_clip_and_weight_clamp_are_parts_too() -> None:
    """The trainer's ``fixed`` mode: ``clip_grad_norm_`` at a constant, the weights clamped at
    a constant after the step; the Guard calls them at their phases."""
    with detached():
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=0.5, fused=True)
        params = list(model.parameters())
        sentinel = trimtab.Sentinel()

        @torch.no_grad()
        def clamp_weights() -> None:
            torch._foreach_clamp_min_(params, -0.05)
            torch._foreach_clamp_max_(params, 0.05)

        parts = GuardParts(
            StateVector([Slot("unused")]), SentinelChecks(sentinel, list(model.named_parameters())),
            trimtab.NonFinitePolicy("skip", opt),
            clip=partial(torch.nn.utils.clip_grad_norm_, max_norm=1e-3),
            clamp_weights=clamp_weights,
        )  # fmt: skip
        guard = trimtab.Guard(model, opt, parts=parts)
    norms = []
    for x, y in _batches()[:NAN_STEP]:
        guard.backward(nn.functional.mse_loss(model(x), y))
        guard.check_gradients()
        guard.decide()
        norms.append(float(guard.clip_gradients()))  # type: ignore[arg-type]
        total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        assert float(total) <= 1e-3 * (1 + 1e-5)  # clipped at the constant
        guard.optimizer_step()
    assert all(n > 1e-3 for n in norms)  # the clip returned the norm before clipping
    assert all(bool((p.detach().abs() <= 0.05).all()) for p in params)  # clamped, each step
    assert "gradient clip" not in guard.report()  # a hand-set clip holds no measured state
    assert guard.state_dict()["clip"] is None


def test_keep_grads_keeps_the_gradient_buffers_where_they_are() -> None:
    model, _, guard = _built(keep_grads=True)
    batches = _batches()
    at = None
    for x, y in batches[:4]:
        guard.step(nn.functional.mse_loss(model(x), guard.bound("targets", y)))
        ptrs = [p.grad.data_ptr() for p in model.parameters()]
        assert at is None or ptrs == at
        at = ptrs
    m2, _, g2 = _built()  # set to None and reallocated: the same numbers
    for x, y in batches[:4]:
        g2.step(nn.functional.mse_loss(m2(x), g2.bound("targets", y)))
    for a, b in zip(model.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_parts_with_building_options_or_another_optimizer_are_refused() -> None:
    model, opt, _, parts, _ = _passed_in()
    with pytest.raises(ValueError, match=r"uses the parts it is given; \['clip', 'bounds'\]"):
        trimtab.Guard(model, opt, parts=parts, clip=False, bounds=["x"])
    other = trimtab.optim.Adam(model.parameters(), lr=1e-2)
    with pytest.raises(ValueError, match=r"parts\.policy steps another optimizer"):
        trimtab.Guard(model, other, parts=parts)
    with pytest.raises(dataclasses.FrozenInstanceError):  # chosen once, never patched
        parts.clip = None  # type: ignore[misc]
