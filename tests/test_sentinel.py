"""Sentinel: the kernel against the reference, first-fire semantics, thresholds, errors, reports."""

from __future__ import annotations

import json
import math

import pytest
import torch

from trimtab import NonFiniteError, Sentinel
from trimtab._impl import interpreter_enabled
from trimtab.sentinel import Rule

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SIZES = (0, 1, 7, 31, 63, 65, 129, 257)  # blocks of 64 below: 0, 1, prime, 2^k±1, > 4 programs
IMPLS = ("torch", "triton")


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Tiny kernel blocks so that tiny tensors span several programs and reduction rounds."""
    ks = pytest.importorskip("trimtab.kernels.sentinel")
    monkeypatch.setattr(ks, "CHECK_BLOCK", 64)
    monkeypatch.setattr(ks, "CHECK_TILE", 16)
    monkeypatch.setattr(ks, "REDUCE_BLOCK", 2)


def subnormal(dtype: torch.dtype) -> float:
    """A subnormal of ``dtype``; a normal for bf16 under the CPU interpreter, whose bf16 -> fp32
    conversion mangles subnormals (GPUs convert them exactly)."""
    tiny = torch.finfo(dtype).tiny
    return tiny if dtype == torch.bfloat16 and interpreter_enabled() else tiny / 4


def special_values(dtype: torch.dtype) -> list[float]:
    fi = torch.finfo(dtype)
    return [math.nan, math.inf, -math.inf, -0.0, subnormal(dtype), fi.max / 2, -fi.max]


def sprinkle(t: torch.Tensor, gen: torch.Generator, count: int) -> None:
    """Write ``count`` random special values (NaN, ±Inf, -0.0, subnormal, huge) into ``t``."""
    if t.numel() == 0:
        return
    values = special_values(t.dtype)
    flat = t.view(-1)
    for _ in range(count):
        i = int(torch.randint(t.numel(), (1,), generator=gen))
        flat[i] = values[int(torch.randint(len(values), (1,), generator=gen))]


def state_of(s: Sentinel) -> dict[str, torch.Tensor]:
    t = s._state.tensors
    return {k: t[k].cpu() for k in ("rec", "value", "counters", "guard_steps")}


def assert_same_state(a: Sentinel, b: Sentinel) -> None:
    sa, sb = state_of(a), state_of(b)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, equal_nan=True, msg=k)


PHASES = ("forward", "backward", "optimizer")


def make_pair(device, thr: torch.Tensor, gen: torch.Generator, grouped: bool = False):
    """The same slots (every dtype and size, three phases) in a torch and a triton sentinel;
    ``grouped``: added phase by phase (a phase's slots consecutive, as the trainer adds them:
    the reference's slice path), else interleaved (its indexed path)."""
    sentinels = [Sentinel(device, impl=impl) for impl in IMPLS]
    tensors = []
    slots = []
    for i, (n, dtype) in enumerate((n, d) for n in SIZES for d in DTYPES):
        x = (torch.randn(n, generator=gen) * 3).to(dtype).to(device)
        tensors.append(x)
        power = 2 if i % 4 == 3 else 1  # some slots of squares (Adam's v)
        rule = Rule.above(thr, factor=1.5, name="thr", power=power) if i % 2 else Rule.nonfinite()
        slots.append((f"t{i}", x, rule, PHASES[i % 3]))
    if grouped:
        slots.sort(key=lambda slot: PHASES.index(slot[3]))
    for s in sentinels:
        for name, x, rule, phase in slots:
            s.add(name, x, rule, phase=phase)
    return sentinels, tensors


@pytest.mark.parametrize("grouped", [False, True])
def test_kernel_matches_reference_over_steps(kernel_device, grouped):
    gen = torch.Generator().manual_seed(0)
    thr = torch.tensor([4.0], device=kernel_device)
    (ref, ker), tensors = make_pair(kernel_device, thr, gen, grouped)
    for step in range(6):
        victim = tensors[int(torch.randint(len(tensors), (1,), generator=gen))]
        sprinkle(victim, gen, 2)
        thr.fill_((4.0, 6.0, math.nan, 2.0, 5.0, 1.0)[step])
        phase = (None, "forward", "backward", "optimizer", None, "forward")[step]
        for s in (ref, ker):
            s.check(phase)
        assert_same_state(ref, ker)
    assert ref.to_dict() == ker.to_dict()  # (to_dict: NaN values as strings compare equal)
    assert len(ker.report()) > 5
    assert ker._state.tensors["done"].abs().sum() == 0  # arrival counters left clean
    spans = [launch.span is not None for launch in ref._state._launches.values()]
    assert all(spans) if grouped else not all(spans)  # both reference paths were compared


@pytest.mark.parametrize("offset", [0, 1, 2, 3, 4])
def test_kernel_reads_whole_blocks_at_any_address(kernel_device, offset):
    """The kernel reads a whole block at a 16-byte aligned address in vector loads and every
    other block element by element: views starting 0-4 floats into their storage (aligned at 0
    and 4), each with a NaN, an Inf and a large value in a whole block, fire as the reference's."""
    gen = torch.Generator().manual_seed(offset)
    sentinels = [Sentinel(kernel_device, impl=impl) for impl in IMPLS]
    views = []
    for i, dtype in enumerate(DTYPES):
        x = (torch.randn(offset + 300, generator=gen)).to(dtype).to(kernel_device)[offset:]
        assert (x.data_ptr() % 16 == 0) == (offset * x.element_size() % 16 == 0)
        x[64 + 3 * i] = (math.nan, math.inf, 1e4, -math.inf)[i]  # in the second block of 64
        views.append(x)
    for s in sentinels:
        for i, x in enumerate(views):
            s.add(f"v{i}", x, Rule.above(torch.tensor([5.0], device=kernel_device)))
        s.check()
    assert_same_state(*sentinels)
    kinds = {f.name: f.kind for f in sentinels[1].report()}
    assert kinds == {"v0": "nan", "v1": "inf", "v2": "threshold", "v3": "inf"}


@pytest.mark.parametrize("impl", IMPLS)
def test_first_firing_is_sticky_and_ordered(impl, kernel_device):
    s = Sentinel(kernel_device, impl=impl)
    a = torch.zeros(100, device=kernel_device)
    b = torch.zeros(3, dtype=torch.float16, device=kernel_device)
    s.add("act", a, phase="forward")
    s.add("grad", b, phase="backward")
    s.check("forward")  # forward step 0
    s.check("backward")  # backward step 0
    b[1] = math.inf
    s.check("forward")  # forward step 1: grad not checked
    s.check("backward")  # backward step 1: grad fires (inf)
    a[70] = math.nan
    a[3] = math.inf
    b[0] = math.nan
    s.check("forward")  # forward step 2: act fires (nan beats inf)
    s.check("backward")  # grad fires again with NaN: not overwritten
    got = [(f.name, f.phase, f.step, f.kind) for f in s.report()]
    assert got == [("grad", "backward", 1, "inf"), ("act", "forward", 2, "nan")]
    assert s.report()[0].value == math.inf and math.isnan(s.report()[1].value)
    assert s.steps() == {"forward": 3, "backward": 3}
    assert bool(s.fired())


@pytest.mark.parametrize("impl", IMPLS)
def test_threshold_is_read_when_the_check_runs(impl, kernel_device):
    bound = torch.full((1,), math.nan, device=kernel_device)  # an unset state-vector slot
    x = torch.full((70,), 3.0, device=kernel_device)
    s = Sentinel(kernel_device, impl=impl)
    s.add("w", x, Rule.above(bound, factor=2.0, name="w_p99"))
    for _ in range(3):
        s.check()
    assert not bool(s.fired()), "an unset (NaN) threshold must never fire"
    bound.fill_(2.0)  # 2 * 2.0 = 4 > 3: quiet
    s.check()
    bound.fill_(1.0)  # 2 * 1.0 = 2 < 3: fires at step 4
    s.check()
    (f,) = s.report()
    assert (f.step, f.kind, f.value) == (4, "threshold", 3.0)
    assert "2 * w_p99" in s.to_dict()["slots"][0]["rule"]


@pytest.mark.parametrize("impl", IMPLS)
def test_power_two_compares_with_the_squared_threshold(impl, kernel_device):
    bound = torch.full((1,), 6.0, device=kernel_device)
    v = torch.full((70,), 30.0, device=kernel_device)  # squares: sqrt(30) = 5.48
    s = Sentinel(kernel_device, impl=impl)
    s.add("v", v, Rule.above(bound, factor=1.0, name="g_bound", power=2))
    s.add("g", v.sqrt(), Rule.above(bound, factor=1.0, name="g_bound"))  # the same, in roots
    s.check()
    assert not bool(s.fired())  # 30 < 6² and 5.48 < 6
    bound.fill_(5.0)  # 30 > 25 and 5.48 > 5: both fire, at the same check
    s.check()
    assert [(f.name, f.step, f.kind) for f in s.report()] == [("v", 1, "threshold"),
                                                             ("g", 1, "threshold")]  # fmt: skip
    assert s.report()[0].value == 30.0
    assert "(1 * g_bound)²" in s.to_dict()["slots"][0]["rule"]
    bound.fill_(math.nan)  # unset: only non-finite fires, as for power 1
    s2 = Sentinel(kernel_device, impl=impl)
    s2.add("v", v.clone(), Rule.above(bound, power=2))
    s2.check()
    assert not bool(s2.fired())


@pytest.mark.parametrize("power", [0, 3, 1.0, True])
def test_rule_power_is_one_or_two(power):
    with pytest.raises(ValueError, match="power must be 1 or 2"):
        Rule.above(1.0, power=power)


@pytest.mark.parametrize("impl", IMPLS)
def test_unset_threshold_still_fires_on_nonfinite(impl, kernel_device):
    x = torch.tensor([1e30, -math.inf], device=kernel_device)
    s = Sentinel(kernel_device, impl=impl)
    s.add("x", x, Rule.above(torch.tensor([math.nan], device=kernel_device)))
    s.add("lit", x[:1].clone(), Rule.above(1e29))
    s.check()
    assert [(f.name, f.kind) for f in s.report()] == [("x", "inf"), ("lit", "threshold")]


@pytest.mark.parametrize("impl", IMPLS)
def test_callable_slots_and_skips(impl, kernel_device):
    net = torch.nn.Linear(3, 2).to(kernel_device)
    s = Sentinel(kernel_device, impl=impl)
    s.add("w.grad", lambda: net.weight.grad, phase="backward")
    s.check("backward")  # no grad yet: skipped, but the step advances
    net(torch.ones(1, 3, device=kernel_device)).sum().backward()
    net.weight.grad[0, 0] = math.nan
    s.check("backward")
    (f,) = s.report()
    assert (f.name, f.step, f.kind) == ("w.grad", 1, "nan")


@pytest.mark.parametrize("impl", IMPLS)
def test_report_to_dict_raise_and_reset(impl, kernel_device):
    s = Sentinel(kernel_device, impl=impl)
    x = torch.ones(5, device=kernel_device)
    s.add("q_target", x, phase="forward")
    s.raise_if_fired()  # nothing fired: no error
    x[2] = -math.inf
    s.check("forward")
    with pytest.raises(NonFiniteError, match=r"'q_target'.*phase 'forward', step 0, kind inf"):
        s.raise_if_fired()
    d = json.loads(json.dumps(s.to_dict(), allow_nan=False))
    assert d["fired"] == [
        {"name": "q_target", "phase": "forward", "step": 0, "kind": "inf", "value": "inf"}
    ]
    assert d["steps"] == {"forward": 1}
    s.reset()
    assert not bool(s.fired()) and s.report() == [] and s.steps() == {"forward": 0}
    x[2] = 0.0
    s.check("forward")
    assert s.report() == []


@pytest.mark.parametrize("impl", IMPLS)
def test_records_after_reset_load_and_a_new_slot(impl, kernel_device):
    """A check made before and after a reset, a state load and a slot added later (which
    rebuilds the state's tensors) records where the report reads: the same firings as a
    sentinel built with every slot from the start."""
    x = torch.zeros(4, device=kernel_device)
    y = torch.zeros(3, device=kernel_device)
    s = Sentinel(kernel_device, impl=impl)
    s.add("x", x, Rule.above(1.0), phase="forward")
    x[1] = 5.0
    s.check("forward")  # fires: step 0
    saved = s.state_dict()
    s.reset()
    x[1] = 0.0
    s.check("forward")
    assert s.report() == []
    s.load_state_dict(saved)
    assert [(f.name, f.step) for f in s.report()] == [("x", 0)]
    s.reset()
    s.check("forward")  # step 0, quiet
    s.add("y", y, phase="forward")  # rebuilds the tensors, keeps the records and counters
    y[0] = math.nan
    x[2] = 2.0
    s.check("forward")  # step 1: both fire
    assert [(f.name, f.step, f.kind) for f in s.report()] == [
        ("x", 1, "threshold"),
        ("y", 1, "nan"),
    ]
    assert s.steps() == {"forward": 2}


BAD_INPUTS = [
    (lambda s: s.add("a", torch.ones(2)), ValueError, r"already has a slot named 'a'"),
    (lambda s: s.add("", torch.ones(2)), TypeError, r"non-empty str"),
    (lambda s: s.add("b", [1.0]), TypeError, r"tensor, a callable returning one, or None"),
    (lambda s: s.add("b", torch.ones(2, dtype=torch.int32)), TypeError, r"dtype torch.int32"),
    (lambda s: s.add("b", torch.ones(2), rule="nonfinite"), TypeError, r"must be a Rule"),
    (lambda s: s.add("b", torch.ones(2), phase=3), TypeError, r"phase must be"),
    (lambda s: s.check("backwards"), ValueError, r"unknown phase 'backwards'.*'step'"),
    (lambda s: Rule.above(torch.ones(1, dtype=torch.float64)), TypeError, r"must be float32"),
    (lambda s: Rule.above(torch.ones(2)), ValueError, r"one element"),
    (lambda s: Rule.above(-1.0), ValueError, r">= 0"),
    (lambda s: Rule.above("1"), TypeError, r"float or a float32 tensor"),
    (lambda s: Rule.above(1.0, factor=math.inf), ValueError, r"finite and >= 0"),
    (lambda s: Sentinel(impl="cuda"), ValueError, r"impl must be"),
]


@pytest.mark.parametrize(("bad", "exc", "pattern"), BAD_INPUTS)
def test_errors(bad, exc, pattern):
    s = Sentinel("cpu", impl="torch")
    s.add("a", torch.ones(2))
    with pytest.raises(exc, match=pattern):
        bad(s)


def test_kernel_refuses_non_contiguous(kernel_device):
    s = Sentinel(kernel_device, impl="triton")
    s.add("wT", torch.ones(3, 4, device=kernel_device).t())
    with pytest.raises(ValueError, match=r"slot 'wT': the kernel reads contiguous tensors only"):
        s.check()


def test_callable_returning_wrong_type_is_named():
    s = Sentinel("cpu", impl="torch")
    s.add("bad", lambda: 3.0)
    with pytest.raises(TypeError, match=r"slot 'bad': its callable returned float"):
        s.check()


def _train(checked: bool, impl: str, device) -> list[torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(
        device
    )
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    s = Sentinel(device, impl=impl)
    bound = torch.tensor([0.5], device=device)
    for i, p in enumerate(net.parameters()):
        s.add(f"p{i}", p, Rule.above(bound, factor=2.0), phase="optimizer")
        s.add(f"g{i}", lambda p=p: p.grad, phase="backward")
    x, y = torch.randn(8, 5, device=device), torch.randn(8, 3, device=device)
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        if checked:
            s.check("backward")
        opt.step()
        if checked:
            s.check("optimizer")
    state = opt.state_dict()["state"][0].values()
    return [t.detach().clone().float() for t in (*net.parameters(), *state)]


@pytest.mark.parametrize("impl", IMPLS)
def test_checking_never_changes_training(impl, kernel_device):
    plain, checked = _train(False, impl, kernel_device), _train(True, impl, kernel_device)
    assert len(plain) == len(checked) == 7  # 4 parameters, Adam's step, exp_avg, exp_avg_sq
    for a, b in zip(plain, checked):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))  # bitwise


