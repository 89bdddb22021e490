"""The fused Adam kernel against its reference, one step from identical states (interpreter on
the CPU, native on the GPU)."""

from __future__ import annotations

import math

import pytest
import torch

from trimtab.kernels import optim as kern
from trimtab.optim import _reference as ref

SHAPES = [(0,), (1,), (37,), (kern.BLOCK + 1,), (3, 131)]


def _state(device, seed=0, nonfinite=False):
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(s, generator=g).to(device) for s in SHAPES]
    gs = [torch.randn(s, generator=g).to(device) for s in SHAPES]
    ms = [0.1 * torch.randn(s, generator=g).to(device) for s in SHAPES]
    vs = [0.01 * torch.rand(s, generator=g).to(device) for s in SHAPES]
    if nonfinite:
        gs[2][3] = math.nan
        ws[4][0, 5] = math.inf
        ws[2][7] = -0.0
        ws[3][11] = 1e-40  # subnormal
    return ws, gs, ms, vs


def _run(device, impl, *, features, sel=None, seed=0, nonfinite=False, lr=1e-2):
    ws, gs, ms, vs = _state(device, seed, nonfinite)
    steps = [torch.tensor(4.0, device=device) for _ in SHAPES]
    l1_flags = [features and w.dim() >= 2 for w in ws]
    coef = torch.tensor([0.3, 0.2, 1.5] if features else [0.01, 0.0, math.inf], device=device)
    kw = dict(lr=lr, beta1=0.9, beta2=0.999, eps=1e-8)
    if impl == "torch":
        row = ref.adam_group_step_reference(
            ws, gs, ms, vs, steps, **kw, weight_decay=coef[0], l1=coef[1] if features else None,
            l1_params=l1_flags, bound=coef[2] if features else None, capturable=True,
            stats=True, quantile=0.99,
        )  # fmt: skip
        return ws, ms, vs, row
    sums = torch.zeros(kern.NUM_SUMS, device=device)
    ints = torch.zeros(1, kern.INT_WIDTH, dtype=torch.int32, device=device)
    sel = torch.full((1, 3), -1, dtype=torch.int32, device=device) if sel is None else sel
    for s in steps:
        s += 1
    kern.adam_group_step_triton(
        ws, gs, ms, vs, torch.stack(steps),
        torch.tensor([int(f) for f in l1_flags], dtype=torch.int32, device=device),
        coef, sums, ints[0], sel[0], **kw, stats=True, l1=features, clamp=features,
    )  # fmt: skip
    q, n = kern.finish_quantiles(ints, sel, 0.99)
    return ws, ms, vs, (sums, ints, q, n, sel)


@pytest.mark.parametrize("features", [False, True])
def test_kernel_step_matches_reference(kernel_device, features):
    ws, ms, vs, row = _run(kernel_device, "torch", features=features, nonfinite=features)
    kw, km, kv, (sums, ints, q, n, _sel) = _run(
        kernel_device, "triton", features=features, nonfinite=features
    )
    for a, b in zip(ws + ms + vs, kw + km + kv):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-6, equal_nan=True)
    # Sums: the reference skips nothing either, so a NaN gradient makes both non-finite.
    torch.testing.assert_close(sums, row[: kern.NUM_SUMS], rtol=1e-4, atol=1e-4, equal_nan=True)
    assert n[0, 0].item() == row[ref.COUNT].item()
    if features:
        assert ints[0, kern.INT_ENGAGED].item() == row[ref.ENGAGED].item() > 0
    max_w = ints[0, kern.INT_MAXBITS : kern.INT_MAXBITS + 1].view(torch.float32)
    assert max_w.item() == row[ref.MAX_W].item()
    # First step: no previous bin, so the coarse bin's lower edge (never above, within 2**-3).
    exact = row[ref.Q_W : ref.Q_V + 1]
    assert (q[0] <= exact).all() and (q[0] >= exact * (1 - 2**-3)).all()


def test_previous_bin_refines_the_quantile(kernel_device):
    """With last step's coarse bin as the refinement bin, the quantile is within 2**-15."""
    *_, row = _run(kernel_device, "torch", features=False, lr=1e-6)
    sel = torch.full((1, 3), -1, dtype=torch.int32, device=kernel_device)
    _run(kernel_device, "triton", features=False, sel=sel, lr=1e-6)  # sets sel
    *_, (_, _, q, _, _) = _run(kernel_device, "triton", features=False, sel=sel, lr=1e-6)
    exact = row[ref.Q_W : ref.Q_V + 1]
    assert (q[0] <= exact).all() and (q[0] >= exact * (1 - 2**-15)).all()


def test_empty_group_quantile_is_zero(kernel_device):
    ints = torch.zeros(2, kern.INT_WIDTH, dtype=torch.int32, device=kernel_device)
    sel = torch.full((2, 3), -1, dtype=torch.int32, device=kernel_device)
    q, n = kern.finish_quantiles(ints, sel, 0.99)
    assert q.eq(0).all() and n.eq(0).all() and sel.eq(-1).all()


def test_optimizer_kernel_path_matches_reference_path(kernel_device):
    """Whole optimizer, features whose numbers do not depend on quantile precision."""
    import trimtab.optim as topt

    torch.manual_seed(0)
    ps = [torch.randn(s, device=kernel_device, requires_grad=True) for s in [(9, 5), (0,), (6,)]]
    qs = [p.detach().clone().requires_grad_() for p in ps]
    kw = dict(lr=1e-2, weight_clamp=False)
    a = topt.Adam([{"params": ps[:1], "l1": True}, {"params": ps[1:]}], impl="triton", **kw)
    b = topt.Adam([{"params": qs[:1], "l1": True}, {"params": qs[1:]}], impl="torch", **kw)
    for _ in range(3):
        for p, q in zip(ps, qs):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    for name in ("decay", "l1"):
        torch.testing.assert_close(
            a.state_vector[f"adam_{name}"], b.state_vector[f"adam_{name}"], rtol=1e-3, atol=1e-5,
            equal_nan=True,
        )  # fmt: skip
