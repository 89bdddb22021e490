"""run.measure_every: validated, resolved per device, and handed to every measured bound."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rl_helpers import random_batch, tiny, wired_learner

from trimtab.optim import Adam
from trimtab.rl.config import CPU_MEASURE_EVERY, RunConfig, TrainConfig, measure_every
from trimtab.rl.configio import ConfigError, from_dict


def test_bad_values_say_what_and_how_to_fix():
    with pytest.raises(ValueError, match="must be 'auto' or an integer >= 1"):
        RunConfig(measure_every=0)
    with pytest.raises(ValueError, match="stability='off' measures none"):
        RunConfig(stability="off", measure_every=4)
    with pytest.raises(ValueError, match="set cuda_graph='off'"):
        RunConfig(device="cuda", cuda_graph="on", measure_every=4)
    with pytest.raises(ValueError, match="'auto'"):
        from_dict(TrainConfig, {"run": {"measure_every": "often"}})
    RunConfig(stability="off")  # "auto" is fine in every mode
    RunConfig(stability="fixed", measure_every="auto")


def test_auto_is_the_cpu_cadence_on_the_cpu_and_one_on_cuda():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert measure_every(RunConfig(), cpu) == CPU_MEASURE_EVERY
    assert measure_every(RunConfig(device="cuda"), cuda) == 1  # captured: cuda_graph auto
    assert measure_every(RunConfig(device="cuda", cuda_graph="off"), cuda) == 1  # eager: alike
    assert measure_every(RunConfig(measure_every=3), cpu) == 3
    assert measure_every(RunConfig(device="cuda", cuda_graph="off", measure_every=3), cuda) == 3
    with pytest.raises(ConfigError, match=r"run\.cuda_graph = 'off'"):
        measure_every(RunConfig(device="cuda", measure_every=3), cuda)  # auto captures on CUDA


def test_the_trainer_hands_its_cadence_to_every_measured_bound():
    learner = wired_learner(tiny(Path("unused"), measure_every=5))
    s = learner.stability
    assert s.bounds.cadence.every == 5
    assert learner.guard.clip.cadence.every == 5
    assert isinstance(learner.agent.optimizer, Adam)
    assert learner.agent.optimizer.cadence.every == 5
    default = wired_learner(tiny(Path("unused")))  # "auto" on the CPU
    assert default.stability.bounds.cadence.every == CPU_MEASURE_EVERY


def test_the_learn_step_moves_the_measured_slots_on_due_steps_only():
    learner = wired_learner(tiny(Path("unused"), measure_every=3))
    state = learner.stability.state
    adam = learner.agent.optimizer
    names = ["targets_bound", "trunk_bound", "grad_clip_bound", "adam_weight_bound"]
    torch.manual_seed(0)
    weights = []
    for step in range(7):
        before = {n: state[n].clone() for n in names}
        learner.learn(random_batch())
        moved = [n for n in names if not torch.equal(state[n].nan_to_num(9.0),
                                                     before[n].nan_to_num(9.0))]  # fmt: skip
        if step % 3:
            assert moved == [], (step, moved)
        else:
            assert "targets_bound" in moved and "trunk_bound" in moved, (step, moved)
        weights.append(learner.params[0].detach().clone())
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(weights))  # every step learns
    assert adam.cadence.step == learner.stability.bounds.cadence.step == 7
    assert learner.guard.clip.cadence.step == 7


def test_one_measures_every_step_as_before():
    cfg = tiny(Path("unused"), measure_every=1)
    learner = wired_learner(cfg)
    state = learner.stability.state
    torch.manual_seed(0)
    for _ in range(3):
        before = state["targets_bound"].clone()
        learner.learn(random_batch())
        assert not torch.equal(state["targets_bound"].nan_to_num(9.0), before.nan_to_num(9.0))
    assert replace(cfg.run, measure_every="auto").measure_every == "auto"
