"""The multi-tensor Adam step (the CPU default) against the per-tensor reference (its oracle):
one group step over several steps in float64 and float32 with every feature on, the whole
optimizer over many steps, the histogram binning and the sample table it uses, the choice of
implementation; and scale_finite_'s flat pass against its per-tensor definition."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import trimtab.optim as topt
from trimtab.clamp import clamp_finite_, scale_finite_
from trimtab.kernels import optim_layout as lay
from trimtab.optim import _multi_tensor as mt
from trimtab.optim import _reference as ref

# A zero-size tensor, primes, more than one block and chunk, a tensor of three dims.
SHAPES = [(0,), (1,), (37,), (lay.BLOCK + 1,), (3, 131), (2, 3, 701)]
STEP = {"torch": ref.adam_group_step_reference, "foreach": mt.adam_group_step_multi_tensor}


def _state(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(s, generator=g, dtype=dtype) for s in SHAPES]
    ms = [0.1 * torch.randn(s, generator=g, dtype=dtype) for s in SHAPES]
    vs = [0.01 * torch.rand(s, generator=g, dtype=dtype) for s in SHAPES]
    ws[2][7] = -0.0
    ws[4][0, 5] = math.inf  # a non-finite weight: not counted, clamped to the bound
    ws[3][11] = 1e-40  # subnormal
    return ws, ms, vs


def _steps(
    impl,
    dtype,
    *,
    capturable,
    features,
    uniform,
    stride,
    skip_at=None,
    scale=None,
    equal=False,
    headroom=1.0,
):
    """Six group steps by ``impl`` from the same state; returns the tensors and, per step, the
    reduced workspace row, the histograms and the quantiles. ``equal``: tell the multi-tensor
    path that the counters are equal (one bias correction)."""
    ws, ms, vs = _state(dtype)
    steps = [torch.tensor(float(0 if uniform else i % 3)) for i in range(len(SHAPES))]
    parts = torch.zeros(1, lay.REPLICAS, lay.PART_WIDTH, dtype=torch.int32)
    ints = torch.zeros(1, lay.INT_WIDTH, dtype=torch.int32)
    sel = torch.full((1, 3), -1, dtype=torch.int32)
    phase = torch.zeros(1, dtype=torch.int32)
    coef = torch.tensor([0.3, 0.2, 1.5] if features else [0.01, 0.0, math.inf])
    g = torch.Generator().manual_seed(5)
    seen = []
    extra = {"equal_steps": equal} if impl == "foreach" else {}
    for k in range(6):
        gs = [torch.randn(s, generator=g, dtype=dtype) for s in SHAPES]
        if k == skip_at:
            gs[2][3] = math.nan
        STEP[impl](
            ws, gs, ms, vs, steps, lay.Workspace(parts[0], ints[0], sel[0], phase),
            lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8,
            weight_decay=None if features else 0.01, slots=(coef[0], coef[1], coef[2]),
            l1_params=[features and w.dim() >= 2 for w in ws], clamp=features, stats=True,
            floor=topt.WEIGHT_BOUND_FLOOR, capturable=capturable, stride=stride,
            skip=None if skip_at is None else torch.tensor(float(k == skip_at)),
            grad_scale=scale, headroom=headroom, **extra,
        )  # fmt: skip
        q, nxt = lay.window_quantiles_reference(ints, sel, 0.99)
        seen.append((lay.parts_reference(parts)[0].clone(), ints.clone(), q.clone()))
        sel.copy_(nxt)
        ints.zero_(), parts.zero_(), phase.add_(1)
        for s in steps:
            s.add_(1)
    return ws + ms + vs, seen


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("capturable", [True, False])
@pytest.mark.parametrize("uniform", ["equal, told", "equal", "unequal"])
@pytest.mark.parametrize("features", [True, False])
def test_group_step_matches_the_reference(dtype, capturable, uniform, features):
    """Every feature on (weight clamp, self-set decay, L1 on the tensors of two or more dims,
    a found_inf skip, a grad scale), a zero-size tensor, Inf and subnormal weights; counters
    equal and the step told so (one coefficient; with a sample of every element, stride 1,
    read in place), equal but not told, or not equal (per tensor; a rotating quarter of the
    elements sampled, stride 4, gathered). The update is the reference's arithmetic; the sums
    differ in their order only; counts, histograms and quantiles match."""
    kw = dict(capturable=capturable, features=features, uniform=uniform != "unequal",
              stride=1 if uniform == "equal, told" else 4,
              equal=uniform == "equal, told")  # fmt: skip
    if features:
        kw.update(skip_at=2, scale=torch.tensor(4.0))
    a, a_seen = _steps("torch", dtype, **kw)
    b, b_seen = _steps("foreach", dtype, **kw)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=2e-6, atol=1e-7)
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, equal_nan=True, **tol)
    for (sa, ia, qa), (sb, ib, qb) in zip(a_seen, b_seen):
        torch.testing.assert_close(sb, sa, rtol=1e-5, atol=1e-6, equal_nan=True)
        assert torch.equal(sa[ref.COUNT], sb[ref.COUNT]), (sa, sb)
        assert torch.equal(sa[ref.ENGAGED], sb[ref.ENGAGED]), (sa, sb)
        assert torch.equal(ia, ib) and torch.equal(qa, qb)
    if features:
        assert a_seen[0][0][ref.ENGAGED] > 0 and a_seen[0][0][ref.SUM_L1_W] > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_group_step_with_headroom_matches_the_reference(dtype):
    """Headroom 2: both clamp at twice the bound and count the bound's exceedances."""
    kw = dict(capturable=True, features=True, uniform=True, stride=1, headroom=2.0)
    a, a_seen = _steps("torch", dtype, **kw)
    b, b_seen = _steps("foreach", dtype, **kw)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=2e-6, atol=1e-7)
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, equal_nan=True, **tol)
    for (sa, ia, qa), (sb, ib, qb) in zip(a_seen, b_seen):
        assert torch.equal(sa[ref.ENGAGED], sb[ref.ENGAGED]), (sa, sb)
        assert torch.equal(ia, ib) and torch.equal(qa, qb)
    weights = torch.cat([w.reshape(-1) for w in a[: len(SHAPES)]]).abs()
    assert weights.max() <= 3.0 and ((weights > 1.5) & (weights < 3.0)).any()
    # the count is of |w| > 1.5 (the bound), more than the clamp's own engagements
    assert a_seen[0][0][ref.ENGAGED] > 1


