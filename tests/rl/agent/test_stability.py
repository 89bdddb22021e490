"""Stability wiring: fault injection names the slot and step, sanitize/skip policies,
diagnostics change nothing, one helper for atom positions."""

from __future__ import annotations

import ast
import json
import math
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rl_helpers import generic, random_batch, tiny

from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.learner import build_learner
from trimtab.rl.train import TrainingHalted, train


def _slots(tmp_path: Path) -> list[dict]:
    train(tiny(tmp_path / "probe"))
    return json.loads((tmp_path / "probe" / "sentinel.json").read_text())["slots"]


def test_fault_injection_names_slot_and_step(tmp_path):
    slots = [s for s in _slots(tmp_path) if s["name"] != "atom_span"]
    rng = random.Random(0)
    trials = [(rng.choice(slots)["name"], rng.randrange(0, 8), rng.choice(["nan", "inf", "1e30"]))
              for _ in range(10)]  # fmt: skip
    trials += [("weight.trunk.0.weight", 5, "1e30"), ("targets", 2, "nan"), ("trunk", 4, "inf")]
    for i, (name, step, value) in enumerate(trials):
        out = tmp_path / f"t{i}"

        def setup(learner, fault=(name, step, float(value))):
            learner.stability.checks.fault = fault

        with pytest.raises(TrainingHalted, match=re.escape(repr(name))):
            train(tiny(out), setup=setup)
        fired = json.loads((out / "sentinel.json").read_text())["fired"]
        first = fired[0]
        assert (first["name"], first["step"]) == (name, step), (name, step, value, fired[:3])
        assert first["kind"] == {"nan": "nan", "inf": "inf", "1e30": "threshold"}[value]
        summary = json.loads((out / "summary.json").read_text())
        assert name in summary["halted"]


def test_sanitize_continues_with_finite_weights(tmp_path):
    out = tmp_path / "run"

    def setup(learner):
        learner.stability.checks.fault = ("grad.trunk.0.weight", 3, float("nan"))

    summary = train(tiny(out, on_nonfinite="sanitize"), setup=setup)
    assert summary["halted"] is None and summary["folds"][0]["nonfinite"] >= 1
    state = torch.load(out / "checkpoints/last.pt", weights_only=False)["state"]["agent"]
    assert all(torch.isfinite(v).all() for v in state["online"].values())
    fired = json.loads((out / "sentinel.json").read_text())["fired"]
    assert fired[0]["name"] == "grad.trunk.0.weight" and fired[0]["step"] == 3


@pytest.mark.parametrize("mode", ["adaptive", "off"])
def test_diagnostics_never_change_training(tmp_path, mode):
    def quiet(learner):
        learner.stability.checks.enabled = False

    train(tiny(tmp_path / "on", stability=mode))
    train(tiny(tmp_path / "off", stability=mode), setup=quiet)
    a = torch.load(tmp_path / "on/checkpoints/last.pt", weights_only=False)["state"]
    b = torch.load(tmp_path / "off/checkpoints/last.pt", weights_only=False)["state"]
    for k, v in a["agent"]["online"].items():
        assert torch.equal(v, b["agent"]["online"][k]), k
    va, vb = a["stability"]["state"]["values"][:2], b["stability"]["state"]["values"][:2]
    torch.testing.assert_close(va, vb, rtol=0, atol=0, equal_nan=True)


def _learner(cfg):
    with Lifecycle():
        return build_learner(generic(cfg), 5, [3, 3], torch.device("cpu"))


def test_atom_positions_have_one_writer():
    """Every place that computes atom positions goes through losses.atoms, fed by the support."""
    root = Path(__file__).parents[3] / "src" / "trimtab" / "rl"
    sources = {p.name: p.read_text() for p in root.rglob("*.py")}
    linspace = [n for n, s in sources.items() if "torch.linspace" in s]  # numpy's are not atoms
    assert linspace == ["losses.py"], linspace
    calls = [
        n
        for n, src in sources.items()
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "atoms"
    ]
    assert set(calls) == {"dqn.py"}, calls  # DQNAgent.atoms, which acting and learning call
    assert "agent.atoms(*support)" in sources["learner.py"]
    # and the adaptive support reads its slot through the bounds' one read-with-floor helper
    assert 'b.support("targets")' in sources["stability.py"]


def test_unset_trunk_bound_does_not_clamp_acting_forwards():
    """Before a fold's first training step the trunk slot is unset: acting must see the trunk
    unclamped (not clamped at the cold-start floor)."""
    agent = _learner(tiny(Path("unused"))).agent
    obs = torch.randn(8, 5) * 10
    with torch.no_grad():
        clamped = agent.online(obs).logits
        agent.online.trunk_out = torch.nn.Identity()
        plain = agent.online(obs).logits
    assert torch.equal(clamped, plain)


def test_norm_gains_keep_their_own_bound():
    """LayerNorm gains (1.0 at init) are not clamped to the weight matrices' p99 bound."""
    learner = _learner(tiny(Path("unused")))
    agent = learner.agent
    batch = random_batch()
    for _ in range(3):
        learner.learn(batch)
    gains = [p for n, p in agent.online.named_parameters() if p.ndim == 1 and "trunk" in n]
    assert gains and max(float(g.abs().max()) for g in gains) > 0.5


