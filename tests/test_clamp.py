"""clamp_finite_ and guard_: the kernel against the reference, bitwise, and guard_'s records."""

from __future__ import annotations

import math

import pytest
import torch

from trimtab import Sentinel, clamp_finite_, guard_
from trimtab._impl import interpreter_enabled
from trimtab.sentinel import Rule

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SIZES = (0, 1, 13, 63, 65, 200)  # blocks of 64 below


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    kc = pytest.importorskip("trimtab.kernels.clamp")
    monkeypatch.setattr(kc, "CLAMP_BLOCK", 64)
    monkeypatch.setattr(kc, "REDUCE_BLOCK", 2)


def noisy(n: int, dtype: torch.dtype, device, seed: int) -> torch.Tensor:
    """Random values with NaN, ±Inf, -0.0, subnormals and huge values sprinkled in."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    specials = torch.tensor([math.nan, math.inf, -math.inf, -0.0, subnormal(dtype), *huge(dtype)])
    if n:
        pos = torch.randint(n, (max(1, n // 8),), generator=gen)
        x[pos] = specials[torch.randint(len(specials), (len(pos),), generator=gen)].double()
    return x.to(dtype).to(device)


def subnormal(dtype: torch.dtype) -> float:
    """A subnormal of ``dtype``; a normal for bf16 under the CPU interpreter, whose bf16 -> fp32
    conversion mangles subnormals (GPUs convert them exactly)."""
    tiny = torch.finfo(dtype).tiny
    return tiny if dtype == torch.bfloat16 and interpreter_enabled() else tiny / 4


def huge(dtype: torch.dtype) -> tuple[float, float]:
    return torch.finfo(dtype).max, -torch.finfo(dtype).max / 3


def bits(t: torch.Tensor) -> torch.Tensor:
    """A bitwise view (so -0.0 differs from 0.0 and NaN equals itself)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()]).cpu()


BOUNDS = ("float", "tensor", "nan_tensor", "nan_float", "negative_tensor", "zero")


def make_bound(kind: str, device):
    return {
        "float": 2.5,
        "zero": 0.0,
        "tensor": torch.tensor([1.75], device=device),
        "nan_tensor": torch.tensor([math.nan], device=device),
        "nan_float": math.nan,  # unset: sanitise only
        "negative_tensor": torch.tensor([-1.0], device=device),
    }[kind]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bound_kind", BOUNDS)
def test_clamp_kernel_matches_reference(dtype, bound_kind, kernel_device):
    bound = make_bound(bound_kind, kernel_device)
    for seed, n in enumerate(SIZES):
        xs = [noisy(n, dtype, kernel_device, seed) for _ in range(2)]
        counters = [torch.zeros(2, dtype=torch.int64, device=kernel_device) for _ in range(2)]
        for x, c, impl in zip(xs, counters, ("torch", "triton")):
            assert clamp_finite_(x, bound, c, impl=impl) is x
        assert torch.equal(bits(xs[0]), bits(xs[1])), (n, dtype)
        assert torch.equal(counters[0], counters[1])
        assert torch.isfinite(xs[1]).all()


@pytest.mark.parametrize("impl", ("torch", "triton"))
def test_clamp_semantics(impl, kernel_device):
    x = torch.tensor(
        [1.0, -3.0, math.nan, math.inf, -math.inf, -0.0, 2.0, 5.0], device=kernel_device
    )
    c = torch.zeros(2, dtype=torch.int64, device=kernel_device)
    clamp_finite_(x, 2.0, c, impl=impl)
    want = torch.tensor([1.0, -2.0, 0.0, 0.0, 0.0, -0.0, 2.0, 2.0])
    assert torch.equal(bits(x), bits(want))
    assert c.tolist() == [2, 3]  # two finite values clamped; three non-finite replaced
    c1 = torch.zeros(1, dtype=torch.int64, device=kernel_device)
    x = torch.tensor([4.0, -4.0, math.nan], device=kernel_device)
    bound = torch.tensor([math.nan], device=kernel_device)  # unset: sanitise only
    clamp_finite_(x, bound, c1, impl=impl)
    assert x.tolist() == [4.0, -4.0, 0.0] and c1.tolist() == [0]
    bound.fill_(3.0)  # read when the kernel runs
    clamp_finite_(x, bound, c1, impl=impl)
    assert x.tolist() == [3.0, -3.0, 0.0] and c1.tolist() == [2]


