"""The Gymnasium trainer: what reaches the replay buffer at episode ends (a time-limit
truncation bootstraps from the true last state, a termination does not), and the example
CartPole config runs in every stability mode."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest
import torch

from trimtab.rl.agent import DQNAgent
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import apply_overrides, from_dict, load_toml
from trimtab.rl.gym_train import train_gym

EXAMPLE = Path(__file__).parents[2] / "examples" / "cartpole.toml"
SHORT = ["gym.total_steps=400", "gym.learning_starts=200", "gym.eval_episodes=2",
         "run.log_every=5", "run.progress=false"]  # fmt: skip
TAU = 0.02  # CartPole's Euler step: x' = x + TAU * x_dot, exactly, on every real transition


def _config(out: Path, *overrides: str) -> TrainConfig:
    data = apply_overrides(load_toml(EXAMPLE), [*SHORT, f'run.out="{out}"', *overrides])
    return from_dict(TrainConfig, data)


@pytest.fixture
def short_pole():
    """CartPole cut at 15 steps: random play terminates some episodes first, truncates most."""
    name = "trimtab-ShortPole-v0"
    gym.register(name, "gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=15)
    yield name
    gym.registry.pop(name)


def test_episode_ends_reach_the_replay_as_they_should(tmp_path, monkeypatch, short_pole):
    buffers = []
    make_replay = DQNAgent.make_replay

    def spy(agent):
        buffers.append(make_replay(agent))
        return buffers[-1]

    monkeypatch.setattr(DQNAgent, "make_replay", spy)
    train_gym(_config(tmp_path / "run", f'env.name="gym:{short_pole}"', 'run.stability="off"'))
    replay = buffers[0]
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


@pytest.mark.parametrize("mode", ["off", "fixed", "adaptive"])
def test_example_config_runs_in_every_mode(tmp_path, mode):
    summary = train_gym(_config(tmp_path / mode, f'run.stability="{mode}"'))
    assert summary["env_steps"] == 400 and summary["updates"] == 21
    assert summary["eval"]["episodes"] == 2 and summary["eval"]["mean_return"] >= 8
    assert (tmp_path / mode / "summary.json").exists()
