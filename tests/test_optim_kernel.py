"""The fused Adam kernels against their references (interpreter on the CPU, native on the GPU):
the update and its statistics one step from identical states, the sampled window quantiles,
and the finalize kernel against the torch finalize on the same workspaces."""

from __future__ import annotations

import math

import pytest
import torch

import trimtab.optim as topt
from trimtab.kernels import optim as kern
from trimtab.kernels._table import pointer_table
from trimtab.optim import _reference as ref

# The interpreter evaluates masked-off lanes too (NaN of unset estimates): numpy warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SHAPES = [(0,), (1,), (37,), (kern.BLOCK + 1,), (3, 131)]


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
    """One group's kernel workspaces, as the optimizer holds them."""

    def __init__(self, device, replicas=kern.REPLICAS):
        shape = (1, replicas, kern.PART_WIDTH)
        self.parts = torch.zeros(shape, dtype=torch.int32, device=device)
        self.ints = torch.zeros(1, kern.INT_WIDTH, dtype=torch.int32, device=device)
        self.sel = torch.full((1, 3), -1, dtype=torch.int32, device=device)
        self.phase = torch.zeros(1, dtype=torch.int32, device=device)

    def quantiles(self, q=0.99):
        """Quantiles of this step (reference finish), then ready for the next step."""
        value, nxt = kern.window_quantiles_reference(self.ints, self.sel, q)
        self.sel.copy_(nxt)
        return value[0]

    def stats(self):
        """The scalar partials reduced over the replicas, in the reference row's order."""
        return kern.parts_reference(self.parts)[0]

    def clear(self):
        self.ints.zero_()
        self.parts.zero_()
        self.phase.add_(1)


def _kernel_step(ws, gs, ms, vs, steps, wk, *, features, lr, stride=1, per_program=None):
    device = ws[0].device
    coef = torch.tensor([0.3, 0.2, 1.5] if features else [0.01, 0.0, math.inf], device=device)
    l1_flags = [features and w.dim() >= 2 for w in ws]
    kern.adam_group_step_triton(
        kern.group_tables(ws, gs, ms, vs, steps),
        torch.tensor([int(f) for f in l1_flags], dtype=torch.int32, device=device),
        (coef[0], coef[1], coef[2]), wk.parts[0], wk.ints[0], wk.sel[0], wk.phase,
        lr=lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=None if features else 0.01,
        stats=True, l1=features, clamp=features, stride=stride,
        floor=topt.WEIGHT_BOUND_FLOOR, per_program=per_program,
    )  # fmt: skip


def _run(device, impl, *, features, wk=None, seed=0, nonfinite=False, lr=1e-2, shapes=SHAPES):
    ws, gs, ms, vs = _state(device, seed, nonfinite, shapes)
    steps = [torch.tensor(4.0, device=device) for _ in shapes]
    if impl == "torch":
        coef = torch.tensor([0.3, 0.2, 1.5] if features else [0.01, 0.0, math.inf], device=device)
        row = ref.adam_group_step_reference(
            ws, gs, ms, vs, steps, lr=lr, beta1=0.9, beta2=0.999, eps=1e-8,
            weight_decay=coef[0] if features else 0.01, l1=coef[1] if features else None,
            l1_params=[features and w.dim() >= 2 for w in ws],
            bound=coef[2] if features else None, capturable=True, stats=True, quantile=0.99,
        )  # fmt: skip
        return ws, ms, vs, row
    wk = Workspace(device) if wk is None else wk
    _kernel_step(ws, gs, ms, vs, steps, wk, features=features, lr=lr)
    return ws, ms, vs, wk


def _check_stats(wk, row, features):
    stats = wk.stats()
    # Sums: the reference skips nothing either, so a NaN gradient makes both non-finite.
    torch.testing.assert_close(
        stats[: kern.NUM_SUMS], row[: kern.NUM_SUMS], rtol=1e-4, atol=1e-4, equal_nan=True
    )
    assert stats[ref.COUNT].item() == row[ref.COUNT].item()
    assert stats[ref.ENGAGED].item() == row[ref.ENGAGED].item()
    if features:
        assert row[ref.ENGAGED].item() > 0 and row[ref.SUM_L1_W].item() > 0
    assert stats[ref.MAX_W].item() == row[ref.MAX_W].item()


