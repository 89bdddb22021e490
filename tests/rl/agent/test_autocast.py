"""run.autocast: validated, applied to every forward (training, target, acting), and the
trainer completes under it; a float16 overflow is named where it happens."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from rl_helpers import generic, random_batch
from rl_helpers import tiny as rl_tiny

from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.dqn import DQNAgent
from trimtab.rl.agent.learner import build_learner
from trimtab.rl.config import RunConfig, TrainConfig
from trimtab.rl.configio import ConfigError, from_dict
from trimtab.rl.run.cli import add_commands, build_config
from trimtab.rl.train import TrainingHalted, train

LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
STEPS = 16  # gradient steps of the short runs


def tiny(out: Path, **run: object) -> TrainConfig:
    return rl_tiny(out, steps_per_fold=STEPS, **run)


def _learner(cfg: TrainConfig):
    with Lifecycle():
        return build_learner(generic(cfg), 5, [3, 3], torch.device("cpu"))


@pytest.mark.parametrize(
    ("make", "error", "pattern"),
    [
        (lambda: from_dict(TrainConfig, {"run": {"autocast": "fp32"}}), ConfigError,
         "run.autocast: must be one of ['none', 'bf16', 'fp16'], got 'fp32'"),
        (lambda: from_dict(TrainConfig, {"run": {"autocast": True}}), ConfigError,
         "run.autocast: must be one of"),
        (lambda: RunConfig(autocast="fp8"), ValueError,  # type: ignore[arg-type]
         "invalid [run] config: run.autocast: must be one of ['none', 'bf16', 'fp16'], got "
         "'fp8'"),
        (lambda: DQNAgent(3, [2], autocast=torch.float64), ValueError,
         "autocast=torch.float64 must be None (float32), torch.bfloat16 or torch.float16"),
    ],
)  # fmt: skip
def test_bad_autocast_is_refused(make, error, pattern):
    with pytest.raises(error, match=re.escape(pattern)):
        make()


@pytest.mark.parametrize("value", ["none", "bf16", "fp16"])
def test_cli_flag_sets_run_autocast(value):
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    args = parser.parse_args(["train", "--autocast", value])
    assert build_config(args).run.autocast == value
    assert build_config(parser.parse_args(["train"])).run.autocast == "none"
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--autocast", "fp8"])


@pytest.mark.parametrize("autocast", ["none", "bf16", "fp16"])
def test_forwards_run_in_the_configured_precision(autocast):
    """On CPU the trunk's output (Linear, LayerNorm, ReLU) is in the low precision in every
    forward: the training, next-state and target forwards of a step (γ > 0: the market's
    default γ = 0 runs no next-state forward), and acting; weights, gradients, the loss and
    the stability state stay float32."""
    cfg = tiny(Path("unused"), autocast=autocast, stability="off")
    cfg = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, gamma=0.9))
    learner = _learner(cfg)
    stab, agent = learner.stability, learner.agent
    seen: list[torch.dtype] = []
    for net in (agent.online, agent.target):
        net.trunk.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    want = LOW.get(autocast, torch.float32)
    info = learner.learn(random_batch())
    assert len(seen) == 3 and set(seen) == {want}  # online(obs), target(x'), online(x')
    agent.act(torch.randn(4, 5), step=0)
    assert len(seen) == 4 and seen[-1] == want
    assert info["loss"].dtype == torch.float32 and info["priorities"].dtype == torch.float32
    for p in agent.online.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        moments = [v for v in agent.optimizer.state[p].values() if v.is_floating_point()]
        assert moments and all(v.dtype == torch.float32 for v in moments)
    assert stab.state["logits_scale"].dtype == torch.float32


@pytest.mark.parametrize("autocast", ["bf16", "fp16"])
def test_short_run_completes_with_finite_weights(tmp_path, autocast):
    out = tmp_path / "run"
    summary = train(tiny(out, autocast=autocast))
    assert summary["halted"] is None and summary["folds"][0]["nonfinite"] == 0
    assert summary["folds"][0]["steps"] == STEPS
    state = torch.load(out / "checkpoints/last.pt", weights_only=False)["state"]
    online = state["agent"]["online"]
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in online.values())
    assert state["config"]["run"]["autocast"] == autocast
    assert f'autocast = "{autocast}"' in (out / "config.toml").read_text()
    assert json.loads((out / "sentinel.json").read_text())["fired"] == []


@pytest.mark.parametrize("mode", ["off", "fixed", "adaptive"])
def test_float16_trunk_overflow_is_named_trunk(mode):
    """A trunk weight 1e6x too large is finite in float32, but under fp16 its Linear output
    passes 65504: the sentinel names the trunk, not the NaN logits computed from it (they fire
    in the same check when the trunk is not clamped, and used to be reported first)."""
    fired = {}
    for autocast in ("none", "fp16"):
        learner = _learner(tiny(Path("unused"), autocast=autocast, stability=mode))
        learner.learn(random_batch())
        with torch.no_grad():
            learner.agent.online.trunk[3].weight.mul_(1e6)
        learner.learn(random_batch())
        fired[autocast] = [f.name for f in learner.stability.sentinel.report()]
    assert fired["none"] == []
    assert fired["fp16"][0] == "trunk", fired["fp16"][:4]


def test_float16_overflow_halts_the_trainer_and_names_the_trunk(tmp_path):
    def blow_up(learner):
        with torch.no_grad():
            learner.agent.online.trunk[3].weight.mul_(1e6)

    out = tmp_path / "run"
    with pytest.raises(TrainingHalted, match="sentinel slot 'trunk' fired first"):
        train(tiny(out, autocast="fp16", stability="off"), setup=blow_up)
    assert json.loads((out / "sentinel.json").read_text())["fired"][0]["name"] == "trunk"