def guarded_pair(device):
    sentinels = []
    for impl in ("torch", "triton"):
        s = Sentinel(device, impl=impl)
        s.add("act", torch.zeros(3, device=device), phase="forward")
        s.add("target", None, Rule.above(torch.tensor([8.0], device=device)), phase="forward")
        s.add("logits", None, phase="forward")
        sentinels.append(s)
    return sentinels


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_guard_kernel_matches_reference(dtype, kernel_device):
    ref, ker = guarded_pair(kernel_device)
    for step, n in enumerate((1, 65, 200, 0, 130)):
        x = noisy(n, dtype, kernel_device, step) if step % 2 else torch.randn(n).to(dtype)
        x = x.to(kernel_device)
        xs = [x.clone(), x.clone()]
        counters = [torch.zeros(2, dtype=torch.int64, device=kernel_device) for _ in range(2)]
        for s, xi, c in zip((ref, ker), xs, counters):
            s.check("forward")
            guard_(xi, 1.5, s, ("target", "logits")[step % 2], c, impl=s._impl)
        assert torch.equal(bits(xs[0]), bits(xs[1]))
        assert torch.equal(counters[0], counters[1])
        for key in ("rec", "value", "counters", "guard_steps"):
            a, b = ref._state.tensors[key], ker._state.tensors[key]
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=key)
    assert ker._state.tensors["done"].abs().sum() == 0
    assert len(ker.report()) >= 1


@pytest.mark.parametrize("impl", ("torch", "triton"))
def test_guard_checks_before_sanitising(impl, kernel_device):
    s = Sentinel(kernel_device, impl=impl)
    s.add("before", torch.zeros(1, device=kernel_device), phase="forward")
    s.add("q", None, Rule.above(4.0), phase="backward")
    for _ in range(2):
        guard_(torch.ones(70, device=kernel_device), 2.0, s, "q", impl=impl)
    s.check("forward")
    x = torch.ones(70, device=kernel_device)
    x[66] = math.nan
    x[3] = 5.0
    guard_(x, 2.0, s, "q", impl=impl)  # the 3rd guard_ call on "q": step 2
    assert bool(torch.isfinite(x).all()) and x[3].item() == 2.0
    guard_(x, 2.0, s, "q", impl=impl)  # clean now; the record stays
    (f,) = s.report()
    assert (f.name, f.phase, f.step, f.kind) == ("q", "backward", 2, "nan")
    assert s._state.tensors["counters"][-1].item() == 5  # 4 guard_ calls + 1 check


def test_guard_host_test_fires_at_the_kernel_rule():
    """On the CPU guard_ decides on the host whether the slot fires (and then skips the record
    ops): the same float64 rule, squared threshold and factor included, at the boundary."""
    s = Sentinel("cpu", impl="torch")
    s.add("sq", None, Rule.above(torch.tensor([3.0]), factor=2.0, power=2), phase="backward")
    edge = 36.0  # (3 * 2)²: not above it
    guard_(torch.tensor([edge, -edge]), 100.0, s, "sq")
    assert s.report() == []
    x = torch.tensor([0.0, -math.nextafter(edge, math.inf)], dtype=torch.float64)
    guard_(x, 100.0, s, "sq")  # the 2nd guard_ call: step 1
    (f,) = s.report()
    assert (f.name, f.step, f.kind, f.value) == ("sq", 1, "threshold", math.nextafter(edge, 99))
    assert s._state.tensors["counters"][-1].item() == 2
    # the factor as the device holds it, float32 (0.7 rounds down): 30 x 0.7 is 20.99999964,
    # so 20.9999999 fires, as on the device
    s.add("f", None, Rule.above(torch.tensor([30.0]), factor=0.7), phase="backward")
    guard_(torch.tensor([20.9999999], dtype=torch.float64), 100.0, s, "f")
    assert [f.name for f in s.report()] == ["sq", "f"]


