"""The learner: one agent, the stability parts of its mode, and the one guarded learn step that
every runner calls. The step is :class:`trimtab.Guard`'s phases with the trainer's own checks and
bounds between them; it reads top to bottom, every stability call marked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from trimtab.clip import AdaptiveGradClip
from trimtab.distributed import RankConsistent
from trimtab.guard import Guard
from trimtab.lifecycle import register
from trimtab.rl.agent.dqn import DQNAgent
from trimtab.rl.agent.graphed import Beside, CapturedStep
from trimtab.rl.agent.replay import ReplayBuffer
from trimtab.rl.agent.stability import Stability, build_stability
from trimtab.rl.config import (
    AUTOCAST_DTYPES,
    DEFAULT_CHECK_EVERY,
    RunConfig,
    TrainConfig,
    uses_cuda_graph,
)

__all__ = ["Learner", "build_learner", "uses_cuda_graph"]


class Learner:
    """An agent, the stability parts of its mode, the :class:`trimtab.Guard` built from them
    and the learn step (build it with :func:`build_learner` inside the run's
    :class:`trimtab.Lifecycle`, so every piece of state registers its fold-boundary reset).

    ``guard.distributed``: a multi-process run's rank part
    (:class:`trimtab.distributed.RankConsistent`), passed into the Guard once
    (:meth:`Stability.guard`): the sentinel, the bounds and the checks' threshold scales are
    attached to it; each step reduces them over the ranks before the fold (one ``all_reduce``),
    a halt decision merges the ranks' flags first, and a loaded checkpoint keeps this rank's own
    seed and random stream (rank 0 saved it)."""

    def __init__(
        self,
        agent: DQNAgent,
        stability: Stability,
        guard: Guard,
        *,
        cuda_graph: bool = False,
        check_every: int = DEFAULT_CHECK_EVERY,
    ) -> None:
        if check_every < 1:
            raise ValueError(f"check_every={check_every} must be >= 1 (learn steps per host read)")
        if cuda_graph and agent.device.type != "cuda":
            raise ValueError(
                f"cuda_graph=True needs the agent on a CUDA device, not {agent.device}; "
                "run eagerly (cuda_graph=False) on the CPU"
            )
        if guard.state is not stability.state or guard.checks is not stability.checks:
            raise ValueError(
                "Learner: the Guard was not built from this stability's parts; build it with "
                "stability.guard(agent.online, agent.optimizer)"
            )
        self.agent, self.stability, self.guard = agent, stability, guard
        self.params = list(agent.online.parameters())
        self.check_every = check_every
        self.consistent: RankConsistent | None = guard.distributed
        #: the bounds' end-of-step fold runs on a second stream beside the sentinel's
        #: optimizer-phase check (CUDA, modes with measured bounds; the others fold nothing).
        #: Not with ranks: the fold then carries the sentinel's merge, which writes the records
        #: that the check beside it writes too (on one stream, in sequence).
        self.beside = Beside(
            agent.device, enabled=stability.bounds is not None and self.consistent is None
        )
        #: the captured step on a given batch (None: eager), and the one that samples its
        #: batch inside the graph (:meth:`learn_from`; built at its first call, per replay)
        self.graph = (
            CapturedStep(self.guarded_step, [agent.generator], self._addresses)
            if cuda_graph
            else None
        )
        self.sampled_graph: CapturedStep | None = None
        self._sampling: tuple[ReplayBuffer, torch.Generator, int] | None = None
        if cuda_graph:  # inside the run's Lifecycle: after every other reset
            register(self, "check_graphs", name="cuda_graph",
                     what="recapture the learn step if a reset moved its buffers")  # fmt: skip

    def learn(
        self, batch: dict[str, Tensor], replay: ReplayBuffer | None = None
    ) -> dict[str, Tensor]:
        """One guarded gradient step on ``batch`` (eager, or a replay of the captured step: the
        same numbers), then what stays on the host: the replay's priorities, the update count
        and the target sync every ``target_update_period`` updates. Returns detached device
        tensors (under capture the same tensors every step, overwritten by the next one). No
        host synchronisation."""
        self._refuse_fault()
        info = self.graph(batch) if self.graph is not None else self.guarded_step(batch)
        if replay is not None:
            replay.update_priorities(batch["indices"], info["priorities"])
        self._count_update()
        return info

    def learn_from(
        self, replay: ReplayBuffer, generator: torch.Generator, batch_size: int
    ) -> dict[str, Tensor]:
        """:meth:`learn` on ``replay.sample(batch_size, generator)``. Captured, the sample and
        the priority update are in the graph too (no copy into static buffers): one graph per
        replay buffer, generator and batch size (the trainer's fresh buffer of each fold is
        captured after its own warm-up), with ``generator`` registered, so the draws are the
        eager ones. The replay's ``beta`` is read when captured."""
        if self.graph is None:
            return self.learn(replay.sample(batch_size, generator), replay)
        self._refuse_fault()
        key = self._sampling
        if key is None or key[0] is not replay or key[1] is not generator or key[2] != batch_size:

            def step(_: dict[str, Tensor]) -> dict[str, Tensor]:
                batch = replay.sample(batch_size, generator)
                info = self.guarded_step(batch)
                replay.update_priorities(batch["indices"], info["priorities"])
                return info

            gens = [self.agent.generator, generator]
            self.sampled_graph = CapturedStep(step, gens, self._addresses)
            self._sampling = (replay, generator, batch_size)
        info = self.sampled_graph({})  # type: ignore[misc]
        self._count_update()
        return info

    def _refuse_fault(self) -> None:
        if self.graph is not None and self.stability.checks.fault is not None:
            raise RuntimeError(
                "the fault-injection hook (Checks.fault) counts checks on the host, which a "
                "captured CUDA graph does not re-run: build the learner with "
                "run.cuda_graph = 'off' to inject faults"
            )

    def _count_update(self) -> None:
        agent = self.agent
        agent.num_updates += 1
        if agent.num_updates % agent.config.target_update_period == 0:
            agent.sync_target()  # in place: the captured step reads the same target weights

    def check_graphs(self) -> None:
        """Drop a captured step whose buffers moved (a reset or load that reallocated them):
        it is recaptured after a new warm-up instead of replaying into freed memory."""
        for graph in (self.graph, self.sampled_graph):
            if graph is not None:
                graph.check()

    def guarded_step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The device part of :meth:`learn`, what a CUDA graph captures: it changes no host
        state and makes no host synchronisation; every decision is a device operation. The
        Guard's phases (``guard.*``), with the trainer's checks and bounds between them."""
        agent, s, guard = self.agent, self.stability, self.guard
        s.checks.batch(batch, guard.policy)  # stability: sentinel "batch" first; skip/sanitize
        support = s.support()  # stability: the C51 support (adaptive: ±measured target bound)
        z = agent.atoms(*support)
        with agent.precision():
            pred = agent.predict(batch, z)  # stability: the trunk clamp is a layer of the net
            targets = agent.bellman_targets(batch, z)
        s.bound_targets(targets.bounded)  # stability: measure, check, clamp the targets
        s.checks.see("trunk", pred.trunk.detach())
        with agent.precision():
            loss, info = agent.loss(batch, pred, targets, support, z)
        s.checks.see_forward(batch["obs"], support[1], pred.logits)  # the forward phase's rest
        guard.check_loss(loss)  # stability: sentinel "forward", the loss and the buffers above
        if pred.trunk.requires_grad:
            pred.trunk.register_hook(s.checks.trunk_grad)  # stability: sentinel, heads' grad
        guard.backward(loss)  # gradients zeroed in place (stable addresses), then backward
        guard.check_gradients()  # stability: sentinel "backward", before anything rewrites them
        info["found_inf"] = guard.decide()  # stability: flag (sanitize: zero)
        norm = guard.clip_gradients()  # stability: gradient clip (none in mode off)
        if norm is not None:
            info["grad_norm"] = norm
        guard.optimizer_step()  # stability: honours found_inf under "skip"; fixed: weight clamp
        with self.beside:  # on CUDA beside the check below (they touch disjoint state)
            guard.fold()  # stability: the ranks' one all_reduce, then every bound's fold, once
        guard.check_weights()  # stability: sentinel "optimizer" (weights, moments)
        self.beside.join()
        return info

    def poll(self) -> str | None:
        """The loop's "did anything fire?", asked every :attr:`check_every` updates (counted by
        the agent's update count, so the cadence survives a resume), None without reading
        anything on the others. On those steps, on one process, the sentinel's flag is
        :meth:`trimtab.Sentinel.peek`-ed (on a GPU: a copy queued now, answered by the copy an
        earlier poll queued, so the host never waits for the device); once it shows a fire,
        :meth:`halt_message`. With ranks, :meth:`halt_message` at once (its merge of the ranks'
        flags is a collective every rank makes on the same step). Under ``halt`` a fire is found
        up to ``check_every - 1`` steps late on the CPU, one poll or more later on a GPU; the
        message names the step where it fired, from the sentinel's device-side record, and
        the loop reads the flag itself before a checkpoint and at a fold's end."""
        if self.agent.num_updates % self.check_every:
            return None
        if self.consistent is None and not self.stability.sentinel.peek():
            return None
        return self.halt_message()

    @classmethod
    def unguarded(cls, agent: DQNAgent) -> Learner:
        """The learn step around an existing agent with the ``off`` mode's parts (no bound, no
        clip; the sentinel still watches): for a user of the agent alone, and its tests."""
        cfg = TrainConfig(run=RunConfig(stability="off"), agent=agent.config)
        stab = build_stability(cfg, n_branches=len(agent.branch_sizes), device=agent.device)
        stab = replace(stab, support=agent.support_fn)  # the agent's own support
        return cls(agent, stab, stab.guard(agent.online, agent.optimizer))

    # --- what a runner calls and reads ----------------------------------------------------
    def see_env(self, obs: Tensor, reward: Tensor, final_obs: Tensor) -> None:
        """Sentinel phase ``env`` on an env step's output, before replay stores it (then
        ``sanitize`` zeroes what is non-finite). One launch, no host sync."""
        self.stability.checks.env(obs, reward, final_obs, self.guard.policy)

    @property
    def fingerprint(self) -> str:
        """The state-vector layout's fingerprint (checkpoints of another layout are refused)."""
        return self.stability.fingerprint

    def log_values(self) -> dict[str, Tensor]:
        """Bounds and engagement rates since the last call (device tensors)."""
        s, clip = self.stability, self.guard.clip
        rates = s.rates()
        clip_rate = (  # the trainer's clip has one global bound; NaN without an adaptive one
            clip.engaged_rate()[0]
            if isinstance(clip, AdaptiveGradClip)
            else torch.full((), math.nan, device=s.state.device)
        )
        return {
            "bound/support": s.support()[1].mean(),
            "bound/trunk": s.state["trunk_bound"],
            "bound/adam_weight": s.state["adam_weight_bound"][0],
            "bound/adam_weight_vectors": s.state["adam_weight_bound"][1],
            "bound/grad_clip": s.state["grad_clip_bound"],
            "engaged/target_clamp": rates[0],
            "engaged/trunk_clamp": rates[1],
            "engaged/grad_clip": clip_rate,
        }

    def halt_message(self) -> str | None:
        """The first sentinel firing under ``on_nonfinite = "halt"`` (a host read). With
        ranks, their flags are merged first (an env-phase fire since the last step's sync is
        seen too), and the message names the rank that fired."""
        rc = self.consistent
        if rc is not None:
            rc.sync_flags()
        message = self.stability.checks.halt_message()
        if rc is None or not message:
            return message
        fired = self.stability.sentinel.report()
        if not fired or fired[0].rank is None:
            return message
        where = f"on rank {fired[0].rank} of {rc.world_size}"
        named = message.replace(" fired first:", f" fired first {where}:", 1)
        return named if named != message else f"{message} ({where})"

    def nonfinite_count(self) -> int:
        return len(self.stability.sentinel.report())

    def sentinel_report(self) -> dict[str, Any]:
        return self.stability.sentinel.to_dict()

    def state_dict(self) -> dict[str, Any]:
        stability = self.stability.state_dict(self.guard.clip)
        return {"agent": self.agent.state_dict(), "stability": stability}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load in place: every buffer keeps its address (the optimizer's loader allocates new
        moments; their values are copied back into the old ones), so a captured step replays
        on the loaded state without a recapture."""
        opt = self.agent.optimizer
        before = {p: dict(st) for p, st in opt.state.items()}
        stream = None
        if self.consistent is not None:  # rank 0 saved it: this rank keeps its own seed
            saved = dict(state["agent"])
            saved["config"] = {**saved["config"], "seed": self.agent.config.seed}
            state, stream = {**state, "agent": saved}, self.agent.generator.get_state()
        self.agent.load_state_dict(state["agent"])
        if stream is not None:  # and its own stream (a mid-fold resume restores the saved one)
            self.agent.generator.set_state(stream)
        self.stability.load_state_dict(state["stability"], self.guard.clip)
        for p, st in opt.state.items():
            for key, new in st.items():
                old = before.get(p, {}).get(key)
                if (isinstance(old, Tensor) and isinstance(new, Tensor) and old.shape == new.shape
                        and old.dtype == new.dtype and old.device == new.device):  # fmt: skip
                    old.copy_(new)
                    st[key] = old
        self.check_graphs()  # a buffer the load could not keep: recapture

    def _addresses(self) -> tuple[int, ...]:
        """Where the step's persistent buffers live: weights, gradients, optimizer state."""
        tensors = [*self.params, *self.agent.target.parameters()]
        tensors += [p.grad for p in self.params if p.grad is not None]
        for st in self.agent.optimizer.state.values():
            tensors += [v for v in st.values() if isinstance(v, Tensor)]
        return tuple(t.data_ptr() for t in tensors)


