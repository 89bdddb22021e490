"""The learning agent: branching (dueling) C51 with an IQN auxiliary loss, Double-DQN (or
target-argmax) targets, n-step returns, a hard-synced target network and ε-greedy exploration.
No host syncs per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from trimtab.lifecycle import active_lifecycle
from trimtab.rl.agent.losses import atoms, c51_loss, c51_projection, quantile_huber_loss
from trimtab.rl.agent.networks import AssetwiseQNetwork, BranchingQNetwork
from trimtab.rl.agent.replay import ReplayBuffer
from trimtab.rl.configio import ConfigError, check_fields

__all__ = [
    "GAMMA_AUTO",
    "SAVED_BEFORE",
    "AgentConfig",
    "DQNAgent",
    "NetworkLayoutError",
    "Prediction",
    "Targets",
]

SupportFn = Callable[[], tuple[Tensor, Tensor]]

#: What a key missing from a saved agent's config means: the agent was saved by a trimtab that
#: did not have the key yet, and was built as this value builds it (today's default builds
#: another network: ``assetwise = "auto"`` is the assetwise one on the market).
SAVED_BEFORE: dict[str, Any] = {"assetwise": False}


#: ``agent.gamma = "auto"``, by whether the run walks forward over market folds: a market
#: position's value is one bar's return less the cost of moving to it (the oracle's greedy
#: rule), a Gymnasium episode's is its return to the end
GAMMA_AUTO = {True: 0.0, False: 0.99}


@dataclass(frozen=True)
class AgentConfig:
    """Every constant of the agent, by name, with the trainer's defaults (the one place they
    are set). Saved with each checkpoint.

    The defaults are sized to the trainer's daily market: rewards ~1e-2, so a shorter horizon
    than Atari's 0.99 and a smaller net suffice; the ε schedule (in env steps summed over the
    default 16 envs: 4000 batched steps) is sized to the default 4 x 2500 learn steps; 8 IQN
    quantiles (the paper uses 64) keep the auxiliary loss from dominating the step time on a
    2-core CPU."""

    # discount per env step; "auto" = 0 for the market (a position's value is the next bar's
    # return less the cost of moving to it: the horizon of a trade), 0.99 for other envs
    # (resolved by TrainConfig; 0.99 for an agent built on its own); at 0 the target is the
    # reward and no network runs on the next state. docs:
    # guides/walk-forward.md#what-the-agent-was-given
    gamma: float | Literal["auto"] = "auto"
    n_step: int = 1  # steps summed before bootstrapping (1: the step's reward and a bootstrap)
    lr: float = 1e-3  # passed to optimizer_factory as lr=
    adam_eps: float = 1e-8  # passed to optimizer_factory as eps= (CleanRL's C51: 0.01/batch)
    # transitions per learn step; "auto" = the run's device profile (trimtab.rl.config
    # DEVICE_PROFILES: 64; 256 on CUDA but for the market), resolved by TrainConfig
    batch_size: int | Literal["auto"] = "auto"
    target_update_period: int = 500  # updates between hard target syncs
    eps_start: float = 1.0  # ε-greedy: linear from eps_start to eps_end ...
    eps_end: float = 0.05  # ε at the end of the schedule (and after it)
    eps_decay_steps: int = 64_000  # ... over this many env steps
    n_atoms: int = 51  # C51 atoms per branch
    v_min: float = -10.0  # the fixed support, used when no support_fn is given
    v_max: float = 10.0  # the fixed support's top (stability = "fixed"); adaptive measures it
    iqn_weight: float = 0.5  # weight of the IQN quantile Huber loss; 0 disables the IQN head
    n_tau: int = 8  # IQN quantile samples of the prediction (N)
    n_tau_target: int = 8  # IQN quantile samples of the target (N')
    kappa: float = 1.0  # quantile Huber threshold κ
    hidden: int = 128  # trunk width (units per hidden layer)
    depth: int = 2  # trunk layers, or gated residual blocks after one Linear
    head_hidden: int | None = None  # width of the value/advantage streams; None = hidden
    trunk: str = "layernorm"  # "layernorm", "mlp" (no normalisation) or "gated"
    dueling: bool = True  # value + advantage streams; False = one plain MLP head per branch
    # True: one network shared by the branches, each seeing only its own asset's features and
    # position (AssetwiseQNetwork; the market's observation layout); False: every branch reads
    # the whole observation through one trunk (BranchingQNetwork); "auto" = True for the market,
    # False for other envs (resolved by TrainConfig; False for an agent built on its own)
    assetwise: bool | Literal["auto"] = "auto"
    # True: the online net picks the next action, the target net evaluates it (Double DQN);
    # False: the target net does both (Bellemare et al.'s C51, CleanRL's c51.py)
    double_dqn: bool = True
    iqn_embed: int = 64  # cosine features of τ
    replay_capacity: int = 50_000  # transitions kept (per fold: each fold starts empty)
    prioritized: bool = False  # prioritized replay (Schaul et al.) instead of uniform
    priority_alpha: float = 0.6  # prioritized replay: priorities are |TD error| ** alpha
    priority_beta: float = 0.4  # prioritized replay: importance weights' exponent
    seed: int = 0  # network initialisation and the agent's generator (exploration, τ samples)

    def __post_init__(self) -> None:
        check_fields(self, "agent")  # types, finite numbers
        bad = []
        if self.gamma != "auto" and not 0.0 <= self.gamma <= 1.0:
            bad.append(f'gamma={self.gamma!r} must be a number in [0, 1] or "auto"')
        for name in ("n_step", "batch_size", "target_update_period", "n_tau", "n_tau_target"):
            if getattr(self, name) != "auto" and getattr(self, name) < 1:
                bad.append(f"{name}={getattr(self, name)} < 1")
        for name in ("hidden", "depth", "iqn_embed", "replay_capacity", "eps_decay_steps"):
            if getattr(self, name) < 1:
                bad.append(f"{name}={getattr(self, name)} < 1")
        if self.n_atoms < 2:
            bad.append(f"n_atoms={self.n_atoms} < 2")
        if not self.v_min < self.v_max:
            bad.append(f"v_min={self.v_min} must be < v_max={self.v_max}")
        if not (0.0 <= self.eps_end <= 1.0 and 0.0 <= self.eps_start <= 1.0):
            bad.append(f"eps_start={self.eps_start}, eps_end={self.eps_end} not in [0, 1]")
        if self.lr <= 0 or self.iqn_weight < 0 or self.kappa < 0:
            bad.append(f"need lr > 0, iqn_weight >= 0, kappa >= 0: {self.lr=}, {self.kappa=}")
        if not self.adam_eps > 0:
            bad.append(f"adam_eps={self.adam_eps} must be > 0 (it keeps Adam's divisor positive)")
        if self.trunk not in ("layernorm", "mlp", "gated"):
            bad.append(f"trunk={self.trunk!r} is not 'layernorm', 'mlp' or 'gated'")
        for name in ("dueling", "double_dqn", "prioritized", "assetwise"):
            value = getattr(self, name)
            auto = name == "assetwise"  # the one flag with an "auto"
            if not isinstance(value, bool) and not (auto and value == "auto"):
                allowed = 'true, false or "auto"' if auto else "true or false"
                bad.append(f"{name}={value!r} must be {allowed}")
        if bad:
            raise ConfigError("invalid AgentConfig: " + "; ".join(bad))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AgentConfig:
        """The config of a saved agent (``DQNAgent.state_dict()["config"]``); a key that its
        trimtab did not have yet takes the value it was built with (:data:`SAVED_BEFORE`)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown AgentConfig fields {unknown}; known: {sorted(known)}")
        return cls(**{**SAVED_BEFORE, **values})


