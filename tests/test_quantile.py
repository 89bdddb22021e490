"""abs_quantile(s): kernel, reference and an exact float64 sort agree on awkward inputs, on
every path of the kernel (direct radix select, sampled bracket and buffer, ties answered by the
bracket, fallback after a missed bracket or an overflowing buffer)."""

from __future__ import annotations

import math

import pytest
import torch

import trimtab
from trimtab.quantile import abs_quantile_reference, abs_quantiles_reference

SIZES = (0, 1, 2, 3, 7, 31, 32, 33, 127, 1000, 4097)
FEW_SIZES = (1, 2, 33, 1000, 4097)  # every family; all of SIZES for "normal" (interpreter time)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QS = (0.5, 0.99, 1.0)  # every family; also 0.9 and 1e-3 for "normal"
REL_2_15 = 2.0**-15
# Tunables scaled down so that tensors of tens of elements are sampled, bracketed, compacted
# into several pools and read by many programs with full and tail blocks, on every path.
SMALL_PLAN = {
    "SMALL_MAX": 0,  # no one-launch path: the multi-pass paths themselves are under test
    "DIRECT_MAX": 40,
    "SAMPLE_STRIDE": 4,
    "SAMPLE_RUN": 4,
    "SAMPLE_ROWS": 16,
    "BRACKET_BLOCK": 128,
    "BLOCK": 256,
    "BUF_BLOCK": 64,
    "CAP_MULT": 2.0,
    "POOLS": 4,
    "BLOCKS_PER_POOL": 2,
    "MAX_BLOCKS_PER_PROGRAM": 4,
    "CAP_ADD": 16,
}


@pytest.fixture
def kq():
    return pytest.importorskip("trimtab.kernels.quantile")


@pytest.fixture
def small_plan(kq, monkeypatch):
    for name, value in SMALL_PLAN.items():
        monkeypatch.setattr(kq, name, value)
    return kq


