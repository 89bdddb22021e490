"""The runner on a Gymnasium env: what reaches the replay buffer at episode ends (a time-limit
truncation bootstraps from the true last state, a termination does not), env.reward_scale,
resume, the example CartPole config in every stability mode, and keys a gym run refuses."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from trimtab.cli import main
from trimtab.rl.agent.dqn import DQNAgent
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import ConfigError, apply_overrides, from_dict, load_toml
from trimtab.rl.train import TrainingInterrupted, train

EXAMPLE = Path(__file__).parents[3] / "examples" / "cartpole.toml"
SHORT = ["gym.total_steps=400", "gym.learning_starts=200", "gym.eval_episodes=2",
         "run.log_every=5", "run.progress=false"]  # fmt: skip
TAU = 0.02  # CartPole's Euler step: x' = x + TAU * x_dot, exactly, on every real transition


def _config(out: Path, *overrides: str) -> TrainConfig:
    data = apply_overrides(load_toml(EXAMPLE), [*SHORT, f'run.out="{out}"', *overrides])
    return from_dict(TrainConfig, data)


@pytest.fixture
def replays(monkeypatch):
    """Every replay buffer the runner makes, in order."""
    made = []
    make_replay = DQNAgent.make_replay

    def spy(agent, *args):
        made.append(make_replay(agent, *args))
        return made[-1]

    monkeypatch.setattr(DQNAgent, "make_replay", spy)
    return made


@pytest.fixture
def short_pole():
    """CartPole cut at 15 steps: random play terminates some episodes first, truncates most."""
    name = "trimtab-ShortPole-v0"
    gym.register(name, "gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=15)
    yield name
    gym.registry.pop(name)


def test_episode_ends_reach_the_replay_as_they_should(tmp_path, replays, short_pole):
    train(_config(tmp_path / "run", f'env.name="gym:{short_pole}"', 'run.stability="off"'))
    replay = replays[0]
    n = len(replay)
    obs, next_obs, discount = replay.obs[:n], replay.next_obs[:n], replay.discount[:n]
    # every stored successor is the true next state, also at an episode end: an autoreset
    # observation stored as next_obs would break the Euler update of the cart position
    torch.testing.assert_close(next_obs[:, 0], obs[:, 0] + TAU * obs[:, 1], atol=1e-5, rtol=0)
    terminal = discount == 0
    assert torch.all(terminal | ((discount - 0.99).abs() < 1e-6))  # γ^1 = 0.99 otherwise
    # discount 0 exactly where CartPole terminates (pole past 12 degrees or cart past 2.4),
    fell = (next_obs[:, 2].abs() > 0.2094) | (next_obs[:, 0].abs() > 2.4)
    assert torch.equal(terminal, fell)
    # while the 15-step limit ends most episodes: at least (400 - 4 x 15) / 15 = 22 finished
    assert 0 < int(terminal.sum()) < 22


def test_reward_scale_scales_what_is_stored_not_what_is_reported(tmp_path, replays):
    """Defect 4: env.reward_scale was ignored for gym envs. With no update (learning_starts past
    the end) both runs act alike: the replay holds 1000 x the rewards, returns are unscaled."""
    quiet = "gym.learning_starts=1000"
    one = train(_config(tmp_path / "one", quiet))
    big = train(_config(tmp_path / "big", quiet, "env.reward_scale=1000.0"))
    n = len(replays[0])
    assert n == len(replays[1]) > 300
    torch.testing.assert_close(replays[0].reward[:n], torch.ones(n), rtol=0, atol=0)
    torch.testing.assert_close(replays[1].reward[:n], torch.full((n,), 1000.0), rtol=0, atol=0)
    assert big["train_return_last100"] == one["train_return_last100"] <= 500
    assert big["eval"] == one["eval"]
    # with updates, the scaled rewards train another network; the logged returns stay unscaled
    train(_config(tmp_path / "one_l"))
    train(_config(tmp_path / "big_l", "env.reward_scale=1000.0"))
    a, b = (torch.load(tmp_path / d / "checkpoints/last.pt", weights_only=False)["state"]
            for d in ("one_l", "big_l"))  # fmt: skip
    assert not torch.equal(a["agent"]["online"]["trunk.0.weight"],
                           b["agent"]["online"]["trunk.0.weight"])  # fmt: skip
    returns = [float(r["episode_return"]) for r in _metrics(tmp_path / "big_l")
               if r["episode_return"]]  # fmt: skip
    assert returns and 0 < max(returns) <= 500


def _metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    full = train(_config(tmp_path / "a", "run.checkpoint_every=5"))
    cfg_b = _config(tmp_path / "b", "run.checkpoint_every=5")
    with pytest.raises(TrainingInterrupted):
        train(cfg_b, stop_after=12)  # last checkpoint: step 10, mid-run
    assert not (tmp_path / "b/summary.json").exists()
    resumed = train(cfg_b, resume=True)
    for key in ("eval", "train_return_last100", "env_steps", "updates"):
        assert full[key] == resumed[key], key
    a = torch.load(tmp_path / "a/checkpoints/last.pt", weights_only=False)["state"]["agent"]
    b = torch.load(tmp_path / "b/checkpoints/last.pt", weights_only=False)["state"]["agent"]
    for k, v in a["online"].items():
        assert torch.equal(v, b["online"][k]), k
    metrics_a = (tmp_path / "a/metrics.csv").read_text()
    assert metrics_a == (tmp_path / "b/metrics.csv").read_text()  # every row, every value


@pytest.mark.parametrize("mode", ["off", "fixed", "adaptive"])
def test_example_config_runs_in_every_mode(tmp_path, mode):
    summary = train(_config(tmp_path / mode, f'run.stability="{mode}"'))
    assert summary["env_steps"] == 400 and summary["updates"] == 21
    assert summary["eval"]["episodes"] == 2 and summary["eval"]["mean_return"] >= 8
    assert summary["folds"][0]["steps"] == 21 and summary["env"] == "gym:CartPole-v1"
    for name in ("summary.json", "sentinel.json", "report.html", "checkpoints/fold_0.pt"):
        assert (tmp_path / mode / name).is_file(), name
    rows = _metrics(tmp_path / mode)
    assert [int(r["step"]) for r in rows] == [5, 10, 15, 20]
    assert {"env_steps", "episode_return", "epsilon", "loss/total"} <= set(rows[0])
    assert "Greedy evaluation" in (tmp_path / mode / "report.html").read_text()


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (["walkforward.learning_starts=64"], "walkforward.learning_starts = 64 (its counterpart: "
                                             "gym.learning_starts)"),
        (["walkforward.folds=3", "data.stress=true"], "data.stress = True; walkforward.folds = 3"),
        (["env.commission_bps=5.0"], "env.commission_bps = 5.0"),
    ],
)  # fmt: skip
def test_market_keys_are_refused_for_a_gym_env(tmp_path, overrides, refused):
    with pytest.raises(ConfigError, match=re.escape(refused) + ".*nothing in a Gymnasium run"):
        _config(tmp_path / "run", *overrides)


def test_gym_keys_are_refused_for_the_market():
    with pytest.raises(ConfigError, match=r"gym.total_steps = 5 .*nothing in a market run"):
        from_dict(TrainConfig, {"gym": {"total_steps": 5}})
    # a key set to its default is indistinguishable from one not set: accepted
    from_dict(TrainConfig, {"gym": {"total_steps": "auto"}})


def test_a_market_flag_on_a_gym_env_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--env", "gym:CartPole-v1", "--folds", "3", "--out", str(out)]
    assert main([*args, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "walkforward.folds = 3" in err and "--folds" in err
    assert not out.exists()


def test_resume_of_a_gym_run_through_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(_config(out, "run.checkpoint_every=5"), stop_after=7)
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out.split("run directory:")[0])
    assert printed == json.loads((out / "summary.json").read_text())["eval"]
    # eval is for market agents: a Gymnasium run (its directory or a checkpoint) says so
    for given in (out, out / "checkpoints" / "fold_0.pt"):
        assert main(["eval", str(given)]) == 2
        err = capsys.readouterr().err
        assert "a Gymnasium run's checkpoint" in err and "summary.json" in err, err


def test_a_gym_run_halts_like_a_market_run(tmp_path):
    """The sentinel halts a Gymnasium run as it halts a market run: ``summary.json`` and
    ``sentinel.json`` written, no greedy evaluation of NaN weights."""
    from trimtab.rl.train import TrainingHalted

    def poison(learner):
        with torch.no_grad():
            next(learner.agent.online.parameters()).fill_(float("nan"))

    out = tmp_path / "run"
    with pytest.raises(TrainingHalted, match="fired first"):
        train(_config(out, 'run.on_nonfinite="halt"'), setup=poison)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["halted"] and summary["folds"] == [] and summary["eval"] is None
    assert summary["updates"] == 5  # the first metrics row is the first host read
    assert json.loads((out / "sentinel.json").read_text())["fired"]