@pytest.mark.gpu
def test_check_is_sync_free_and_graph_capturable():
    ts = [torch.randn(n, device="cuda") for n in (1, 5000, 70001)]
    ts.append(torch.randn(4099, device="cuda", dtype=torch.bfloat16))
    bound = torch.tensor([100.0], device="cuda")
    s = Sentinel("cuda")
    for i, t in enumerate(ts):
        s.add(f"t{i}", t, Rule.above(bound), phase="backward")
    s.check("backward")  # warm-up: builds the pointer table and the launch metadata
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        s.check("backward")
        s.fired()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # capturing runs nothing: no step is counted
        s.check("backward")
    for _ in range(3):
        graph.replay()  # steps 2, 3, 4
    assert not bool(s.fired())
    ts[2][50_000] = math.nan
    graph.replay()  # step 5: fires
    graph.replay()
    (f,) = s.report()
    assert (f.name, f.kind, f.step) == ("t2", "nan", 5)
    assert s.steps() == {"backward": 7}


def test_host_rule_is_the_device_rule():
    """The CPU's host-side "does anything fire?" (which lets a quiet check skip its record ops)
    answers exactly what the records' own rule does, on awkward values and factors."""
    from trimtab.sentinel_state import _first_firings, fires_on_host

    gen = torch.Generator().manual_seed(3)
    specials = [0.0, math.nan, math.inf, 1e-45, 3.4e38]
    for _ in range(200):
        k = int(torch.randint(1, 6, (1,), generator=gen))
        thr = torch.rand(k, generator=gen) * 10
        thr[torch.rand(k, generator=gen) < 0.2] = math.nan
        factor = torch.tensor([(1.0, 1.5, 1e3, 1.1)[i % 4] for i in range(k)]).double()
        squares = [bool(torch.rand(1, generator=gen) < 0.4) for _ in range(k)]  # some squared
        squared = torch.tensor(squares)
        edge = thr.double() * factor
        edge = torch.where(squared, edge * edge, edge)  # exactly at the limit, or one ulp above
        amax = torch.where(torch.rand(k, generator=gen) < 0.5, edge, edge.nextafter(edge + 1))
        for i in range(k):
            if torch.rand(1, generator=gen) < 0.3:
                amax[i] = specials[int(torch.randint(len(specials), (1,), generator=gen))]
        never = torch.zeros(k, dtype=torch.int64)  # no slot has fired before
        zero = torch.zeros((), dtype=torch.int64)
        first, _ = _first_firings(amax, zero, thr, factor, squared, never, zero)
        assert fires_on_host(amax, thr, factor.tolist(), squares) == bool(first.any())