@pytest.mark.parametrize("features", [False, True])
def test_kernel_step_matches_reference(kernel_device, features):
    ws, ms, vs, row = _run(kernel_device, "torch", features=features, nonfinite=features)
    kw, km, kv, wk = _run(kernel_device, "triton", features=features, nonfinite=features)
    for a, b in zip(ws + ms + vs, kw + km + kv):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-6, equal_nan=True)
    _check_stats(wk, row, features)
    # First step: no window yet, so the octave's lower edge (never above, at least half).
    q = wk.quantiles()
    exact = row[ref.Q_W : ref.Q_V + 1]
    assert (q <= exact).all() and (q >= 0.5 * exact).all()


@pytest.mark.parametrize("replicas", [1, 4])
@pytest.mark.parametrize("features", [False, True])
def test_replicated_partials_reduce_to_the_reference(kernel_device, features, replicas):
    """More programs (11) than replicas: programs share rows, and the rows sum to the exact
    statistics (counts and max exactly, sums up to float32 rounding)."""
    shapes = [(5 * kern.BLOCK + 3,), (3, kern.BLOCK), (kern.BLOCK + 1,), (37,)]  # 6 + 3 + 2 + 1
    wk = Workspace(kernel_device, replicas)
    kw = dict(features=features, nonfinite=False, lr=1e-2, shapes=shapes)
    *_, row = _run(kernel_device, "torch", **kw)
    *_, wk = _run(kernel_device, "triton", wk=wk, **kw)
    _check_stats(wk, row, features)
    rows = wk.parts[0, :, kern.PART_FINITE]
    assert rows.gt(0).all() and rows.sum().item() == sum(math.prod(s) for s in shapes)


@pytest.mark.parametrize("features", [False, True])
def test_programs_of_several_blocks_and_odd_addresses_match_the_reference(kernel_device, features):
    """Programs stepping three blocks each (one reduction per program), and tensors at an
    address that is not 16-byte aligned (the masked path for whole blocks too)."""
    shapes = [(2 * kern.BLOCK,), (kern.BLOCK + 5,), (3, kern.BLOCK), (37,), (kern.BLOCK,)]
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
    steps = [torch.tensor(4.0, device=kernel_device) for _ in shapes]
    coef = torch.tensor([0.3, 0.2, 1.5] if features else [0.01, 0.0, math.inf])
    states = [[t.clone() for t in ts] for ts in (ws, gs, ms, vs)]
    row = ref.adam_group_step_reference(
        *states, [s.clone() for s in steps], lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8,
        weight_decay=coef[0].to(kernel_device) if features else 0.01,
        l1=coef[1].to(kernel_device) if features else None,
        l1_params=[features and w.dim() >= 2 for w in ws],
        bound=coef[2].to(kernel_device) if features else None, capturable=True, stats=True,
        quantile=0.99,
    )  # fmt: skip
    wk = Workspace(kernel_device, replicas=2)
    _kernel_step(ws, gs, ms, vs, steps, wk, features=features, lr=1e-2, per_program=3)
    for a, b in zip(states[0] + states[2] + states[3], ws + ms + vs):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-6, equal_nan=True)
    _check_stats(wk, row, features)
    # Blocks per tensor 2 + 2 + 3 + 1 + 1, three per program; programs 0 and 2 share row 0
    # (with the NaN gradient of tensor 0; the Inf weight is in block 5, program 1).
    first, last = 2 * kern.BLOCK + kern.BLOCK, kern.BLOCK + 37 + kern.BLOCK
    assert wk.parts[0, 0, kern.PART_FINITE].item() == first + last - features


def test_window_refines_the_quantile_to_one_part_in_256(kernel_device):
    """With last step's quantile as the window centre, the quantile is within 2**-8 below."""
    *_, row = _run(kernel_device, "torch", features=False, lr=1e-6)
    wk = Workspace(kernel_device)
    _run(kernel_device, "triton", features=False, wk=wk, lr=1e-6)
    coarse = wk.quantiles()  # sets the windows
    wk.clear()
    _run(kernel_device, "triton", features=False, wk=wk, lr=1e-6)
    fine = wk.quantiles()
    exact = row[ref.Q_W : ref.Q_V + 1]
    assert (fine <= exact).all() and (fine >= exact * (1 - 2**-8)).all()
    assert (fine >= coarse).all() and (wk.sel >= 0).all()


