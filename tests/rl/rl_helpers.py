"""Helpers of the trainer tests (imported by them; pytest puts this folder on sys.path)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import from_dict

#: A training run of a few seconds: one fold of a short market, a tiny net.
TINY = {
    "run": {"progress": False, "checkpoint_every": 1000, "log_every": 4},
    "data": {"synthetic_days": 300},
    "env": {"n_envs": 4, "episode_days": 16},
    "walkforward": {"folds": 1, "steps_per_fold": 12, "learning_starts": 12},  # 3 x 4 envs
    "agent": {"batch_size": 16, "hidden": 16, "n_atoms": 11, "n_tau": 4, "n_tau_target": 4,
              "iqn_embed": 8, "replay_capacity": 1000, "target_update_period": 5},
}  # fmt: skip


def tiny(out: Path, steps_per_fold: int = 12, **run: object) -> TrainConfig:
    """:data:`TINY` writing to ``out``, ``steps_per_fold`` gradient steps, ``run`` overrides."""
    data = copy.deepcopy(TINY)
    data["run"].update(out=str(out), **run)
    data["walkforward"]["steps_per_fold"] = steps_per_fold
    return from_dict(TrainConfig, data)


def wired_learner(cfg, obs_dim: int = 5, branches: int = 2):
    """The learner of ``cfg`` (branches of 3 actions), built as the trainer builds it, on a
    generic observation: the whole-observation network (``agent.assetwise = False``), since
    ``obs_dim`` need not be the market's blocks of features and positions."""
    from trimtab.lifecycle import Lifecycle
    from trimtab.rl.agent.learner import build_learner

    cfg = generic(cfg)
    with Lifecycle():
        return build_learner(cfg, obs_dim, [3] * branches, torch.device("cpu"))


def wired_agent(cfg, obs_dim: int = 5, branches: int = 2):
    """``(stability, agent)`` of :func:`wired_learner`."""
    learner = wired_learner(cfg, obs_dim, branches)
    return learner.stability, learner.agent


def random_batch(obs_dim: int = 5, branches: int = 2, n: int = 16) -> dict[str, torch.Tensor]:
    return {"obs": torch.randn(n, obs_dim), "action": torch.randint(0, 3, (n, branches)),
            "reward": torch.randn(n), "next_obs": torch.randn(n, obs_dim),
            "discount": torch.full((n,), 0.9)}  # fmt: skip


def generic(cfg):
    """``cfg`` with the whole-observation network (``agent.assetwise = False``): for learners
    built on a made-up observation rather than the market's blocks of features and positions."""
    from dataclasses import replace

    return replace(cfg, agent=replace(cfg.agent, assetwise=False))
