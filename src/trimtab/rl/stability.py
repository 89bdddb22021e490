"""The trainer's stability wiring: every bound from a state-vector slot, every check named.

``adaptive``: the C51 support, the target clamp and the trunk clamp follow p99 bounds measured
online (producer -> AdaptiveEMA -> slot -> consumer), with engagement-rate correction; the
gradient clip is :class:`trimtab.AdaptiveGradClip`; every network steps with
:class:`trimtab.optim.Adam` (weight clamp, decay and L1 inside the step).
``fixed``: the same mechanisms at the constants people hand-set today (:data:`FIXED`).
``off``: no clamp, no clip, C51 support fixed at ±10 as in Dopamine.
In every mode the sentinel watches the same slots; diagnostics never change a number.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trimtab.clamp import guard_
from trimtab.estimate import AdaptiveEMA
from trimtab.quantile import abs_quantile
from trimtab.rl.agent import DQNAgent, StepGuard
from trimtab.rl.config import TrainConfig
from trimtab.sentinel import Rule, Sentinel
from trimtab.state import Slot, StateVector

__all__ = ["FIXED", "SUPPORT_FLOOR", "Stability"]

#: The hand-set constants of ``--stability fixed`` (and the ±10 support of ``off``): what
#: Dopamine and common DQN code use, kept to show what the adaptive mode replaces.
FIXED = {"support": 10.0, "target_clamp": 10.0, "grad_clip": 10.0, "weight_clamp": 100.0}

#: Cold-start floor of the support and clamp slots (a numerical constant, design invariant 3):
#: before the first measurement, or if every target is exactly 0, the support is ±1e-3 rather
#: than a collapsed [0, 0]. It goes on the slot value read by the consumer, never on a bound.
SUPPORT_FLOOR = 1e-3

#: The quantile the producers measure: a clamp at it should engage on 1 - Q of the elements.
Q = 0.99

#: Sentinel threshold factor on measured p99 bounds: an excursion of 1e3 times the running p99
#: of a buffer is the onset of the blow-up chain (targets, then moments, then weights) that the
#: sentinel exists to name; ordinary heavy tails (Student-t, 4 d.o.f.) stay two orders below.
EXCURSION_FACTOR = 1e3


class Stability(StepGuard):
    """Producers, consumers and checks of one trainer, by ``cfg.run.stability`` mode."""

    def __init__(self, cfg: TrainConfig, n_branches: int, device: torch.device) -> None:
        self.mode = cfg.run.stability
        self.policy = cfg.run.on_nonfinite
        self.n_branches = n_branches
        self.device = device
        self.lr = cfg.agent.lr
        self.state = StateVector(
            [
                Slot("target_bound", doc="p99 |Bellman target| (IQN samples): support and clamp"),
                Slot("trunk_bound", doc="p99 |trunk output|: activation clamp"),
            ],
            device=device,
        )
        self.target_ema = AdaptiveEMA(1, device=device)
        self.trunk_ema = AdaptiveEMA(1, device=device)
        self.engaged = torch.zeros(2, 2, dtype=torch.int64, device=device)  # [consumer, (n, N)]
        self.sentinel = Sentinel(device)
        self.agent: DQNAgent | None = None
        self._latest: dict[str, Tensor] = {}
        self._fixed_support = (
            torch.full((n_branches,), -FIXED["support"], device=device),
            torch.full((n_branches,), FIXED["support"], device=device),
        )

    # --- wiring -------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return self.state.fingerprint

    def optimizer_factory(self, params: Any, lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr)

    def attach(self, agent: DQNAgent) -> None:
        """Install the hooks on ``agent`` and name the sentinel's slots."""
        self.agent = agent
        agent.guard = self
        agent.online.trunk_hook = self._trunk_hook
        s = self.sentinel
        # A slot that a clamp sanitises is checked by guard_ in the same pass (None source);
        # a slot with no clamp in this mode is checked, as it is, in the forward phase.
        guarded = {"targets": self.mode != "off", "trunk": self.mode == "adaptive"}
        for name, slot in (("targets", "target_bound"), ("trunk", "trunk_bound")):
            rule = Rule.above(self.state[slot], factor=EXCURSION_FACTOR, name=slot)
            source = None if guarded[name] else (lambda n=name: self._latest.get(n))
            s.add(name, source, rule, phase="forward")
        self._guarded = guarded
        self._loss = torch.zeros((), device=self.device)
        s.add("loss", self._loss, phase="forward")
        for name, p in agent.online.named_parameters():
            s.add(f"grad.{name}", lambda p=p: p.grad, phase="backward")
        for name, p in agent.online.named_parameters():
            s.add(f"weight.{name}", p, phase="optimizer")

    # --- the C51 support: one helper reads the slot ---------------------------------------------
    def support_fn(self) -> tuple[Tensor, Tensor]:
        """Per-branch ``(v_min, v_max)``: ``±fmax(target_bound, floor)`` when adaptive."""
        if self.mode != "adaptive":
            return self._fixed_support
        b = self.state.read("target_bound", floor=SUPPORT_FLOOR).expand(self.n_branches)
        return -b, b

    # --- StepGuard hooks ----------------------------------------------------------------------
    def targets(self, x: Tensor, kind: str) -> Tensor:
        if kind == "c51":
            return x  # the projection clips T z to the support, which follows the same slot
        x = x.contiguous()
        if self.mode == "adaptive":
            # producer first: the bound is measured on the targets before any clamp
            obs = abs_quantile(x, Q).reshape(1)
            self.state["target_bound"].copy_(self.target_ema.update(obs)[0])
            bound = self.state.read("target_bound", floor=SUPPORT_FLOOR)
        elif self.mode == "fixed":
            bound = FIXED["target_clamp"]
        else:
            bound = float("nan")  # off: only checked (below)
        if not self._guarded["targets"]:
            self._latest["targets"] = x
            return x
        counter = self.engaged[0]
        counter[1] += x.numel()
        return guard_(x, bound, self.sentinel, "targets", counter)

    def _trunk_hook(self, h: Tensor) -> Tensor:
        if not self._guarded["trunk"]:
            self._latest["trunk"] = h.detach()
            return h
        return _TrunkGuard.apply(h, self)

    def after_forward(self, loss: Tensor, info: dict[str, Tensor]) -> None:
        self._loss.copy_(loss.detach())
        self.sentinel.check("forward")

    def after_backward(self, net: nn.Module, info: dict[str, Tensor]) -> None:
        self.sentinel.check("backward")
        params = [p for p in net.parameters() if p.grad is not None]
        if self.mode == "fixed":
            info["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, FIXED["grad_clip"])

    def after_step(self) -> None:
        self.sentinel.check("optimizer")

    # --- reporting ----------------------------------------------------------------------------
    def log_values(self) -> dict[str, Tensor]:
        rates = self.engaged[:, 0].double() / self.engaged[:, 1].clamp_min(1).double()
        self.engaged.zero_()
        _, hi = self.support_fn()
        return {
            "bound/support": hi.mean(),
            "bound/trunk": self.state["trunk_bound"],
            "engaged/target_clamp": rates[0],
            "engaged/trunk_clamp": rates[1],
        }

    def nonfinite_count(self) -> int:
        return len(self.sentinel.report())

    def halt_message(self) -> str | None:
        if self.policy != "halt" or not bool(self.sentinel.fired()):
            return None
        first = self.sentinel.report()[0]
        return (
            f"non-finite or runaway values: sentinel slot {first.name!r} fired first, "
            f"phase {first.phase}, step {first.step} ({first.kind}, value {first.value})"
        )

    def sentinel_report(self) -> dict[str, Any]:
        return self.sentinel.to_dict()

    def state_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.state_dict(),
            "target_ema": self.target_ema.state_dict(),
            "trunk_ema": self.trunk_ema.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state["state"])
        self.target_ema.load_state_dict(state["target_ema"])
        self.trunk_ema.load_state_dict(state["trunk_ema"])


class _TrunkGuard(torch.autograd.Function):
    """Trunk output: measure p99 |h|, check it into the sentinel, then sanitise and clamp it.

    Gradients pass where the value was kept and are zero where it was clamped or replaced,
    the gradient of ``clamp``.
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, stab: Stability) -> Tensor:
        y = h.detach().clone()
        obs = abs_quantile(y, Q).reshape(1)  # producer first, on the unclamped values
        stab.state["trunk_bound"].copy_(stab.trunk_ema.update(obs)[0])
        bound = stab.state.read("trunk_bound", floor=SUPPORT_FLOOR)
        counter = stab.engaged[1]
        counter[1] += y.numel()
        guard_(y, bound, stab.sentinel, "trunk", counter)
        ctx.save_for_backward(y == h)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (kept,) = ctx.saved_tensors
        return grad * kept, None
