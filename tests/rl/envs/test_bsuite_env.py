"""``--env bsuite:ID``: bsuite's own environment and CSV logger through the trainer, read back
with bsuite's own loader and scored by its own analysis; resume; the config's refusals."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from trimtab.cli import main
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import ConfigError, apply_overrides, from_dict, load_toml
from trimtab.rl.envs import gym_state
from trimtab.rl.envs.bsuite_env import bsuite_modules
from trimtab.rl.train import TrainingInterrupted, train

EXAMPLE = Path(__file__).parents[3] / "examples" / "bsuite.toml"
SHORT = ["gym.total_steps=600", "gym.learning_starts=200", "gym.eval_episodes=1",
         "run.log_every=20", "run.progress=false", "agent.replay_capacity=1000",
         "agent.hidden=16", "agent.head_hidden=16"]  # fmt: skip


def _config(out: Path, *overrides: str) -> TrainConfig:
    data = apply_overrides(load_toml(EXAMPLE), [*SHORT, f'run.out="{out}"', *overrides])
    return from_dict(TrainConfig, data)


def test_a_short_run_logs_in_bsuite_format_and_bsuite_loads_it(tmp_path):
    out = tmp_path / "run"
    summary = train(_config(out, 'env.name="bsuite:cartpole_scale/0"'))
    _, _, _ = bsuite_modules()
    from bsuite.logging import csv_load

    df, sweep_vars = csv_load.load_bsuite(str(out / "bsuite"))
    assert sweep_vars == ["agent_name"] and set(df.bsuite_id) == {"cartpole_scale/0"}
    assert (df.reward_scale == 0.001).all() and df.episode.is_monotonic_increasing
    assert df.steps.max() <= 600 and df.episode.max() == summary["train_episodes"] > 1
    # the logged returns are the env's scaled ones; raw_return is bsuite's unscaled count
    last = df.iloc[-1]
    assert last.total_return == pytest.approx(0.001 * last.raw_return)
    assert summary["bsuite_id"] == "cartpole_scale/0" and summary["bsuite_complete"] is False
    assert summary["bsuite_budget_episodes"] == 1000 and summary["env_steps"] == 600
    assert 0 <= summary["bsuite_score"] <= 1
    assert summary["eval"]["episodes"] == 1
    assert "Greedy evaluation" in (out / "report.html").read_text()


@pytest.mark.slow
def test_the_episode_budget_ends_a_run_without_a_step_cap(tmp_path, monkeypatch):
    _, sweep, _ = bsuite_modules()
    monkeypatch.setattr(sweep, "EPISODES", {**sweep.EPISODES, "mountain_car/0": 3})
    summary = train(_config(tmp_path / "run", 'env.name="bsuite:mountain_car/0"',
                            'gym.total_steps="auto"'))  # fmt: skip
    assert summary["train_episodes"] == 3 and summary["bsuite_complete"] is True
    rows = list(csv.DictReader((tmp_path / "run/bsuite/bsuite_id_-_mountain_car-0.csv").open()))
    assert [int(r["episode"]) for r in rows] == [1, 2, 3]
    assert summary["env_steps"] == int(rows[-1]["steps"])


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    name = 'env.name="bsuite:cartpole_scale/2"'
    full = train(_config(tmp_path / "a", name, "run.checkpoint_every=30"))
    cfg_b = _config(tmp_path / "b", name, "run.checkpoint_every=30")
    with pytest.raises(TrainingInterrupted):
        train(cfg_b, stop_after=80)  # last checkpoint at update 60, mid-run
    resumed = train(cfg_b, resume=True)
    for key in ("eval", "train_episodes", "env_steps", "updates", "bsuite_score"):
        assert full[key] == resumed[key], key
    log = "bsuite/bsuite_id_-_cartpole_scale-2.csv"
    assert (tmp_path / "a" / log).read_text() == (tmp_path / "b" / log).read_text()
    assert (tmp_path / "a/metrics.csv").read_text() == (tmp_path / "b/metrics.csv").read_text()


def test_the_same_seed_is_the_same_run_and_ids_differ(tmp_path):
    a = train(_config(tmp_path / "a", 'env.name="bsuite:cartpole_scale/0"'))
    b = train(_config(tmp_path / "b", 'env.name="bsuite:cartpole_scale/0"'))
    c = train(_config(tmp_path / "c", 'env.name="bsuite:cartpole_scale/1"'))

    def log(run: str, n: int) -> str:
        return (tmp_path / run / f"bsuite/bsuite_id_-_cartpole_scale-{n}.csv").read_text()

    assert log("a", 0) == log("b", 0) and a["eval"] == b["eval"]
    assert log("a", 0) != log("c", 1)
    assert c["bsuite_settings"] == {"reward_scale": 0.001}


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ('env.name="bsuite:cartpole_scale/99"', r"'cartpole_scale/99' is no bsuite id.*cartpole"),
        ('env.name="bsuite:nonsense"', r"is no bsuite id; an id is EXPERIMENT/NUMBER"),
        ("env.n_envs=4", r"env.n_envs = 4: a bsuite run steps one env"),
        ("walkforward.steps_per_fold=9", r"walkforward.steps_per_fold = 9 .*nothing in a"),
    ],
)
def test_bad_bsuite_configs_are_refused_in_one_line(tmp_path, capsys, override, pattern):
    cfg = tmp_path / "c.toml"
    cfg.write_text(EXAMPLE.read_text())
    code = main(["train", "--config", str(cfg), "--out", str(tmp_path / "r"),
                 "--set", override, "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert __import__("re").search(pattern, err), err
    assert not (tmp_path / "r").exists()


def test_without_bsuite_the_error_names_the_extra(monkeypatch):
    import importlib

    real = importlib.import_module

    def missing(name, *a):
        if name.startswith("bsuite"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(ConfigError, match=r"pip install 'trimtab\[bsuite\]'"):
        bsuite_modules()


def test_eval_refuses_a_bsuite_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    train(_config(out, 'env.name="bsuite:cartpole_scale/0"'))
    assert main(["eval", str(out)]) == 2
    assert "is a bsuite run's checkpoint" in capsys.readouterr().err


def test_random_states_and_named_tuples_round_trip_as_plain_data():
    from collections import namedtuple

    State = namedtuple("State", ["x", "v"])
    rs = np.random.RandomState(3)
    rs.rand(5)
    data = gym_state.to_data(rs)
    buf = __import__("io").BytesIO()
    torch.save(data, buf)  # plain data: it loads with weights_only=True
    buf.seek(0)
    back = gym_state.from_data(torch.load(buf, weights_only=True))
    assert back.rand() == rs.rand()
    saved = gym_state.to_data(State(1.5, np.float64(2.0)))
    assert gym_state.from_data(saved, State(0, 0)) == State(1.5, 2.0)
    with pytest.raises(gym_state.EnvStateError, match="no counterpart"):
        gym_state.from_data(saved, (0, 0))