def build_learner(
    cfg: TrainConfig,
    obs_dim: int,
    branch_sizes: list[int],
    device: torch.device,
    *,
    wrap_online: Callable[[nn.Module], nn.Module] | None = None,
    consistent: RankConsistent | None = None,
) -> Learner:
    """The agent, the stability parts of ``cfg.run.stability`` (and ``cfg.run.ablate``) and the
    Guard built from them, chosen here once: the learn step has no branch on the mode. A
    multi-process run passes its rank parts in (:meth:`trimtab.rl.run.ddp.Ranks.parts`):
    ``wrap_online`` (DDP around the online network) and ``consistent`` (the bounds and flags
    reduced over the ranks: the Guard's ``distributed`` part)."""
    stab = build_stability(cfg, n_branches=len(branch_sizes), device=device)
    agent = DQNAgent(
        obs_dim, branch_sizes, replace(cfg.agent, seed=cfg.run.seed), device,
        optimizer_factory=stab.make_optimizer, support_fn=stab.support,
        autocast=AUTOCAST_DTYPES[cfg.run.autocast], trunk_out=stab.trunk_out,
        wrap_online=wrap_online,
    )  # fmt: skip
    guard = stab.guard(agent.online, agent.optimizer, consistent)
    return Learner(agent, stab, guard, cuda_graph=uses_cuda_graph(cfg.run, device),
                   check_every=cfg.run.check_every)  # fmt: skip
