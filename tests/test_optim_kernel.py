"""The fused Adam kernels against their references (interpreter on the CPU, native on the GPU):
the update and the workspace it writes (sums, counts, the sampled histograms) from identical
states through one signature, the window quantiles, the finalize kernel against the torch
finalize, and the whole optimizer's two paths over many steps with every feature on."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import trimtab.optim as topt
from trimtab.kernels import optim as kern
from trimtab.kernels import optim_layout as lay
from trimtab.kernels._table import pointer_table
from trimtab.optim import _reference as ref

# The interpreter evaluates masked-off lanes too (NaN of unset estimates): numpy warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SHAPES = [(0,), (1,), (37,), (lay.BLOCK + 1,), (3, 131)]
STEP = {"torch": ref.adam_group_step_reference, "triton": kern.adam_group_step_triton}


def _state(device, seed=0, nonfinite=False, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(s, generator=g).to(device) for s in shapes]
    gs = [torch.randn(s, generator=g).to(device) for s in shapes]
    ms = [0.1 * torch.randn(s, generator=g).to(device) for s in shapes]
    vs = [0.01 * torch.rand(s, generator=g).to(device) for s in shapes]
    if nonfinite:
        gs[2][3] = math.nan
        ws[4][0, 5] = math.inf
        ws[2][7] = -0.0
        ws[3][11] = 1e-40  # subnormal
    return ws, gs, ms, vs


class Workspace:
    """One group's workspace, as the optimizer holds it (G = 1)."""

    def __init__(self, device, replicas=lay.REPLICAS):
        shape = (1, replicas, lay.PART_WIDTH)
        self.parts = torch.zeros(shape, dtype=torch.int32, device=device)
        self.ints = torch.zeros(1, lay.INT_WIDTH, dtype=torch.int32, device=device)
        self.sel = torch.full((1, 3), -1, dtype=torch.int32, device=device)
        self.phase = torch.zeros(1, dtype=torch.int32, device=device)

    def work(self):
        return lay.Workspace(self.parts[0], self.ints[0], self.sel[0], self.phase)

    def quantiles(self, q=0.99):
        """Quantiles of this step (reference finish), then ready for the next step."""
        value, nxt = lay.window_quantiles_reference(self.ints, self.sel, q)
        self.sel.copy_(nxt)
        return value[0]

    def stats(self):
        """The scalar partials reduced over the replicas, in the statistics row's order."""
        return lay.parts_reference(self.parts)[0]

    def clear(self):
        self.ints.zero_()
        self.parts.zero_()
        self.phase.add_(1)


def _group_step(impl, ws, gs, ms, vs, steps, wk, *, features, lr, skip=None, **kw):
    """One group's step by ``impl``, through the one signature both implementations take."""
    device = ws[0].device
    coef = torch.tensor([0.3, 0.2, 1.5] if features else [0.01, 0.0, math.inf], device=device)
    STEP[impl](
        ws, gs, ms, vs, steps, wk.work(), lr=lr, beta1=0.9, beta2=0.999, eps=1e-8,
        weight_decay=None if features else 0.01, slots=(coef[0], coef[1], coef[2]),
        l1_params=[features and w.dim() >= 2 for w in ws], clamp=features, stats=True,
        floor=topt.WEIGHT_BOUND_FLOOR, skip=skip, **kw,
    )  # fmt: skip


def _run(device, impl, *, features, wk=None, seed=0, nonfinite=False, lr=1e-2, shapes=SHAPES,
         **kw):  # fmt: skip
    ws, gs, ms, vs = _state(device, seed, nonfinite, shapes)
    steps = [torch.tensor(3.0, device=device) for _ in shapes]
    wk = Workspace(device) if wk is None else wk
    _group_step(impl, ws, gs, ms, vs, steps, wk, features=features, lr=lr, **kw)
    assert all(s.item() == 3.0 for s in steps)  # read as step + 1; the finalize steps them
    return ws, ms, vs, wk