class NetworkLayoutError(ValueError):
    """A saved agent whose network is of another layout than this agent's config builds:
    ``saved`` and ``built`` name the two networks, ``fix`` the setting that loads it."""

    def __init__(self, saved: type[nn.Module], built: type[nn.Module]) -> None:
        def key(network: type[nn.Module]) -> str:
            return f"agent.assetwise = {str(network is AssetwiseQNetwork).lower()}"

        self.saved = f"{saved.__name__} ({key(saved)})"
        self.built = f"{built.__name__} ({key(built)})"
        self.fix = key(saved)
        super().__init__(
            f"the saved agent's network is {self.saved}, but this config builds {self.built}; "
            f"set {self.fix} to load it"
        )


def _network_class(cfg: AgentConfig) -> type[BranchingQNetwork]:
    """The network ``cfg`` builds: :class:`AssetwiseQNetwork` for ``assetwise = True``, else
    :class:`BranchingQNetwork` (an unresolved ``"auto"`` included: an agent built on its own)."""
    return AssetwiseQNetwork if cfg.assetwise is True else BranchingQNetwork


class Prediction(NamedTuple):
    """The online forward of a batch."""

    trunk: Tensor  # [B, H], after the trunk's output module
    logits: Tensor  # [B, D, A, N], every action
    logits_taken: Tensor  # [B, D, N], at the taken actions
    taus: Tensor | None  # [B, T] IQN quantile levels (None without IQN)
    quantiles: Tensor | None  # [B, T, D] Z_τ at the taken actions