BAD = [
    (lambda x, s: clamp_finite_([1.0], 1.0), TypeError, r"x must be a tensor"),
    (lambda x, s: clamp_finite_(x.int(), 1.0), TypeError, r"dtype torch.int32"),
    (lambda x, s: clamp_finite_(x, -1.0), ValueError, r"bound must be >= 0"),
    (lambda x, s: clamp_finite_(x, True), TypeError, r"bound must be a float"),
    (lambda x, s: clamp_finite_(x, torch.ones(1).double()), TypeError, r"must be float32"),
    (lambda x, s: clamp_finite_(x, torch.ones(2)), ValueError, r"one element"),
    (lambda x, s: clamp_finite_(x, 1.0, torch.zeros(1)), TypeError, r"int64 tensor"),
    (lambda x, s: clamp_finite_(x, 1.0, torch.zeros(3).long()), ValueError, r"1 or 2"),
    (lambda x, s: clamp_finite_(x, 1.0, impl="gpu"), ValueError, r"impl must be"),
    (lambda x, s: guard_(x, 1.0, object(), "g"), TypeError, r"must be a Sentinel"),
    (lambda x, s: guard_(x, 1.0, s, "nope"), KeyError, r"no slot named 'nope'"),
    (lambda x, s: guard_(x, 1.0, s, "checked"), ValueError, r"add\(name, None"),
]


@pytest.mark.parametrize(("bad", "exc", "pattern"), BAD)
def test_errors(bad, exc, pattern):
    s = Sentinel("cpu", impl="torch")
    s.add("checked", torch.ones(2))
    s.add("g", None)
    with pytest.raises(exc, match=pattern):
        bad(torch.ones(4), s)


@pytest.mark.gpu
def test_clamp_and_guard_are_sync_free():
    x = torch.randn(100_003, device="cuda") * 4
    bound = torch.tensor([2.0], device="cuda")
    c = torch.zeros(2, dtype=torch.int64, device="cuda")
    s = Sentinel("cuda")
    s.add("x", None, Rule.above(bound, factor=10.0))
    guard_(x.clone(), bound, s, "x", c)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        clamp_finite_(x.clone(), bound, c)
        clamp_finite_(x.clone(), 3.0, c)
        guard_(x, bound, s, "x", c)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert x.abs().max().item() <= 2.0


# --- scale_finite_: the gradient clip's multi-tensor scale-and-sanitise --------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_scale_finite_kernel_matches_reference(kernel_device) -> None:
    from trimtab.clamp import scale_finite_

    g = torch.Generator().manual_seed(0)
    shapes = [(0,), (1,), (37,), (2049,), (3, 700)]
    xs = [torch.randn(s, generator=g) * 1e30 for s in shapes]
    xs[2][5], xs[3][0], xs[3][2048], xs[4][1, 3] = math.nan, math.inf, -math.inf, math.nan
    scale = torch.tensor([0.5, 1.0, 0.0, 2.0, 1e-3])
    ref = [x.clone().to(kernel_device) for x in xs]
    ker = [x.clone().to(kernel_device) for x in xs]
    ca = torch.zeros(1, dtype=torch.int64, device=kernel_device)
    cb = torch.zeros(1, dtype=torch.int64, device=kernel_device)
    scale_finite_(ref, scale.to(kernel_device), ca, impl="torch")
    scale_finite_(ker, scale.to(kernel_device), cb, impl="triton")
    for a, b in zip(ref, ker):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
        assert torch.isfinite(b).all()
    assert int(ca) == int(cb) == 4
    torch.testing.assert_close(ref[0].cpu(), torch.empty(0))
    torch.testing.assert_close(ref[3].cpu()[1:2047], xs[3][1:2047] * 2.0)
    assert (ref[2] == 0).all()  # scale 0 (a non-finite gradient): zeroed, NaN included


def test_scale_finite_rejects_bad_arguments() -> None:
    from trimtab.clamp import scale_finite_

    with pytest.raises(ValueError, match="2 elements for 1 tensors"):
        scale_finite_([torch.ones(3)], torch.ones(2))
    with pytest.raises(TypeError, match="float32"):
        scale_finite_([torch.ones(3)], torch.ones(1, dtype=torch.float64))
    with pytest.raises(TypeError, match="int64"):
        scale_finite_([torch.ones(3)], torch.ones(1), torch.zeros(2, dtype=torch.int64))