def _check_stats(wk, wr, features):
    """The kernel's workspace ``wk`` against the reference's ``wr``."""
    stats, row = wk.stats(), wr.stats()
    # Sums: the reference skips nothing either, so a NaN gradient makes both non-finite.
    torch.testing.assert_close(
        stats[: lay.NUM_SUMS], row[: lay.NUM_SUMS], rtol=1e-4, atol=1e-4, equal_nan=True
    )
    torch.testing.assert_close(stats[ref.SUM_GG :], row[ref.SUM_GG :], rtol=1e-4, atol=1e-4)
    assert stats[ref.COUNT].item() == row[ref.COUNT].item()
    assert stats[ref.ENGAGED].item() == row[ref.ENGAGED].item()
    if features:
        assert row[ref.ENGAGED].item() > 0 and row[ref.SUM_L1_W].item() > 0
    # The max: exact up to the last bit's rounding of the update (FMA contraction on the GPU).
    torch.testing.assert_close(stats[ref.MAX_W], row[ref.MAX_W], rtol=1e-6, atol=0)
    _same_histograms(wk.ints, wr.ints)


def _same_histograms(a, b):
    """The same sampled elements in the same bins. Exact under the interpreter; on the GPU an
    element whose last bit rounds differently may sit in the neighbouring bin, so there the
    running counts may differ by a couple of elements."""
    slack = 2 if a.is_cuda else 0
    under = slice(lay.INT_UNDER, lay.INT_UNDER + 3)
    assert (a[:, under].long() - b[:, under].long()).abs().max() <= slack
    for off in (lay.HIST_OFFSET, lay.WINDOW_OFFSET):
        ha = a[:, off : off + 3 * lay.BINS].reshape(-1, 3, lay.BINS).long()
        hb = b[:, off : off + 3 * lay.BINS].reshape(-1, 3, lay.BINS).long()
        assert (ha.cumsum(-1) - hb.cumsum(-1)).abs().max() <= slack
        if off == lay.HIST_OFFSET:
            assert torch.equal(ha.sum(-1), hb.sum(-1))


@pytest.mark.parametrize("features", [False, True])
def test_kernel_step_matches_reference(kernel_device, features):
    ws, ms, vs, wr = _run(kernel_device, "torch", features=features, nonfinite=features)
    kw, km, kv, wk = _run(kernel_device, "triton", features=features, nonfinite=features)
    for a, b in zip(ws + ms + vs, kw + km + kv):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-6, equal_nan=True)
    _check_stats(wk, wr, features)
    # First step: no window yet, so the octave's lower edge (never above, at least half).
    q = wk.quantiles()[0]
    if not features:  # no clamp: the weights are the quantile's |w|
        exact = ref_quantile(torch.cat([w.reshape(-1) for w in ws]))
        assert q <= exact and q >= 0.5 * exact


def test_kernel_step_with_headroom_matches_reference(kernel_device):
    """Headroom 2: the clamp binds at twice the bound (1.5), and the engagement count is the
    bound's exceedances, in the kernel as in the reference."""
    ws, ms, vs, wr = _run(kernel_device, "torch", features=True, nonfinite=True, headroom=2.0)
    kw, km, kv, wk = _run(kernel_device, "triton", features=True, nonfinite=True, headroom=2.0)
    for a, b in zip(ws + ms + vs, kw + km + kv):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-6, equal_nan=True)
    _check_stats(wk, wr, True)
    flat = torch.cat([w.reshape(-1) for w in ws]).abs()
    assert flat[torch.isfinite(flat)].max() == 3.0  # the Inf weight, clamped at 2 x 1.5
    assert ((flat > 1.5) & (flat < 3.0)).any()  # weights past the bound but not cut


def ref_quantile(x, q=0.99):
    """The exact q-quantile of the finite |x| (rank ceil(n q)), for the approximation bounds."""
    a = x.abs()
    a = a[torch.isfinite(a)].sort().values
    return a[max(math.ceil(a.numel() * q), 1) - 1]


