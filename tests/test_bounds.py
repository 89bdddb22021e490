"""AdaptiveBounds and BoundClamp: the measure -> clamp -> fold loop, its reset, checkpoints,
engagement feedback and the clamp layer's gradient."""

from __future__ import annotations

import math

import pytest
import torch

from trimtab.bounds import AdaptiveBounds, BoundClamp
from trimtab.lifecycle import Lifecycle
from trimtab.sentinel import Sentinel
from trimtab.state import Slot, StateVector


def _run(bounds: AdaptiveBounds, name: str, scale: float, steps: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = scale * torch.randn(4096, generator=g)
        bounds.measure(name, x)
        bounds.clamp_(name, x)
        bounds.fold()


def test_bound_tracks_the_p99_and_clamps_about_one_percent():
    b = AdaptiveBounds(["a", "b"])
    _run(b, "a", 5.0, 200)
    assert float(b.values[0]) == pytest.approx(5.0 * 2.5758, rel=0.03)
    assert math.isnan(float(b.values[1]))  # never measured: unset, clamps nothing
    assert math.isnan(float(b.bound("b"))) and float(b.read("b")) == pytest.approx(b.floor)
    assert float(b.engaged_rates()[0]) == pytest.approx(0.01, abs=0.004)


def test_first_step_reads_its_own_measurement_and_reset_forgets_everything():
    with Lifecycle() as life:
        b = AdaptiveBounds(["a"], name="act")
    x = 3.0 * torch.randn(10_000, generator=torch.Generator().manual_seed(1))
    b.measure("a", x)
    from trimtab.quantile import abs_quantile

    assert torch.equal(b.bound("a"), abs_quantile(x, 0.99))  # unset slot: this step's value
    _run(b, "a", 5.0, 100)
    assert "act: unset bounds ['a']" in "\n".join(life.describe())
    life.fold_boundary()
    fresh = AdaptiveBounds(["a"])
    for k, v in fresh.state_dict().items():
        got = b.state_dict()[k]
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(got, v, rtol=0, atol=0, equal_nan=True)
    _run(b, "a", 0.01, 1, seed=5)
    _run(fresh, "a", 0.01, 1, seed=5)
    assert torch.equal(b.values, fresh.values)


def test_a_stale_bound_is_raised_by_the_engagement_test():
    b = AdaptiveBounds(["a"])
    _run(b, "a", 1.0, 50)
    before = float(b.values[0])
    # the data jump x20 while the quantile estimate lags: most elements clamp, the test fires
    _run(b, "a", 20.0, 3, seed=9)
    assert float(b.engagement.rate[0]) > 0 or float(b.values[0]) > 10 * before


def test_headroom_clamps_only_excursions_and_the_test_still_counts_the_quantile():
    b = AdaptiveBounds(["a"], headroom=2.0)
    _run(b, "a", 5.0, 200)
    assert float(b.values[0]) == pytest.approx(5.0 * 2.5758, rel=0.03)  # still the p99
    assert torch.equal(b.clamp_bound("a"), 2.0 * b.bound("a"))
    # the clamp at 2 x p99 of a normal (5.15 sigma) binds on ~3e-7 of the elements, not 1%
    assert float(b.engaged_rates()[0]) < 1e-5
    # the test counts exceedances of the slot: about 1 - q, and it does not fire
    assert float(b.engagement.fraction[0]) == pytest.approx(0.01, abs=0.004)
    assert not bool(b.engagement.stale[0])
    x = torch.tensor([0.0, 1.5, 3.0, -30.0, 200.0])
    b.values.fill_(1.0)
    b.measure("a", x)
    b.clamp_("a", x)
    assert x.tolist() == [0.0, 1.5, 2.0, -2.0, 2.0]  # clamped at 2 x the slot
    assert b._above.tolist() == [4] and b._counts[0, 0].item() == 3  # test at 1, clamp at 2
    # a stale estimate is still raised (the data jump x20)
    c = AdaptiveBounds(["a"], headroom=2.0)
    _run(c, "a", 1.0, 50)
    before = float(c.values[0])
    _run(c, "a", 20.0, 3, seed=9)
    assert float(c.engagement.rate[0]) > 0 or float(c.values[0]) > 10 * before
    for bad in (0.5, math.inf, math.nan):
        with pytest.raises(ValueError, match="headroom"):
            AdaptiveBounds(["a"], headroom=bad)


def test_state_dict_round_trip_continues_identically():
    a = AdaptiveBounds(["x", "y"])
    _run(a, "x", 2.0, 20)
    b = AdaptiveBounds(["x", "y"])
    b.load_state_dict(a.state_dict())
    _run(a, "x", 3.0, 5, seed=3)
    _run(b, "x", 3.0, 5, seed=3)
    torch.testing.assert_close(a.values, b.values, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match="do not match"):
        AdaptiveBounds(["x"]).load_state_dict(a.state_dict())


def test_slots_must_be_declared_consecutively_in_a_shared_state_vector():
    sv = StateVector([*AdaptiveBounds.slots(["a", "b"]), Slot("other")])
    AdaptiveBounds(["a", "b"], state=sv)
    split = StateVector([Slot("a_bound"), Slot("other"), Slot("b_bound")])
    with pytest.raises(ValueError, match="consecutive"):
        AdaptiveBounds(["a", "b"], state=split)
    with pytest.raises(KeyError, match=r"AdaptiveBounds\.slots"):
        AdaptiveBounds(["c"], state=sv)
    with pytest.raises(ValueError, match="unique"):
        AdaptiveBounds(["a", "a"])


def test_clamp_checks_into_the_sentinel_before_sanitising():
    s = Sentinel("cpu")
    b = AdaptiveBounds(["h"], sentinel=s)
    x = torch.randn(100)
    x[3] = math.nan
    b.measure("h", x)
    b.clamp_("h", x)
    assert torch.isfinite(x).all()  # sanitised ...
    fired = s.report()
    assert fired and fired[0].name == "h" and fired[0].kind == "nan"  # ... after the check


def test_bound_clamp_layer_measures_only_the_training_forward_and_masks_the_gradient():
    b = AdaptiveBounds(["h"])
    layer = BoundClamp(b, "h")
    h = (torch.randn(64, 32) * 4).requires_grad_()
    y = layer(h)
    bound = float(b.bound("h"))
    assert float(y.detach().abs().max()) <= bound + 1e-6
    y.sum().backward()
    assert torch.equal(h.grad, (h.detach().abs() <= bound).float())
    b.fold()
    seen = b.engagement.seen_total.clone()
    with torch.no_grad():
        layer(torch.randn(64, 32) * 100)  # an acting forward: clamps, counts nothing
    b.fold()
    assert torch.equal(b.engagement.seen_total, seen)


def _derive_cases(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    special = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-30, 3e38, -2.0, 5e-4])
    cases = []
    for n in (1, 2, 3, 9, 17):
        values = torch.randn(n, generator=g).abs() * 10 ** torch.randint(-6, 6, (n,), generator=g)
        obs = torch.randn(n, generator=g).abs() * 10 ** torch.randint(-6, 6, (n,), generator=g)
        pick = torch.randint(0, len(special), (2, n), generator=g)
        hit = torch.rand(2, n, generator=g) < 0.5
        values = torch.where(hit[0], special[pick[0]], values)
        obs = torch.where(hit[1], special[pick[1]], obs)
        cases.append((values.to(device), obs.to(device)))
    return cases


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 3e38 x 2: Inf
@pytest.mark.parametrize("headroom", [1.0, 2.0, 1.5])
def test_derive_kernel_equals_its_torch_reference(kernel_device, headroom):
    """The read rows' kernel against the torch reference: NaN, ±Inf, ±0, tiny and huge slots and
    measurements, 1 to 17 bounds; bitwise, NaN where the reference has NaN."""
    from trimtab.bounds import _derive_reference
    from trimtab.kernels.bounds import derive_triton

    for values, obs in _derive_cases(kernel_device):
        floor = 1e-3
        want = torch.empty(4, values.numel(), device=kernel_device)
        got = torch.full_like(want, 7.0)
        _derive_reference(values, obs, want, torch.full((), floor, device=kernel_device), headroom)
        derive_triton(values, obs, got, floor, headroom)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        # the rows mean what the five-op read computed: max(slot or measurement, floor), ...
        v = torch.where(values.isnan(), obs, values)
        b = torch.maximum(v, torch.tensor(floor, device=kernel_device))
        torch.testing.assert_close(want[0], b, rtol=0, atol=0, equal_nan=True)
        assert not want[1].isnan().any() and torch.equal(want[3], -want[1])