def test_group_of_zero_size_tensors_and_a_default_stride():
    """Only zero-size tensors: nothing moves, an all-zero row; a group past 2**18 elements
    samples with stride 2 by default, as the reference."""
    for shapes in ([(0,), (0, 3)], [(1 << 18,), (5,)]):
        got = []
        for impl in ("torch", "foreach"):
            ws = [torch.ones(s) for s in shapes]
            gs = [torch.full(s, 0.5) for s in shapes]
            ms, vs = [torch.zeros(s) for s in shapes], [torch.zeros(s) for s in shapes]
            parts = torch.full((1, lay.REPLICAS, lay.PART_WIDTH), 0, dtype=torch.int32)
            ints = torch.zeros(1, lay.INT_WIDTH, dtype=torch.int32)
            work = lay.Workspace(parts[0], ints[0], torch.full((3,), -1, dtype=torch.int32),
                                 torch.zeros(1, dtype=torch.int32))  # fmt: skip
            zero = torch.tensor(0.0)
            STEP[impl](
                ws, gs, ms, vs, [torch.tensor(0.0) for _ in shapes], work, lr=0.1, beta1=0.9,
                beta2=0.999, eps=1e-8, weight_decay=0.0, slots=(zero, zero, torch.tensor(2.0)),
                l1_params=[False] * len(shapes), clamp=True, stats=True, floor=1e-30,
            )  # fmt: skip
            got.append((ws, lay.parts_reference(parts)[0], ints.clone()))
        (wa, sa, ia), (wb, sb, ib) = got
        assert all(torch.equal(x, y) for x, y in zip(wa, wb))
        torch.testing.assert_close(sb, sa, rtol=1e-4, atol=0)  # float32 sums of 2**18 terms
        assert torch.equal(ia, ib)


