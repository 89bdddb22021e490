"""What the runner needs of an environment, as types: :class:`EnvAdapter` (the Protocol every
adapter implements), :class:`EnvStep` (one step of the envs) and :class:`FoldPlan` (how long a
fold trains). A new kind of environment is a class with these members, registered in
:mod:`trimtab.rl.envs.registry`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

__all__ = ["EnvAdapter", "EnvStep", "FoldPlan"]


class EnvStep(NamedTuple):
    """One step of ``E`` envs, as device tensors. ``reward`` is the env's own (unscaled), ``[E]``
    or, from an adapter with ``reward_parts``, one part per action branch ``[E, D]``;
    ``final_obs`` is the true successor also where an episode ended (the next episode's first
    observation is in ``obs``); ``episode_return [E]`` is the unscaled return of the episode
    that ended at this step, read only where ``terminated | truncated``."""

    obs: Tensor
    reward: Tensor
    final_obs: Tensor
    terminated: Tensor
    truncated: Tensor
    episode_return: Tensor


@dataclass(frozen=True)
class FoldPlan:
    """How long fold ``index`` trains: ``max_updates`` gradient steps (market) or
    ``max_env_steps`` env steps summed over envs (Gymnasium), and until ``stop()`` says so
    where the adapter has its own end (bsuite: the experiment's episode budget); learning waits
    for ``learning_starts`` env steps. ``expected_updates`` sizes the progress bar."""

    index: int
    learning_starts: int
    expected_updates: int
    max_updates: int | None = None
    max_env_steps: int | None = None
    stop: Callable[[], bool] | None = None

    def updates_done(self, fold_step: int) -> bool:
        return self.max_updates is not None and fold_step >= self.max_updates

    def done(self, fold_step: int, env_steps: int) -> bool:
        full = self.max_env_steps is not None and env_steps >= self.max_env_steps
        return full or self.updates_done(fold_step) or (self.stop is not None and self.stop())


@runtime_checkable
class EnvAdapter(Protocol):
    """An environment as the runner trains on it: its folds (one for an env that is not walked
    forward), a fold's ``n_envs`` envs opened, stepped with device tensors in and out, saved and
    restored mid-fold as plain data (``--resume``), and the greedy policy evaluated at a fold's
    end. It never learns: the runner does that, the same way for every adapter."""

    #: whether the envs live on the run's device (a collection step can then be captured)
    on_device: bool
    #: whether ``EnvStep.reward`` is ``[E, D]``, one part per action branch (summing to the
    #: step's reward), rather than one shared ``[E]``
    reward_parts: bool
    n_envs: int
    n_folds: int
    obs_dim: int
    branch_sizes: list[int]

    def plan(self, k: int) -> FoldPlan:
        """How long fold ``k`` trains."""
        ...

    def updates_due(self, before: int, after: int) -> int:
        """Gradient steps due after the env steps (summed over envs) went from before to after."""
        ...

    def open_fold(self, k: int, seed: int) -> Tensor:
        """Fold ``k``'s envs reset with ``seed``; their first observations ``[n_envs, obs_dim]``."""
        ...

    def step(self, action: Tensor) -> EnvStep:
        """Every env stepped with its action ``[n_envs, len(branch_sizes)]``."""
        ...

    def generators(self) -> list[torch.Generator]:
        """The torch generators of the envs (checkpointed with the run)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The open fold's env state as tensors, arrays and numbers (no pickles)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state."""
        ...

    def normalizer_state(self) -> dict[str, Any] | None:
        """The feature normaliser of the open fold (None where observations are raw)."""
        ...

    def evaluate(self, agent: Any, k: int) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        """Fold ``k``'s greedy evaluation: its metrics row and, where dated, its daily curves."""
        ...

    def summary(self, rows: list[dict[str, Any]], run_dir: Any = None) -> dict[str, Any]:
        """The run's summary entries of this env from the folds' rows."""
        ...

    def close(self) -> None:
        """Release the envs."""
        ...
