"""Collection, the acting half of the loop: act -> env step -> check -> store, for every env at
once; on a CUDA device with an env that lives there, captured in one CUDA graph and replayed.

The runner calls :meth:`Collector.step` once per batched env step. What one step does, in order,
is :meth:`Collector.collect`; what it keeps between steps (the current observation, the episode
statistics, on CUDA the env-step clock of the ε schedule) are device tensors, read by the host
only when a metrics row or a checkpoint asks for them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trimtab.rl.agent.dqn import DQNAgent
from trimtab.rl.agent.graphed import CapturedStep
from trimtab.rl.agent.replay import ReplayBuffer
from trimtab.rl.envs.protocol import EnvAdapter

__all__ = ["COLLECT_WARMUP", "Collector"]

#: Eager collection steps on a side stream before the capture: the replay's per-env windows, the
#: sentinel's pointer tables and cuBLAS's workspace are built lazily on a first call and must
#: exist before it (PyTorch's whole-network recipe warms up "a few" iterations; its example: 3).
#: They are real env steps, stored and counted like every other.
COLLECT_WARMUP = 3


class Collector:
    """One batched env step of ``adapter``'s ``n_envs`` envs, with the agent acting ε-greedily.

    Per step (:meth:`collect`): ``a = act(x)``; ``(x', r, final, term, trunc) = env.step(a)``;
    the sentinel's ``env`` phase on ``(x', reward_scale * r, final)``: the reward in the
    training units of its threshold (then ``sanitize`` zeroes what is non-finite);
    ``replay.add(x, a, reward_scale * r, final, term, trunc)``; the returns of the
    episodes that ended are summed on the device; ``x <- x'``.

    ``capture=True`` (a CUDA device and an adapter whose envs live on it, ``adapter.on_device``)
    makes the step a :class:`~trimtab.rl.agent.graphed.CapturedStep` at its first call:
    :data:`COLLECT_WARMUP` steps eagerly on a side stream, then one step captured in a
    :class:`torch.cuda.CUDAGraph` and replayed for every later step: the env, the replay and
    the ε schedule's clock are device state, and the generators drawn from (the agent's, the
    env's) are registered with the graph, so a replay continues their streams as an eager step
    would. The replay buffer and the env are the fold's own, so a collector serves one fold.
    Elsewhere every step is eager, ε computed on the host from the runner's count.
    """

    def __init__(
        self,
        agent: DQNAgent,
        adapter: EnvAdapter,
        learner: Any,
        replay: ReplayBuffer,
        reward_scale: float = 1.0,
        *,
        capture: bool = False,
        warmup: int = COLLECT_WARMUP,
    ) -> None:
        device = agent.device
        if capture and not (device.type == "cuda" and getattr(adapter, "on_device", False)):
            raise ValueError(
                f"capture=True needs a CUDA device and envs that live on it (market, env.impl = "
                f"'torch'); this collector runs on {device} with {type(adapter).__name__}: "
                "collect eagerly (capture=False)"
            )
        if warmup < 1:
            raise ValueError(f"warmup={warmup}: capture needs at least one eager step before it")
        self.agent, self.adapter, self.learner, self.replay = agent, adapter, learner, replay
        self.reward_scale, self.n_envs = float(reward_scale), int(adapter.n_envs)
        self.capture, self.warmup = capture, warmup
        self.obs = torch.zeros(self.n_envs, adapter.obs_dim, device=device)
        # per env: the returns of the episodes ended since the last metrics row, and how many
        # (float64: a sum of many returns; summed over envs when read)
        self._ep_sum = torch.zeros(self.n_envs, dtype=torch.float64, device=device)
        self._ep_count = torch.zeros(self.n_envs, dtype=torch.float64, device=device)
        # ε's clock on the device (global env steps), advanced by the step itself when captured
        self._clock = torch.zeros((), dtype=torch.long, device=device) if capture else None
        #: the captured step (``capture=True``), made at the first step: the generators it
        #: registers are the fold's, which the adapter opened by then
        self.captured: CapturedStep | None = None

    def start(self, obs: Tensor, env_steps: int) -> None:
        """The fold's first observation (or a resumed one) and the global env-step count."""
        self.obs.copy_(obs)
        if self._clock is not None:
            self._clock.fill_(env_steps)

    # --- the step -------------------------------------------------------------------------
    def step(self, env_steps: int) -> None:
        """One batched env step; ``env_steps``: global env steps before it (ε's clock)."""
        if self.capture and self.learner.stability.checks.fault is not None:
            raise RuntimeError(
                "the fault-injection hook (Checks.fault) counts checks on the host, which a "
                "captured collection does not re-run: set run.cuda_graph = 'off' to inject faults"
            )
        if not self.capture:
            self.collect(env_steps)
            return
        if self.captured is None:
            self.captured = CapturedStep(self._collect_on_clock, self._generators(),
                                         addresses=lambda: (), warmup=self.warmup)  # fmt: skip
        self.captured({})

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        """The captured step's graph (None before the capture, and eager)."""
        return None if self.captured is None else self.captured.graph

    def collect(self, clock: int | Tensor) -> None:
        """act -> env step -> check -> store; ``clock`` is ε's step count (an int, or the
        device counter, which this advances by ``n_envs``). No host synchronisation."""
        agent, obs = self.agent, self.obs
        # act: one ε-greedy action per env and branch (ε counts env steps summed over envs)
        action = agent.act(obs, clock)
        # env step
        step = self.adapter.step(action)
        # the training reward: what replay stores and the targets are built from (returns stay
        # unscaled)
        reward = step.reward * self.reward_scale if self.reward_scale != 1.0 else step.reward
        # check: the sentinel sees what the env returned before anything consumes it, the reward
        # in training units, as its threshold is (a multiple of the targets' bound)
        self.learner.see_env(step.obs, reward, step.final_obs)
        # store: n-step transitions into replay
        self.replay.add(obs, action, reward, step.final_obs, step.terminated, step.truncated)
        # episode statistics, on the device
        ended = step.terminated | step.truncated
        self._ep_sum.add_(torch.where(ended, step.episode_return, 0.0))
        self._ep_count.add_(ended)
        obs.copy_(step.obs)
        if isinstance(clock, Tensor):
            clock.add_(self.n_envs)

    # --- capture --------------------------------------------------------------------------
    def _collect_on_clock(self, _: dict[str, Tensor]) -> dict[str, Tensor]:
        """:meth:`collect` on the device clock, as :class:`CapturedStep` calls a step."""
        self.collect(self._clock)  # type: ignore[arg-type]
        return {}

    def _generators(self) -> list[torch.Generator]:
        gens = [self.agent.generator, *self.adapter.generators()]
        return [g for g in gens if g.device.type == "cuda"]

    # --- what the runner reads and saves --------------------------------------------------
    def episodes(self) -> Tensor:
        """``[2]``: the summed returns of the episodes ended since the last :meth:`clear`, and
        their count (a device tensor; no host read)."""
        return torch.stack([self._ep_sum.sum(), self._ep_count.sum()])

    def clear(self) -> None:
        """Start the next metrics row's episode statistics."""
        self._ep_sum.zero_()
        self._ep_count.zero_()

    def load_episodes(self, episodes: Tensor) -> None:
        """Restore :meth:`episodes` (a checkpoint's ``[2]``) into env 0's accumulators."""
        self.clear()
        self._ep_sum[0].copy_(episodes[0])
        self._ep_count[0].copy_(episodes[1])
