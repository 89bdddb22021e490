"""abs_quantile(s): kernel, reference and an exact float64 sort agree on awkward inputs."""

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


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 256 and chunks of at most 4 blocks, so small tensors exercise many programs,
    full and tail blocks, and all three per-block paths (uniform, sparse, histogram). Used by a
    few tests only: the interpreter runs about 3x slower with it."""
    kq = pytest.importorskip("trimtab.kernels.quantile")
    if not torch.cuda.is_available():
        monkeypatch.setattr(kq, "BLOCK", 256)
        monkeypatch.setattr(kq, "SPARSE_MAX", 8)
        monkeypatch.setattr(kq, "MAX_BLOCKS_PER_PROGRAM", 4)


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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_and_reference_match_exact_sort(family, dtype, kernel_device, request):
    if family in ("normal", "relu"):
        request.getfixturevalue("small_blocks")
    sprinkle = family not in ("equal", "zeros")
    xs = _inputs(family, dtype, kernel_device, sprinkle, seed=FAMILIES.index(family))
    for q in (*QS, 0.9, 1e-3) if family == "normal" else QS:
        want = [_exact(x, q) for x in xs]
        ref = abs_quantiles_reference(xs, q)
        got = trimtab.abs_quantiles(xs, q, impl="triton", return_nonfinite=True)
        assert got.value.dtype == torch.float32 and got.value.device == xs[0].device
        assert got.nonfinite.tolist() == [c for _, c in want] == ref[1].tolist()
        assert ref[0].tolist() == [v for v, _ in want], (family, q)
        if dtype != torch.float32:  # two passes resolve every bit of fp16/bf16
            assert got.value.tolist() == [v for v, _ in want], (family, q)
            continue
        for (v, _), g in zip(want, got.value.tolist()):
            assert v * (1 - REL_2_15) <= g <= v, (family, q, v, g)
        if q == 0.99:
            exact = trimtab.abs_quantiles(xs, q, impl="triton", exact=True)
            assert exact.tolist() == [v for v, _ in want], (family, q)


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


def test_many_tensors_with_an_empty_one_and_mixed_shapes(kernel_device, small_blocks):
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
        got = trimtab.abs_quantile(x, q, exact=True, return_nonfinite=True)
        assert got.value.item() == want.item()
        assert got.nonfinite.item() == n - finite.numel()
        approx = trimtab.abs_quantile(x, q).item()
        assert want.item() * (1 - REL_2_15) <= approx <= want.item()


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