# --- the whole optimizer ------------------------------------------------------------------------
PARITY_SHAPES = [(9, 5), (5,), (300,), (0,), (7,), (4, 3)]


def _optimizer_run(impl, dtype, steps=12):
    """Two groups (L1 on the first), weight clamp and self-set decay; the (7,) parameter has no
    gradient on every third step; step 5's NaN/Inf gradients are skipped through found_inf;
    a state_dict round trip after step 7."""
    torch.manual_seed(0)
    ps = [torch.randn(s, dtype=dtype).requires_grad_() for s in PARITY_SHAPES]
    groups = [{"params": ps[:2], "l1": True}, {"params": ps[2:]}]
    make = lambda: topt.Adam(groups, lr=3e-2, impl=impl, capturable=True)  # noqa: E731
    opt = make()
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(ps):
            noise = torch.randn(p.shape, generator=g, dtype=dtype)
            p.grad = (1.0 + step) ** 2 * (noise - 0.5 * torch.sign(p.detach()))
            if i == 4 and step % 3 == 0:
                p.grad = None
        if step == 5:
            ps[0].grad[1, 2] = math.nan
            ps[2].grad[7] = -math.inf
        found_inf = torch.stack([~torch.isfinite(p.grad).all() for p in ps if p.grad is not None])
        opt.step(found_inf=found_inf.any())
        if step == 7:
            sd = copy.deepcopy(opt.state_dict())
            opt = make()
            opt.load_state_dict(sd)
    return ps, opt


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_optimizer_matches_the_reference_over_many_steps(dtype):
    r_ps, r = _optimizer_run("torch", dtype)
    f_ps, f = _optimizer_run("foreach", dtype)
    assert f.impl == "foreach" and r.impl == "torch"
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    for p, q in zip(r_ps, f_ps):
        torch.testing.assert_close(q, p, **tol)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(f.state[q][key], r.state[p][key], **tol)
    slots = dict(rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(
        f.state_vector.tensor, r.state_vector.tensor, equal_nan=True, **slots
    )
    assert torch.equal(f._sel, r._sel) and torch.equal(f._phase, r._phase)
    for key in ("engaged_total", "seen_total"):
        assert torch.equal(f.engagement.state_dict()[key], r.engagement.state_dict()[key])
    sv = r.state_vector.as_dict()  # every feature was exercised
    assert r.engagement.engaged_total.min() > 0 and max(sv["adam_decay"]) > 0
    assert math.isfinite(sv["adam_l1"][0])
    assert r.state[r_ps[0]]["step"].item() == 11 and r.state[r_ps[4]]["step"].item() == 7


def test_moments_live_in_the_flat_rows_on_the_cpu():
    """After a step the optimizer's moments of a group are views of one flat buffer each (the
    step copies them neither in nor out), the same tensor objects as before it; a load that
    replaces them is adopted at the next step, which matches a fresh optimizer's."""
    ps = [torch.nn.Parameter(torch.randn(s)) for s in ((3, 4), (0,), (5,))]
    opt = topt.Adam(ps, lr=1e-2)
    for p in ps:
        p.grad = torch.randn(p.shape)
    opt.step()
    m = [opt.state[p]["exp_avg"] for p in ps]
    opt.step()
    assert all(a is opt.state[p]["exp_avg"] for a, p in zip(m, ps))
    bases = {t.untyped_storage().data_ptr() for t in m if t.numel()}
    assert len(bases) == 1 and m[2].data_ptr() == m[0].data_ptr() + 12 * 4
    other = topt.Adam([torch.nn.Parameter(p.detach().clone()) for p in ps], lr=1e-2)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))
    for q, p in zip(other.param_groups[0]["params"], ps):
        q.grad = p.grad.clone()
    opt.step(), other.step()
    for q, p in zip(other.param_groups[0]["params"], ps):
        assert torch.equal(q, p)
        assert torch.equal(other.state[q]["exp_avg_sq"], opt.state[p]["exp_avg_sq"])


