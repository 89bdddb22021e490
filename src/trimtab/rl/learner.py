"""The learner: one agent and its stability parts, built once from the config, and the one
guarded learn step that every runner calls. The runner never touches stability directly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from trimtab.rl.agent import DQNAgent
from trimtab.rl.config import AUTOCAST_DTYPES, TrainConfig
from trimtab.rl.replay import ReplayBuffer
from trimtab.rl.stability import Stability

__all__ = ["Learner", "build_learner"]


class Learner:
    """An agent, the stability parts of its mode and the learn step (construct inside the run's
    :class:`trimtab.Lifecycle` so every piece of state registers its fold-boundary reset)."""

    def __init__(self, agent: DQNAgent, stability: Stability) -> None:
        self.agent = agent
        self.stability = stability

    @property
    def fingerprint(self) -> str:
        """The state-vector layout's fingerprint (checkpoints of another layout are refused)."""
        return self.stability.fingerprint

    def learn(
        self, batch: dict[str, Tensor], replay: ReplayBuffer | None = None
    ) -> dict[str, Tensor]:
        """One guarded gradient step on ``batch``; returns detached device tensors."""
        return self.agent.update(batch, replay)

    def log_values(self) -> dict[str, Tensor]:
        """Bounds and engagement rates since the last call (device tensors)."""
        return self.stability.log_values()

    def halt_message(self) -> str | None:
        """The first sentinel firing under ``on_nonfinite = "halt"`` (a host read)."""
        return self.stability.halt_message()

    def nonfinite_count(self) -> int:
        return self.stability.nonfinite_count()

    def sentinel_report(self) -> dict[str, Any]:
        return self.stability.sentinel_report()

    def state_dict(self) -> dict[str, Any]:
        return {"agent": self.agent.state_dict(), "stability": self.stability.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.agent.load_state_dict(state["agent"])
        self.stability.load_state_dict(state["stability"])


def build_learner(
    cfg: TrainConfig, obs_dim: int, branch_sizes: list[int], device: torch.device
) -> Learner:
    """The agent and the stability parts of ``cfg.run.stability`` (and ``cfg.run.ablate``)."""
    stab = Stability(cfg, n_branches=len(branch_sizes), device=device)
    agent = DQNAgent(
        obs_dim, branch_sizes, replace(cfg.agent, seed=cfg.run.seed), device,
        optimizer_factory=stab.optimizer_factory, support_fn=stab.support_fn,
        autocast=AUTOCAST_DTYPES[cfg.run.autocast],
    )  # fmt: skip
    stab.attach(agent)
    return Learner(agent, stab)
