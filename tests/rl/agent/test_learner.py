"""The guarded learn step: the regression tests of issue 10's defects, the fold boundary resetting
every piece of state, the non-finite policies in every mode, and the step's shape."""

from __future__ import annotations

import inspect
import math
from dataclasses import FrozenInstanceError, replace
from functools import partial
from pathlib import Path

import pytest
import torch
from rl_helpers import generic, random_batch, tiny, wired_learner

from trimtab.clip import AdaptiveGradClip
from trimtab.lifecycle import Lifecycle
from trimtab.quantile import abs_quantile
from trimtab.rl.agent.learner import Learner, build_learner

MODES = ["adaptive", "fixed", "off"]


def _learner(mode: str = "adaptive", policy: str = "halt", **agent) -> tuple[Learner, Lifecycle]:
    cfg = tiny(Path("unused"), stability=mode, on_nonfinite=policy)
    if agent:
        cfg = replace(cfg, agent=replace(cfg.agent, **agent))
    with Lifecycle() as life:
        learner = build_learner(generic(cfg), 5, [3, 3], torch.device("cpu"))
    return learner, life


def _scaled_batch(scale: float, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    batch = random_batch()
    batch["reward"] = scale * (1.0 + 0.1 * batch["reward"])
    return batch


def _flat(state, prefix=""):
    """Every tensor of a nested state dict, by path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        out = {}
        for k, v in state.items():
            out.update(_flat(v, f"{prefix}/{k}"))
        return out
    if isinstance(state, (list, tuple)):
        out = {}
        for i, v in enumerate(state):
            out.update(_flat(v, f"{prefix}/{i}"))
        return out
    return {}


@pytest.mark.parametrize("mode", MODES)
def test_fold_boundary_resets_every_piece_of_state(mode):
    """Defect 1: after a boundary, the stability state and the optimizer state equal a freshly
    built learner's; nothing (estimator, engagement, watch EMA, flags) survives."""
    learner, life = _learner(mode)
    for i in range(12):
        learner.learn(_scaled_batch(5.0, i))
    learner.stability.checks.fault = ("loss", 12, math.nan)  # fire the sentinel, too
    learner.learn(_scaled_batch(5.0, 99))
    assert learner.nonfinite_count() >= 1
    life.fold_boundary()
    fresh, _ = _learner(mode)
    got, want = _flat(learner.state_dict()["stability"]), _flat(fresh.state_dict()["stability"])
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, equal_nan=True, msg=k)
    assert learner.nonfinite_count() == 0
    opt_state = learner.agent.optimizer.state_dict()["state"]
    for p_state in opt_state.values():  # moments zeroed (trimtab) or dropped (torch)
        for key in ("exp_avg", "exp_avg_sq"):
            if key in p_state:
                assert not p_state[key].any(), key
    lines = "\n".join(life.describe())
    for owner in ("state_vector", "sentinel", "checks", "agent.target", "optimizer"):
        assert owner in lines, (owner, lines)
    if mode == "adaptive":
        assert "bounds" in lines and "clip" in lines