def test_a_quantile_that_leaves_the_window_falls_back_to_its_octave(kernel_device):
    wk = Workspace(kernel_device)
    _run(kernel_device, "triton", features=False, wk=wk, lr=1e-6)
    wk.quantiles()
    wk.clear()
    # Same shapes, everything 8x larger: the rank lies above last step's window.
    ws, gs, ms, vs = (
        [8 * t for t in ts] for ts in _state(kernel_device, 0)
    )  # fmt: skip
    steps = [torch.tensor(4.0, device=kernel_device) for _ in SHAPES]
    _kernel_step(ws, gs, ms, vs, steps, wk, features=False, lr=1e-6)
    in_window = wk.ints[0, kern.WINDOW_OFFSET : kern.WINDOW_OFFSET + kern.BINS].sum().item()
    below = wk.ints[0, kern.INT_UNDER].item()
    assert below + in_window < 0.99 * wk.stats()[ref.COUNT].item()
    q = wk.quantiles()
    exact = ref.abs_quantile(torch.cat([w.reshape(-1) for w in ws]), 0.99, impl="torch")
    assert q[0] <= exact and q[0] >= 0.5 * exact
    assert math.log2(q[0].item()).is_integer()  # an octave's lower edge


def _chunk_sizes(shapes):
    """Elements of each sampling chunk, in the pointer table's order (BLOCK // SUB a block)."""
    sizes = []
    for shape in shapes:
        n = math.prod(shape)
        for j in range(max(1, -(-n // kern.BLOCK)) * (kern.BLOCK // kern.SUB)):
            sizes.append(min(max(n - j * kern.SUB, 0), kern.SUB))
    return sizes


@pytest.mark.parametrize("per_program", [1, 3])
def test_sampling_covers_every_chunk_once_per_stride_steps(kernel_device, per_program):
    """Chunk c is histogrammed when (c + phase) % S == 0, also when a program steps several
    blocks; the sums see every element every step."""
    stride = 8
    shapes = [(5 * kern.BLOCK + 3,), (2 * kern.SUB + 5,), (kern.BLOCK,), (17,)]
    numel = sum(math.prod(s) for s in shapes)
    wk = Workspace(kernel_device, replicas=2)  # 9 blocks on 2 rows of partials
    seen = []
    for _ in range(stride):
        ws, gs, ms, vs = _state(kernel_device, 1, shapes=shapes)
        steps = [torch.tensor(1.0, device=kernel_device) for _ in shapes]
        _kernel_step(
            ws, gs, ms, vs, steps, wk, features=False, lr=1e-3, stride=stride,
            per_program=per_program,
        )  # fmt: skip
        hist = wk.ints[0, kern.HIST_OFFSET : kern.HIST_OFFSET + kern.BINS]
        seen.append(hist.sum().item())
        assert wk.stats()[ref.COUNT].item() == numel  # the sums see everything
        wk.clear()
    chunks = _chunk_sizes(shapes)
    expect = [sum(n for c, n in enumerate(chunks) if (c + t) % stride == 0) for t in range(stride)]
    assert seen == expect and sum(seen) == numel and min(seen) > 0


def test_sampled_quantile_is_within_its_documented_error(kernel_device):
    """2**17 sampled of 2**19 Gaussian weights: rank error sqrt(q(1-q)/n) ≈ 2.7e-4, about
    0.4% of the p99; with the window's 2**-8 the estimate stays within 2% of the exact p99."""
    shapes = [(1 << 19,)]
    stride = kern.sample_stride(1 << 19)
    assert stride == 4
    g = torch.Generator().manual_seed(5)
    w = torch.randn(shapes[0], generator=g).to(kernel_device)
    exact = ref.abs_quantile(w, 0.99, impl="torch").item()
    wk = Workspace(kernel_device)
    for _ in range(3):
        z = torch.zeros_like(w)
        steps = [torch.tensor(1.0, device=kernel_device)]
        _kernel_step([w], [z], [z.clone()], [z.clone()], steps, wk, features=False, lr=0.0,
                     stride=stride)  # fmt: skip
        q = wk.quantiles()[0].item()
        wk.clear()
    assert abs(q - exact) < 0.02 * exact


def test_empty_group_quantile_is_zero(kernel_device):
    ints = torch.zeros(2, kern.INT_WIDTH, dtype=torch.int32, device=kernel_device)
    sel = torch.full((2, 3), -1, dtype=torch.int32, device=kernel_device)
    q, nxt = kern.window_quantiles_reference(ints, sel, 0.99)
    assert q.eq(0).all() and nxt.eq(-1).all()


def test_sample_stride():
    assert kern.sample_stride(0) == 1
    assert kern.sample_stride(2 * kern.MIN_SAMPLE - 1) == 1
    assert kern.sample_stride(10**6) == 4
    assert kern.sample_stride(10**8) == kern.MAX_SAMPLE_STRIDE
    for n in (10**6, 10**7, 10**8):
        assert n // kern.sample_stride(n) >= kern.MIN_SAMPLE


def _groups(ps):
    return [
        {"params": ps[:1], "l1": True},
        {"params": ps[1:3], "weight_decay": 0.05},
        {"params": ps[3:], "weight_clamp": False, "weight_decay": 0.0},  # no statistics
        {"params": ps[4:4]},  # never a gradient: an empty group
    ]


@pytest.mark.parametrize("replicas", [kern.REPLICAS, 1])
def test_finalize_kernel_matches_the_torch_finalize(kernel_device, monkeypatch, replicas):
    """Same update kernel, same workspaces: the one-launch finalize and the torch finalize
    (replica reduction, window quantiles, engagement correction, AdaptiveEMA, slots) agree
    over many steps; with one replica a group's programs share it."""
    monkeypatch.setattr(kern, "REPLICAS", replicas)
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
        a.step()
        b.step()
    assert (a.state_vector["adam_decay"] > 0).any()  # the gated decay path ran
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.state[p]["step"], b.state[q]["step"], rtol=0, atol=0)
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
    assert a._parts.shape[1] == replicas
    assert a._ints.eq(0).all() and a._parts.eq(0).all()
    slots = a.state_vector.as_dict()
    assert all(math.isfinite(v) for v in slots["adam_weight_bound"][:2])
    assert math.isnan(slots["adam_weight_bound"][2]) and math.isfinite(slots["adam_l1"][0])


def test_optimizer_kernel_path_matches_reference_path(kernel_device):
    """Whole optimizer, features whose numbers do not depend on quantile precision."""
    torch.manual_seed(0)
    ps = [torch.randn(s, device=kernel_device, requires_grad=True) for s in [(9, 5), (0,), (6,)]]
    qs = [p.detach().clone().requires_grad_() for p in ps]
    kw = dict(lr=1e-2, weight_clamp=False)
    a = topt.Adam([{"params": ps[:1], "l1": True}, {"params": ps[1:]}], impl="triton", **kw)
    b = topt.Adam([{"params": qs[:1], "l1": True}, {"params": qs[1:]}], impl="torch", **kw)
    for _ in range(4):
        for p, q in zip(ps, qs):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.state[p]["step"].cpu(), b.state[q]["step"].cpu())
    for name in ("decay", "l1"):
        torch.testing.assert_close(
            a.state_vector[f"adam_{name}"], b.state_vector[f"adam_{name}"], rtol=1e-3, atol=1e-5,
            equal_nan=True,
        )  # fmt: skip


def test_kernel_path_reset_and_reload(kernel_device):
    torch.manual_seed(0)
    ps = [torch.randn(s, device=kernel_device, requires_grad=True) for s in [(9, 5), (6,)]]
    opt = topt.Adam(ps, lr=1e-2, impl="triton")
    for _ in range(3):
        for p in ps:
            p.grad = torch.randn_like(p)
        opt.step()
    assert (opt._sel >= 0).all() and opt._phase.item() == 3
    sd = opt.state_dict()
    fresh = topt.Adam([p.detach().clone().requires_grad_() for p in ps], lr=1e-2, impl="triton")
    fresh.load_state_dict(sd)
    assert torch.equal(fresh._sel, opt._sel) and torch.equal(fresh._phase, opt._phase)
    opt.reset_state()
    assert (opt._sel == -1).all() and opt._phase.item() == 0
    assert opt.state_vector.tensor.isnan().all()
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()  # a fresh first step: the tables point at the same (zeroed) moments
    assert all(s["step"].item() == 1 for s in opt.state.values())


def test_pointer_table_of_step_counters(kernel_device):
    steps = [torch.tensor(float(i), device=kernel_device) for i in range(3)]
    table = pointer_table(steps, 1)
    assert table.count == 3 and table.num_blocks == 3
