"""The trainer's stability parts, chosen once per run from ``run.stability`` and ``run.ablate``:
the learn step calls the same parts in every mode, and no part branches on the mode per step.

``adaptive``: the C51 support, the target clamp and the trunk clamp read bounds measured online
by one :class:`trimtab.AdaptiveBounds` (p99 -> engagement raise -> adaptive EMA -> slot); the
gradient clip is :class:`trimtab.AdaptiveGradClip`; the optimizer is :class:`trimtab.optim.Adam`
(weight clamp and self-set decay inside its step).
``fixed``: the same mechanisms at the constants people hand-set today (:data:`FIXED`), the
support and the target clamp at the agent's ``[v_min, v_max]``.
``off``: no clamp, no clip, ``torch.optim.Adam``, the support fixed at ``[v_min, v_max]``.
In every mode the sentinel watches the same buffers; diagnostics never change a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from trimtab.bounds import AdaptiveBounds, BoundClamp
from trimtab.clamp import guard_
from trimtab.clip import AdaptiveGradClip
from trimtab.distributed import RankConsistent
from trimtab.guard import Clip, Guard, GuardParts
from trimtab.lifecycle import register
from trimtab.nonfinite import NonFinitePolicy
from trimtab.optim import Adam
from trimtab.optim.adam import adam_slots
from trimtab.rl.agent.checks import WATCHED, Checks, watch_slots
from trimtab.rl.config import ABLATIONS, TrainConfig, measure_every
from trimtab.sentinel import Sentinel
from trimtab.state import Slot, StateVector

__all__ = ["FIXED", "SUPPORT_FLOOR", "Stability", "build_stability"]

#: The hand-set constants of ``--stability fixed``: what Dopamine and common DQN code use, kept
#: to show what the adaptive mode replaces. The C51 support of ``fixed`` and ``off`` (and the
#: target clamp of ``fixed``, at the support's edge) is the agent's ``[v_min, v_max]``, which a
#: task sets to its own return range (CartPole: ±100).
FIXED = {"grad_clip": 10.0, "weight_clamp": 100.0}

#: Cold-start floor of the support and the trunk clamp (a numerical constant, invariant 3).
SUPPORT_FLOOR = 1e-3

#: The bounds measured online, in slot order: the Bellman targets (support and target clamp)
#: and the trunk output (activation clamp).
BOUNDS = ("targets", "trunk")


def layout() -> list[Slot]:
    """The state vector of every mode (one layout, so one fingerprint per trainer version)."""
    return [
        *AdaptiveBounds.slots(BOUNDS),
        *watch_slots(),
        *adam_slots(2, prefix="adam"),  # groups: matrices, then vectors
        Slot("grad_clip_bound", doc="gradient-norm clip bound"),
    ]


class _FixedClamp:
    """A constant clamp that checks its buffer into the sentinel first and counts engagements."""

    def __init__(self, name: str, bound: float, sentinel: Sentinel, checks: Checks) -> None:
        self.name, self.bound, self.sentinel, self.checks = name, bound, sentinel, checks
        dev = checks.device
        self.counts = torch.zeros(2, dtype=torch.int64, device=dev)  # engaged, non-finite
        self.seen = torch.zeros((), dtype=torch.int64, device=dev)

    @torch.no_grad()
    def __call__(self, x: Tensor) -> None:
        self.checks.inject(self.name, x, f"guard:{self.name}")
        guard_(x, self.bound, self.sentinel, self.name, self.counts)
        self.seen.add_(x.numel())

    def rate(self) -> Tensor:
        r = self.counts[0].double() / self.seen.double()
        self.counts.zero_()
        self.seen.zero_()
        return r


@dataclass(frozen=True, slots=True)  # frozen: a part is chosen once, never set afterwards
class Stability:
    """The parts of one run's stability that the agent is built with, chosen once by
    :func:`build_stability`; :meth:`guard` then builds the :class:`trimtab.Guard` over the
    agent's network and optimizer from them. The learn step
    (:meth:`trimtab.rl.agent.learner.Learner.guarded_step`) calls each at its place."""

    mode: str
    state: StateVector
    sentinel: Sentinel
    checks: Checks
    #: the online bounds (adaptive mode), or None
    bounds: AdaptiveBounds | None
    #: per-branch ``(v_min, v_max)`` of the C51 support
    support: Callable[[], tuple[Tensor, Tensor]]
    #: measure, check and clamp the Bellman targets the loss will use (in place)
    bound_targets: Callable[[Tensor], None]
    #: the module after the trunk of both networks (the trunk clamp), or None
    trunk_out: nn.Module | None
    #: ``(params, lr, eps) -> optimizer`` for the agent's online network
    make_optimizer: Callable[..., torch.optim.Optimizer]
    #: engagement rates of the (target, trunk) clamps since the last call
    rates: Callable[[], Tensor]
    #: the answer to a non-finite gradient or input (run.on_nonfinite)
    on_nonfinite: str = "halt"
    #: :meth:`guard` builds an AdaptiveGradClip over the network's parameters
    adaptive_clip: bool = False
    #: the quantile the AdaptiveGradClip estimates (run.bound_quantile)
    quantile: float = 0.99
    #: where it clips: this times its bound (run.clip_headroom)
    clip_headroom: float = 1.0
    #: learn steps per measurement of every measured bound (run.measure_every, resolved)
    measure_every: int = 1

    @property
    def fingerprint(self) -> str:
        return self.state.fingerprint

    def guard(
        self,
        net: nn.Module,
        optimizer: torch.optim.Optimizer,
        consistent: RankConsistent | None = None,
    ) -> Guard:
        """The Guard of the learn step over the agent's network and its optimizer, built once
        (inside the run's Lifecycle: every part registers its reset there). Its parts: this
        mode's clip (adaptive: :class:`trimtab.AdaptiveGradClip`; fixed: the hand-set norm clip
        and, after the step, the hand-set weight clamp; off: none), the sentinel's gradient,
        weight and moment slots (:meth:`Checks.attach`), the non-finite policy, the bounds; and
        a multi-process run's rank part, to which the checks' threshold scales attach (MAX
        over the ranks) before the Guard attaches the sentinel and the bounds."""
        params = list(net.parameters())
        clip: Clip | None = None
        clamp_weights: Callable[[], None] | None = None
        if self.adaptive_clip:
            clip = AdaptiveGradClip(params, quantile=self.quantile, state_vector=self.state,
                                    headroom=self.clip_headroom,
                                    measure_every=self.measure_every)  # fmt: skip
        elif self.mode == "fixed":
            clip = partial(torch.nn.utils.clip_grad_norm_, max_norm=FIXED["grad_clip"])
            clamp_weights = partial(_clamp_weights, params, FIXED["weight_clamp"])
        if not isinstance(optimizer, Adam):  # trimtab's Adam registers its own reset
            register(optimizer, _drop_moments, name="optimizer[torch.optim.Adam]",
                     what="zero moments and step counts")  # fmt: skip
        self.checks.attach(net, optimizer)
        policy = NonFinitePolicy(self.on_nonfinite, optimizer, self.state.device)  # type: ignore[arg-type]
        if consistent is not None:
            consistent.attach_max(*(self.state[f"{n}_scale"] for n in WATCHED))
        parts = GuardParts(self.state, self.checks, policy, clip=clip, bounds=self.bounds,
                           clamp_weights=clamp_weights)  # fmt: skip
        # keep_grads: the sentinel's pointer table and a captured CUDA graph need the
        # gradients' buffers at stable addresses
        return Guard(net, optimizer, parts=parts, distributed=consistent, keep_grads=True)

    def state_dict(self, clip: Clip | None) -> dict[str, Any]:
        """The parts' state, with the Guard's ``clip`` (an adaptive one holds state)."""
        clip = clip if isinstance(clip, AdaptiveGradClip) else None
        return {
            "state": self.state.state_dict(),
            "bounds": self.bounds.state_dict() if self.bounds is not None else None,
            "checks": self.checks.state_dict(),
            "clip": clip.state_dict() if clip is not None else None,
            "sentinel": self.sentinel.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], clip: Clip | None) -> None:
        self.state.load_state_dict(state["state"])
        if self.bounds is not None:
            self.bounds.load_state_dict(state["bounds"])
        self.checks.load_state_dict(state["checks"])
        if isinstance(clip, AdaptiveGradClip):
            clip.load_state_dict(state["clip"])
        self.sentinel.load_state_dict(state["sentinel"])


@torch.no_grad()
def _drop_moments(optimizer: torch.optim.Optimizer) -> None:
    # Zeroed in place (moments and step counts), which is torch's Adam's fresh state: a
    # captured CUDA graph keeps replaying on the same buffers (clearing the dict would free them).
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, Tensor):
                value.zero_()


@torch.no_grad()
def _clamp_weights(params: list[Tensor], bound: float) -> None:
    torch._foreach_clamp_min_(params, -bound)
    torch._foreach_clamp_max_(params, bound)


def build_stability(cfg: TrainConfig, n_branches: int, device: torch.device) -> Stability:
    """The parts of ``cfg.run.stability`` with ``cfg.run.ablate`` switched off. Construct
    inside the run's :class:`trimtab.Lifecycle`: every part registers its reset there; then
    build the agent with them and :meth:`Stability.guard` over its network and optimizer."""
    mode = cfg.run.stability
    every = measure_every(cfg.run, device) if mode == "adaptive" else 1
    on = {m: mode == "adaptive" and m not in cfg.run.ablate for m in ABLATIONS}
    state = StateVector(layout(), device=device)
    sentinel = Sentinel(device)
    guarded = {"targets": mode == "fixed" or on["target_clamp"], "trunk": on["trunk_clamp"]}
    thresholds = {"targets": "targets_bound", "trunk": "trunk_bound"}
    checks = Checks(state, sentinel, cfg.run.on_nonfinite, guarded, thresholds, every)
    v_min, v_max = cfg.agent.v_min, cfg.agent.v_max
    fixed_support = (
        torch.full((n_branches,), v_min, device=device),
        torch.full((n_branches,), v_max, device=device),
    )
    nan = torch.full((2,), math.nan, dtype=torch.float64, device=device)

    # -- bounds measured online ---------------------------------------------------------------
    measured = [b for b, m in (("targets", on["support"] or on["target_clamp"]),
                               ("trunk", on["trunk_clamp"])) if m]  # fmt: skip
    bounds = None
    if measured:
        bounds = AdaptiveBounds(
            measured, q=cfg.run.bound_quantile, floor=SUPPORT_FLOOR, state=state,
            sentinel=sentinel, add_slots=False, name="bounds",
            headroom=cfg.run.clamp_headroom, measure_every=every,
        )  # fmt: skip
        bounds.fault_hook = lambda name, x: checks.inject(name, x, f"guard:{name}")

    def see_targets(x: Tensor) -> None:
        checks.see("targets", x)

    bound_targets: Callable[[Tensor], None] = see_targets
    rates: Callable[[], Tensor] = lambda: nan  # noqa: E731
    trunk_out: nn.Module | None = None
    support = lambda: fixed_support  # noqa: E731
    if bounds is not None:
        b = bounds
        if on["support"]:
            # On the CPU the pair is remembered while what it reads (the slot, a view of the
            # state vector, and this step's measurement) is unwritten, by their version
            # counters: an act between two learn steps reuses it, and the agent then reuses
            # its atoms (DQNAgent.atoms). Elsewhere a captured CUDA graph may hold the read.
            held: list[Any] = []

            def support() -> tuple[Tensor, Tensor]:
                key = (b.values._version, b._obs._version)
                if held and held[0] == key:
                    return held[1]
                lo, hi = b.support("targets")  # one copy of the bound's derived rows
                pair = (lo.expand(n_branches), hi.expand(n_branches))
                if device.type == "cpu":
                    held[:] = [key, pair]
                return pair

        if "targets" in measured and on["target_clamp"]:

            def bound_targets(x: Tensor) -> None:
                b.measure("targets", x)  # stability: p99 |target| before any clamp
                b.clamp_("targets", x)  # stability: check, then clamp

        elif "targets" in measured:  # the support measures them; no clamp (an ablation)

            def bound_targets(x: Tensor) -> None:
                b.measure("targets", x)
                checks.see("targets", x)

        if on["trunk_clamp"]:
            trunk_out = BoundClamp(b, "trunk")

        def rates() -> Tensor:
            r = b.engaged_rates()
            return torch.stack([r[measured.index(n)] if n in measured else nan[0] for n in BOUNDS])

    elif mode == "fixed":
        fixed = _FixedClamp("targets", max(-v_min, v_max), sentinel, checks)
        bound_targets = fixed
        rates = lambda: torch.stack([fixed.rate(), nan[1]])  # noqa: E731

    # -- the optimizer ----------------------------------------------------------------------
    skip = cfg.run.on_nonfinite == "skip"

    def make_optimizer(params: Any, lr: float, eps: float = 1e-8) -> torch.optim.Optimizer:
        params = list(params)
        # Two groups, each with its own measured bounds: weight matrices, and vectors (biases,
        # LayerNorm gains); vectors get no decay, as is standard for biases and norm gains.
        groups = [{"params": [p for p in params if p.ndim >= 2]},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]  # fmt: skip
        if mode == "adaptive":
            groups[0]["weight_decay"] = "auto" if on["decay"] else 0.0
            return Adam(groups, lr=lr, eps=eps, weight_clamp=on["weight_clamp"],
                        quantile=cfg.run.bound_quantile, state_vector=state, capturable=True,
                        weight_headroom=cfg.run.weight_headroom,
                        measure_every=every, adopt_params=True)  # fmt: skip
        if mode == "fixed":  # hand-set decay-free Adam; the ±100 clamp is after_step
            return Adam(groups, lr=lr, eps=eps, weight_decay=0.0, weight_clamp=False,
                        state_vector=state, capturable=True, adopt_params=True)  # fmt: skip
        # off: torch's Adam; fused (which honours GradScaler's found_inf) where skip needs it,
        # capturable on CUDA (its step counters on the device: a CUDA graph can hold the step;
        # torch refuses to capture a step whose capturable flag is off, fused or not)
        cuda = bool(params) and params[0].is_cuda
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True if skip else None,
                                capturable=cuda)  # fmt: skip

    return Stability(
        mode=mode, state=state, sentinel=sentinel, checks=checks, bounds=bounds,
        support=support, bound_targets=bound_targets, trunk_out=trunk_out,
        make_optimizer=make_optimizer, rates=rates, on_nonfinite=cfg.run.on_nonfinite,
        adaptive_clip=on["grad_clip"], quantile=cfg.run.bound_quantile,
        clip_headroom=cfg.run.clip_headroom, measure_every=every,
    )  # fmt: skip
