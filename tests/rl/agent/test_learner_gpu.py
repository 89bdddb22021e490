"""On a CUDA device: the guarded learn step makes no host synchronisation in any mode or policy
(invariant 1), eager or captured in a CUDA graph; the captured step gives the eager step's
numbers (losses, bounds, weights, moments, sentinel records, generator state) across a target
sync and a fold boundary, in every mode and policy, and after a checkpoint load; a NaN under
capture halts naming its slot and step."""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rl_helpers import generic, tiny

from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.learner import build_learner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MODES = ["adaptive", "fixed", "off"]
POLICIES = ["halt", "skip", "sanitize"]
#: steps of the parity runs: capture after 3 warm-up steps, target syncs after updates 5 and
#: 10 (TINY's period), a fold boundary after step 7, a NaN reward in step 12's batch
STEPS, BOUNDARY, NAN_STEP = 14, 7, 12


def _batch(seed: int, n: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b = {"obs": torch.randn(n, 5, generator=g), "action": torch.randint(0, 3, (n, 2), generator=g),
         "reward": torch.randn(n, generator=g), "next_obs": torch.randn(n, 5, generator=g),
         "discount": torch.full((n,), 0.9)}  # fmt: skip
    return {k: v.cuda() for k, v in b.items()}


def _learner(graph: str, **run):
    cfg = tiny(Path("unused"), cuda_graph=graph, device="cuda", **run)
    with Lifecycle() as life:
        learner = build_learner(generic(cfg), 5, [3, 3], torch.device("cuda"))
    return learner, life


def _log(case: str, **values) -> None:
    """Append measured differences to $TRIMTAB_PARITY_LOG (a JSON line per case), if set."""
    path = os.environ.get("TRIMTAB_PARITY_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"case": case, **values}) + "\n")


def _snapshot(learner) -> dict[str, torch.Tensor]:
    """Every number the step leaves behind, by name."""
    out = {f"online.{k}": v for k, v in learner.agent.online.state_dict().items()}
    out.update({f"target.{k}": v for k, v in learner.agent.target.state_dict().items()})
    for i, st in enumerate(learner.agent.optimizer.state.values()):
        out.update({f"opt{i}.{k}": v for k, v in st.items() if isinstance(v, torch.Tensor)})
    out["state_vector"] = learner.stability.state.tensor
    out["found_inf"] = learner.guard.policy.found_inf
    out["generator"] = learner.agent.generator.get_state()
    return {k: v.detach().clone() for k, v in out.items()}


def _run(learner, life, steps=STEPS, nan_step=NAN_STEP):
    losses = []
    for i in range(steps):
        batch = _batch(i)
        if i == nan_step:
            batch["reward"][3] = math.nan
        info = learner.learn(batch)
        losses.append(info["loss"].clone())
        if i == BOUNDARY:
            life.fold_boundary()
    return torch.stack(losses)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else math.inf
    diff = torch.where(a.isnan() & b.isnan(), 0.0, (a.double() - b.double()).abs())
    return float(diff.nan_to_num(math.inf).max())


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", MODES)
def test_captured_step_gives_the_eager_numbers(mode, policy):
    eager, life_e = _learner("off", stability=mode, on_nonfinite=policy)
    graphed, life_g = _learner("on", stability=mode, on_nonfinite=policy)
    assert eager.graph is None and graphed.graph is not None
    loss_e, loss_g = _run(eager, life_e), _run(graphed, life_g)
    assert graphed.graph.captures == 1  # the boundary reset everything in place: no recapture
    a, b = _snapshot(eager), _snapshot(graphed)
    diffs = {k: _max_diff(a[k], b[k]) for k in a}
    same = torch.equal(loss_e.nan_to_num(), loss_g.nan_to_num()) and not any(diffs.values())
    if os.environ.get("TRIMTAB_PARITY_LOG"):  # and eager against itself, for scale
        again, life_a = _learner("off", stability=mode, on_nonfinite=policy)
        loss_a, c = _run(again, life_a), _snapshot(again)
        eager_vs_eager = max(_max_diff(a[k], c[k]) for k in a)
        _log(f"{mode}/{policy}", loss=_max_diff(loss_e, loss_g), worst=max(diffs.values()),
             bitwise=same, eager_vs_eager_loss=_max_diff(loss_e, loss_a),
             eager_vs_eager_worst=eager_vs_eager)  # fmt: skip
    torch.testing.assert_close(loss_g, loss_e, rtol=1e-5, atol=1e-6, equal_nan=True)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, equal_nan=True, msg=k)
    assert graphed.sentinel_report()["fired"] == eager.sentinel_report()["fired"]
    assert graphed.agent.num_updates == eager.agent.num_updates == STEPS


def test_captured_step_under_autocast_gives_the_eager_numbers():
    eager, life_e = _learner("off", autocast="bf16")
    graphed, life_g = _learner("on", autocast="bf16")
    loss_e, loss_g = _run(eager, life_e), _run(graphed, life_g)
    _log("adaptive/halt/bf16", loss=_max_diff(loss_e, loss_g))
    torch.testing.assert_close(loss_g, loss_e, rtol=1e-5, atol=1e-6, equal_nan=True)
    for name, x in _snapshot(graphed).items():
        torch.testing.assert_close(x, _snapshot(eager)[name], rtol=1e-5, atol=1e-6,
                                   equal_nan=True, msg=name)  # fmt: skip


def _filled_replay(learner, seed: int):
    """A prioritized replay of ``learner``'s agent, filled with 30 steps of 4 envs."""
    replay = learner.agent.make_replay()
    g = torch.Generator().manual_seed(seed)
    for _ in range(30):
        obs, nxt = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
        action = torch.randint(0, 3, (4, 2), generator=g)
        done = torch.rand(4, generator=g) < 0.1
        replay.add(*(x.cuda() for x in (obs, action, torch.randn(4, generator=g), nxt, done,
                                         torch.zeros(4, dtype=torch.bool))))  # fmt: skip
    return replay, torch.Generator(device="cuda").manual_seed(seed)


@pytest.mark.parametrize("mode", MODES)
def test_sampling_inside_the_graph_gives_the_eager_numbers(mode):
    """learn_from: sample, step and priority update in one graph, against the eager learn on
    replay.sample; a second buffer (the trainer's next fold) is captured anew."""
    runs = {}
    for graph in ("off", "on"):
        learner, life = _learner(graph, stability=mode)
        learner.agent.config = replace(learner.agent.config, prioritized=True)
        losses, replays = [], []
        for fold in range(2):
            replay, gen = _filled_replay(learner, seed=fold)
            for _ in range(8):
                losses.append(learner.learn_from(replay, gen, 16)["loss"].clone())
            replays.append(replay.priority.clone())
            life.fold_boundary()
        runs[graph] = (torch.stack(losses), torch.cat(replays), _snapshot(learner), learner)
    (loss_e, prio_e, a, _), (loss_g, prio_g, b, captured) = runs["off"], runs["on"]
    assert captured.sampled_graph.captures == 1 and captured.graph.captures == 0
    _log(f"learn_from/{mode}", loss=_max_diff(loss_e, loss_g), priorities=_max_diff(prio_e, prio_g))
    torch.testing.assert_close(loss_g, loss_e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(prio_g, prio_e, rtol=1e-5, atol=1e-6)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, equal_nan=True, msg=k)


def test_a_checkpoint_loads_into_the_captured_buffers():
    """Save at step 6, run to 10, load, redo steps 7-10: the same losses, on the same graph."""
    learner, _ = _learner("on", stability="adaptive")
    first, saved = [], None
    for i in range(11):
        first.append(learner.learn(_batch(i))["loss"].clone())
        if i == 6:
            saved = copy.deepcopy(learner.state_dict())
    graph = learner.graph.graph
    learner.load_state_dict(saved)
    again = [learner.learn(_batch(i))["loss"].clone() for i in range(7, 11)]
    assert learner.graph.graph is graph and learner.graph.captures == 1
    torch.testing.assert_close(torch.stack(again), torch.stack(first[7:]), rtol=1e-5, atol=1e-6)


def test_a_nan_under_capture_halts_naming_slot_and_step():
    """Captured after 3 steps, the flag peeked every 4: a NaN reward in learn step 6 is in the
    copy queued at the poll after update 8, which the poll after update 12 answers from (the
    device synchronised before each poll: the copy is made), named with its step."""
    learner, _ = _learner("on", on_nonfinite="halt", check_every=4)
    found = {}
    for i in range(14):
        batch = _batch(i)
        if i == 6:
            batch["next_obs"][0, 1] = math.nan
        learner.learn(batch)
        torch.cuda.synchronize()
        message = learner.poll()
        if message:
            found[learner.agent.num_updates] = message
    assert learner.graph.captures == 1
    assert sorted(found) == [12]
    assert "'replay.next_obs' fired first: nan in phase batch at learn step 6 of" in found[12]
    assert "5 learn step(s) ran after it" in found[12]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("graph", ["off", "on"])
def test_learn_step_makes_no_host_sync(mode, policy, graph):
    learner, _ = _learner(graph, stability=mode, on_nonfinite=policy)
    batches = [_batch(i) for i in range(8)]
    for b in batches[:4]:  # warm-up: lazy state, kernels compiled (captured: and the capture)
        learner.learn(b)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for b in batches[4:]:
            info = learner.learn(b)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert graph == "off" or learner.graph.captures == 1
    assert torch.isfinite(info["loss"]) and learner.nonfinite_count() == 0