def test_reads_follow_every_write_of_the_slots():
    """The read rows are refreshed wherever the slots or the measurements change: a fold, a
    measure of an unset slot, a reset, the bounds' load, and a write through the shared state
    vector's own methods (a checkpoint load of another object that shares it)."""
    sv = StateVector([*AdaptiveBounds.slots(["a"]), Slot("other")])
    b = AdaptiveBounds(["a"], state=sv, headroom=2.0)
    assert math.isnan(float(b.bound("a"))) and float(b.read("a")) == pytest.approx(b.floor)
    x = 3.0 * torch.randn(2_000, generator=torch.Generator().manual_seed(2))
    b.measure("a", x)  # unset: the bound is this step's measurement
    assert float(b.bound("a")) == float(b._obs[0]) and float(b.clamp_bound("a")) == 2 * float(
        b._obs[0]
    )
    b.fold()
    assert float(b.bound("a")) == float(b.values[0])
    saved = sv.state_dict()
    sv.write_("a_bound", 40.0)
    assert float(b.bound("a")) == 40.0 and float(b.support("a")[0]) == -40.0
    sv.load_state_dict(saved)
    assert float(b.bound("a")) == float(saved["values"][0])
    sv.reset()
    assert math.isnan(float(b.bound("a")))
    b.load_state_dict({**b.state_dict(), "values": torch.tensor([0.5])})
    assert float(b.read("a")) == 0.5
    b.reset()
    assert math.isnan(float(b.clamp_bound("a")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_clamp_at_the_kept_bound_is_the_clamp_of_a_fresh_one(dtype):
    """On the CPU the clamp reads its bound as derived once per change of the rows
    (``_prepared``): a clamped copy and an in-place clamp, counted or not, give the bits and
    counts of :func:`trimtab.clamp_finite_` at the clamp row as it stands, through a measure of
    an unset slot, folds, a write through the state vector, a reset and a negative slot."""
    from trimtab.clamp import clamp_finite_

    sv = StateVector([*AdaptiveBounds.slots(["a", "b"])])
    b = AdaptiveBounds(["a", "b"], state=sv, headroom=2.0, sentinel=Sentinel("cpu"))
    g = torch.Generator().manual_seed(3)

    def sample() -> torch.Tensor:
        x = (4.0 * torch.randn(257, generator=g)).to(dtype)
        x[::37] = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e30, -1e30, 0.0, 5.0],
                               dtype=dtype)[: len(x[::37])]  # fmt: skip
        return x

    def agree(name: str) -> None:
        i = b.names.index(name)
        bound = b._rows[2, i : i + 1].clone()
        x = sample()
        want = clamp_finite_(x.clone(), bound)
        assert torch.equal(b.clamped(name, x), want) and b.clamped(name, x).dtype == dtype
        assert torch.equal(b.clamp_(name, x.clone(), count=False), want)
        c_want, c_got = torch.zeros(2, dtype=torch.int64), b._counts[i].clone()
        y = b.clamp_(name, x.clone())
        clamp_finite_(x.clone(), bound, c_want)
        assert torch.equal(y, want) and torch.equal(b._counts[i] - c_got, c_want)

    for name in ("a", "b"):
        agree(name)  # unset: nothing clamped, only the non-finite replaced
    for step in range(4):
        b.measure("a", 2.0 * (step + 1) * torch.randn(500, generator=g))
        agree("a"), agree("b")
        b.fold()
        agree("a"), agree("b")
    sv.write_("b_bound", 0.25)
    agree("b")
    sv.write_("b_bound", -1.0)  # a negative bound clamps at 0
    agree("b")
    b.reset()
    agree("a"), agree("b")