@pytest.mark.parametrize("mode", ["off", "fixed"])
def test_fixed_supports_are_the_agents_configured_support(mode):
    """``off`` and ``fixed`` use [v_min, v_max] from the config: a hard-wired ±10 capped every
    CartPole value (up to 100) at 10 whatever the config said."""
    cfg = tiny(Path("unused"), stability=mode)
    cfg = replace(cfg, agent=replace(cfg.agent, v_min=-100.0, v_max=50.0))
    learner = _learner(cfg)
    agent = learner.agent
    v_min, v_max = learner.stability.support()
    assert v_min.tolist() == [-100.0, -100.0] and v_max.tolist() == [50.0, 50.0]
    batch = random_batch()
    batch["reward"].fill_(80.0)  # T z = 80 + 0.9 z: beyond ±10, inside the configured support
    _, info = agent.compute_loss(batch)
    assert float(info["target_mean"]) > 20.0  # a ±10 support would cap it at 10


def test_adaptive_support_grows_without_the_iqn_loss():
    """With ``iqn_weight = 0`` the reach of the C51 targets feeds the support slot (before,
    nothing did and the support stayed at its ±1e-3 floor); it grows toward r / (1 − γ)."""
    cfg = tiny(Path("unused"))
    cfg = replace(cfg, agent=replace(cfg.agent, iqn_weight=0.0, gamma=0.9))  # the batch's γ
    learner = _learner(cfg)
    support = learner.stability.support
    batch = random_batch()
    batch["reward"].fill_(5.0)
    for _ in range(5):
        learner.learn(batch)
    v_min, v_max = support()
    assert float(v_max.min()) > 4.0 and torch.equal(v_min, -v_max)
    for _ in range(300):
        learner.learn(batch)
    # discount 0.9, reward 5: the largest return is 5 / (1 - 0.9) = 50
    assert 35.0 < float(support()[1].min()) < 55.0


def test_watched_threshold_keeps_the_folds_largest_scale():
    """Gradients shrink as training converges; the sentinel's threshold scale is the largest
    p99 the buffer has had this fold, so an ordinary gradient after a 1e4x shrink does not
    fire (1e3 x a recent p99 halted solved CartPole runs), while a 1e30 still does."""
    stab = _learner(tiny(Path("unused"))).stability
    g = torch.Generator().manual_seed(0)
    for scale in [1.0] * 20 + [1e-4] * 200:
        stab.checks._watch({"grad_trunk": scale * torch.randn(256, generator=g)})
    assert float(stab.state["grad_trunk_scale"]) > 1.0  # not the recent 1e-4 scale
    stab.sentinel.add(
        "probe",
        torch.randn(256, generator=g),
        stab.sentinel._slots["grad.trunk_output"].rule,
        phase="probe",
    )
    stab.sentinel.check("probe")
    assert not bool(stab.sentinel.fired())
    stab.state.reset("fold")
    assert torch.isnan(stab.state["grad_trunk_scale"]).all()  # forgotten at a fold boundary


def test_bound_quantile_and_clamp_headroom_reach_every_adaptive_bound():
    """``run.bound_quantile`` sets the quantile of every measured bound (targets, trunk, Adam's
    weight bound, the gradient clip) and ``run.clamp_headroom`` where the trunk and target
    clamps bind; the support stays the bound itself. Bad values are refused, naming the key."""
    learner = _learner(tiny(Path("unused"), bound_quantile=0.999, clamp_headroom=3.0))
    s = learner.stability
    assert s.bounds.q == 0.999 and s.bounds.headroom == 3.0
    assert learner.agent.optimizer.quantile == 0.999 and learner.guard.clip.quantile == 0.999
    batch = random_batch()
    for _ in range(3):
        learner.learn(batch)
    b = s.bounds
    assert torch.equal(b.clamp_bound("trunk"), 3.0 * b.bound("trunk"))
    assert torch.equal(s.support()[1][0], b.read("targets"))  # the support has no headroom
    for key, value in (("bound_quantile", 1.0), ("bound_quantile", 0.2), ("clamp_headroom", 0.9),
                       ("clip_headroom", 0.5), ("clip_headroom", math.inf)):  # fmt: skip
        with pytest.raises(ValueError, match=key):
            tiny(Path("unused"), **{key: value})


def test_clip_headroom_reaches_the_clip_and_is_refused_where_no_adaptive_clip_runs():
    assert _learner(tiny(Path("unused"))).guard.clip.headroom == 1.0
    assert _learner(tiny(Path("unused"), clip_headroom=2.0)).guard.clip.headroom == 2.0
    for mode in ("fixed", "off"):
        with pytest.raises(ValueError, match=r"clip_headroom=2\.0 applies to the adaptive"):
            tiny(Path("unused"), stability=mode, clip_headroom=2.0)


@pytest.mark.parametrize("key,value", [("clamp_headroom", 3.0), ("clip_headroom", 2.0),
                                       ("weight_headroom", 1.0)])  # fmt: skip
def test_every_headroom_is_refused_where_nothing_adaptive_would_read_it(key, value):
    """Each headroom moves where an adaptive consumer binds; fixed and off have none, so a value
    other than the default would silently do nothing there: refused, naming the key."""
    tiny(Path("unused"), stability="adaptive", **{key: value})  # accepted where it applies
    for mode in ("fixed", "off"):
        with pytest.raises(ValueError, match=rf"{key}={value} applies to the adaptive"):
            tiny(Path("unused"), stability=mode, **{key: value})