@pytest.mark.parametrize("replicas", [1, 4])
@pytest.mark.parametrize("features", [False, True])
def test_replicated_partials_reduce_to_the_reference(kernel_device, features, replicas):
    """More programs (11) than replicas: programs share rows, and the rows sum to the exact
    statistics (counts and max exactly, sums up to float32 rounding)."""
    shapes = [(5 * lay.BLOCK + 3,), (3, lay.BLOCK), (lay.BLOCK + 1,), (37,)]  # 6 + 3 + 2 + 1
    kw = dict(features=features, nonfinite=False, lr=1e-2, shapes=shapes)
    *_, wr = _run(kernel_device, "torch", **kw)
    *_, wk = _run(kernel_device, "triton", wk=Workspace(kernel_device, replicas), **kw)
    _check_stats(wk, wr, features)
    rows = wk.parts[0, :, lay.PART_FINITE]
    assert rows.gt(0).all() and rows.sum().item() == sum(math.prod(s) for s in shapes)


@pytest.mark.parametrize("features", [False, True])
def test_programs_of_several_blocks_and_odd_addresses_match_the_reference(kernel_device, features):
    """Programs stepping three blocks each (one reduction per program), and tensors at an
    address that is not 16-byte aligned (the masked path for whole blocks too)."""
    shapes = [(2 * lay.BLOCK,), (lay.BLOCK + 5,), (3, lay.BLOCK), (37,), (lay.BLOCK,)]
    ws, gs, ms, vs = _state(kernel_device, 3, False, shapes)
    # The second and last tensors start 4 bytes into their storage.
    for ts in (ws, gs, ms, vs):
        for i in (1, 4):
            ts[i] = torch.cat([ts[i].new_zeros(1), ts[i].reshape(-1)])[1:].view(shapes[i])
    assert ws[1].data_ptr() % 16 != 0 and ws[0].data_ptr() % 16 == 0
    if features:
        gs[0][3] = math.nan
        ws[2][1, 5] = math.inf
        ws[4][7] = -0.0
        ws[1][11] = 1e-40  # subnormal
    steps = [torch.tensor(3.0, device=kernel_device) for _ in shapes]
    states = [[t.clone() for t in ts] for ts in (ws, gs, ms, vs)]
    wr = Workspace(kernel_device, replicas=2)
    _group_step("torch", *states, steps, wr, features=features, lr=1e-2)
    wk = Workspace(kernel_device, replicas=2)
    _group_step("triton", ws, gs, ms, vs, steps, wk, features=features, lr=1e-2, per_program=3)
    for a, b in zip(states[0] + states[2] + states[3], ws + ms + vs):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-6, equal_nan=True)
    _check_stats(wk, wr, features)
    # Blocks per tensor 2 + 2 + 3 + 1 + 1, three per program; programs 0 and 2 share row 0
    # (with the NaN gradient of tensor 0; the Inf weight is in block 5, program 1).
    first, last = 2 * lay.BLOCK + lay.BLOCK, lay.BLOCK + 37 + lay.BLOCK
    assert wk.parts[0, 0, lay.PART_FINITE].item() == first + last - features


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_window_refines_the_quantile_to_one_part_in_256(kernel_device, impl):
    """With last step's quantile as the window centre, the quantile is within 2**-8 below."""
    wk = Workspace(kernel_device)
    _run(kernel_device, impl, features=False, wk=wk, lr=1e-6)
    coarse = wk.quantiles()  # sets the windows
    wk.clear()
    ws, ms, vs, _ = _run(kernel_device, impl, features=False, wk=wk, lr=1e-6)
    fine = wk.quantiles()
    exact = torch.stack([ref_quantile(torch.cat([t.reshape(-1) for t in x])) for x in (ws, ms, vs)])
    assert (fine <= exact).all() and (fine >= exact * (1 - 2**-8)).all()
    assert (fine >= coarse).all() and (wk.sel >= 0).all()


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_a_quantile_that_leaves_the_window_falls_back_to_its_octave(kernel_device, impl):
    wk = Workspace(kernel_device)
    _run(kernel_device, impl, features=False, wk=wk, lr=1e-6)
    wk.quantiles()
    wk.clear()
    # Same shapes, everything 8x larger: the rank lies above last step's window.
    ws, gs, ms, vs = ([8 * t for t in ts] for ts in _state(kernel_device, 0))
    steps = [torch.tensor(3.0, device=kernel_device) for _ in SHAPES]
    _group_step(impl, ws, gs, ms, vs, steps, wk, features=False, lr=1e-6)
    in_window = wk.ints[0, lay.WINDOW_OFFSET : lay.WINDOW_OFFSET + lay.BINS].sum().item()
    below = wk.ints[0, lay.INT_UNDER].item()
    assert below + in_window < 0.99 * wk.stats()[ref.COUNT].item()
    q = wk.quantiles()
    exact = ref_quantile(torch.cat([w.reshape(-1) for w in ws]))
    assert q[0] <= exact and q[0] >= 0.5 * exact
    assert math.log2(q[0].item()).is_integer()  # an octave's lower edge