def _family(name: str, n: int, g: torch.Generator) -> torch.Tensor:
    if name == "normal":
        return torch.randn(n, generator=g, dtype=torch.float64)
    if name == "uniform":
        return torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1
    if name == "cauchy":
        return torch.empty(n, dtype=torch.float64).cauchy_(generator=g)
    if name == "pareto":  # tail index 1.1, spanning many octaves
        return torch.rand(n, generator=g, dtype=torch.float64).clamp_min(1e-12) ** (-1 / 1.1)
    if name == "outliers":  # a few enormous values among small ones
        x = torch.rand(n, generator=g, dtype=torch.float64) * 1e-3
        x[torch.randperm(n, generator=g)[: max(1, n // 50)]] = 1e30
        return x
    if name == "equal":
        return torch.full((n,), -2.75, dtype=torch.float64)
    if name == "zeros":
        return torch.zeros(n, dtype=torch.float64)
    if name == "subnormal":  # float32 subnormals; fp16/bf16 casts flush or round them
        return (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 2e-39
    if name == "relu":  # half exact zeros
        return torch.randn(n, generator=g, dtype=torch.float64).clamp_min(0)
    raise ValueError(name)


SAMPLED_FAMILIES = ("normal", "cauchy", "outliers", "relu")
FAMILIES = (
    "normal",
    "uniform",
    "cauchy",
    "pareto",
    "outliers",
    "equal",
    "zeros",
    "subnormal",
    "relu",
)


def _sprinkle(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """NaN, ±Inf, -0.0, a subnormal and the largest finite value at random places."""
    x = x.clone()
    n = x.numel()
    if n < 7:
        return x
    specials = [math.nan, math.inf, -math.inf, -0.0, torch.finfo(x.dtype).tiny / 4]
    specials.append(-torch.finfo(x.dtype).max)
    idx = torch.randperm(n, generator=g)[: len(specials)]
    for i, v in zip(idx.tolist(), specials):
        x[i] = v
    return x


def _inputs(family: str, dtype: torch.dtype, device, sprinkle: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sizes = SIZES if family == "normal" else FEW_SIZES
    xs = [_family(family, n, g).to(dtype) for n in sizes]
    if sprinkle:
        xs = [_sprinkle(x, g) for x in xs]
    return [x.to(device) for x in xs]


def _exact(x: torch.Tensor, q: float) -> tuple[float, int]:
    """The definition, in float64 on the host: rank ceil(q*n) of the sorted finite |x|."""
    a = x.detach().double().abs().cpu()
    finite = a[torch.isfinite(a)]
    n = finite.numel()
    if n == 0:
        return 0.0, a.numel()
    k = max(1, math.ceil(q * n))
    return float(finite.sort().values[k - 1]), a.numel() - n


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_and_reference_match_exact_sort(family, dtype, kernel_device, request):
    if family in SAMPLED_FAMILIES:  # the others take the direct path (interpreter time)
        request.getfixturevalue("small_plan")
    sprinkle = family not in ("equal", "zeros")
    xs = _inputs(family, dtype, kernel_device, sprinkle, seed=FAMILIES.index(family))
    for q in (*QS, 0.9, 1e-3) if family == "normal" else QS:
        want = [_exact(x, q) for x in xs]
        ref = abs_quantiles_reference(xs, q)
        got = trimtab.abs_quantiles(xs, q, impl="triton", return_nonfinite=True)
        assert got.value.dtype == torch.float32 and got.value.device == xs[0].device
        assert got.nonfinite.tolist() == [c for _, c in want] == ref[1].tolist()
        assert ref[0].tolist() == [v for v, _ in want], (family, q)
        assert got.value.tolist() == [v for v, _ in want], (family, q)  # exact, every dtype


def _sampled(kq, n: int) -> torch.Tensor:
    """Which elements the sample reads (the kernel's stratified hash, replayed)."""
    stride, run = kq.SAMPLE_STRIDE, kq.SAMPLE_RUN
    mask = torch.zeros(n, dtype=torch.bool)
    for s in range(-(-n // (stride * run))):
        first = (s * stride + (((s * 2654435761) >> 16) & (stride - 1))) * run
        mask[first : first + run] = True
    return mask


def _paths(kq, xs, q):
    """Values and the path each tensor took, from the kernel's workspace."""
    values, ws = kq.run(xs, q)
    return values.tolist(), kq.paths(ws)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_path_is_exact(small_plan, dtype, kernel_device, monkeypatch):
    """Force each path: a sample that misses the rest of the data (miss), a buffer too small
    (overflow), a tie filling the bracket (answered, even when it overflows)."""
    kq = small_plan
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(n, generator=g).to(dtype).to(kernel_device) for n in (33, 700, 2049)]
    tie = torch.full((1500,), 1.5)
    tie[:150] = torch.rand(150, generator=g)
    tie[-150:] = 2 + torch.rand(150, generator=g)
    xs.append(tie[torch.randperm(1500, generator=g)].to(dtype).to(kernel_device))
    xs.append(torch.full((300,), math.nan).to(dtype).to(kernel_device))  # no finite element
    for q, tie_path in ((0.5, "answered"), (0.99, "buffer")):  # rank 0.5 is in the tie
        want = [_exact(x, q)[0] for x in xs]
        values, paths = _paths(kq, xs, q)
        assert values == want, q
        assert paths == ["direct", "buffer", "buffer", tie_path, "answered"], (q, paths)
        # Adversarial: the sampled runs hold huge values, the rest normal ones.
        hidden = [x.clone() for x in xs]
        for x in hidden[1:3]:
            x[_sampled(kq, x.numel())] *= 1e3
        values, paths = _paths(kq, hidden, q)
        assert values == [_exact(x, q)[0] for x in hidden], q
        if q == 0.5:  # (the 0.99 bracket is open upwards at these sample sizes: no miss)
            assert paths[1:3] == ["miss", "miss"], (q, paths)
        with monkeypatch.context() as m:
            m.setattr(kq, "CAP_MULT", 0.0)
            m.setattr(kq, "CAP_ADD", 1)
            m.setattr(kq, "BUF_BLOCK", 16)
            values, paths = _paths(kq, xs, q)
            assert values == want, q
            if q == 0.5:  # (at 0.99 fewer elements are in the bracket than a pool holds)
                assert paths[1:] == ["overflow", "overflow", "answered", "answered"], paths


def test_unfused_selects_match(small_plan, kernel_device, monkeypatch):
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(n, generator=g).to(kernel_device) for n in (0, 20, 500, 3000)]
    xs[2][::7] = math.inf
    want = [_exact(x, 0.99)[0] for x in xs]
    monkeypatch.setattr(small_plan, "FUSED", False)
    got = trimtab.abs_quantiles(xs, 0.99, impl="triton", return_nonfinite=True)
    assert got.value.tolist() == want
    assert got.nonfinite.tolist() == [0, 0, 72, 0]


@pytest.mark.parametrize("layout", ["sorted", "clustered", "periodic"])
def test_structured_data_spreads_over_pools(small_plan, layout, kernel_device):
    """The sample hashes its runs and the buffer its pools: sorted data, a hot region, and
    values that repeat with the period of a block still take the buffer path."""
    g = torch.Generator().manual_seed(2)
    n = 4096
    x = torch.randn(n, generator=g)
    if layout == "sorted":
        x = x.abs().sort().values
    elif layout == "clustered":
        x[1000:1100] *= 100
    else:
        x = x.reshape(-1, 64) * torch.linspace(0.1, 10, 64)
    x = x.reshape(-1).to(kernel_device)
    for q in (0.5, 0.99):
        values, paths = _paths(small_plan, [x], q)
        assert values == [_exact(x, q)[0]] and paths == ["buffer"], (q, paths)


def test_subnormal_answers_are_exact_without_exact_flag(kernel_device):
    x = torch.tensor([3e-44, -5e-42, 7.1e-40, 1e-39, 0.0, -0.0], device=kernel_device)
    for q in (0.3, 0.5, 0.6, 0.8, 1.0):  # ranks 2 (a zero), 3, 4, 5, 6
        got = trimtab.abs_quantile(x, q, impl="triton")
        assert got.item() == _exact(x, q)[0], q


def test_single_tensor_api(kernel_device):
    x = torch.randn(3, 5, 7, device=kernel_device)
    x[0, 0, 0] = math.nan
    for impl in ("torch", "triton"):
        v = trimtab.abs_quantile(x, 0.9, impl=impl)
        assert v.shape == () and v.dtype == torch.float32 and v.device == x.device
        r = trimtab.abs_quantile(x, 0.9, impl=impl, return_nonfinite=True)
        assert isinstance(r, trimtab.quantile.AbsQuantile)
        assert r.nonfinite.item() == 1 and r.nonfinite.dtype == torch.int64
        assert r.value.item() == pytest.approx(_exact(x, 0.9)[0], rel=REL_2_15)


def test_many_tensors_with_an_empty_one_and_mixed_shapes(kernel_device, small_plan):
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(s, generator=g).to(kernel_device) for s in ((5, 7), (0,), (300,), (1,))]
    xs.append(torch.randn(20, 30, generator=g).to(kernel_device).t())  # non-contiguous
    xs.append(torch.randn(601, generator=g).to(kernel_device)[1:])  # not 16-byte aligned
    got = trimtab.abs_quantiles(xs, 0.99, impl="triton", exact=True)
    assert got.shape == (len(xs),)
    assert got.tolist() == [_exact(x, 0.99)[0] for x in xs]
    assert trimtab.abs_quantiles([], 0.99).shape == (0,)


def test_mixed_dtypes_and_float64_in_one_call(kernel_device):
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(100, generator=g, dtype=torch.float64).to(kernel_device)]
    xs += [torch.randn(100, generator=g).to(d).to(kernel_device) for d in DTYPES]
    xs[0][5] = 1e300  # finite in float64, would be +Inf if cast to float32
    got = trimtab.abs_quantiles(xs, 0.999, impl="triton", exact=True, return_nonfinite=True)
    want = [_exact(x, 0.999) for x in xs]
    assert got.nonfinite.tolist() == [0] * 4
    assert got.value[1:].tolist() == [v for v, _ in want[1:]]
    assert got.value[0].item() == torch.tensor(want[0][0], dtype=torch.float32).item()


def test_large_on_cpu_reference_beyond_torch_quantile_limit():
    x = torch.randn(17_000_000, generator=torch.Generator().manual_seed(1))
    v, c = abs_quantile_reference(x, 0.99)
    k = math.ceil(0.99 * x.numel())
    assert v.item() == x.abs().kthvalue(k).values.item() and c.item() == 0


BAD = [
    (torch.arange(5), 0.5, TypeError, "float16, bfloat16, float32 or float64"),
    (torch.ones(5, dtype=torch.bool), 0.5, TypeError, "floating tensor"),
    (torch.ones(5), 0.0, ValueError, r"\(0, 1\]"),
    (torch.ones(5), 1.5, ValueError, r"\(0, 1\]"),
    (torch.ones(5), torch.tensor(0.5), ValueError, "host sync"),
]


@pytest.mark.parametrize(("x", "q", "exc", "pattern"), BAD)
def test_errors(x, q, exc, pattern):
    with pytest.raises(exc, match=pattern):
        trimtab.abs_quantile(x, q)


def test_bad_impl():
    with pytest.raises(ValueError, match="impl"):
        trimtab.abs_quantile(torch.ones(3), 0.5, impl="cuda")


# --- GPU only -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n", [20_000_000, 100_000_000])
def test_gpu_large_matches_kthvalue(n):
    x = torch.randn(n, device="cuda")
    x[::1000] = math.nan
    a = x.abs()
    finite = a[torch.isfinite(a)]
    for q in (0.5, 0.99, 1.0):
        want = finite.kthvalue(max(1, math.ceil(q * finite.numel()))).values
        got = trimtab.abs_quantile(x, q, return_nonfinite=True)
        assert got.value.item() == want.item()
        assert got.nonfinite.item() == n - finite.numel()


@pytest.mark.gpu
def test_gpu_paths_on_large_tensors(kq, monkeypatch):
    """Default settings take the buffer path on large tensors; the radix select over whole
    tensors (the fallback's passes, forced by a large DIRECT_MAX) and the unfused selects give
    the same exact values."""
    g = torch.Generator(device="cuda").manual_seed(3)
    xs = [torch.randn(n, device="cuda", generator=g) for n in (5_000_000, 300_001, 40_000)]
    xs.append(torch.empty(2_000_000, device="cuda").cauchy_(generator=g))
    xs.append(torch.full((1_000_000,), 0.5, device="cuda"))
    for q in (0.5, 0.99, 0.999, 1.0):
        want = [abs_quantile_reference(x, q)[0].item() for x in xs]
        values, ws = kq.run(xs, q)
        assert values.tolist() == want, q
        assert kq.paths(ws) == ["buffer"] * 4 + ["answered"], (q, kq.paths(ws))
        with monkeypatch.context() as m:
            m.setattr(kq, "DIRECT_MAX", 1 << 40)
            values, ws = kq.run(xs, q)
            assert values.tolist() == want and kq.paths(ws) == ["direct"] * 5, q
        with monkeypatch.context() as m:
            m.setattr(kq, "FUSED", False)
            assert kq.run(xs, q)[0].tolist() == want, q


def _mlp_like(device: str) -> list[torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    shapes = [(4096, 1024), (4096,), (1024, 4096), (1024,), (512, 1024), (512,)] * 4
    ts = [torch.randn(s, device=device, generator=g) for s in shapes]
    return ts + [t * 1e-3 for t in ts]


@pytest.mark.gpu
def test_gpu_batch_sync_free_and_graph_capturable():
    ts = _mlp_like("cuda")
    want = torch.stack([abs_quantile_reference(t, 0.99)[0] for t in ts])
    got = trimtab.abs_quantiles(ts, 0.99, exact=True)  # warm-up: compile, cache the table
    assert torch.equal(got, want)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = trimtab.abs_quantiles(ts, 0.99, exact=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = trimtab.abs_quantiles(ts, 0.99, exact=True)
    for t in ts:
        t.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, 2 * want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_launch_small_path_matches_the_multi_pass_one(dtype, kernel_device, monkeypatch):
    """Tensors up to SMALL_MAX take the one-launch select; the per-pass launches (SMALL_MAX = 0)
    give the very same values and counts, NaN/Inf/empty included."""
    from trimtab.kernels import quantile as kq

    xs = _inputs("normal", dtype, kernel_device, sprinkle=True, seed=7)
    assert max(x.numel() for x in xs) <= kq.SMALL_MAX
    for q in QS:
        small = trimtab.abs_quantiles(xs, q, impl="triton", return_nonfinite=True)
        monkeypatch.setattr(kq, "SMALL_MAX", 0)
        multi = trimtab.abs_quantiles(xs, q, impl="triton", return_nonfinite=True)
        monkeypatch.undo()
        assert small.value.tolist() == multi.value.tolist(), q
        assert small.nonfinite.tolist() == multi.nonfinite.tolist(), q