def test_quiet_cpu_checks_skip_nothing(monkeypatch):
    """A CPU check where nothing fires skips the record ops: the records, values and counters
    are those of the full reference path over steps that fire and steps that do not."""
    import trimtab.sentinel_state as ss

    gen = torch.Generator().manual_seed(1)
    thr = torch.tensor([4.0])
    (quick, _), tensors = make_pair("cpu", thr, gen, grouped=True)
    full = Sentinel("cpu", impl="torch")  # the same slots on the same tensors
    for slot in quick._slots.values():
        full.add(slot.name, slot.source, slot.rule, phase=slot.phase)
    host_rule = ss.fires_on_host
    for step in range(8):
        if step % 3 == 2:
            i = int(torch.randint(len(tensors), (1,), generator=gen))
            sprinkle(tensors[i], gen, 1)
        thr.fill_((4.0, 6.0, 2.0, math.nan, 5.0, 1.0, 3.0, 9.0)[step])
        phase = (None, "forward", "backward", "optimizer")[step % 4]
        quick.check(phase)
        monkeypatch.setattr(ss, "fires_on_host", lambda *a: True)  # always the full path
        full.check(phase)
        monkeypatch.setattr(ss, "fires_on_host", host_rule)
        assert_same_state(quick, full)
    assert len(full.report()) > 2