def test_first_bounds_after_a_boundary_follow_the_new_scale():
    """Defect 1 as reported: 200 steps at reward 5, a boundary, then reward -0.05: the first
    bound after the boundary is that step's own measurement (the estimator restarts), where the
    estimator that survived the boundary kept it near 6."""
    learner, life = _learner()
    for i in range(200):
        learner.learn(_scaled_batch(5.0, i))
    assert float(learner.stability.state["targets_bound"]) > 4.0
    life.fold_boundary()
    seen = []
    bound_targets = learner.stability.bound_targets

    def spy(x):
        seen.append(abs_quantile(x.clone(), 0.99))
        bound_targets(x)

    # a spy on the targets' bound: the stability's parts are frozen, the learner reads a copy
    learner.stability = replace(learner.stability, bound_targets=spy)
    learner.learn(_scaled_batch(-0.05, 1000))
    got = learner.stability.state["targets_bound"]
    torch.testing.assert_close(got, seen[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_skip_leaves_weights_and_moments_untouched_through_the_step(mode):
    """Defect 2: a NaN in one gradient, under skip, moves nothing in any mode, through the
    learn step as the trainer runs it (the adaptive clip sanitises after the flag is set)."""
    learner, _ = _learner(mode, "skip")
    opt = learner.agent.optimizer
    for i in range(3):
        learner.learn(_scaled_batch(1.0, i))
    params = learner.params
    before = [p.detach().clone() for p in params]
    moments = [opt.state[p]["exp_avg"].clone() for p in params]
    learner.stability.checks.fault = ("grad.trunk.0.weight", 3, math.nan)
    info = learner.learn(_scaled_batch(1.0, 3))
    assert float(info["found_inf"]) == 1.0
    moved = [not torch.equal(p, b) for p, b in zip(params, before)]
    assert not any(moved), f"{sum(moved)} of {len(params)} parameters moved"
    assert all(torch.equal(opt.state[p]["exp_avg"], m) for p, m in zip(params, moments))
    info = learner.learn(_scaled_batch(1.0, 4))
    assert float(info["found_inf"]) == 0.0
    assert any(not torch.equal(p, b) for p, b in zip(params, before))


@pytest.mark.parametrize("mode", MODES)
def test_sanitize_steps_with_finite_weights(mode):
    learner, _ = _learner(mode, "sanitize")
    for i in range(3):
        learner.learn(_scaled_batch(1.0, i))
    learner.stability.checks.fault = ("grad.trunk.0.weight", 3, math.inf)
    before = [p.detach().clone() for p in learner.params]
    learner.learn(_scaled_batch(1.0, 3))
    assert all(torch.isfinite(p).all() for p in learner.params)
    assert any(not torch.equal(p, b) for p, b in zip(learner.params, before))
    assert learner.sentinel_report()["fired"][0]["name"] == "grad.trunk.0.weight"


def test_trunk_clamp_counts_only_the_training_forward():
    """Defect 3: the engagement counts of the trunk clamp are those of the training forward
    (the next-state forwards no longer overwrite them), checked number for number. Every
    step measures (measure_every = 1): the second step's counts are folded."""
    learner = wired_learner(tiny(Path("unused"), measure_every=1))
    bounds = learner.stability.bounds
    learner.learn(_scaled_batch(1.0, 0))  # the trunk bound exists now
    captured = []
    trunk = learner.agent.online.trunk
    hook = trunk.register_forward_hook(
        lambda m, i, o: captured.append(o.detach().clone()) if o.requires_grad else None
    )
    bound = bounds.values[bounds.names.index("trunk")].clone()
    engaged0 = bounds.engagement.engaged_total.clone()
    seen0 = bounds.engagement.seen_total.clone()
    learner.learn(_scaled_batch(1.0, 1))
    hook.remove()
    assert len(captured) == 1  # one back-propagated forward per step
    i = bounds.names.index("trunk")
    h = captured[0]
    assert int(bounds.engagement.seen_total[i] - seen0[i]) == h.numel()
    assert int(bounds.engagement.engaged_total[i] - engaged0[i]) == int((h.abs() > bound).sum())


def test_trunk_sentinel_step_is_the_learn_step():
    """Defect 3: a fault in the trunk at step 4 is reported at step 4, during the fifth learn
    step (the counter once counted every guarded forward: three per step)."""
    learner, _ = _learner()
    learner.stability.checks.fault = ("trunk", 4, math.inf)
    for i in range(4):
        learner.learn(_scaled_batch(1.0, i))
    assert learner.nonfinite_count() == 0
    learner.learn(_scaled_batch(1.0, 4))
    first = learner.sentinel_report()["fired"][0]
    assert (first["name"], first["step"]) == ("trunk", 4)


@pytest.mark.parametrize("mode", MODES)
def test_diagnostics_never_change_the_step(mode):
    a, _ = _learner(mode)
    b, _ = _learner(mode)
    b.stability.checks.enabled = False
    for i in range(6):
        a.learn(_scaled_batch(2.0, i))
        b.learn(_scaled_batch(2.0, i))
    for p, q in zip(a.params, b.params):
        assert torch.equal(p, q)
    torch.testing.assert_close(a.stability.state.tensor[:2], b.stability.state.tensor[:2],
                               rtol=0, atol=0, equal_nan=True)  # fmt: skip


def test_learn_step_reads_top_to_bottom_with_no_mode_branch():
    """The step function (what a CUDA graph captures) and its host wrapper each fit one screen
    and never branch on the mode or the policy."""
    for fn in (Learner.guarded_step, Learner.learn):
        src = inspect.getsource(fn)
        assert len(src.splitlines()) <= 50
        code = "\n".join(line.split("#")[0] for line in src.splitlines())
        for word in ("mode", "adaptive", "fixed", "policy ==", "ablate"):
            assert word not in code, word
    assert inspect.getsource(Learner.guarded_step).count("# stability") >= 8


@pytest.mark.parametrize("mode", MODES)
def test_the_learn_step_stands_on_one_guard_built_from_the_modes_parts(mode):
    """Issue 27: the learner's parts are one trimtab.Guard's (built once, from the mode's
    stability parts, never set afterwards), and the learn step calls its phases in order."""
    learner, _ = _learner(mode)
    g, s = learner.guard, learner.stability
    assert g.state is s.state and g.checks is s.checks and g.sentinel is s.sentinel
    assert g.bounds is s.bounds and (g.bounds is None) == (mode != "adaptive")
    assert g.optimizer is learner.agent.optimizer and g.keep_grads and g.distributed is None
    clip = {"adaptive": AdaptiveGradClip, "fixed": partial, "off": type(None)}[mode]
    assert isinstance(g.clip, clip)
    assert (g.parts.clamp_weights is not None) == (mode == "fixed")
    with pytest.raises(FrozenInstanceError):
        s.bounds = None  # type: ignore[misc]
    step = inspect.getsource(Learner.guarded_step)
    phases = ["check_loss", "backward", "check_gradients", "decide", "clip_gradients",
              "optimizer_step", "fold", "check_weights"]  # fmt: skip
    at = [step.index(f"guard.{p}(") for p in phases]
    assert at == sorted(at)
    other, _ = _learner(mode)
    with pytest.raises(ValueError, match="not built from this stability's parts"):
        Learner(learner.agent, learner.stability, other.guard)


def test_a_huge_support_edge_is_named():
    """A finite but absurd C51 support (1e30) fires the atom_span slot against the bound it is
    read from (it once checked for NaN/Inf only: the one silent case of the fault benchmark)."""
    learner, _ = _learner()
    for i in range(4):
        learner.learn(_scaled_batch(1.0, i))
    learner.stability.checks.fault = ("atom_span", 5, 1e30)
    for i in range(3):
        learner.learn(_scaled_batch(1.0, 10 + i))
    first = learner.sentinel_report()["fired"][0]
    assert (first["name"], first["step"], first["kind"]) == ("atom_span", 5, "threshold")


@pytest.mark.parametrize("mode", MODES)
def test_clip_rate_is_logged_per_interval_and_restarts_at_a_boundary(mode):
    """``engaged/grad_clip``: the fraction of steps since the last log on which the adaptive clip
    bound, read from its own counts (NaN in the modes without it), counted afresh after a
    fold boundary zeroed them."""
    learner, life = _learner(mode)
    if mode != "adaptive":
        assert math.isnan(float(learner.log_values()["engaged/grad_clip"]))
        return
    clip = learner.guard.clip
    for i in range(10):
        learner.learn(_scaled_batch(5.0, i))
    first = float(learner.log_values()["engaged/grad_clip"])
    assert first == int(clip.engaged.sum()) / 10
    before = int(clip.engaged.sum())
    for i in range(6):
        learner.learn(_scaled_batch(5.0, 100 + i))
    got = float(learner.log_values()["engaged/grad_clip"])
    assert got == (int(clip.engaged.sum()) - before) / 6
    life.fold_boundary()
    for i in range(4):
        learner.learn(_scaled_batch(5.0, 200 + i))
    got = float(learner.log_values()["engaged/grad_clip"])
    assert got == int(clip.engaged.sum()) / 4 and 0.0 <= got <= 1.0