@pytest.mark.parametrize("every", [1, 3])
def test_parameters_and_gradients_live_in_the_flat_rows_on_the_cpu(every):
    """After a step a group's parameters are views of one flat buffer, and so are its gradients
    (a backward accumulates into them); stepping through them, through gradients set to None
    (copied in and adopted again), or with every parameter replaced by another tensor gives
    bitwise the same weights, moments and slots."""

    def run(grads: str) -> tuple[list[torch.nn.Parameter], topt.Adam]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        ps = list(net.parameters())
        opt = topt.Adam(ps, lr=3e-2, measure_every=every, adopt_params=True)
        for step in range(7):
            x = torch.randn(16, 6, generator=torch.Generator().manual_seed(step))
            if grads == "none":
                opt.zero_grad(set_to_none=True)
            else:
                for p in ps:
                    if p.grad is not None:
                        p.grad.zero_()
            net(x).square().mean().backward()
            if grads == "replaced" and step == 3:  # new memory: adopted again at the next step
                for p in ps:
                    p.data = p.data.clone()
            opt.step()
        return ps, opt

    kept, a = run("kept")
    for other in ("none", "replaced"):
        ps, b = run(other)
        for p, q in zip(kept, ps):
            assert torch.equal(p, q)
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(a.state[p][key], b.state[q][key])
        assert torch.equal(
            a.state_vector.tensor.nan_to_num(3.0), b.state_vector.tensor.nan_to_num(3.0)
        )
    weights = [p for p in kept if p.ndim]  # one group: one storage, in order
    assert len({p.untyped_storage().data_ptr() for p in weights}) == 1
    assert weights[1].data_ptr() == weights[0].data_ptr() + weights[0].numel() * 4
    assert len({p.grad.untyped_storage().data_ptr() for p in kept}) == 1


def test_parameters_keep_their_memory_unless_adopted():
    """By default (as torch's optimizers) a step never re-points a parameter; nor does
    adopt_params for a parameter subclass (FSDP's flat parameter is one, which FSDP re-points
    itself)."""

    class Flat(torch.nn.Parameter):
        pass

    for params, adopt in (([torch.nn.Parameter(torch.randn(4, 3))], False),
                          ([Flat(torch.randn(4, 3))], True)):  # fmt: skip
        before = params[0].data_ptr()
        opt = topt.Adam(params, lr=1e-2, adopt_params=adopt)
        for _ in range(2):
            params[0].grad = torch.randn(4, 3)
            opt.step()
        assert params[0].data_ptr() == before
    with pytest.raises(TypeError, match="adopt_params must be a bool"):
        topt.Adam(params, adopt_params=1)


def test_the_multi_tensor_path_is_the_cpu_default():
    p = torch.nn.Parameter(torch.randn(3))
    assert topt.Adam([p]).impl == "foreach"
    assert topt.Adam([p], impl="torch").impl == "torch"
    with pytest.raises(ValueError, match="impl must be None, 'torch'"):
        topt.Adam([p], impl="fused")
    # A group mixing dtypes is outside the flat buffers: the reference steps it.
    assert mt.fits([p, p], [p, p]) and not mt.fits([p, p.double()], [p, p.double()])
    q = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    opt = topt.Adam([p, q])
    p.grad, q.grad = torch.ones(3), torch.ones(4, dtype=torch.float64)
    opt.step()
    assert opt.state[q]["step"].item() == 1 and torch.isfinite(q).all()


# --- the binning ----------------------------------------------------------------------------------
def test_sample_table_rows_are_the_sampled_elements():
    numels = (0, 5000, 1, 9000, 4096)
    for stride in (1, 2, 4):
        table = lay.sampled_index_table(numels, stride, torch.device("cpu"))
        for phase in range(2 * stride):
            mask = lay.sampled_elements(numels, torch.tensor([phase], dtype=torch.int32), stride)
            row = table[phase % stride]
            assert torch.equal(row[row < sum(numels)], torch.nonzero(mask).reshape(-1))


