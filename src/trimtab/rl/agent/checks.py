"""The trainer's sentinel: which buffers are checked, in which phase, against which measured
threshold; the threshold scales it measures; the fault-injection test hook; the halt report.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from trimtab._cadence import Cadence
from trimtab.estimate import NOISE_RATE, AdaptiveEMA
from trimtab.lifecycle import detached, register
from trimtab.nonfinite import NonFinitePolicy
from trimtab.sentinel import Rule, Sentinel
from trimtab.state import Slot, StateVector

__all__ = [
    "BATCH_FIELDS",
    "ENV_FIELDS",
    "EXCURSION_FACTOR",
    "EXCURSION_Z",
    "FALSE_ALARM_PROB",
    "WATCHED",
    "Checks",
    "watch_slots",
    "watch_threshold",
]

#: Sentinel threshold factor on the bound slots that consumers use (the clip bound, the optimizer's
#: weight and moment p99s, the target and trunk bounds): a value 1e3 times its measured bound is
#: the onset of the blow-up chain (targets, then moments, then weights) that the sentinel exists
#: to name. Also the watched thresholds' margin until their spread is measured (two steps).
EXCURSION_FACTOR = 1e3

#: Probability per check that a healthy watched buffer fires (``FALSE_ALARM_PROB``), and the
#: margin it sets, in standard deviations of log max|x| about its level (``EXCURSION_Z``). The
#: max of many values is Gumbel-distributed on a log scale whatever their tail (Fisher-Tippett;
#: the log of a Fréchet max is Gumbel), and a Gumbel's right tail is P(G > μ + kσ) =
#: 1 - exp(-exp(-γ - kπ/√6)) (γ Euler's constant): k = 12.1 for 1e-7. Lighter-tailed values
#: (a normal max, a lognormal) have lighter tails still; measured on simulated healthy streams
#: by ``benchmarks/bench_ema_alarm.py``.
FALSE_ALARM_PROB = 1e-7
EXCURSION_Z = (-math.log(FALSE_ALARM_PROB) - 0.5772156649015329) * math.sqrt(6.0) / math.pi

#: Observations before a watched threshold's margin rests on its measured spread alone: the
#: noise variance's own memory (1/NOISE_RATE), after which it is no longer a plain small-sample
#: mean. Before, the margin is at least EXCURSION_FACTOR (a cold start, not a bound).
COLD_OBS = round(1.0 / NOISE_RATE)

#: The quantile measured for a watched threshold: the max (over the finite elements), the
#: statistic the check compares; :func:`finite_abs_max` computes it.
Q = 1.0

#: Buffers measured only to give the sentinel a threshold (checked first, then measured, so
#: a step's own excursion never raises the bound it is checked against).
WATCHED = ("obs", "logits", "loss", "grad_trunk")


#: What an env step hands the runner (slot ``env.<name>``) and the replay fields a learn step
#: consumes (slot ``replay.<name>``): every source of data that reaches the loss. The actions
#: are indices the agent chose, never a value read from data, so they are not watched.
ENV_FIELDS = ("obs", "reward", "final_obs")
BATCH_FIELDS = ("obs", "reward", "next_obs", "discount", "weights")


def watch_slots() -> list[Slot]:
    """The state-vector slots of the threshold scales (declare them in the layout)."""
    return [
        Slot(f"{n}_scale", doc=f"max this fold of the threshold on max |{n}|: sentinel threshold")
        for n in WATCHED
    ]


class _Moment:
    """An Adam moment of ``p`` (``exp_avg`` or ``exp_avg_sq``) as the sentinel checks it; None
    before the first step. The fault-injection hook writes into what it returns."""

    def __init__(self, optimizer: torch.optim.Optimizer, p: Tensor, key: str):
        self.optimizer, self.p, self.key = optimizer, p, key

    def __call__(self) -> Tensor | None:
        return self.optimizer.state.get(self.p, {}).get(self.key)


def finite_abs_max(tensors: list[Tensor]) -> Tensor:
    """max |x| over the finite elements of each tensor (one or more), float32 ``[len]``; 0 for
    a tensor with none: :func:`trimtab.abs_quantiles` at ``q = 1`` exactly (the order
    statistic of rank n of the finite |x|), in three multi-tensor passes instead of a selection
    per tensor (about 15x cheaper on the CPU). No sync."""
    nonempty = [t.detach().reshape(-1) for t in tensors if t.numel()]
    found = iter(())
    if nonempty:
        mags = torch._foreach_abs(nonempty)
        for m in mags:  # NaN and ±Inf read as 0, which no finite |x| is below
            m.nan_to_num_(nan=0.0, posinf=0.0)
        found = iter(torch._foreach_max(mags))
    zero = torch.zeros((), dtype=torch.float32, device=tensors[0].device)
    return torch.stack([next(found).float() if t.numel() else zero for t in tensors])


def watch_threshold(ema: AdaptiveEMA, z: float = EXCURSION_Z) -> Tensor:
    """The threshold on max|x| per slot of a log-scale estimator of max|x|: its level times
    ``exp(z · sd)``, sd = ``sqrt(noise_var + std_error²)`` the spread of one new log max about
    the estimated level. NaN where the slot is unset. Cold start: until the spread rests on
    ``COLD_OBS`` observations (a variance from a handful of differences can be any size), the
    margin is at least ``EXCURSION_FACTOR``, and exactly that until it is measured at all. No
    host sync. The arithmetic is the estimator's (:meth:`trimtab.AdaptiveEMA.upper_bound_log`,
    the reference of the fused fold's kernel) with this module's constants."""
    return ema.upper_bound_log(z, cold_factor=EXCURSION_FACTOR, cold_obs=COLD_OBS)


class Checks:
    """The sentinel's slots for one agent, and the calls of the learn step that feed them.

    Phases, in the order data flows: ``env`` (what an env step returned, checked by the runner
    before replay stores it), ``batch`` (every replay field of a sampled batch, checked first
    thing in the learn step, before anything consumes it), ``forward`` (observations, the C51
    atom span, the
    targets and trunk where no clamp guards them, logits, loss), ``backward_heads`` (the
    gradient where it leaves the heads: a hook on the trunk output), ``backward`` (every
    parameter's gradient), ``optimizer`` (every weight and both Adam moments). ``guarded``
    names the buffers a clamp checks itself in the same pass (:func:`trimtab.guard_`): their
    slots are fed by the clamp, not read here. Thresholds come from state-vector slots: a bound
    that a consumer uses, or a ``*_scale`` slot that :meth:`_fold` keeps at the largest threshold
    this fold. Diagnostics never change training: with :attr:`enabled` False no check runs and
    every number of the step is unchanged (tested).

    It is the trainer's :class:`trimtab.guard.StepChecks`: the Guard's loss, gradient and
    weight phases run :meth:`loss` (the forward phase), :meth:`gradients` and :meth:`weights`.
    """

    def __init__(
        self,
        state: StateVector,
        sentinel: Sentinel,
        policy: str,
        guarded: dict[str, bool],
        thresholds: dict[str, str],
        measure_every: int = 1,
    ) -> None:
        self.state, self.sentinel, self.policy = state, sentinel, policy
        self.guarded, self.thresholds = guarded, thresholds
        self.device = state.tensor.device
        with detached():  # reset with this object's own registration below
            self.watch_ema = AdaptiveEMA(len(WATCHED), device=self.device)
        self._seen: dict[str, Tensor] = {}
        self._loss = torch.zeros((), device=self.device)
        self._masks: dict[tuple[str, ...], Tensor] = {}
        #: This step's max |x| of the watched buffers measured so far (after their checks),
        #: folded together by :meth:`gradients`: one estimator update a step.
        self._pending: dict[str, Tensor] = {}
        #: The learn steps that measure the watched buffers (and fold them): the measured
        #: bounds' cadence (``run.measure_every``; every step on CUDA, every 16th on the CPU in
        #: adaptive mode). Every step is checked against the thresholds in force either way.
        self.cadence = Cadence(measure_every, "the sentinel's watched thresholds")
        self._scale_index = torch.tensor(
            [state.index(f"{n}_scale")[0] for n in WATCHED], device=self.device
        )
        #: The largest gradient-clip bound this fold, what the gradients' and Adam's moments'
        #: threshold multiplies (NaN until the clip measures one; raised by :meth:`weights`).
        #: Not the bound itself: the clip bound follows the gradients down by orders of
        #: magnitude once a task is learned (CartPole: 0.25 early, 1.4e-4 at 480k steps), and a
        #: healthy gradient 1e3 times that fired (a halt at x1000, 9e501b0). The watched
        #: buffers' thresholds hold their largest scale this fold for the same reason.
        self.grad_scale = torch.full((1,), math.nan, device=self.device)
        #: Test hook: ``(slot name, step, value)`` writes ``value`` into that slot's buffer right
        #: before its check number ``step`` (the step the sentinel will report).
        self.fault: tuple[str, int, float] | None = None
        #: False runs no check at all: the test of invariant 7 (diagnostics change nothing).
        self.enabled = True
        self._checks: dict[str, int] = {}
        register(
            self, "reset", name="checks",
            what="forget the threshold-scale estimator, the largest clip bound and the "
            "fault-injection counters",
        )  # fmt: skip

    # --- wiring ---------------------------------------------------------------------------
    def attach(self, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Name the sentinel's slots for ``net`` and its ``optimizer``, in data-flow order (ties
        in a phase are reported in the order added: an overflowing trunk is named, not the
        logits after it)."""
        s, seen = self.sentinel, self._seen

        def above(
            slot: str, i: int | None = None, factor: float = EXCURSION_FACTOR, power: int = 1
        ) -> Rule:
            view = self.state[slot] if i is None else self.state[slot][i]
            return Rule.above(view, factor=factor, name=slot, power=power)

        def watched(name: str) -> Rule:  # a *_scale slot holds the threshold itself
            return above(f"{name}_scale", factor=1.0)

        def source(name: str) -> Callable[[], Tensor | None]:
            return lambda: seen.get(name)

        for name in ENV_FIELDS:
            rule = watched("obs") if "obs" in name else above("targets_bound")
            s.add(f"env.{name}", source(f"env.{name}"), rule, phase="env")
        for name in BATCH_FIELDS:
            rule = {"obs": watched("obs"), "next_obs": watched("obs"),
                    "reward": above("targets_bound")}.get(name)  # fmt: skip
            s.add(f"replay.{name}", source(f"replay.{name}"), rule, phase="batch")
        s.add("obs", source("obs"), watched("obs"), phase="forward")
        # the support's edge against the bound it is read from (adaptive): a 1e30 there fires
        s.add("atom_span", source("atom_span"), above("targets_bound"), phase="forward")
        for name in ("targets", "trunk"):  # a guarded one is fed by its clamp (source None)
            src = None if self.guarded[name] else source(name)
            s.add(name, src, above(self.thresholds[name]), phase="forward")
        s.add("logits", source("logits"), watched("logits"), phase="forward")
        s.add("loss", self._loss, watched("loss"), phase="forward")
        s.add("grad.trunk_output", source("grad_trunk"), watched("grad_trunk"),
              phase="backward_heads")  # fmt: skip

        def grads(power: int = 1) -> Rule:
            return Rule.above(self.grad_scale, factor=EXCURSION_FACTOR, power=power,
                              name="grad_clip_bound (largest this fold)")  # fmt: skip

        for name, p in net.named_parameters():
            s.add(f"grad.{name}", lambda p=p: p.grad, grads(), phase="backward")
        for name, p in net.named_parameters():
            g = 0 if p.ndim >= 2 else 1  # the optimizer group, and so the slot element
            s.add(f"weight.{name}", p, above("adam_weight_bound", g), phase="optimizer")
            # Adam's moments average the clipped gradients: |m| <= max |g| <= the clip bound
            # (an element is at most its tensor's norm) and v <= (max |g|)² too, so both
            # excursions are the gradients' (the same threshold, squared for v: no square root
            # of v is taken; a NaN or an Inf in v fires as non-finite). Not a multiple of the
            # moments' own p99: when the gradient is sparse (IQN's gradients ~1e-3 of C51's at
            # a reward scale of 1e-3) max |m| exceeds 1e3 x the group's p99 in health (a false
            # alarm on 5 of 6 market runs at x0.001).
            for moment, key, power in (("adam_m", "exp_avg", 1), ("adam_v", "exp_avg_sq", 2)):
                rule = grads(power)
                s.add(f"{moment}.{name}", _Moment(optimizer, p, key), rule, phase="optimizer")

    # --- the runner's and the learn step's calls ----------------------------------------------
    def env(self, obs: Tensor, reward: Tensor, final_obs: Tensor, policy: NonFinitePolicy) -> None:
        """Phase ``env``: an env step's output, before replay stores it or the agent acts on it;
        then ``policy`` (sanitize zeroes what is non-finite; skip waits for a batch holding it)."""
        self._seen.update({"env.obs": obs, "env.reward": reward, "env.final_obs": final_obs})
        self._check("env")
        policy.source([obs, reward, final_obs])

    def batch(self, batch: dict[str, Tensor], policy: NonFinitePolicy) -> None:
        """Phase ``batch``: every replay field the step consumes, before anything reads it;
        then ``policy`` (skip: the step is skipped; sanitize: non-finite elements are zeroed)."""
        fields = [batch[k] for k in BATCH_FIELDS if k in batch]
        self._seen.update({f"replay.{k}": batch[k] for k in BATCH_FIELDS if k in batch})
        self._check("batch")
        policy.inputs(fields)

    def see(self, name: str, x: Tensor) -> None:
        """Hold ``x`` as this step's buffer ``name`` for the next check of its phase."""
        self._seen[name] = x

    def see_forward(self, obs: Tensor, atom_span: Tensor, logits: Tensor) -> None:
        """Hold the forward phase's buffers besides the loss, for :meth:`loss` to check. The
        atom span and the logits are made contiguous (a branch-shared support is one value
        expanded over the branches; several branches' dueling logits are a strided view): the
        sentinel's kernel reads contiguous tensors only, and one strided slot would send the
        phase's whole check to its torch reference (dozens of kernels; one copy instead)."""
        self._seen.update(obs=obs.contiguous(), atom_span=atom_span.contiguous(),
                          logits=logits.detach().contiguous())  # fmt: skip

    def loss(self, loss: Tensor) -> None:
        """Phase ``forward`` (the Guard's loss check, :meth:`trimtab.Guard.check_loss`): the
        loss with what :meth:`see_forward` and :meth:`see` hold, then measure the watched
        buffers' max |x| (folded into their threshold scales by :meth:`gradients`)."""
        self._loss.copy_(loss.detach())
        self._check("forward")
        self._measure({"obs": self._seen["obs"], "logits": self._seen["logits"],
                       "loss": self._loss})  # fmt: skip

    def trunk_grad(self, g: Tensor) -> None:
        """Hook on the trunk output: phase ``backward_heads``, then measure it likewise."""
        self._seen["grad_trunk"] = g
        self._check("backward_heads")
        self._measure({"grad_trunk": g})

    def gradients(self) -> None:
        """Phase ``backward``: every parameter's gradient, before anything rewrites it; then
        the step's one fold of the watched buffers into their threshold scales. (No check
        reads an ``*_scale`` slot between the measurements and this fold, and the estimator's
        slots are independent, so this is the fold of each buffer right after its check.)"""
        self._check("backward")
        self._fold()

    def weights(self) -> None:
        """Phase ``optimizer``: every weight and both moments after the step, the moments
        against the largest clip bound this fold, raised first by this step's."""
        if self.enabled:
            torch.fmax(self.grad_scale, self.state["grad_clip_bound"].reshape(1),
                       out=self.grad_scale)  # fmt: skip
        self._check("optimizer")

    # --- internals ------------------------------------------------------------------------
    def _check(self, phase: str) -> None:
        if not self.enabled:
            return
        if self.fault is not None:
            slot = self.sentinel._slots.get(self.fault[0])
            if slot is not None and slot.phase == phase and slot.source is not None:
                src = slot.source
                t = src if isinstance(src, Tensor) else src()
                self.inject(self.fault[0], t, phase)
        self.sentinel.check(phase)
        self._checks[phase] = self._checks.get(phase, 0) + 1

    def inject(self, name: str, x: Tensor | None, counter: str) -> None:
        """Write the fault into ``x`` if it is due at this check (test hook); a clamp that
        checks its own buffer calls this with ``counter = "guard:" + name``."""
        f = self.fault
        if f is None or f[0] != name or x is None:
            return
        if self._checks.get(counter, 0) == f[1]:
            with torch.no_grad():
                x.view(-1)[x.numel() // 2] = f[2]
        if counter.startswith("guard:"):
            self._checks[counter] = self._checks.get(counter, 0) + 1

    @torch.no_grad()
    def _measure(self, values: dict[str, Tensor]) -> None:
        """Hold max |x| of watched buffers (after their check) for this step's fold, on the
        steps the cadence measures."""
        if not self.cadence.due:
            return
        names = [n for n in WATCHED if n in values]
        self._pending.update(zip(names, finite_abs_max([values[n] for n in names]).unbind()))

    @torch.no_grad()
    def _fold(self) -> None:
        """Fold the held max|x| of watched buffers into their thresholds: one log-scale
        estimator update and one write of the slots for all of them
        (:meth:`trimtab.AdaptiveEMA.update_log_and_raise`). A slot holds the largest
        threshold this fold (:func:`watch_threshold`, the slots reset at a boundary), so
        gradients that shrink by orders of magnitude as training converges keep the threshold
        of their largest scale; a healthy buffer exceeds it with probability about
        ``FALSE_ALARM_PROB`` per check (the Gumbel model; measured, ≲ 1e-6 on power-law
        buffers), a 1e30 or a NaN at once. Ends the step's count of the cadence."""
        self.cadence.take()
        if not self._pending:
            return
        key = tuple(n for n in WATCHED if n in self._pending)
        if key not in self._masks:  # built once per set of names (a host-to-device copy)
            self._masks[key] = torch.tensor([n in key for n in WATCHED], device=self.device)
        mask = self._masks[key]
        zero = next(iter(self._pending.values())).new_zeros(())
        obs = torch.stack([self._pending.get(n, zero) for n in WATCHED])
        self._pending.clear()
        # update_log, then fmax of each masked slot with its watch_threshold: on CUDA one
        # launch (the threshold and the write were 23 more operators); on the CPU the same ops.
        self.watch_ema.update_log_and_raise(
            obs, mask, self.state.tensor, self._scale_index,
            z=EXCURSION_Z, cold_factor=EXCURSION_FACTOR, cold_obs=COLD_OBS,
        )  # fmt: skip

    def _watch(self, values: dict[str, Tensor]) -> None:
        """Measure and fold ``values`` at once (what a learn step does over its phases)."""
        self._measure(values)
        self._fold()

    # --- reports ----------------------------------------------------------------------------
    def reset(self) -> None:
        self.watch_ema.reset()
        self.cadence.reset()
        self.grad_scale.fill_(math.nan)
        self._checks.clear()
        self._pending.clear()

    def halt_message(self) -> str | None:
        """The first firing, when the policy is ``halt`` and anything fired (a host read)."""
        if self.policy != "halt" or not bool(self.sentinel.fired()):
            return None
        first = self.sentinel.report()[0]
        unit = "batched env step" if first.phase == "env" else "learn step"
        # The flag is read every run.check_every steps, not every step: say how many steps ran
        # past the fire (the loop halts before any checkpoint holds them).
        done = self.sentinel.steps().get("batch", 0)  # learn steps of this fold so far
        after = done - 1 - first.step if first.phase != "env" else 0
        late = (
            f"; {after} learn step(s) ran after it before the host read the flag (not "
            "checkpointed; resume from the last checkpoint)"
            if after > 0
            else ""
        )
        return (
            f"sentinel slot {first.name!r} fired first: {first.kind} in phase {first.phase} "
            f"at {unit} {first.step} of this fold (value {first.value}){late}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"watch_ema": self.watch_ema.state_dict(), "grad_scale": self.grad_scale.clone(),
                "cadence": self.cadence.state_dict()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.watch_ema.load_state_dict(state["watch_ema"])
        self.cadence.load(state.get("cadence"))  # a checkpoint from before it: counts from 0
        # a checkpoint from before the slot: unset, raised again by the next step's clip bound
        self.grad_scale.copy_(state.get("grad_scale", torch.full((1,), math.nan)))
