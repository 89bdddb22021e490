"""A config that cannot fit is refused in one line with its estimate, before any run directory;
an out-of-memory during a run ends in one line naming the keys to lower."""

from __future__ import annotations

import pytest
import torch

from trimtab.cli import main
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import from_dict
from trimtab.rl.run import memory, runner


@pytest.mark.parametrize(
    ("setting", "part", "key"),
    [
        ("agent.replay_capacity=10000000000", "replay", "agent.replay_capacity"),
        ("agent.hidden=10000000", "networks", "agent.hidden"),
        ("env.n_envs=1000000000", "envs", "env.n_envs"),
    ],
)
def test_an_impossible_size_is_refused_before_the_run_dir(tmp_path, capsys, setting, part, key):
    out = tmp_path / "run"
    assert main(["train", "--set", setting, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"({part} " in err and f"lower {key}" in err and "GiB free" in err, err
    assert not out.exists()


def test_the_estimate_follows_the_sizes():
    base = TrainConfig()
    parts = memory.estimate_bytes(base, obs_dim=40, branch_sizes=[3] * 4, envs_on_device=True)
    row = 2 * 40 * 4 + 4 * 8 + 4 * 4 + 4  # obs, next obs, actions, a reward per branch, discount
    assert parts["replay"] == (base.agent.replay_capacity + 1) * row
    bigger = from_dict(TrainConfig, {"agent": {"hidden": 256, "batch_size": 128}})
    more = memory.estimate_bytes(bigger, obs_dim=40, branch_sizes=[3] * 4, envs_on_device=True)
    assert more["networks"] > 2 * parts["networks"] and more["activations"] > parts["activations"]
    host = memory.estimate_bytes(base, obs_dim=4, branch_sizes=[2], envs_on_device=False)
    assert host["envs"] == base.env.n_envs * memory.HOST_ENV_BYTES
    # the parameter count is the agent's own, to within a quarter
    from trimtab.rl.agent.dqn import DQNAgent

    for kw in ({}, {"hidden": 256, "depth": 3}, {"iqn_weight": 0.0}, {"trunk": "gated"},
               {"assetwise": False}, {"assetwise": False, "hidden": 256}):  # fmt: skip
        cfg = from_dict(TrainConfig, {"agent": kw})
        agent = DQNAgent(40, [3] * 4, cfg.agent)
        real = sum(p.numel() for p in agent.online.parameters())
        assert 0.75 < memory._parameters(40, [3] * 4, cfg.agent) / real < 1.25, kw
    # the default run fits here with room to spare
    assert sum(parts.values()) < 2**30


def test_a_default_config_is_refused_where_memory_is_short(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 20)
    assert main(["train", "--out", str(tmp_path / "run")]) == 2
    assert "has 1 MiB free: lower agent.batch_size" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_out_of_memory_during_a_run_is_one_line(tmp_path, capsys, monkeypatch):
    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(runner, "_train_fold", oom)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "out of memory on cpu during the run" in err, err
    assert "lower agent.batch_size (or agent.n_tau), " in err and str(out) in err
    assert memory.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not memory.is_out_of_memory(RuntimeError("shape mismatch"))
