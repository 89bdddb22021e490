"""The Gymnasium adapter's greedy evaluation: its episodes run side by side, one batched action
per step for the envs still playing, and give each episode the return a lone greedy rollout of
the same seed gives."""

from __future__ import annotations

import gymnasium as gym
import torch

from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import from_dict
from trimtab.rl.envs.adapters import GymAdapter


class _PoleRule:
    """A greedy policy that reads only its own row (push toward the pole's lean), counting the
    act calls and the rows they carry."""

    def __init__(self) -> None:
        self.calls, self.rows = 0, 0

    def act(self, obs: torch.Tensor, step: int, greedy: bool = False) -> torch.Tensor:
        assert greedy and step == 0
        self.calls += 1
        self.rows += obs.shape[0]
        return (obs[:, 2:3] > 0).long()


def _alone(seed: int) -> float:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        x = torch.as_tensor(obs).view(1, -1)
        a = int((x[0, 2] > 0).item())
        obs, r, term, trunc, _ = env.step(a)
        total, done = total + float(r), term or trunc
    env.close()
    return total


def test_episodes_side_by_side_match_each_lone_rollout() -> None:
    cfg = from_dict(TrainConfig, {"env": {"name": "gym:CartPole-v1"},
                                  "gym": {"eval_episodes": 6}, "run": {"seed": 3}})  # fmt: skip
    adapter = GymAdapter(cfg, torch.device("cpu"))
    policy = _PoleRule()
    row, _ = adapter.evaluate(policy, 0)
    alone = [_alone(10_000 + 3 + i) for i in range(6)]
    assert row["episodes"] == 6
    assert row["mean_return"] == sum(alone) / 6
    assert row["min_return"] == min(alone) and row["max_return"] == max(alone)
    assert len(set(alone)) > 1  # episodes of different lengths: envs leave the batch one by one
    # one act call per step of the longest episode, each env's steps counted once
    assert policy.calls == max(alone) and policy.rows == sum(alone)
