"""The trainer's stability wiring: every bound from a state-vector slot, every check named.

``adaptive``: the C51 support, the target clamp and the trunk clamp follow p99 bounds measured
online (producer -> AdaptiveEMA -> slot -> consumer), each raised by the engagement-rate
correction; the gradient clip is :class:`trimtab.AdaptiveGradClip`; every network steps with
:class:`trimtab.optim.Adam` (weight clamp, self-set decay inside the step).
``fixed``: the same mechanisms at the constants people hand-set today (:data:`FIXED`).
``off``: no clamp, no clip, the C51 support fixed at the agent's ``[v_min, v_max]`` (±10 by
default, as in Dopamine). ``fixed`` reads the same configured support.
In every mode the sentinel watches the same buffers; diagnostics never change a number.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trimtab.clamp import clamp_finite_, guard_
from trimtab.clip import AdaptiveGradClip
from trimtab.engagement import EngagementCorrection
from trimtab.estimate import AdaptiveEMA
from trimtab.lifecycle import register
from trimtab.optim import Adam
from trimtab.optim.adam import adam_slots
from trimtab.quantile import abs_quantile, abs_quantiles
from trimtab.rl.agent import DQNAgent, StepGuard
from trimtab.rl.config import ABLATIONS, TrainConfig
from trimtab.sentinel import Rule, Sentinel
from trimtab.state import Slot, StateVector

__all__ = ["FIXED", "SUPPORT_FLOOR", "Stability"]

#: The hand-set constants of ``--stability fixed``: what Dopamine and common DQN code use, kept
#: to show what the adaptive mode replaces. The C51 support of ``fixed`` and ``off`` (and the
#: target clamp of ``fixed``, at the support's edge) is not here: it is the agent's
#: ``[v_min, v_max]`` (±10 by default), which a task sets to its own return range (CartPole:
#: ±100). A constant ±10 here once overrode that config and capped every CartPole value at 10
#: (true values reach 100), which no hyperparameter could make up for.
FIXED = {"grad_clip": 10.0, "weight_clamp": 100.0}

#: Cold-start floor of the support and activation-clamp slots (a numerical constant, design
#: invariant 3): before the first measurement, or if every target is exactly 0, the support is
#: ±1e-3 rather than a collapsed [0, 0]. It goes on the slot value a consumer reads.
SUPPORT_FLOOR = 1e-3

#: The quantile the producers measure: a clamp at it should engage on 1 - Q of the elements.
Q = 0.99

#: Sentinel threshold factor on measured p99 bounds: a value 1e3 times the running p99 of its
#: buffer is the onset of the blow-up chain (targets, then moments, then weights) that the
#: sentinel exists to name; ordinary heavy tails (Student-t, 4 d.o.f.) stay orders below it.
EXCURSION_FACTOR = 1e3

_CONSUMERS = ("targets", "trunk")
#: Buffers measured only to give the sentinel a threshold (checked first, then measured, so
#: a step's own excursion never raises the bound it is checked against).
_WATCHED = ("obs", "logits", "loss", "grad_trunk")


class Stability(StepGuard):
    """Producers, consumers and checks of one trainer, by ``cfg.run.stability`` mode."""

    def __init__(self, cfg: TrainConfig, n_branches: int, device: torch.device) -> None:
        self.mode = cfg.run.stability
        # adaptive mechanisms switched off for an ablation (config run.ablate)
        self.on = {m: self.mode == "adaptive" and m not in cfg.run.ablate for m in ABLATIONS}
        self.policy = cfg.run.on_nonfinite
        self.n_branches = n_branches
        self.device = device
        self.state = StateVector(
            [
                Slot("target_bound", doc="p99 |Bellman target| (IQN samples): support and clamp"),
                Slot("trunk_bound", doc="p99 |trunk output|: activation clamp"),
                *(
                    Slot(f"{n}_scale", doc=f"max this fold of p99 |{n}|: sentinel threshold scale")
                    for n in _WATCHED
                ),
                *adam_slots(2, prefix="adam"),  # groups: matrices, then vectors
                Slot("grad_clip_bound", doc="gradient-norm clip bound"),
            ],
            device=device,
        )
        self.ema = AdaptiveEMA(len(_CONSUMERS), device=device)
        self.engagement = EngagementCorrection(
            len(_CONSUMERS), expected_rate=1.0 - Q, device=device, name="clamps"
        )
        # per consumer: (engaged, non-finite) of this step, and (engaged, seen) since the log
        self._step_counts = torch.zeros(len(_CONSUMERS), 2, dtype=torch.int64, device=device)
        self._step_seen = torch.zeros(len(_CONSUMERS), dtype=torch.int64, device=device)
        self._step_max = torch.zeros(len(_CONSUMERS), device=device)
        self._log_counts = torch.zeros(len(_CONSUMERS), 2, dtype=torch.int64, device=device)
        self.watch_ema = AdaptiveEMA(len(_WATCHED), device=device)
        self._watch_masks: dict[tuple[str, ...], Tensor] = {}
        self.sentinel = Sentinel(device)
        #: Test hook: ``(slot name, step, value)`` writes ``value`` into that slot's buffer right
        #: before its check number ``step`` (the step the sentinel will report).
        self.fault: tuple[str, int, float] | None = None
        #: False runs every producer, clamp and clip but no sentinel check: the test of
        #: invariant 7 (diagnostics never change training) compares the two.
        self.diagnostics = True
        self._checks: dict[str, int] = {}
        self.clip: AdaptiveGradClip | None = None
        self.agent: DQNAgent | None = None
        self._latest: dict[str, Tensor] = {}
        self._loss = torch.zeros((), device=device)
        self._masks = torch.eye(len(_CONSUMERS), dtype=torch.bool, device=device)
        self._nan = torch.full((), float("nan"), device=device)
        self._fixed_support = (  # the agent's configured support (fixed, off, ablations)
            torch.full((n_branches,), cfg.agent.v_min, device=device),
            torch.full((n_branches,), cfg.agent.v_max, device=device),
        )
        self._fixed_clamp = max(-cfg.agent.v_min, cfg.agent.v_max)  # fixed mode: the edge

    # --- wiring -------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return self.state.fingerprint

    def optimizer_factory(self, params: Any, lr: float, eps: float = 1e-8) -> torch.optim.Optimizer:
        """Every network with parameters steps with this (invariant 5: one implementation)."""
        params = list(params)
        # Two groups, each with its own measured bounds: weight matrices, and vectors (biases,
        # LayerNorm gains). One group-wide p99 bound clamped the LayerNorm gains (all 1.0 at
        # init) to the matrices' p99 (~0.15) and shrank the trunk 7x in one step; vectors get
        # no decay, as is standard for biases and norm gains.
        groups = [{"params": [p for p in params if p.ndim >= 2]},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]  # fmt: skip
        if self.mode == "adaptive":
            decay: float | str = "auto" if self.on["decay"] else 0.0
            groups[0]["weight_decay"] = decay
            return Adam(groups, lr=lr, eps=eps, weight_clamp=self.on["weight_clamp"],
                        state_vector=self.state, capturable=True)  # fmt: skip
        if self.mode == "fixed":  # hand-set decay-free Adam; the ±100 clamp is in after_step
            return Adam(groups, lr=lr, eps=eps, weight_decay=0.0, weight_clamp=False,
                        state_vector=self.state, capturable=True)  # fmt: skip
        return torch.optim.Adam(params, lr=lr, eps=eps)

    def attach(self, agent: DQNAgent) -> None:
        """Install the hooks on ``agent`` and name the sentinel's slots."""
        self.agent = agent
        agent.guard = self
        agent.online.trunk_hook = self._trunk_hook
        if self.on["grad_clip"]:
            self.clip = AdaptiveGradClip(list(agent.online.parameters()), state_vector=self.state)
        s = self.sentinel
        thr = {"targets": "target_bound", "trunk": "trunk_bound"}
        # A buffer a clamp sanitises is checked by guard_ in the same pass (source None);
        # one with no clamp in this mode is checked as it is, in its phase.
        self._guarded = {
            "targets": self.mode == "fixed" or self.on["target_clamp"],
            "trunk": self.on["trunk_clamp"],
        }

        def view(slot: str, i: int | None) -> Tensor:
            return self.state[slot] if i is None else self.state[slot][i]

        def above(slot: str, i: int | None = None) -> Rule:
            return Rule.above(view(slot, i), factor=EXCURSION_FACTOR, name=slot)

        def above_sq(slot: str, i: int | None = None) -> Rule:  # Adam's v: the factor squared
            return Rule.above(view(slot, i), factor=EXCURSION_FACTOR**2, name=slot)

        # Slots of one phase fire together when a value propagates (an inf trunk makes NaN
        # logits); ties are reported in the order added, so they are added in data-flow order:
        # an unclamped trunk that overflows (float16 autocast) is named, not the logits after it.
        s.add("obs", lambda: self._latest.get("obs"), above("obs_scale"), phase="forward")
        s.add("atom_span", lambda: self._latest.get("atom_span"), phase="forward")
        for name in _CONSUMERS:
            source = None if self._guarded[name] else (lambda n=name: self._latest.get(n))
            s.add(name, source, above(thr[name]), phase="forward")
        s.add("logits", lambda: self._latest.get("logits"), above("logits_scale"), phase="forward")
        s.add("loss", self._loss, above("loss_scale"), phase="forward")
        # the backward pass is checked twice: where it leaves the heads (the gradient at the
        # trunk output) and once it has reached every parameter
        s.add("grad.trunk_output", lambda: self._latest.get("grad_trunk"),
              above("grad_trunk_scale"), phase="backward_heads")  # fmt: skip
        opt = agent.optimizer
        for name, p in agent.online.named_parameters():
            # sanitize: guard_ checks each gradient and then sanitises it in the same pass
            source = None if self.policy == "sanitize" else (lambda p=p: p.grad)
            s.add(f"grad.{name}", source, above("grad_clip_bound"), phase="backward")
        for name, p in agent.online.named_parameters():
            g = 0 if p.ndim >= 2 else 1  # the optimizer group, and so the slot element
            s.add(f"weight.{name}", p, above("adam_weight_bound", g), phase="optimizer")
            moments = (("adam_m", "exp_avg", above("adam_p99_m", g)),
                       ("adam_v", "exp_avg_sq", above_sq("adam_p99_v", g)))  # fmt: skip
            for moment, key, rule in moments:
                source = lambda p=p, k=key: opt.state.get(p, {}).get(k)  # noqa: E731
                s.add(f"{moment}.{name}", source, rule, phase="optimizer")
        register(self, "reset_counters", name="stability", what="restart fault-injection counters")

    # --- checks, with the fault-injection test hook ---------------------------------------------
    def reset_counters(self) -> None:
        self._checks.clear()

    def _inject(self, name: str, x: Tensor | None, counter: str) -> None:
        f = self.fault
        if (
            f is not None
            and f[0] == name
            and x is not None
            and self._checks.get(counter, 0) == f[1]
        ):
            with torch.no_grad():
                x.view(-1)[x.numel() // 2] = f[2]

    def _check(self, phase: str) -> None:
        if self.fault is not None:
            slot = self.sentinel._slots.get(self.fault[0])
            if slot is not None and slot.phase == phase and slot.source is not None:
                t = slot.source if isinstance(slot.source, Tensor) else slot.source()
                self._inject(self.fault[0], t, phase)
        if self.diagnostics:
            self.sentinel.check(phase)
        self._checks[phase] = self._checks.get(phase, 0) + 1

    def _guard(self, name: str, x: Tensor, bound: Tensor | float, counts: Tensor | None) -> None:
        self._inject(name, x, f"guard:{name}")
        if self.diagnostics:
            guard_(x, bound, self.sentinel, name, counts)  # check first, then sanitise, clamp
        else:
            clamp_finite_(x, bound, counts)
        self._checks[f"guard:{name}"] = self._checks.get(f"guard:{name}", 0) + 1

    def _watch(self, values: dict[str, Tensor]) -> None:
        """Fold p99 |x| of watched buffers into their threshold slots (after their check):
        one quantile launch and one estimator update for all of them."""
        names = [n for n in _WATCHED if n in values]
        q = abs_quantiles([values[n].reshape(-1) for n in names], Q)
        parts = iter(q.unbind())
        zero = q.new_zeros(())
        obs = torch.stack([next(parts) if n in values else zero for n in _WATCHED])
        key = tuple(names)
        if key not in self._watch_masks:  # built once per set of names (a host-to-device copy)
            self._watch_masks[key] = torch.tensor(
                [n in values for n in _WATCHED], device=self.device
            )
        est = self.watch_ema.update_log(obs, self._watch_masks[key])
        # The threshold scale is the largest the buffer has had this fold (the slots reset at a
        # fold boundary): an excursion is 1e3 x above every scale seen, not above a recent one.
        # Gradients that shrink as training converges (CartPole, solved: the p99 at the trunk
        # output fell by orders of magnitude) then no longer make an ordinary gradient fire.
        for n in names:
            slot = self.state[f"{n}_scale"]
            slot.copy_(torch.fmax(slot, est[_WATCHED.index(n)]))

    # --- the C51 support: the one helper that reads its slot ------------------------------------
    def support_fn(self) -> tuple[Tensor, Tensor]:
        """Per-branch ``(v_min, v_max)``: ``±fmax(target_bound, floor)`` when adaptive."""
        if not self.on["support"]:
            return self._fixed_support
        b = self.state.read("target_bound", floor=SUPPORT_FLOOR).expand(self.n_branches)
        return -b, b

    # --- producers and consumers ----------------------------------------------------------------
    def _produce(self, c: int, slot: str, x: Tensor) -> Tensor:
        """Measure p99 |x| (before any clamp), raise it by the engagement correction, fold it
        into the slot; return the bound a consumer reads."""
        obs = abs_quantile(x, Q).reshape(1).expand(len(_CONSUMERS)).contiguous()
        self.state[slot].copy_(self.engagement.fold(self.ema, obs, self._masks[c])[c])
        # the largest finite |x| (NaN and ±Inf count as 0), for the engagement correction
        flat = x.detach().reshape(-1).float().abs().nan_to_num_(0.0, 0.0, 0.0)
        if flat.numel():
            torch.amax(flat, 0, out=self._step_max[c])
        else:
            self._step_max[c].zero_()
        self._step_seen[c].fill_(x.numel())  # fill_: a kernel argument, not a host copy
        return self.state.read(slot, floor=SUPPORT_FLOOR)

    def _consume(self, c: int, name: str, x: Tensor, bound: Tensor | float) -> Tensor:
        counts = self._step_counts[c]
        counts.zero_()
        self._guard(name, x, bound, counts)
        self._log_counts[c, 0].add_(counts[0])  # add_ on a view: no write-back copy
        self._log_counts[c, 1].add_(x.numel())
        return x

    def _observe_engagement(self) -> None:
        self.engagement.observe(self._step_counts[:, 0], self._step_seen, self._step_max)

    # --- StepGuard hooks ------------------------------------------------------------------------
    def _full_precision(self) -> torch.autocast:
        """The hooks below run inside the agent's forward, so under its autocast (run.autocast):
        the producers, EMAs and clamps must not. Buffers keep their dtype (quantile, clamp and
        sentinel read float16/bfloat16 and compute in float32); a low-precision overflow is
        checked as the inf it became."""
        return torch.autocast(self.device.type, enabled=False)

    def targets(self, x: Tensor, kind: str) -> Tensor:
        with self._full_precision():
            return self._targets(x.float(), kind)

    def _targets(self, x: Tensor, kind: str) -> Tensor:
        if kind == "c51":
            return x  # the projection clips T z to the support, which reads the same slot
        # "iqn": quantile samples of the target, unbounded, so the support follows the values.
        # "c51_edge" (C51 alone): max_j |G + γ^k z_j| = |G| + γ^k b on a support ±b. The C51
        # values themselves cannot lead the support (they live on it; measured, the p99 of
        # the scalar targets stalled at 8 on CartPole, values reach 100), but their reach
        # can: b ← p99 |G| + γ b grows to p99 |G| / (1 − γ), the largest return the rewards
        # allow (CartPole: 100). Before, nothing fed the slot: the support stayed at ±1e-3.
        x = x.contiguous()
        bound: Tensor | float = self._fixed_clamp
        if self.on["support"] or self.on["target_clamp"]:  # the slot feeds both
            bound = self._produce(0, "target_bound", x)
        if not self._guarded["targets"]:
            self._latest["targets"] = x
            return x
        return self._consume(0, "targets", x, bound)

    def _trunk_hook(self, h: Tensor) -> Tensor:
        if not self._guarded["trunk"]:
            # the training forward's trunk, whose logits are checked with it (a later
            # no-grad forward of next states must not replace it)
            if h.requires_grad:
                self._latest["trunk"] = h.detach()
                h.register_hook(self._record_trunk_grad)
            return h
        with self._full_precision():
            return _TrunkGuard.apply(h, self)

    def _record_trunk_grad(self, g: Tensor) -> None:
        self._latest["grad_trunk"] = g
        self._check("backward_heads")
        self._watch({"grad_trunk": g})

    def after_forward(self, loss: Tensor, info: dict[str, Tensor]) -> None:
        self._loss.copy_(loss.detach())
        if self.agent is not None and "obs" in info:
            self._latest["obs"] = info["obs"]
        self._latest["atom_span"] = self.support_fn()[1]
        if "logits" in info:
            self._latest["logits"] = info["logits"]
        self._check("forward")
        watched = {k: self._latest[k] for k in ("obs", "logits") if k in self._latest}
        self._watch({**watched, "loss": self._loss})
        if self.mode == "adaptive":
            self._observe_engagement()

    def after_backward(self, net: nn.Module, info: dict[str, Tensor]) -> None:
        params = [p for p in net.parameters() if p.grad is not None]
        if self.policy == "sanitize":  # check, then sanitise (NaN bound: no clamp), one pass
            for name, p in net.named_parameters():
                if p.grad is not None:
                    self._guard(f"grad.{name}", p.grad, self._nan, None)
        self._check("backward")
        if self.mode == "adaptive" and self.clip is not None:
            info["grad_norm"] = self.clip(params)
        elif self.mode == "fixed":
            info["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, FIXED["grad_clip"])

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.policy != "skip":
            optimizer.step()
            return
        # skip: a step whose gradients hold NaN/Inf leaves weights and moments as they were,
        # decided on the device (a where, not a branch), at the cost of one snapshot.
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        ok = torch.stack([torch.isfinite(p.grad).all() for p in params]).all()
        before = []
        for p in params:
            moments = optimizer.state.get(p, {})
            saved = {k: v.clone() for k, v in moments.items() if isinstance(v, Tensor)}
            before.append((p, p.detach().clone(), saved))
        optimizer.step()
        with torch.no_grad():
            for p, w, st in before:
                p.copy_(torch.where(ok, p, w))
                for k, v in st.items():
                    optimizer.state[p][k].copy_(torch.where(ok, optimizer.state[p][k], v))

    def after_step(self) -> None:
        if self.mode == "fixed" and self.agent is not None:
            with torch.no_grad():
                for p in self.agent.online.parameters():
                    p.clamp_(-FIXED["weight_clamp"], FIXED["weight_clamp"])
        self._check("optimizer")

    # --- reporting ------------------------------------------------------------------------------
    def log_values(self) -> dict[str, Tensor]:
        rates = self._log_counts[:, 0].double() / self._log_counts[:, 1].clamp_min(1).double()
        self._log_counts.zero_()
        out = {
            "bound/support": self.support_fn()[1].mean(),
            "bound/trunk": self.state["trunk_bound"],
            "bound/adam_weight": self.state["adam_weight_bound"][0],
            "bound/adam_weight_vectors": self.state["adam_weight_bound"][1],
            "bound/grad_clip": self.state["grad_clip_bound"],
            "engaged/target_clamp": rates[0],
            "engaged/trunk_clamp": rates[1],
        }
        return out

    def nonfinite_count(self) -> int:
        return len(self.sentinel.report())

    def halt_message(self) -> str | None:
        if self.policy != "halt" or not bool(self.sentinel.fired()):
            return None
        first = self.sentinel.report()[0]
        return (
            f"sentinel slot {first.name!r} fired first: {first.kind} in phase {first.phase} "
            f"at step {first.step} of this fold (value {first.value})"
        )

    def sentinel_report(self) -> dict[str, Any]:
        return self.sentinel.to_dict()

    def state_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.state_dict(),
            "ema": self.ema.state_dict(),
            "watch_ema": self.watch_ema.state_dict(),
            "engagement": self.engagement.state_dict(),
            "clip": self.clip.state_dict() if self.clip is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state["state"])
        self.ema.load_state_dict(state["ema"])
        self.watch_ema.load_state_dict(state["watch_ema"])
        self.engagement.load_state_dict(state["engagement"])
        if self.clip is not None:
            self.clip.load_state_dict(state["clip"])


class _TrunkGuard(torch.autograd.Function):
    """Trunk output: produce its p99 bound, check it into the sentinel, sanitise and clamp it.

    The gradient passes where a value was kept and is zero where it was clamped or replaced
    (the gradient of ``clamp``); it is recorded for the sentinel's ``backward_heads`` check.
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, stab: Stability) -> Tensor:
        y = h.detach().clone()
        # The bound is produced from the training forward (the one that will be
        # back-propagated); acting and next-state forwards read it as it stands.
        if h.requires_grad:
            bound = stab._produce(1, "trunk_bound", y)
        else:  # unset (a fold's first steps): no clamp, not a clamp at the cold-start floor
            v = stab.state["trunk_bound"]
            bound = torch.where(torch.isnan(v), v, stab.state.read("trunk_bound", SUPPORT_FLOOR))
        stab._consume(1, "trunk", y, bound)
        ctx.save_for_backward(y == h)
        ctx.stab = stab
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (kept,) = ctx.saved_tensors
        ctx.stab._record_trunk_grad(grad)
        return grad * kept, None