class Targets(NamedTuple):
    """The Bellman targets of a batch (no gradient), float32."""

    tz: Tensor  # [B, D, N] T z_j, projected onto the support by the loss
    next_probs: Tensor  # [B, D, N] p(x', a*; θ⁻); at γ = 0 all of the mass on atom 0
    next_action: Tensor | None  # [B, D] a*; None at γ = 0 (no next state is evaluated)
    bounded: Tensor  # what a target bound measures: IQN samples [B, T', D], or C51 reach [B, D]


def _logits_at(logits: Tensor, action: Tensor) -> Tensor:
    """Each branch's logits at its action: ``[B, D, A, N]``, ``[B, D] -> [B, D, N]``."""
    index = action[:, :, None, None].expand(-1, -1, 1, logits.shape[-1])
    return logits.gather(2, index).squeeze(2)


def _quantiles_at(quantiles: Tensor, action: Tensor) -> Tensor:
    """Each branch's quantiles at its action: ``[B, T, D, A]``, ``[B, D] -> [B, T, D]``."""
    index = action[:, None, :, None].expand(-1, quantiles.shape[1], -1, 1)
    return quantiles.gather(3, index).squeeze(3)


class DQNAgent:
    """Branching dueling distributional DQN (C51 + IQN auxiliary), Double DQN, n-step.

    For a transition ``(x, a, G, x', γ^k)`` from the replay buffer, per branch ``d``:

    1. ``a*_d = argmax_a Σ_i z_i p_i(x', a; θ)``  (Double DQN: the online net selects,
       van Hasselt et al. 2016); with ``double_dqn=False``, ``θ⁻`` selects (C51's own rule)
    2. ``T z_j = G + γ^k z_j``, then ``target_transform``; every branch uses the shared reward
       and its own next action (Branching DQN's independent per-branch targets, Tavakoli 2018),
       or, where the env splits the reward (a batch ``reward [B, D]``), its own part ``G_d``
    3. ``m = Φ(T z, p(x', a*_d; θ⁻))``  (C51 projection, Bellemare et al. 2017)
    4. ``L_C51 = −Σ_i m_i log p_i(x, a_d; θ)``, averaged over branches
    5. ``L_IQN = ρ^κ`` between ``Z_τ(x, a_d; θ)`` and ``G + γ^k Z_τ'(x', a*_d; θ⁻)``
       (Dabney et al. 2018), averaged over branches
    6. ``L = mean_batch w · (L_C51 + iqn_weight · L_IQN)``; priorities are ``L_C51`` per sample.

    At ``γ = 0`` (the market's default: a position is worth one bar) ``T z_j = G`` whatever
    follows ``x'``, so step 1 is skipped and neither network runs on ``x'``: step 3 projects
    ``G``'s point mass and step 5's samples are ``G`` (:meth:`bellman_targets`).

    ``autocast`` (``torch.bfloat16`` or ``torch.float16``; ``None`` = float32) runs every
    forward pass and the loss (training, target and acting forwards) under ``torch.autocast``;
    weights, gradients and optimizer state stay float32, backward runs outside the context, and
    Bellman targets reach the guard and the projection as float32. No ``GradScaler``: float16
    overflow past 65504 is left to show (the stress benchmark's mixed-precision case).

    Stability enters through two constructor arguments chosen by the run's builder, never
    through callbacks: ``support_fn`` returns the per-branch ``(v_min, v_max)`` (the adaptive
    support reads a measured bound), and ``trunk_out`` is a module inserted after the trunk of
    both networks (the adaptive trunk clamp). The guarded step itself, with every stability call
    in the order it runs, is :meth:`trimtab.rl.agent.learner.Learner.learn`; this class holds the
    algorithm's pieces it calls (:meth:`predict`, :meth:`next_state`, :meth:`bellman_targets`,
    :meth:`loss`). ``wrap_online`` (e.g. DDP around the online network) is applied once, here,
    after the weights exist; the target is then copied from the wrapped network.

    The target network registers with the active :class:`trimtab.Lifecycle` for a hard sync at
    each fold boundary. Nothing here makes a host synchronisation; ``info`` holds device tensors.
    """

    def __init__(
        self,
        obs_dim: int,
        branch_sizes: Sequence[int],
        config: AgentConfig | None = None,
        device: torch.device | str = "cpu",
        optimizer_factory: Callable[..., torch.optim.Optimizer] = torch.optim.Adam,
        support_fn: SupportFn | None = None,
        autocast: torch.dtype | None = None,
        trunk_out: nn.Module | None = None,
        wrap_online: Callable[[nn.Module], nn.Module] | None = None,
    ) -> None:
        if autocast not in (None, torch.bfloat16, torch.float16):
            raise ValueError(
                f"autocast={autocast} must be None (float32), torch.bfloat16 or torch.float16"
            )
        cfg = config if config is not None else AgentConfig()
        if cfg.gamma == "auto":  # TrainConfig resolves it per env; on its own: not the market
            cfg = replace(cfg, gamma=GAMMA_AUTO[False])
        self.config = cfg
        self.autocast = autocast
        self.obs_dim, self.branch_sizes = obs_dim, [int(n) for n in branch_sizes]
        self.device = torch.device(device)
        with torch.random.fork_rng(devices=[]):  # same weights for the same seed, always
            torch.manual_seed(cfg.seed)
            self.online = self._make_network(trunk_out).to(self.device)
            self.target = self._make_network(trunk_out).to(self.device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = optimizer_factory(self.online.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(cfg.seed)
        d = len(self.branch_sizes)
        self._fixed_support = (
            torch.full((d,), cfg.v_min, device=self.device),
            torch.full((d,), cfg.v_max, device=self.device),
        )
        self._sizes = torch.tensor(self.branch_sizes, device=self.device)
        self.support_fn: SupportFn = support_fn if support_fn is not None else self.fixed_support
        self.num_updates = 0
        self._z_memo: tuple[Tensor, Tensor, tuple[int, int], Tensor] | None = None
        active_lifecycle().register_target_sync(self.online, self.target, name="agent.target")
        if wrap_online is not None:  # e.g. DDP: rank 0's weights broadcast; the target follows
            self.online = wrap_online(self.online)
            self.sync_target()

    def _make_network(self, trunk_out: nn.Module | None) -> BranchingQNetwork:
        cfg = self.config
        return _network_class(cfg)(
            self.obs_dim, self.branch_sizes, hidden=cfg.hidden, depth=cfg.depth,
            n_atoms=cfg.n_atoms, iqn_embed=cfg.iqn_embed, head_hidden=cfg.head_hidden,
            trunk=cfg.trunk, dueling=cfg.dueling, trunk_out=trunk_out,  # type: ignore[arg-type]
            iqn=cfg.iqn_weight > 0,
        )  # fmt: skip

    def precision(self) -> torch.autocast:
        """The forward passes' autocast context (a disabled one when ``autocast`` is None)."""
        return torch.autocast(
            self.device.type, dtype=self.autocast, enabled=self.autocast is not None
        )

    def fixed_support(self) -> tuple[Tensor, Tensor]:
        """The default ``support_fn``: ``(v_min, v_max)`` from the config, one per branch."""
        return self._fixed_support

    def make_replay(self, reward_parts: bool = False) -> ReplayBuffer:
        """A replay buffer whose n-step and γ match this agent's config; ``reward_parts``: the
        env gives each branch its own reward (``[E, D]``), stored and summed per branch."""
        cfg = self.config
        return ReplayBuffer(
            cfg.replay_capacity, self.obs_dim, len(self.branch_sizes), self.device,
            n_step=cfg.n_step, gamma=cfg.gamma, prioritized=cfg.prioritized,
            alpha=cfg.priority_alpha, beta=cfg.priority_beta, reward_parts=reward_parts,
        )  # fmt: skip

    def atoms(self, v_min: Tensor, v_max: Tensor) -> Tensor:
        """:func:`trimtab.rl.agent.losses.atoms` of the support, ``[D, n_atoms]``. On the CPU it is
        remembered while the support is the same two tensors, unmodified (their version
        counters): the fixed support of ``off`` and ``fixed`` is spread into atoms once, not at
        every act and learn step (8 ops, which a CPU pays in microseconds of dispatch each); a
        measured support is a new pair per call, so it is computed each time. Elsewhere always
        computed: a captured CUDA graph may hold the call. Callers never write into it."""
        n = self.config.n_atoms
        if self.device.type != "cpu" or v_min.is_inference() or v_max.is_inference():
            return atoms(v_min, v_max, n)
        memo, version = self._z_memo, (v_min._version, v_max._version)
        if memo is not None and memo[0] is v_min and memo[1] is v_max and memo[2] == version:
            return memo[3]
        z = atoms(v_min, v_max, n)
        self._z_memo = (v_min, v_max, version, z)
        return z

    # --- acting ---------------------------------------------------------------------------
    def epsilon(self, step: int | Tensor) -> float | Tensor:
        """Linear ε schedule: ``eps_start`` at step 0 to ``eps_end`` at ``eps_decay_steps``.
        ``step`` a device tensor (a captured loop's clock): ε as a float64 device tensor, the
        same float64 arithmetic as for an int, so the same value."""
        cfg = self.config
        if isinstance(step, Tensor):
            frac_t = (step.double() / cfg.eps_decay_steps).clamp(0.0, 1.0)
            return (1.0 - frac_t) * cfg.eps_start + frac_t * cfg.eps_end
        frac = min(max(step, 0) / cfg.eps_decay_steps, 1.0)
        return (1.0 - frac) * cfg.eps_start + frac * cfg.eps_end  # exact at both ends

    @torch.no_grad()
    def act(self, obs: Tensor, step: int | Tensor, greedy: bool = False) -> Tensor:
        """ε-greedy actions ``[E, D]`` for ``obs [E, obs_dim]``; each branch explores alone.
        ``step`` (ε's clock, env steps) may be a device tensor: no host read then either."""
        v_min, v_max = self.support_fn()
        z = self.atoms(v_min, v_max)
        with self.precision():
            q = self.online.q_values(self.online(obs).logits, z)
        action = q.argmax(dim=-1)
        if greedy:
            return action
        u = torch.rand(action.shape, generator=self.generator, device=self.device)
        random_action = torch.minimum((u * self._sizes).long(), self._sizes - 1)
        explore = torch.rand(action.shape, generator=self.generator, device=self.device)
        return torch.where(explore < self.epsilon(step), random_action, action)

    # --- learning: the pieces of the loss, in the order the learn step calls them ------------
    def predict(self, batch: dict[str, Tensor], z: Tensor) -> Prediction:
        """The online forward of ``batch["obs"]`` (the one back-propagated): every action's
        logits, the taken actions' logits and, with IQN, ``Z_τ`` at the taken actions."""
        cfg = self.config
        online = self.online(batch["obs"])
        logits = _logits_at(online.logits, batch["action"])  # [B, D, N]
        taus = quantiles = None
        if cfg.iqn_weight > 0:
            n = batch["obs"].shape[0]
            taus = torch.rand(n, cfg.n_tau, generator=self.generator, device=self.device)
            z_tau = self.online.quantiles(online.trunk, taus)
            quantiles = _quantiles_at(z_tau, batch["action"])  # [B, T, D]
        return Prediction(online.trunk, online.logits, logits, taus, quantiles)

    @torch.no_grad()
    def bellman_targets(self, batch: dict[str, Tensor], z: Tensor) -> Targets:
        """Steps 1-2 and 5's target (class docstring), float32 whatever the forwards ran in.

        ``bounded`` is what a target bound measures and clamps: the IQN target samples, which
        the IQN loss then uses; without IQN, each C51 target's reach ``max_j |G + γ^k z_j|``
        (``|G| + γ^k b`` on a support ±b), a measurement only: the C51 values live on the
        support and cannot lead it, but their reach grows the support to ``p99 |G| / (1 − γ)``,
        the largest return the rewards allow.
        """
        cfg = self.config
        n = batch["obs"].shape[0]
        # n-step return: shared by every branch [B], or each branch's own part [B, D]
        reward = batch["reward"].view(n, -1, 1)
        if cfg.gamma == 0.0:
            return self._reward_targets(reward, z)
        discount = batch["discount"].view(n, 1, 1)  # γ^k, or 0 after a termination
        next_obs = batch["next_obs"]
        # Double DQN: the online network selects a*, the target network evaluates it; without
        # it the target network does both.
        next_target = self.target(next_obs)
        selector = self.online(next_obs).logits if cfg.double_dqn else next_target.logits
        next_action = self.online.q_values(selector, z).argmax(dim=-1)  # [B, D]
        next_probs = torch.softmax(_logits_at(next_target.logits, next_action), dim=-1)
        tz = (reward + discount * z).float()  # T z_j  [B, D, N]
        if cfg.iqn_weight > 0:
            taus_next = torch.rand(
                n, cfg.n_tau_target, generator=self.generator, device=self.device
            )
            next_z = _quantiles_at(self.target.quantiles(next_target.trunk, taus_next), next_action)
            bounded = (reward.view(n, 1, -1) + discount * next_z).float()  # [B, T', D]
        else:
            bounded = tz.abs().amax(dim=-1)  # [B, D]
        return Targets(tz, next_probs.float(), next_action, bounded)

    def _reward_targets(self, reward: Tensor, z: Tensor) -> Targets:
        """:meth:`bellman_targets` at ``γ = 0``, where ``γ^k = 0`` for every transition: ``T z_j
        = G + 0 · z_j = G`` on every atom, so the next state's values are multiplied by zero and
        no network runs on ``x'`` (the target network's forward and Double DQN's online one, with
        their IQN heads, are skipped). C51's target is the projection of ``G``'s point mass
        (every ``T z_j`` is ``G``; all of the mass on one atom), IQN's ``N'`` samples are ``G``
        each. The general path's targets to within rounding: there the mass is a softmax, whose
        sum is 1 to within an ulp or so."""
        cfg = self.config
        n, branches, n_atoms = reward.shape[0], len(self.branch_sizes), z.shape[-1]
        # T z_j = G, shaped as G + 0 · z is: [B, D, N] (one reward per sample: [B, 1, N]
        # where z is one support for every branch)
        tz = reward.expand(torch.broadcast_shapes(reward.shape, z.shape)).float()
        mass = torch.zeros((n, branches, n_atoms), device=tz.device)
        mass[..., 0] = 1.0  # the point mass: one atom carries all of it, the rest nothing
        if cfg.iqn_weight > 0:
            bounded = reward.view(n, 1, -1).expand(n, cfg.n_tau_target, branches)
            # a copy, always: the target bound clamps it in place, and ``tz`` views the reward
            bounded = bounded.clone(memory_format=torch.contiguous_format).float()  # [B, T', D]
        else:
            bounded = tz.abs().amax(dim=-1)  # [B, D]
        return Targets(tz, mass, None, bounded)

    def loss(
        self,
        batch: dict[str, Tensor],
        pred: Prediction,
        targets: Targets,
        support: tuple[Tensor, Tensor],
        z: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Steps 3-6: the C51 projection and cross-entropy, the IQN quantile Huber loss, the
        importance-weighted mean; and an info dict of detached device tensors."""
        cfg = self.config
        v_min, v_max = support
        target_probs = c51_projection(targets.tz, targets.next_probs, v_min, v_max)
        c51 = c51_loss(pred.logits_taken, target_probs).mean(dim=-1)  # [B], over branches
        if pred.quantiles is not None and pred.taus is not None:
            iqn = quantile_huber_loss(pred.quantiles, targets.bounded, pred.taus, cfg.kappa)
            iqn = iqn.mean(dim=-1)  # [B]
        else:
            iqn = torch.zeros_like(c51)
        per_sample = (c51 + cfg.iqn_weight * iqn).float()  # float32 whatever the forwards ran in
        weights = batch.get("weights")
        loss = (per_sample * weights).mean() if weights is not None else per_sample.mean()
        with torch.no_grad():
            q_taken = (torch.softmax(pred.logits_taken, dim=-1) * z).sum(dim=-1)
            info = {
                "loss": loss.detach(),
                "c51_loss": c51.mean(),
                "iqn_loss": iqn.mean(),
                "q_mean": q_taken.mean(),
                "target_mean": (target_probs * z).sum(dim=-1).mean(),
                "priorities": c51.detach().float(),
            }
            if targets.next_action is not None:
                info["next_action"] = targets.next_action
        return loss, info

    def compute_loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The unguarded loss of one batch (no bound measured or applied): :meth:`predict`,
        :meth:`bellman_targets` and :meth:`loss` under the agent's precision."""
        support = self.support_fn()
        z = self.atoms(*support)  # [D, N]
        with self.precision():
            pred = self.predict(batch, z)
            targets = self.bellman_targets(batch, z)
            return self.loss(batch, pred, targets, support, z)

    @torch.no_grad()
    def sync_target(self) -> None:
        """Hard copy θ⁻ ← θ."""
        for t, o in zip(self.target.parameters(), self.online.parameters(), strict=True):
            t.copy_(o)

    # --- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "branch_sizes": list(self.branch_sizes),
            "obs_dim": self.obs_dim,
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "num_updates": self.num_updates,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = AgentConfig.from_dict(state["config"])
        theirs, ours = _network_class(saved), _network_class(self.config)
        if theirs is not ours:
            raise NetworkLayoutError(theirs, ours)
        if (saved, state["branch_sizes"], state["obs_dim"]) != (
            self.config,
            self.branch_sizes,
            self.obs_dim,
        ):
            raise ValueError(
                "agent state was saved with a different config, branch sizes or obs_dim "
                f"({state['branch_sizes']}, {state['obs_dim']}); construct the agent with "
                "AgentConfig.from_dict(state['config']) to resume"
            )
        ours, theirs = set(self.online.state_dict()), set(state["online"])
        if ours != theirs:
            iqn = sorted(k for k in theirs - ours if k.startswith(("tau_embed.", "iqn_head.")))
            why = (
                f" (it has an IQN head, {iqn[:2]}..., which an agent with iqn_weight = 0 no "
                "longer builds: it was written by an earlier trimtab; resume it with that "
                "version, or start a fresh run)"
                if iqn
                else ""
            )
            raise ValueError(
                f"agent state's network weights do not match this network{why}: missing "
                f"{sorted(ours - theirs)[:4]}, unexpected {sorted(theirs - ours)[:4]}"
            )
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state["num_updates"])
        self.generator.set_state(state["generator"])