def test_support_is_a_snapshot_and_a_dropped_bounds_object_is_not_kept_alive():
    import gc
    import weakref

    sv = StateVector(AdaptiveBounds.slots(["a"]))
    b = AdaptiveBounds(["a"], state=sv)
    lo, hi = b.support("a")
    assert float(hi) == pytest.approx(b.floor) and float(lo) == -float(hi)
    b.measure("a", torch.full((100,), 8.0))
    assert float(hi) == pytest.approx(b.floor)  # kept as read: atoms spread from it stay valid
    assert float(b.support("a")[1]) == 8.0
    gone = weakref.ref(b)
    del b, lo, hi
    gc.collect()
    assert gone() is None  # the state vector holds its refresh weakly
    sv.write_("a_bound", 1.0)  # and forgets it
    assert sv._watchers == []


def test_a_copy_watches_its_own_state_vector():
    """copy.deepcopy of bounds (or of a network holding a BoundClamp, as a target network is
    often made) copies the state vector's watchers: the copy's rows follow the copy's slots."""
    import copy
    import pickle

    b = AdaptiveBounds(["a"])
    c = copy.deepcopy(b)
    assert c.state is not b.state and c._rows.data_ptr() != b._rows.data_ptr()
    c.state.write_("a_bound", 5.0)
    assert float(c.bound("a")) == 5.0 and math.isnan(float(b.bound("a")))
    b.state.write_("a_bound", 2.0)
    assert float(b.bound("a")) == 2.0 and float(c.bound("a")) == 5.0
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), BoundClamp(b, "a"))
    twin = copy.deepcopy(net)
    twin[1].bounds.state.write_("a_bound", 7.0)
    assert float(twin[1].bounds.read("a")) == 7.0 and float(b.read("a")) == 2.0
    sv = pickle.loads(pickle.dumps(b.state))  # a state vector alone pickles as before
    assert torch.equal(sv.tensor, b.state.tensor)