def _chunk_sizes(shapes):
    """Elements of each sampling chunk, in the pointer table's order (BLOCK // SUB a block)."""
    sizes = []
    for shape in shapes:
        n = math.prod(shape)
        for j in range(max(1, -(-n // lay.BLOCK)) * (lay.BLOCK // lay.SUB)):
            sizes.append(min(max(n - j * lay.SUB, 0), lay.SUB))
    return sizes


@pytest.mark.slow
@pytest.mark.parametrize("per_program", [1, 3])
def test_sampling_covers_every_chunk_once_per_stride_steps(kernel_device, per_program):
    """Chunk c is histogrammed when (c + phase) % S == 0, also when a program steps several
    blocks, and the reference samples the very same elements; the sums see every element."""
    stride = 8
    shapes = [(5 * lay.BLOCK + 3,), (2 * lay.SUB + 5,), (lay.BLOCK,), (17,)]
    numel = sum(math.prod(s) for s in shapes)
    wk = Workspace(kernel_device, replicas=2)  # 9 blocks on 2 rows of partials
    wr = Workspace(kernel_device, replicas=2)
    seen = []
    for _ in range(stride):
        for impl, w in (("triton", wk), ("torch", wr)):
            ws, gs, ms, vs = _state(kernel_device, 1, shapes=shapes)
            steps = [torch.tensor(0.0, device=kernel_device) for _ in shapes]
            extra = dict(per_program=per_program) if impl == "triton" else {}
            _group_step(
                impl, ws, gs, ms, vs, steps, w, features=False, lr=1e-3, stride=stride, **extra
            )
        _same_histograms(wk.ints, wr.ints)
        hist = wk.ints[0, lay.HIST_OFFSET : lay.HIST_OFFSET + lay.BINS]
        seen.append(hist.sum().item())
        assert wk.stats()[ref.COUNT].item() == numel  # the sums see everything
        wk.clear()
        wr.clear()
    chunks = _chunk_sizes(shapes)
    expect = [sum(n for c, n in enumerate(chunks) if (c + t) % stride == 0) for t in range(stride)]
    assert seen == expect and sum(seen) == numel and min(seen) > 0


def test_sampled_quantile_is_within_its_documented_error():
    """2**17 sampled of 2**19 Gaussian weights: rank error sqrt(q(1-q)/n) ≈ 2.7e-4, about
    0.4% of the p99; with the window's 2**-8 the estimate stays within 2% of the exact p99.
    (The reference: it samples and bins exactly as the kernel, as the tests above show.)"""
    n = 1 << 19
    stride = lay.sample_stride(n)
    assert stride == 4
    g = torch.Generator().manual_seed(5)
    w = torch.randn(n, generator=g)
    exact = ref_quantile(w).item()
    wk = Workspace(torch.device("cpu"))
    for _ in range(3):
        z = torch.zeros_like(w)
        steps = [torch.tensor(0.0)]
        _group_step("torch", [w], [z], [z.clone()], [z.clone()], steps, wk, features=False,
                    lr=0.0, stride=stride, capturable=False)  # fmt: skip
        q = wk.quantiles()[0].item()
        wk.clear()
    assert abs(q - exact) < 0.02 * exact


def test_empty_group_quantile_is_zero():
    ints = torch.zeros(2, lay.INT_WIDTH, dtype=torch.int32)
    sel = torch.full((2, 3), -1, dtype=torch.int32)
    q, nxt = lay.window_quantiles_reference(ints, sel, 0.99)
    assert q.eq(0).all() and nxt.eq(-1).all()


def test_sample_stride():
    assert lay.sample_stride(0) == 1
    assert lay.sample_stride(2 * lay.MIN_SAMPLE - 1) == 1
    assert lay.sample_stride(10**6) == 4
    assert lay.sample_stride(10**8) == lay.MAX_SAMPLE_STRIDE
    for n in (10**6, 10**7, 10**8):
        assert n // lay.sample_stride(n) >= lay.MIN_SAMPLE


def test_kernel_modules_are_leaves():
    """kernels/optim*.py import nothing outside kernels/, and optim.py does not import the
    finalize (no cycle); the layout module needs no Triton."""
    import ast
    from pathlib import Path

    root = Path(kern.__file__).parent
    for name in ("optim.py", "optim_finalize.py", "optim_layout.py"):
        tree = ast.parse((root / name).read_text())
        mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        ours = [m for m in mods if m.startswith("trimtab")]
        assert all(m.startswith("trimtab.kernels.") for m in ours), (name, ours)
        if name == "optim.py":
            assert "trimtab.kernels.optim_finalize" not in ours
        if name == "optim_layout.py":
            assert not any(m.startswith("triton") for m in mods)


def _groups(ps):
    return [
        {"params": ps[:1], "l1": True},
        {"params": ps[1:3], "weight_decay": 0.05},
        {"params": ps[3:], "weight_clamp": False, "weight_decay": 0.0},  # no statistics
        {"params": ps[4:4]},  # never a gradient: an empty group
    ]


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [lay.REPLICAS, 1])
def test_finalize_kernel_matches_the_torch_finalize(kernel_device, monkeypatch, replicas):
    """Same update kernel, same workspaces: the one-launch finalize and the torch finalize
    (replica reduction, window quantiles, engagement correction, AdaptiveEMA, slots, a skipped
    step) agree over many steps; with one replica a group's programs share it."""
    monkeypatch.setattr(lay, "REPLICAS", replicas)
    torch.manual_seed(0)
    shapes = [(9, 5), (300,), (7,), (4,)]
    ps = [torch.randn(s, device=kernel_device, requires_grad=True) for s in shapes]
    qs = [p.detach().clone().requires_grad_() for p in ps]
    a = topt.Adam(_groups(ps), lr=3e-2, impl="triton")
    b = topt.Adam(_groups(qs), lr=3e-2, impl="triton")
    b._finalize_impl = "torch"
    for step in range(12):
        for p, q in zip(ps, qs):
            # Outward (the clamp engages) and growing (so the decay applies from step 3 on).
            p.grad = (1.0 + step) ** 2 * (torch.randn_like(p) - 0.5 * torch.sign(p.detach()))
            q.grad = p.grad.clone()
        skip = torch.tensor(float(step == 6), device=kernel_device)
        a.step(found_inf=skip)
        b.step(found_inf=skip)
    assert (a.state_vector["adam_decay"] > 0).any()  # the gated decay path ran
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.state[p]["step"], b.state[q]["step"], rtol=0, atol=0)
        assert a.state[p]["step"].item() == 11  # one step skipped
    torch.testing.assert_close(
        a.state_vector.tensor, b.state_vector.tensor, rtol=1e-4, atol=1e-6, equal_nan=True
    )
    for name, t in a._ema._t.items():
        torch.testing.assert_close(t, b._ema._t[name], rtol=1e-3, atol=1e-5, equal_nan=True)
    ea, eb = a.engagement.state_dict(), b.engagement.state_dict()
    for key in ("rate", "max", "engaged_total", "seen_total"):
        torch.testing.assert_close(ea[key], eb[key], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert a.engagement.engaged_total.sum() > 0
    assert torch.equal(a._sel, b._sel) and torch.equal(a._phase, b._phase)
    assert a._phase.item() == 11
    assert a._parts.shape[1] == replicas
    assert a._ints.eq(0).all() and a._parts.eq(0).all()
    slots = a.state_vector.as_dict()
    assert all(math.isfinite(v) for v in slots["adam_weight_bound"][:2])
    assert math.isnan(slots["adam_weight_bound"][2]) and math.isfinite(slots["adam_l1"][0])


# --- the whole optimizer: both paths, every feature on --------------------------------------
PARITY_SHAPES = [(9, 5), (5,), (300,), (0,), (7,), (4, 3)]
NO_GRAD_SOMETIMES = 4  # the (7,) parameter has no gradient on every third step
NONFINITE_STEP = 5  # NaN and Inf gradients, skipped through found_inf
RELOAD_AFTER = 7  # state_dict save and load into a fresh optimizer


def _parity_groups(ps):
    # Two groups, both with the weight clamp and self-set decay ("auto"); L1 on the first.
    return [{"params": ps[:2], "l1": True}, {"params": ps[2:]}]


def _parity_run(device, impl, *, reload, steps=12):
    torch.manual_seed(0)
    ps = [torch.randn(s, device=device).requires_grad_() for s in PARITY_SHAPES]
    # capturable: the reference keeps its step counts on the device too (found_inf on a GPU)
    make = lambda: topt.Adam(_parity_groups(ps), lr=3e-2, impl=impl, capturable=True)  # noqa: E731
    opt = make()
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(ps):
            noise = torch.randn(p.shape, generator=g).to(device)
            # Outward (the clamp engages) and growing (the self-set decay switches on).
            p.grad = (1.0 + step) ** 2 * (noise - 0.5 * torch.sign(p.detach()))
            if i == NO_GRAD_SOMETIMES and step % 3 == 0:
                p.grad = None
        if step == NONFINITE_STEP:
            ps[0].grad[1, 2] = math.nan
            ps[2].grad[7] = -math.inf
        # As a clip or GradScaler computes it: on the device, every step.
        found_inf = torch.stack(
            [~torch.isfinite(p.grad).all() for p in ps if p.grad is not None]
        ).any()
        opt.step(found_inf=found_inf)
        if reload and step == RELOAD_AFTER:
            sd = copy.deepcopy(opt.state_dict())
            opt = make()
            opt.load_state_dict(sd)
    return ps, opt


def _assert_same_state(a_ps, a, b_ps, b, exact):
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-4, atol=1e-5)
    for p, q in zip(a_ps, b_ps):
        torch.testing.assert_close(p, q, **tol)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(a.state[p][key], b.state[q][key], **tol)
    slots = dict(rtol=0, atol=0) if exact else dict(rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(
        a.state_vector.tensor, b.state_vector.tensor, equal_nan=True, **slots
    )
    # The estimators' internals (candidate scores, covariances) fold the decay observation, a
    # quotient of nearly cancelling float32 sums: looser than the slots consumers read.
    inner = dict(rtol=0, atol=0) if exact else dict(rtol=1e-2, atol=1e-4)
    for name, t in a._ema._t.items():
        torch.testing.assert_close(t, b._ema._t[name], equal_nan=True, **inner)
    ea, eb = a.engagement.state_dict(), b.engagement.state_dict()
    for key in ("engaged_total", "seen_total"):
        assert torch.equal(ea[key], eb[key]), key
    assert torch.equal(a._sel, b._sel) and torch.equal(a._phase, b._phase)


@pytest.mark.slow
def test_optimizer_paths_agree_over_many_steps_with_every_feature_on(kernel_device):
    """Reference (the CPU path) and Triton over 12 steps, float32 (the kernels' dtype): weight
    clamp, self-set decay, L1, two groups, a zero-size parameter, a parameter without a
    gradient on some steps, NaN/Inf gradients skipped by found_inf, and a state_dict round
    trip after step 7 that continues exactly as an uninterrupted run. Same sampled
    histograms, so the same quantiles and windows; tolerances cover float32 rounding only
    (the order of the sums and the bias-correction arithmetic differ)."""
    t_ps, t_opt = _parity_run(kernel_device, "triton", reload=True)
    r_ps, r_opt = _parity_run(kernel_device, "torch", reload=True)
    _assert_same_state(t_ps, t_opt, r_ps, r_opt, exact=False)
    # Every feature was exercised.
    sv = r_opt.state_vector.as_dict()
    assert r_opt.engagement.engaged_total.min() > 0  # the clamp engaged in both groups
    assert math.isfinite(sv["adam_l1"][0]) and math.isnan(sv["adam_l1"][1])
    assert max(sv["adam_decay"]) > 0  # the self-set decay applied
    assert r_opt.state[r_ps[0]]["step"].item() == 11  # the non-finite step was skipped
    assert r_opt.state[r_ps[4]]["step"].item() == 7  # and a parameter had no gradient
    assert all(torch.isfinite(p).all() for p in r_ps)
    # The round trip continued exactly as a run without it.
    u_ps, u_opt = _parity_run(kernel_device, "torch", reload=False)
    _assert_same_state(r_ps, r_opt, u_ps, u_opt, exact=True)


# --- found_inf ------------------------------------------------------------------------------
def _snapshot(ps, opt):
    tensors = [p.detach().clone() for p in ps]
    for p in ps:
        tensors += [t.clone() for t in opt.state[p].values() if isinstance(t, torch.Tensor)]
    tensors += [opt.state_vector.tensor.clone(), opt._sel.clone(), opt._phase.clone()]
    tensors += [t.clone() for t in opt._ema.state_dict().values()]
    eng = opt.engagement.state_dict()
    tensors += [t.clone() for t in eng["fraction"].values()]
    tensors += [eng[k].clone() for k in ("rate", "max", "z", "engaged_total", "seen_total")]
    return tensors


def _bits_equal(a, b):
    """Bitwise equality, NaN payloads included."""
    if a.dtype.is_floating_point:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("flag", [torch.tensor(True), torch.tensor(1.0), torch.tensor([3.0])])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_found_inf_leaves_everything_bitwise_unchanged(kernel_device, impl, flag):
    torch.manual_seed(0)
    ps = [torch.randn(s, device=kernel_device).requires_grad_() for s in [(6, 5), (0,), (40,)]]
    opt = topt.Adam(_parity_groups(ps), lr=1e-2, impl=impl, capturable=True)
    for _ in range(3):
        for p in ps:
            p.grad = torch.randn_like(p)
        opt.step()
    before = _snapshot(ps, opt)
    for p in ps:
        p.grad = torch.randn_like(p)
    ps[0].grad[2, 3] = math.nan
    ps[2].grad[0] = math.inf
    opt.step(found_inf=flag.to(kernel_device))
    after = _snapshot(ps, opt)
    assert len(before) == len(after)
    assert all(_bits_equal(a, b) for a, b in zip(before, after))
    for p in ps:  # then a normal step moves
        p.grad = torch.randn_like(p)
    opt.step(found_inf=torch.tensor(False, device=kernel_device))
    assert not torch.equal(ps[0], before[0]) and not torch.equal(ps[2], before[2])
    assert opt.state[ps[0]]["step"].item() == 4 and opt._phase.item() == 4


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_found_inf_zero_is_found_inf_none(kernel_device, impl):
    """A zero flag steps exactly as no flag (which is the step as it was before found_inf)."""
    runs = []
    for flag in (None, torch.tensor(0.0, device=kernel_device)):
        torch.manual_seed(0)
        ps = [torch.randn(s, device=kernel_device).requires_grad_() for s in [(6, 5), (40,)]]
        opt = topt.Adam(_parity_groups(ps), lr=1e-2, impl=impl, capturable=True)
        for _ in range(4):
            for p in ps:
                p.grad = torch.randn_like(p)
            opt.step(found_inf=flag)
        runs.append(_snapshot(ps, opt))
    assert all(_bits_equal(a, b) for a, b in zip(*runs))


def test_pointer_table_of_step_counters(kernel_device):
    steps = [torch.tensor(float(i), device=kernel_device) for i in range(3)]
    table = pointer_table(steps, 1)
    assert table.count == 3 and table.num_blocks == 3
