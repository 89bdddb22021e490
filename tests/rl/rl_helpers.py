"""Helpers of the trainer tests (imported by them; pytest puts this folder on sys.path)."""

from __future__ import annotations

import torch


def wired_agent(cfg, obs_dim: int = 5, branches: int = 2):
    """A DQN agent with ``cfg``'s stability wiring attached, as the trainer builds it."""
    from trimtab.lifecycle import Lifecycle
    from trimtab.rl.agent import DQNAgent
    from trimtab.rl.config import AUTOCAST_DTYPES
    from trimtab.rl.stability import Stability

    with Lifecycle():
        stab = Stability(cfg, n_branches=branches, device=torch.device("cpu"))
        agent = DQNAgent(
            obs_dim, [3] * branches, cfg.agent,
            optimizer_factory=stab.optimizer_factory, support_fn=stab.support_fn,
            autocast=AUTOCAST_DTYPES[cfg.run.autocast],
        )  # fmt: skip
        stab.attach(agent)
    return stab, agent


def random_batch(obs_dim: int = 5, branches: int = 2, n: int = 16) -> dict[str, torch.Tensor]:
    return {"obs": torch.randn(n, obs_dim), "action": torch.randint(0, 3, (n, branches)),
            "reward": torch.randn(n), "next_obs": torch.randn(n, obs_dim),
            "discount": torch.full((n,), 0.9)}  # fmt: skip
