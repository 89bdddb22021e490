"""``trimtab.optim.Adam``: AdamW whose weight bound, weight decay and L1 strength are measured.

A real ``torch.optim.Optimizer`` (param groups, state dicts, LR schedulers, CUDA graphs); with
every trimtab feature off it is ``torch.optim.AdamW``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import torch

from trimtab._cadence import Cadence
from trimtab._headroom import check_headroom
from trimtab._impl import resolve_impl
from trimtab.engagement import EngagementCorrection
from trimtab.estimate import AdaptiveEMA
from trimtab.kernels import optim_layout as lay
from trimtab.lifecycle import register
from trimtab.optim import _multi_tensor as mt
from trimtab.optim import _reference as ref
from trimtab.optim._checkpoint import Checkpoints
from trimtab.optim._finalize import ReferenceFinalize
from trimtab.optim._groups import check_group, undecorated
from trimtab.optim._slots import _SLOT_DOCS, NORM_EPS, SLOT_NAMES, WEIGHT_BOUND_FLOOR
from trimtab.optim._triton_path import TritonPath
from trimtab.state import LayoutMismatchError, Slot, StateVector

__all__ = ["NORM_EPS", "SLOT_NAMES", "WEIGHT_BOUND_FLOOR", "Adam", "adam_slots"]

_INF = math.inf


def adam_slots(num_groups: int, prefix: str = "adam") -> list[Slot]:
    """The slots an :class:`Adam` over ``num_groups`` groups needs, to include in a shared
    :class:`~trimtab.StateVector` passed as ``state_vector=``."""
    return [
        Slot(f"{prefix}_{n}", size=num_groups, reset="unset", doc=_SLOT_DOCS[n]) for n in SLOT_NAMES
    ]


class Adam(Checkpoints, ReferenceFinalize, TritonPath, torch.optim.Optimizer):
    r"""AdamW with a measured weight clamp, adaptive decoupled weight decay and an adaptive L1
    proximal step, every magnitude read from a state-vector slot.

    **Step** (per parameter group; ``u`` is the Adam direction, :math:`\eta` the lr):

    .. math::
        u = \hat m / (\sqrt{\hat v} + \epsilon), \quad
        w \leftarrow \operatorname{clamp}\big(\operatorname{prox}_{\eta\lambda_1}
        (w (1 - \eta\lambda) - \eta u),\ \pm b\big)

    Bias correction and decoupled decay are AdamW's (Loshchilov & Hutter 2019). With
    ``weight_decay=<float>``, ``weight_clamp=False`` and ``l1=False`` the arithmetic is exactly
    ``torch.optim.AdamW``'s.

    **Statistics oracle.** The same pass over ``w, g, m, v`` yields, per group, ``Σ w·u, Σ w², Σ
    u², Σ|u|, Σ_{L1}|w|, Σ g², Σ v̂``, the q-quantile of ``|w|`` (after the update, before the
    clamp), ``|m|`` and ``|v|``, the clamp's engagement count and the max ``|w|``; each step's
    observation is folded into the slots by an :class:`~trimtab.AdaptiveEMA`. The coefficients a
    step uses come from the slots as they stood before it (one step of lag, so the kernel reads
    every tensor once). Every path computes the same statistics by one definition
    (:mod:`trimtab.kernels.optim_layout`): the sums cover every element, and the quantiles
    come from a rotating systematic sample of 1024-element chunks (at least 2**17 elements,
    every chunk once per at most 64 steps; every element below 256K parameters), read to
    within 2**-8 below the sampled order statistic (within a factor 2 below on a step where
    the quantile moves by more than √2). The reference
    (:func:`trimtab.optim._reference.adam_group_step_reference`, the oracle) samples and
    bins the very elements the kernel does. On CUDA (:mod:`trimtab.kernels.optim`) a step is
    one fused update launch per group, then one finalize launch for all groups (quantiles,
    engagement correction, both EMAs, slots, step counters): two launches in all for one
    group, no host sync, capturable in a CUDA graph.

    **Skipped steps** (``step(found_inf=flag)``, or a ``torch.amp.GradScaler`` stepping this
    optimizer, which hands it its scale and flag): a nonzero flag leaves parameters, moments,
    step counts and every statistic, estimate and slot bitwise unchanged, decided on the
    device (a select in the reference, masked stores in the kernels).

    **Weight clamp** (``weight_clamp=True``): ``|w| <= b``, ``b`` the group's ``weight_bound``
    slot read as ``max(slot, WEIGHT_BOUND_FLOOR)``, no clamp while unset. The slot is the EMA
    of p99 ``|w|`` (folded on a log scale, as are the three quantile slots: their noise is
    multiplicative, and ``exp`` of the estimate stays positive whatever the filter
    extrapolates) raised by :class:`~trimtab.EngagementCorrection`: a clamp at the p99 engages
    on about 1% of weights by construction; a significantly higher rate means the weights are
    growing past a stale bound, and the observation is raised toward the observed max.
    ``weight_headroom`` ``h >= 1`` moves where the clamp binds to ``h b`` while the test still
    counts the exceedances of ``b``. At ``h = 1`` the clamp cuts the top 1% of the weights on
    every step. The measured p99 then sees those weights only as far as one step carries them
    past ``b``, so the bound can rise only as fast as the engagement test raises it, and the
    weights can grow no faster than that. On CartPole this held C51's cross-entropy at 3.5-3.6
    at 100k steps, against 2.7-2.9 with no weight clamp (docs: results/stability.md). At ``h > 1``
    the clamp binds only on weights ``h`` times past the measured p99 (an excursion), and the
    p99 follows the weights as they grow.

    **Adaptive decay** (``weight_decay="auto"``). The update is
    :math:`w' = (1 - \eta\lambda) w - \eta u`, so per step

    .. math::
        \|w'\|^2 - \|w\|^2 = -2\eta\lambda\|w\|^2 - 2\eta\, w\cdot u + \eta^2\|u\|^2
        + O(\eta^2\lambda),

    which vanishes (``‖w‖`` in equilibrium) at

    .. math:: \lambda^* = \frac{-w\cdot u + \tfrac{\eta}{2}\|u\|^2}{\max(\|w\|^2, \epsilon)}.

    With L1 on, the proximal step already shrinks ``‖w‖²`` by about
    :math:`2\eta\lambda_1 \sum_{L1}|w|` per step, so the observation is taken net of it,
    :math:`\lambda^* - \lambda_1 \sum_{L1}|w| / \|w\|^2`: decay adds only the shrink that L1
    does not already provide, instead of doubling it (which held back weights that had to grow).
    The observation :math:`\lambda^*` is smoothed by the EMA. Applying it whenever it is
    positive (whenever the update pushes the weights outward) is wrong twice over. It is a
    ratchet: inward steps shrink ``‖w‖`` and outward ones are cancelled, so the norm can fall but
    never rise. And a steady outward push is not drift: weights growing toward a distant
    solution are pushed outward just as steadily (under Adam, whose step has unit scale,
    identically), until they arrive. Measured: a regression whose solution has 300x the norm of
    the initial weights ended at 5% of it, and CartPole's weight bound fell 7x before its return
    collapsed. What tells the two apart is the gradient: approaching a solution it shrinks;
    in the runaway this optimizer exists for (Bellman targets inflate, gradients grow, Adam's
    second moment saturates, weights follow) it grows. So the same pass measures
    :math:`\rho = \sum g^2 / \sum \hat v` (this step's squared gradient against its
    bias-corrected long-run mean: about 1 while the gradient scale is steady, above 1 while it
    rises), folds :math:`\log\rho` into the slot ``grad_growth`` as its lower confidence bound
    (estimate minus ``z`` standard errors, :attr:`~trimtab.AdaptiveEMA.std_error`, ``z`` the
    engagement test's threshold at its false-alarm probability), and the rate applied is

    .. math::
        \lambda = \begin{cases}\operatorname{clamp}(\hat\lambda - z\,\mathrm{se}(\hat\lambda),
        \ 0,\ 1/\eta) & \text{if grad\_growth} > 0 \text{ (last step)} \\
        0 & \text{otherwise:}\end{cases}

    decay holds ``‖w‖`` only while the gradient scale is significantly rising and the outward
    push is confidently there; ``1/η``: a step never removes more than the whole weight. Under
    a loss that pushes outward forever with a growing gradient (the weight-drift test) the
    decay switches on and holds the weights in a shallow limit cycle; toward a solution, under
    gradient noise, and at a stationary gradient scale it stays off. A push whose gradient
    does not grow (a loss linear in ``w``) is not held by decay; the weight clamp and its
    engagement correction bound it. The sign matters: ``|w·g|`` would decay weights that the
    loss is already pulling in. It uses the Adam direction ``u``, not the gradient ``g``:
    ``u`` is the step actually applied, so only it makes the equilibrium exact, and ``u`` is
    invariant to the loss scale, so ``λ`` is too (as is ``ρ``), whereas ``|w·g|/‖w‖²`` has
    units of gradient per weight and would change if the loss were multiplied by 100.
    ``weight_decay=<float>`` fixes the rate, ``0`` switches it off.

    **L1 proximal step** (``l1=True``; on parameters of two or more dims, whose dim 1 is the
    input feature, e.g. a first ``nn.Linear`` over input features):
    :math:`w \leftarrow \operatorname{sign}(w)\max(|w| - \eta\lambda_1, 0)` with

    .. math::
        \lambda_1 = D \cdot \overline{|u|}, \qquad
        D = \frac{\log K - H(p)}{\log K}, \quad p_i = \frac{\|g_{:,i}\|}{\sum_j \|g_{:,j}\|}

    over the ``K`` input features. ``D`` is the entropy deficit: 0 while gradients spread evenly
    (no pruning), toward 1 as they concentrate on few features. The issue's rate
    ``(mean|g| / mean|w|) · D`` is a rate per unit weight; in Adam the step is ``η u`` (``η``
    carries the weight units, ``u`` is dimensionless), so the threshold per unit lr is the
    dimensionless ``D · mean|u|``: the L1 pull is the fraction ``D`` of the mean Adam step, and
    a weight survives only if its gradient signal is consistently stronger than that.

    **State vector** (``state_vector=None``: its own) with the slots of :func:`adam_slots`:
    ``{prefix}_weight_bound, _decay, _l1, _p99_w, _p99_m, _p99_v, _grad_growth``, one value
    per group. Its
    fingerprint goes into :meth:`state_dict`; a mismatched layout refuses to load.

    **Cadence** (``measure_every = k``): the statistics are taken, and folded into the slots,
    on steps ``0, k, 2k, ...`` since the last reset (a host count; the sampling phase advances
    on those steps only, so the rotating sample still covers every chunk); every step updates
    the weights with the coefficients and clamp in force. Between measurements a slot is as
    the last one left it: the weights move by at most ``k`` learning-rate steps meanwhile. A
    captured CUDA graph replays one step: capture with ``k = 1``.

    **Parameters in the optimizer's memory** (``adopt_params=True``, the CPU's multi-tensor path
    only): each group's parameters and gradients live in the optimizer's flat rows, as its
    moments always do there. Their ``.data`` and ``.grad`` become views of the rows at a step
    (adopted again after anything gives them new memory; a backward accumulates into the
    gradients in place, as into buffers zeroed in place), so a step copies nothing in or out:
    DDP's ``gradient_as_bucket_view`` idea, for the weights too. The numbers are the same. Only
    for parameters whose memory nothing else manages: FSDP's flat parameters, for one, are
    re-pointed by FSDP itself (plain ``nn.Parameter`` objects only; others are copied as by
    default). The trainer sets it for its own network.

    **Reset**: :meth:`reset_state` zeroes moments and step counts and forgets every estimate;
    the optimizer registers it with the active :class:`~trimtab.Lifecycle` on construction.

    ``capturable=True`` keeps step counts on the device (the step can be captured in a CUDA
    graph); the whole step makes no host sync either way. The Triton path (``impl=None`` on
    CUDA, float32 contiguous parameters) always keeps steps on the device.

    **Implementations** (``impl``), one signature per group step, chosen here only:
    ``"triton"`` (the fused kernels), ``"foreach"`` (:mod:`trimtab.optim._multi_tensor`: a
    group as flat buffers, a few dozen whole-group ops a step; the default wherever Triton does
    not run, e.g. the CPU) and ``"torch"`` (the readable per-tensor reference, the oracle both
    are tested against). ``None``: Triton on CUDA where it fits, else the multi-tensor path;
    a group whose tensors mix dtypes or devices takes the reference.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float | str = "auto",
        *,
        weight_clamp: bool = True,
        l1: bool = False,
        amsgrad: bool = False,
        capturable: bool = False,
        quantile: float = 0.99,
        weight_headroom: float = 1.0,
        state_vector: StateVector | None = None,
        prefix: str = "adam",
        impl: str | None = None,
        measure_every: int = 1,
        adopt_params: bool = False,
    ) -> None:
        if isinstance(quantile, bool) or not isinstance(quantile, float) or not 0 < quantile < 1:
            raise ValueError(f"quantile must be a float in (0, 1), got {quantile!r}")
        weight_headroom = check_headroom(weight_headroom, "weight_headroom", "clamp")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            weight_clamp=weight_clamp,
            l1=l1,
            amsgrad=amsgrad,
            capturable=capturable,
        )
        check_group(defaults)
        #: which steps take the statistics (each step counts one)
        self.cadence = Cadence(measure_every, "trimtab.optim.Adam")
        if not isinstance(adopt_params, bool):
            raise TypeError(f"adopt_params must be a bool, got {adopt_params!r}")
        self.adopt_params = adopt_params
        self._sealed = False
        super().__init__(params, defaults)
        self._sealed = True
        self.quantile = quantile
        self.weight_headroom = weight_headroom
        self.prefix = prefix
        all_params = [p for g in self.param_groups for p in g["params"]]
        if not all_params:
            raise ValueError("optimizer got an empty parameter list")
        device = all_params[0].device
        if any(p.device != device for p in all_params):
            raise ValueError("all parameters must be on one device (one state vector per device)")
        self.device = device
        self.impl = self._choose_impl(impl, all_params)
        num_groups = len(self.param_groups)
        self.state_vector = self._make_state_vector(state_vector, num_groups, device)
        self._ema = AdaptiveEMA(len(SLOT_NAMES) * num_groups, device=device)
        # One engagement consumer per group: its weight clamp.
        self.engagement = EngagementCorrection(
            num_groups, expected_rate=1.0 - quantile, device=device, name=f"{prefix}.engagement"
        )
        self._lr_dev = torch.zeros(num_groups, device=device)
        self._lr_host: list[Any] = [None] * num_groups
        self._consts: dict[Any, torch.Tensor] = {}
        #: Sharded parameters (:meth:`trimtab.distributed.RankConsistent.attach_optimizer`):
        #: reduces the step's workspace over the ranks before the finalize; None alone.
        self.reduce_hook: Callable[[Adam], None] | None = None
        self._init_workspace(num_groups)
        #: Per group, known on the host without reading a counter: every step counter is equal
        #: (see :meth:`_note_stepped`); the multi-tensor path then computes one bias correction.
        self._equal_steps = [True] * num_groups
        #: The multi-tensor path's group layouts, this optimizer's own: on the CPU they hold
        #: its moments (:func:`trimtab.optim._multi_tensor.adam_group_step_multi_tensor`).
        self._layouts: OrderedDict = OrderedDict()
        if self.impl == "triton":
            self._init_kernel_state()
        # torch.amp.GradScaler hands this optimizer its scale and found_inf (as attributes
        # grad_scale and found_inf) instead of unscaling and checking on the host.
        self._step_supports_amp_scaling = True
        register(
            self,
            "reset_state",
            name=f"optimizer[{prefix}]",
            what="zero Adam moments and step counts; forget weight-bound, decay and L1 estimates",
        )

    # --- construction helpers -------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_sealed", False):
            raise RuntimeError(
                "trimtab.optim.Adam sizes its state-vector slots by the number of parameter "
                "groups at construction; pass every group to the constructor"
            )
        undecorated(torch.optim.Optimizer.add_param_group)(self, param_group)
        check_group(self.param_groups[-1])

    def _choose_impl(self, impl: str | None, params: list[torch.Tensor]) -> str:
        """``"triton"`` (CUDA, float32 contiguous), ``"foreach"`` (the multi-tensor path) or
        ``"torch"`` (the per-tensor reference, the oracle: only when asked for). ``None``:
        resolve_impl's rule, with the multi-tensor path where it would pick the reference."""
        if impl not in (None, "torch", "foreach", "triton"):
            raise ValueError(
                f"impl must be None, 'torch' (the per-tensor reference), 'foreach' (multi-tensor) "
                f"or 'triton', got {impl!r}"
            )
        if impl == "foreach":
            return impl

        def bad() -> list[torch.Tensor]:
            return [p for p in params if p.dtype != torch.float32 or not p.is_contiguous()]

        chosen = resolve_impl(
            impl,
            params,
            fits=lambda: not bad(),
            why=lambda: (
                "Adam: the kernel needs float32 contiguous parameters, got "
                f"{sorted({(str(p.dtype), p.is_contiguous()) for p in bad()})} (dtype, contiguous)"
            ),
        )
        return "foreach" if impl is None and chosen == "torch" else chosen

    def _make_state_vector(
        self, sv: StateVector | None, num_groups: int, device: torch.device
    ) -> StateVector:
        self._owns_sv = sv is None
        if sv is None:
            return StateVector(adam_slots(num_groups, self.prefix), device=device)
        for slot in adam_slots(num_groups, self.prefix):
            if slot.name not in sv:
                raise LayoutMismatchError(
                    f"state_vector has no slot {slot.name!r}; include "
                    f"trimtab.optim.adam_slots({num_groups}, prefix={self.prefix!r}) in its layout"
                )
            if sv.index(slot.name)[1] != num_groups:
                raise LayoutMismatchError(
                    f"slot {slot.name!r} has size {sv.index(slot.name)[1]}, this optimizer has "
                    f"{num_groups} parameter groups"
                )
        if sv.device != device:
            raise ValueError(f"state_vector is on {sv.device}, the parameters on {device}")
        return sv

    def _const(self, key: Any, values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        """A device tensor of host ``values``, built once per distinct value (no per-step copy)."""
        full_key = (key, tuple(values), dtype)
        t = self._consts.get(full_key)
        if t is None:
            t = torch.tensor(values, dtype=dtype).to(self.device)
            self._consts[full_key] = t
        return t

    def _slot(self, name: str) -> torch.Tensor:
        return self.state_vector.view(f"{self.prefix}_{name}").reshape(-1)

    # --- the step -------------------------------------------------------------------------
    def _lr_vector(self) -> torch.Tensor:
        for i, group in enumerate(self.param_groups):
            lr = group["lr"]
            if isinstance(lr, torch.Tensor):
                self._lr_dev[i].copy_(lr.reshape(()))
            elif self._lr_host[i] != lr:
                self._lr_dev[i].fill_(lr)  # a fill with a host scalar: no copy, no sync
                self._lr_host[i] = lr
        return self._lr_dev

    def _init_workspace(self, num_groups: int) -> None:
        """The step's workspace (layout: :mod:`trimtab.kernels.optim_layout`), the same for
        both paths: per group the scalar partials, histograms, window bases and the L1
        gradients' entropy deficit; one sampling phase."""
        dev = self.device
        shape = (num_groups, lay.REPLICAS, lay.PART_WIDTH)
        self._parts = torch.zeros(shape, dtype=torch.int32, device=dev)
        self._ints = torch.zeros(num_groups, lay.INT_WIDTH, dtype=torch.int32, device=dev)
        self._sel = torch.full((num_groups, 3), -1, dtype=torch.int32, device=dev)
        self._phase = torch.zeros(1, dtype=torch.int32, device=dev)
        self._deficit = torch.full((num_groups,), math.nan, device=dev)
        self._fold_ws = torch.zeros(lay.fold_shape(num_groups), device=dev)  # Triton finalize
        self._slot_views = [
            tuple(self._slot(n)[gi] for n in ("decay", "l1", "weight_bound"))
            for gi in range(num_groups)
        ]

    def _work(self, gi: int) -> lay.Workspace:
        return lay.Workspace(self._parts[gi], self._ints[gi], self._sel[gi], self._phase)

    def _clear_workspace(self) -> None:
        self._sel.fill_(-1)
        self._phase.zero_()
        self._ints.zero_()
        self._parts.zero_()
        self._deficit.fill_(math.nan)

    @staticmethod
    def _needs_stats(group: Mapping[str, Any]) -> bool:
        return group["weight_decay"] == "auto" or group["weight_clamp"] or group["l1"]

    def _state_of(self, p: torch.Tensor, group: Mapping[str, Any]) -> dict[str, Any]:
        state = self.state[p]
        on_device = group["capturable"] or self.impl == "triton"
        step_device = p.device if on_device else torch.device("cpu")
        if len(state) == 0:
            fmt = torch.contiguous_format if self.impl == "triton" else torch.preserve_format
            state["step"] = torch.zeros((), dtype=torch.float32, device=step_device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=fmt)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=fmt)
        elif state["step"].device != step_device:  # e.g. loaded from a non-capturable run
            state["step"] = state["step"].to(device=step_device, dtype=torch.float32)
        return state

    def _group_tensors(self, group: Mapping[str, Any]) -> tuple[list[torch.Tensor], ...]:
        params, grads, ms, vs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("trimtab.optim.Adam does not support sparse gradients")
            state = self._state_of(p, group)
            params.append(p)
            grads.append(p.grad)
            ms.append(state["exp_avg"])
            vs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        return params, grads, ms, vs, steps

    def _skip_flag(self, found_inf: torch.Tensor | None) -> torch.Tensor | None:
        """``found_inf`` (or GradScaler's ``self.found_inf``) as a 0-dim float32 device tensor."""
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
            if found_inf is None:
                return None
        if not isinstance(found_inf, torch.Tensor) or found_inf.numel() != 1:
            raise TypeError(
                "found_inf must be a one-element tensor (nonzero: skip this step), got "
                f"{found_inf!r}; pass found_inf=None to always step"
            )
        if found_inf.device != self.device:
            raise ValueError(
                f"found_inf is on {found_inf.device}, the parameters on {self.device}; the "
                "skip is decided on the parameters' device (a copy here would be a host sync)"
            )
        on_host = [not g["capturable"] for g in self.param_groups]
        if self.impl != "triton" and self.device.type != "cpu" and any(on_host):
            raise ValueError(
                "found_inf needs step counts on the device: pass capturable=True (the "
                "reference path on a GPU keeps them on the CPU otherwise), or found_inf=None"
            )
        return found_inf.reshape(()).to(torch.float32)

    @torch.no_grad()
    def step(self, closure: Any = None, *, found_inf: torch.Tensor | None = None) -> Any:
        """One optimizer step over every parameter with a gradient; no host sync.

        ``found_inf``: a one-element device tensor (bool or float), as
        ``torch.amp.GradScaler`` computes it; nonzero skips the step on the device: parameters,
        moments, step counts and every statistic and slot stay exactly as they were. A
        GradScaler that steps this optimizer passes its scale and ``found_inf`` itself (the
        gradients are then unscaled inside the step)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        skip = self._skip_flag(found_inf)
        grad_scale = getattr(self, "grad_scale", None)
        if self.impl == "triton":
            from trimtab.kernels.optim import adam_group_step_triton as kernel_step
        observed = [False] * len(self.param_groups)
        measure = self.cadence.take()
        all_steps: list[torch.Tensor] = []
        for gi, group in enumerate(self.param_groups):
            params, grads, ms, vs, steps = self._group_tensors(group)
            if not params:
                continue
            lr = group["lr"]
            if self.impl == "triton" and isinstance(lr, torch.Tensor):
                raise ValueError(
                    "the Triton path takes a Python float lr; use impl='torch' for a tensor lr"
                )
            stats = measure and self._needs_stats(group)
            observed[gi] = stats
            l1_params = [group["l1"] and p.dim() >= 2 for p in params]
            if stats and any(l1_params):
                cols = [ref.feature_axis_sq_norms(g) for g, f in zip(grads, l1_params) if f]
                self._deficit[gi].copy_(ref.entropy_deficit(cols, self.device))
            wd = group["weight_decay"]
            beta1, beta2 = group["betas"]
            if self.impl == "triton":
                group_step = kernel_step
            elif self.impl == "foreach" and mt.fits(params, grads):
                group_step = partial(mt.adam_group_step_multi_tensor, cache=self._layouts,
                                     equal_steps=self._equal_steps[gi],
                                     adopt_params=self.adopt_params)  # fmt: skip
            else:  # the reference: asked for, or a group of mixed dtypes or devices
                group_step = ref.adam_group_step_reference
            group_step(
                params, grads, ms, vs, steps, self._work(gi),
                lr=lr, beta1=beta1, beta2=beta2, eps=group["eps"],
                weight_decay=None if wd == "auto" else float(wd), slots=self._slot_views[gi],
                l1_params=l1_params, clamp=group["weight_clamp"], stats=stats,
                floor=WEIGHT_BOUND_FLOOR, skip=skip, grad_scale=grad_scale,
                capturable=group["capturable"], headroom=self.weight_headroom,
            )  # fmt: skip
            all_steps.extend(steps)
            self._note_stepped(gi, len(params))
        if not all_steps:
            return loss
        if self.reduce_hook is not None and any(observed):  # the ranks count alike
            self.reduce_hook(self)
        if self.impl == "triton" and self._finalize_impl == "triton":
            self._finalize_triton(observed, all_steps, skip)
        else:
            self._finalize_reference(observed, all_steps, skip)
        return loss

    def _note_stepped(self, gi: int, stepped: int) -> None:
        """Group ``gi``'s counters stay equal while every step steps all of its parameters:
        they start equal (created together at the first step, or zeroed by :meth:`reset_state`)
        and the finalize adds one increment to every counter it steps (skipped or not). A
        parameter left out (no gradient) ends it until the next reset or load."""
        if stepped != len(self.param_groups[gi]["params"]):
            self._equal_steps[gi] = False

    # --- lifecycle ------------------------------------------------------------------------
    @torch.no_grad()
    def reset_state(self) -> None:
        """Zero moments and step counts, forget every estimate: the next step is that of a
        fresh optimizer. In place, so a captured CUDA graph keeps working."""
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                if key in state:
                    state[key].zero_()
        self._ema.reset()
        self.engagement.reset()
        for name in SLOT_NAMES:
            self._slot(name).fill_(math.nan)
        self._equal_steps = [True] * len(self.param_groups)
        self.cadence.reset()
        self._clear_workspace()