def test_host_abs_max_is_the_reference():
    """The CPU's NumPy read of max |x| (the quiet check's fast path) gives
    :func:`abs_max_reference`'s value for every dtype NumPy has, on NaN, ±Inf, empty, huge,
    subnormal and strided tensors, and declines bfloat16 and non-CPU tensors."""
    from trimtab.sentinel_state import abs_max_host, abs_max_reference

    gen = torch.Generator().manual_seed(5)
    cases = []
    for dtype in (torch.float16, torch.float32, torch.float64):
        for special in (None, math.nan, math.inf, -math.inf, 6e4, 1e-40, -0.0):
            x = torch.randn(7, 5, generator=gen).to(dtype)
            if special is not None:
                x[3, 2] = special
            cases += [x, x.t(), x[:, ::2], x[:0]]
    got = abs_max_host(cases)
    assert got is not None
    for x, value in zip(cases, got, strict=True):
        want = abs_max_reference(x).item()
        assert (math.isnan(want) and math.isnan(value)) or value == want, (x.dtype, want, value)
    assert abs_max_host([torch.ones(3), torch.ones(3, dtype=torch.bfloat16)]) is None
    assert abs_max_host([]) == []


def test_peek_on_the_cpu_is_the_flag_now():
    x = torch.ones(3)
    s = Sentinel("cpu")
    s.add("x", x)
    s.check()
    assert s.peek() is False
    x[1] = math.nan
    s.check()
    assert s.peek() is True and bool(s.fired())
    s.reset()
    assert s.peek() is False


def test_peek_on_a_gpu_answers_from_an_earlier_copy_and_forgets_it_at_a_reset():
    """Each peek queues a copy of the flag and answers from the one before it, once made: a
    fire is seen one peek late; a copy queued before a reset is not a fire after it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = torch.ones(3, device="cuda")
    s = Sentinel("cuda")
    s.add("x", x)
    s.check()
    assert s.peek() is False  # nothing queued before: queues the first copy (no fire)
    x[1] = math.nan
    s.check()
    torch.cuda.synchronize()
    assert s.peek() is False  # the first copy, made before the NaN; queues the next
    torch.cuda.synchronize()
    assert s.peek() is True  # the copy made after it
    torch.cuda.synchronize()
    s.reset()  # the copy the last peek queued (a fire) is forgotten
    assert s.peek() is False
    torch.cuda.synchronize()
    assert s.peek() is False
    torch.cuda.set_sync_debug_mode("error")  # peek itself never waits for the device
    try:
        for _ in range(3):
            s.check()
            s.peek()
    finally:
        torch.cuda.set_sync_debug_mode("default")