def test_histograms_from_fine_match_the_reference_binning():
    g = torch.Generator().manual_seed(3)
    n = 5000
    values = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-8, 8, (n,), generator=g)
              for _ in range(3)]  # fmt: skip
    values[0][:7] = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40, 3e38])
    sampled = torch.rand(n, generator=g) < 0.5
    keys = [(lay.float_bits(v) >> lay.FINE_SHIFT).long() for v in values]
    ones = torch.ones(int(sampled.sum()), dtype=torch.int32)
    empty = torch.zeros(lay.FINE_KEYS, dtype=torch.int32)
    fine = torch.stack([empty.clone().index_add_(0, k[sampled], ones) for k in keys])
    # Window bases as the finalize writes them (multiples of 2**15), none, and at the top.
    for sel in ([-1, -1, -1], [0, 1 << 15, 100 << 23], [lay.FINITE_KEYS << 15, 65000 << 15, -1]):
        sel = torch.tensor(sel, dtype=torch.int32)
        a = torch.zeros(lay.INT_WIDTH, dtype=torch.int32)
        b = torch.zeros(lay.INT_WIDTH, dtype=torch.int32)
        lay.histograms_reference(a, values, sampled, sel)
        lay.histograms_from_fine(b, fine, sel)
        assert torch.equal(a, b)


# --- scale_finite_ ------------------------------------------------------------------------------
def test_scale_finite_flat_pass_is_the_per_tensor_definition():
    g = torch.Generator().manual_seed(0)
    a = [
        torch.randn(5, 7, generator=g),
        torch.randn(0),
        torch.randn(13, generator=g).half(),
        torch.randn(4, 3, generator=g).t(),  # not contiguous
        torch.randn(9, generator=g, dtype=torch.float64),
        torch.randn(6, generator=g).bfloat16(),
    ]
    a[0][1, 2], a[2][3], a[3][0, 1], a[4][2], a[5][1] = math.nan, math.inf, -math.inf, -0.0, 1e38
    b = [t.clone() for t in a]
    scale = torch.tensor([2.0, 1.0, 0.5, 3.0, 1e300, 7.0]).float()  # 1e300 -> Inf in float32
    count = torch.zeros(1, dtype=torch.int64)
    scale_finite_(a, scale, count, impl="torch")
    pair = torch.zeros(2, dtype=torch.int64)
    torch._foreach_mul_(b, [c.to(t.dtype) for c, t in zip(scale.unbind(), b)])
    for t in b:
        clamp_finite_(t, math.nan, pair, impl="torch")
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y) and torch.equal(x.signbit(), y.signbit())
    assert count.item() == pair[1].item() > 0


# --- the sentinel's check: one foreach max for every tensor ------------------------------------
def test_abs_max_many_is_abs_max_reference_of_each():
    from trimtab.sentinel_state import abs_max_many, abs_max_reference

    g = torch.Generator().manual_seed(0)
    ts = [
        torch.randn(3, 4, generator=g),
        torch.zeros(0),
        torch.tensor([1.0, math.nan, -2.0]),
        torch.tensor([-math.inf, 1.0]),
        torch.randn(5, generator=g).half(),
        torch.randn(6, generator=g).bfloat16(),
        torch.randn(4, 6, generator=g, dtype=torch.float64).t(),
        torch.tensor([-0.0, 1e-40]),
        torch.zeros(0, 3),
    ]
    a = abs_max_many(ts)
    b = torch.stack([abs_max_reference(t) for t in ts])
    assert a.dtype == torch.float64 and torch.equal(a.isnan(), b.isnan())
    assert torch.equal(a.nan_to_num(), b.nan_to_num())
    assert abs_max_many([torch.zeros(0)]).tolist() == [0.0]
