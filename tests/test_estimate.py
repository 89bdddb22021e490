"""AdaptiveEMA: bootstrap, smoothing vs tracking, outliers, masking, state, errors, no sync."""

from __future__ import annotations

import math
import re

import pytest
import torch

from trimtab import AdaptiveEMA


def _noise(steps: int, slots: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(steps, slots, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _feed(ema: AdaptiveEMA, obs: torch.Tensor) -> torch.Tensor:
    """Run every row of ``obs`` through ``ema``; return the estimates, one row per step."""
    return torch.stack([ema.update(row.to(ema.dtype)).clone() for row in obs])


def test_unset_until_first_observation_which_replaces() -> None:
    ema = AdaptiveEMA(3)
    assert torch.isnan(ema.estimate).all()
    out = ema.update(torch.tensor([5.0, -2.0, 1e6]))
    assert torch.equal(out, torch.tensor([5.0, -2.0, 1e6]))
    assert torch.equal(ema.alpha, torch.ones(3))
    # A slot that was masked out on the first step is still unset, and its first one replaces.
    ema = AdaptiveEMA(2)
    ema.update(torch.tensor([1.0, 7.0]), mask=torch.tensor([True, False]))
    assert torch.isnan(ema.estimate[1])
    ema.update(torch.tensor([1.0, 7.0]))
    assert ema.estimate[1] == 7.0


def test_starts_as_a_plain_mean() -> None:
    # Every candidate runs its Riccati recursion from the first observation's variance, so its
    # gain starts near 1/n whatever its steady state: no candidate jumps to its steady gain.
    ema = AdaptiveEMA(1)
    ema.update(torch.tensor([2.0]))
    torch.testing.assert_close(
        ema.update(torch.tensor([4.0])), torch.tensor([3.0]), atol=0.05, rtol=0
    )
    # Over many slots of unit noise the error after n observations is near the mean's 1/√n
    # (steady-state gains from the start, averaged over the grid, would give about 2.4/√n).
    ema = AdaptiveEMA(2000, dtype=torch.float64)
    est = _feed(ema, _noise(10, 2000, seed=12))
    rms = est.square().mean(1).sqrt() * torch.arange(1, 11, dtype=torch.float64).sqrt()
    assert (rms[1:] < 1.2).all(), rms


def test_stationary_noise_smooths() -> None:
    level = torch.tensor([3.0, -100.0, 0.001])
    scale = torch.tensor([1.0, 10.0, 1e-4])
    ema = AdaptiveEMA(3, dtype=torch.float64)
    alphas, errors = [], []
    for row in level + scale * _noise(3000, 3, seed=1):
        errors.append((ema.update(row) - level) / scale)
        alphas.append(ema.alpha.clone())
    assert (torch.stack(alphas[-1000:]).mean(0) < 0.05).all(), alphas[-1]
    # RMS error in units of the noise: a fixed α = 0.2 gives 0.33, α = 0.05 gives 0.16.
    rms = torch.stack(errors[-1000:]).square().mean(0).sqrt()
    assert (rms < 0.2).all(), rms


def test_random_walk_is_tracked_near_the_kalman_optimum() -> None:
    level = torch.cumsum(0.1 * _noise(3000, 4, seed=2), 0)  # Q/R = 0.01
    ema = AdaptiveEMA(4, dtype=torch.float64)
    alphas, errors = [], []
    for row, lv in zip(level + _noise(3000, 4, seed=3), level):
        errors.append(ema.update(row) - lv)
        alphas.append(ema.alpha.clone())
    late = torch.stack(alphas[-1000:]).mean()
    assert 0.03 < late < 0.3, late  # the steady-state Kalman gain is 0.095
    # The Kalman filter's MSE is 0.095; fixed α = 0.05 gives 0.12, a stationary-tuned α worse.
    mse = torch.stack(errors[1000:]).square().mean()
    assert mse < 0.125, mse


@pytest.mark.parametrize("height", [5.0, -8.0, 50.0])
def test_step_change_is_tracked_within_a_few_steps(height: float) -> None:
    obs = _noise(1500, 4, seed=4)
    obs[1000:] += height
    est = _feed(AdaptiveEMA(4, dtype=torch.float64), obs)
    assert (est[995:1000].abs() < 0.5).all()
    assert ((est[1003:1010] - height).abs().mean() < 0.5).all()  # like a restarted mean
    # Settled: RMS below a fixed α = 0.2 (0.33), far below the lag of a slow EMA.
    assert ((est[1050:] - height).square().mean(0).sqrt() < 0.3).all()


def _fixed_ema_mse(obs: torch.Tensor, level: torch.Tensor, alpha: float) -> torch.Tensor:
    est, m = [], obs[0].clone()
    for row in obs:
        m += alpha * (row - m)
        est.append(m.clone())
    return (torch.stack(est) - level).square().mean()


def test_linear_trend_is_tracked_without_lag() -> None:
    steps = torch.arange(3000, dtype=torch.float64)[:, None]
    level = 0.02 * steps.expand(3000, 4)
    est = _feed(AdaptiveEMA(4, dtype=torch.float64), level + _noise(3000, 4, seed=13))
    # An EMA trades lag s(1-α)/α against noise α/(2-α): at best MSE ≈ 0.085 (α ≈ 0.1); the
    # trend candidates carry no lag, so the mixture goes well below any fixed rate.
    mse = (est[1000:] - level[1000:]).square().mean()
    best_fixed = min(_fixed_ema_mse(level + _noise(3000, 4, seed=13), level, a) for a in (0.2, 0.1))
    assert mse < 0.05 < best_fixed, (mse, best_fixed)


def test_slow_drift_beats_every_fixed_rate() -> None:
    # The benchmark's drift signal (one sine cycle over the run), where a local-level-only
    # filter lags: the target is 1.25 x the best fixed rate; the trend family beats it.
    steps = torch.arange(3000, dtype=torch.float64)[:, None]
    phase = torch.tensor([0.3, 1.9, 4.0], dtype=torch.float64)
    level = 3.0 * torch.sin(2.0 * math.pi * steps / 3000 + phase)
    obs = level + _noise(3000, 3, seed=14)
    mse = (_feed(AdaptiveEMA(3, dtype=torch.float64), obs) - level).square().mean()
    best_fixed = min(_fixed_ema_mse(obs, level, a) for a in (0.1, 0.05, 0.02))
    assert mse < 0.8 * best_fixed, (mse, best_fixed)


def test_trend_that_stops_overshoots_little() -> None:
    steps = torch.arange(3000, dtype=torch.float64)[:, None]
    level = torch.clamp(0.02 * steps, max=20.0).expand(3000, 32)  # a ramp, flat from step 1000
    err = _feed(AdaptiveEMA(32, dtype=torch.float64), level + _noise(3000, 32, seed=15)) - level
    # The trend candidates overshoot the corner; their squared errors move the weight back to
    # the level candidates within ~100 steps. The mean overshoot stays a fraction of σ.
    bias = err.mean(1)
    assert bias[1000:1200].max() < 0.5, bias[1000:1200].max()
    assert bias[1200:].abs().max() < 0.15, bias[1200:].abs().max()
    assert err[1200:].square().mean().sqrt() < 0.25


def test_shift_during_a_trend_restarts_the_slope() -> None:
    steps = torch.arange(3000, dtype=torch.float64)[:, None]
    level = torch.where(steps < 1500, 0.02 * steps, 0.0).expand(3000, 32)  # ramp to 30, then 0
    err = _feed(AdaptiveEMA(32, dtype=torch.float64), level + _noise(3000, 32, seed=16)) - level
    # Restarted from the two observations of the new level: error like a fresh mean's ~1/√n.
    assert err[1502:1510].abs().mean() < 0.5, err[1502:1510].abs().mean()
    # No candidate carries the old slope on: a slope of 0.02 would be 2 off within 100 steps.
    bias = err[1510:1700].mean(1)
    assert bias.abs().max() < 0.2, bias.abs().max()


def test_lone_spike_barely_moves_the_estimate() -> None:
    obs = _noise(1000, 2, seed=5)
    obs[800, 0] += 1e4
    est = _feed(AdaptiveEMA(2, dtype=torch.float64), obs)
    assert (est[800, 0] - est[799, 0]).abs() < 0.2  # at most α c √S, not α 1e4
    assert est[-1].abs().max() < 0.2


def test_nonfinite_observations_are_ignored_and_counted() -> None:
    obs = _noise(300, 3, seed=6, dtype=torch.float32)
    ref = AdaptiveEMA(3)
    _feed(ref, obs)
    ema = AdaptiveEMA(3)
    bad = {0: math.nan, 1: math.inf, 2: -math.inf}
    for i, row in enumerate(obs):
        ema.update(row)
        if i % 7 == 0:  # interleave rejected observations, each into a different slot
            junk = row.clone()
            junk[i % 3] = bad[i % 3]
            mask = torch.zeros(3, dtype=torch.bool)
            mask[i % 3] = True
            ema.update(junk, mask=mask)
    assert torch.equal(ema.estimate, ref.estimate)
    expected = torch.bincount(torch.arange(0, 300, 7) % 3, minlength=3)
    assert torch.equal(ema.nonfinite_count, expected)
    assert ema.nonfinite_count.dtype == torch.int64
    # Only non-finite: the slot stays unset.
    fresh = AdaptiveEMA(1)
    fresh.update(torch.tensor([math.nan]))
    assert torch.isnan(fresh.estimate).all() and fresh.nonfinite_count.item() == 1


def test_mask_updates_only_the_selected_slots() -> None:
    obs = _noise(200, 4, seed=7, dtype=torch.float32)
    ema = AdaptiveEMA(4)
    _feed(ema, obs[:100])
    before = ema.state_dict()
    mask = torch.tensor([True, False, True, False])
    for row in obs[100:]:
        ema.update(row, mask=mask)
    after = ema.state_dict()
    for name, value in after.items():
        assert torch.equal(value[~mask], before[name][~mask]), name
    assert not torch.equal(after["mean"][mask], before["mean"][mask])
    # A NaN in a masked-out slot is neither used nor counted.
    ema.update(torch.tensor([0.0, math.nan, 0.0, math.nan]), mask=mask)
    assert ema.nonfinite_count.sum() == 0


def test_slots_are_independent_of_their_batch() -> None:
    obs = _noise(400, 5, seed=8)
    obs[200:, 2] += 6.0
    batched = _feed(AdaptiveEMA(5, dtype=torch.float64), obs)
    alone = _feed(AdaptiveEMA(1, dtype=torch.float64), obs[:, 2:3])
    torch.testing.assert_close(batched[:, 2:3], alone, rtol=0, atol=0)


def test_reset_returns_to_unset_in_place() -> None:
    ema = AdaptiveEMA(2)
    view = ema.estimate
    _feed(ema, _noise(100, 2, seed=9, dtype=torch.float32))
    ema.update(torch.tensor([math.nan, 0.0]))
    ema.reset()
    assert torch.isnan(view).all()  # handed-out views (and captured graphs) see the reset
    assert torch.isnan(ema.alpha).all()
    assert torch.equal(ema.nonfinite_count, torch.zeros(2, dtype=torch.int64))
    assert torch.equal(ema.update(torch.tensor([4.0, -4.0])), torch.tensor([4.0, -4.0]))


def test_float32_matches_float64() -> None:
    obs = 3.0 + 2.0 * _noise(2000, 6, seed=10)
    obs[1000:, :3] -= 10.0
    e64 = _feed(AdaptiveEMA(6, dtype=torch.float64), obs)
    e32 = _feed(AdaptiveEMA(6, dtype=torch.float32), obs.float())
    assert e64.dtype == torch.float64 and e32.dtype == torch.float32
    torch.testing.assert_close(e32.double(), e64, rtol=1e-4, atol=1e-4)


def test_state_dict_round_trip_continues_identically() -> None:
    obs = _noise(600, 3, seed=11, dtype=torch.float32)
    obs[300:, 1] += 5.0
    a = AdaptiveEMA(3)
    _feed(a, obs[:250])
    b = AdaptiveEMA(3)
    b.load_state_dict(a.state_dict())
    assert torch.equal(_feed(a, obs[250:]), _feed(b, obs[250:]))
    assert torch.equal(a.nonfinite_count, b.nonfinite_count)


def test_to_moves_the_state_and_returns_self() -> None:
    ema = AdaptiveEMA(2, device="cpu")
    assert ema.to("cpu") is ema
    assert all(t.device.type == "cpu" for t in ema.state_dict().values())


def _bad_calls() -> list[tuple[str, object, type[Exception], str]]:
    def update(obs, mask=None):
        return lambda: AdaptiveEMA(3).update(obs, mask)

    def load(state):
        return lambda: AdaptiveEMA(3).load_state_dict(state)

    def raise_(target, index, **over):
        kw = {"z": 12.0, "cold_factor": 1e3, "cold_obs": 3, **over}
        return lambda: AdaptiveEMA(3).update_log_and_raise(torch.ones(3), None, target, index, **kw)

    def bound(**over):
        kw = {"z": 12.0, "cold_factor": 1e3, "cold_obs": 3, **over}
        return lambda: AdaptiveEMA(3).upper_bound_log(**kw)

    vec, at = torch.zeros(5), torch.tensor([4, 0, 2])

    good = AdaptiveEMA(3).state_dict()
    return [
        ("zero slots", lambda: AdaptiveEMA(0), ValueError, "num_slots must be an int >= 1"),
        ("negative slots", lambda: AdaptiveEMA(-2), ValueError, "num_slots must be an int"),
        ("float slots", lambda: AdaptiveEMA(2.0), ValueError, "num_slots must be an int"),
        ("bool slots", lambda: AdaptiveEMA(True), ValueError, "num_slots must be an int"),
        ("half dtype", lambda: AdaptiveEMA(2, dtype=torch.float16), TypeError, "dtype must be"),
        ("wrong length", update(torch.zeros(4)), ValueError, r"shape \(3,\).*got \(4,\)"),
        ("2-d obs", update(torch.zeros(3, 1)), ValueError, r"shape \(3,\)"),
        ("scalar obs", update(torch.tensor(1.0)), ValueError, r"shape \(3,\)"),
        ("int obs", update(torch.zeros(3, dtype=torch.int64)), TypeError, "floating-point"),
        ("bool obs", update(torch.zeros(3, dtype=torch.bool)), TypeError, "floating-point"),
        ("list obs", update([1.0, 2.0, 3.0]), TypeError, "must be a torch.Tensor"),
        ("float mask", update(torch.zeros(3), torch.ones(3)), TypeError, "mask must be a bool"),
        ("short mask", update(torch.zeros(3), torch.ones(2, dtype=torch.bool)), ValueError,
         r"mask must have shape \(3,\)"),
        ("missing key", load({k: v for k, v in good.items() if k != "p_ll"}), KeyError,
         r"missing \['p_ll'\]"),
        ("wrong slots", load({k: v[:2] for k, v in good.items()}), ValueError,
         "has shape .* but this AdaptiveEMA has 3 slots"),
        ("int target", raise_(torch.zeros(5, dtype=torch.int64), at), TypeError,
         "target must be a floating-point tensor"),
        ("2-d target", raise_(vec[None], at), ValueError, r"target must be a vector .*\(1, 5\)"),
        ("float index", raise_(vec, at.float()), TypeError, "index must be an int64 tensor"),
        ("int32 index", raise_(vec, at.int()), TypeError, "index must be an int64 tensor"),
        ("short index", raise_(vec, at[:2]), ValueError, r"index must have shape \(3,\)"),
        ("index out of range", raise_(vec, torch.tensor([4, 0, 5])), ValueError,
         r"distinct elements of target, 0 to 4, got \[4, 0, 5\]"),
        ("negative index", raise_(vec, torch.tensor([4, 0, -1])), ValueError, "0 to 4"),
        ("repeated index", raise_(vec, torch.tensor([4, 0, 4])), ValueError, "distinct"),
        ("nan z", bound(z=math.nan), ValueError, "z must be a finite positive number"),
        ("negative z", bound(z=-1.0), ValueError, "z must be a finite positive number"),
        ("tensor z", bound(z=torch.tensor(3.0)), ValueError, "z must be a finite positive"),
        ("cold factor < 1", bound(cold_factor=0.5), ValueError, "cold_factor must be a finite"),
        ("float cold_obs", bound(cold_obs=2.0), ValueError, "cold_obs must be an int >= 0"),
        ("raise: inf z", raise_(vec, at, z=math.inf), ValueError, "z must be a finite"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "exc", "pattern"),
    [c[1:] for c in _bad_calls()],
    ids=[c[0] for c in _bad_calls()],
)
def test_bad_arguments_raise_clear_errors(call, exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=re.compile(pattern)):
        call()


@pytest.mark.gpu
def test_update_makes_no_host_sync() -> None:
    ema = AdaptiveEMA(64, device="cuda")
    obs = torch.randn(300, 64, device="cuda")
    obs[::17, 3] = math.nan
    mask = torch.rand(64, device="cuda") < 0.5
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for row in obs:
            ema.update(row, mask=mask)
        ema.reset()
        ema.update(obs[0])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ema.estimate.is_cuda


@pytest.mark.gpu
def test_update_captures_in_a_cuda_graph() -> None:
    slots = 16
    obs = torch.randn(200, slots, device="cuda", dtype=torch.float64)
    obs[100:] += 5.0
    eager = AdaptiveEMA(slots, device="cuda", dtype=torch.float64)
    expected = _feed(eager, obs)

    ema = AdaptiveEMA(slots, device="cuda", dtype=torch.float64)
    static = torch.zeros(slots, device="cuda", dtype=torch.float64)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
        ema.update(static)
    torch.cuda.current_stream().wait_stream(stream)
    ema.reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ema.update(static)
    ema.reset()
    got = []
    for row in obs:
        static.copy_(row)
        graph.replay()
        got.append(out.clone())
    torch.testing.assert_close(torch.stack(got), expected)


def test_std_error_is_nan_until_the_noise_is_known_then_covers_the_level():
    ema = AdaptiveEMA(2)
    gen = torch.Generator().manual_seed(0)
    assert torch.isnan(ema.std_error).all()
    ema.update(torch.tensor([5.0, 1.0]))
    assert torch.isnan(ema.std_error).all()  # R needs two observations
    covered = 0
    for step in range(2000):
        noise = torch.randn(1, generator=gen)
        ema.update(torch.cat([5.0 + noise, torch.ones(1)]))
        se = ema.std_error
        if step >= 100:
            covered += int(abs(ema.estimate[0].item() - 5.0) <= 3.0 * se[0].item())
    assert covered >= 0.95 * 1900  # a 3-sigma interval about the estimate holds the level
    assert 0.0 < ema.std_error[0].item() < 0.5  # far below the noise's sd of 1
    assert ema.std_error[1].item() < 1e-3  # a constant signal is known exactly


def test_a_shift_thousands_of_noise_sds_large_is_followed():
    """The shift test compares the two exceeding observations with each other (as noise), not
    their z-scores, which differ by the prediction's move: a 10x drop of a quiet signal (once
    taken for an endless run of outliers) restarts the estimate within two steps."""
    ema = AdaptiveEMA(1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        ema.update(2.6 + 1e-3 * torch.randn(1, generator=gen))
    for _ in range(3):
        ema.update(0.26 + 1e-3 * torch.randn(1, generator=gen))
    assert abs(ema.estimate.item() - 0.26) < 0.01


def test_update_log_stays_positive_after_a_tenfold_drop_and_skips_zeros():
    """Magnitudes folded on a log scale: the trend filters cannot extrapolate a sharp drop below
    zero (on a linear scale a negative bound made every value fire the trainer's sentinel), and
    a zero magnitude is no observation rather than a non-finite one."""
    ema, mask = AdaptiveEMA(1), torch.ones(1, dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    noise = 1 + 0.05 * torch.randn(60, 1, generator=g)
    values = [2.3 * n for n in noise[:20]] + [0.24 * n for n in noise[20:]]
    out = [ema.update_log(v, mask) for v in values]
    assert all(float(o) > 0 for o in out) and abs(float(out[-1]) - 0.24) < 0.05
    before = ema.estimate.clone()
    ema.update_log(torch.zeros(1))
    assert torch.equal(ema.estimate, before) and ema.nonfinite_count.item() == 0


def test_a_rise_of_the_noise_is_learnt_and_does_not_move_the_level() -> None:
    # Unit noise, then 8x the noise at the same level. Two noise values of one sign look like a
    # level shift: the leaders keep the old level, so such a false restart is undone, and a pair
    # of exceedances of opposite signs raises R. (Before: R crept up at META_RATE, and the shift
    # test, still judging by the old noise, restarted the level every few steps.)
    obs = _noise(1300, 8, seed=5)
    obs[1000:] *= 8.0
    ema = AdaptiveEMA(8, dtype=torch.float64)
    est, noise = [], []
    for row in obs:
        est.append(ema.update(row).clone())
        noise.append(ema.noise_var.clone())
    assert (torch.stack(noise)[1050] > 16.0).all()  # R follows within ~50 steps (true: 64)
    rms = torch.stack(est)[1000:].square().mean(0).sqrt()
    # A fixed α = 0.05 gives 1.28 here (8 · √(0.05/1.95)); the level never moved.
    assert rms.median() < 1.0 and (rms < 2.5).all(), rms
    assert torch.equal(ema.count, torch.full((8,), 1300))


def _quiet_then(values: list[float], seed: int = 11) -> list[torch.Tensor]:
    """400 steps of unit noise at level 0, then ``values``; the estimates after each value."""
    ema = AdaptiveEMA(1, dtype=torch.float64)
    for row in _noise(400, 1, seed=seed):
        ema.update(row)
    return [ema.update(torch.tensor([v], dtype=torch.float64)).clone() for v in values]


def test_a_shift_is_a_run_of_three_agreeing_exceedances() -> None:
    # Two agreeing exceedances of one sign are as often a rise of the noise: the level is not
    # restarted on them (the second reports the midpoint, at even odds), the third restarts it.
    est = _quiet_then([10.0, 10.2, 9.9, 10.1])
    assert abs(float(est[0])) < 1.0  # a lone exceedance: an outlier, winsorized
    assert 3.0 < float(est[1]) < 7.0  # one short of a shift: the midpoint is reported
    assert abs(float(est[2]) - 10.03) < 0.05  # the mean of the run
    assert abs(float(est[3]) - 10.05) < 0.1
    # Two agreeing exceedances, then back: the state never left the old level.
    back = _quiet_then([10.0, 10.2, 0.1, -0.2, 0.3])
    assert (torch.stack(back[2:]).abs() < 0.5).all()


def test_a_run_soon_after_an_outlier_needs_one_more_value() -> None:
    # An exceedance that was no shift (here one of the opposite sign) within QUIET_STEPS: noise
    # may be rising, so a run needs NOISY_RUN (4) values; after QUIET_STEPS it needs SHIFT_RUN.
    est = _quiet_then([-9.0, 0.2, 10.0, 10.1, 9.9, 10.0])
    assert abs(float(est[4])) < 6.0 and abs(float(est[5]) - 10.0) < 0.1
    late = _quiet_then([-9.0, 0.2, -0.3, 0.1, 0.0, -0.1, 10.0, 10.1, 9.9])
    assert abs(float(late[8]) - 10.0) < 0.1


def test_a_shift_whose_noise_grew_with_it_raises_the_noise() -> None:
    # A magnitude on a linear scale: the level ×10 and its noise ×10. The values disagree by
    # the old noise's measure, but are closer to each other than to the old level: a shift, and
    # R rises to their spread rather than creeping up at NOISE_RATE.
    ema = AdaptiveEMA(1, dtype=torch.float64)
    for row in 1.0 + 0.1 * _noise(400, 1, seed=12):
        ema.update(row)
    r_before = float(ema.noise_var)
    for v in (10.3, 9.1, 10.9, 9.6):
        est = ema.update(torch.tensor([v], dtype=torch.float64))
    assert abs(float(est) - 10.0) < 1.0 and float(ema.noise_var) > 20 * r_before


@pytest.mark.slow
def test_a_noise_free_closed_loop_holds_its_fixed_point():
    """The C51 support's loop (a bound fed back into its own measurement: every target reaches
    1 + 0.99 b) gives update_log an input with no noise. R floored at R_FLOOR_LOG keeps the
    estimate at the fixed point 100; at TINY (1e-12) the winsorised candidates froze off the
    input and the support fell to ~9 near update 4,100 (benchmarks/experiments/support_loop.py)."""
    from trimtab.bounds import AdaptiveBounds

    bounds = AdaptiveBounds(["targets"], q=0.99, floor=1e-3)
    reach = torch.empty(128)
    seen = []
    for _ in range(5000):
        b = bounds.read("targets")
        seen.append(float(b))
        reach.copy_(1.0 + 0.99 * b)
        bounds.measure("targets", reach)
        bounds.clamp_("targets", reach)
        bounds.fold()
    late = seen[1000:]
    assert min(late) > 90.0 and max(late) < 102.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("num_slots", [1, 3, 17])
def test_compiled_fold_is_the_eager_fold_bitwise(dtype, log, num_slots):
    """The CPU runs the torch fold compiled by TorchScript: the same aten ops, so every state
    tensor equals the eager fold's bit for bit, through NaN, zeros, masks, shifts and a reset."""
    g = torch.Generator().manual_seed(num_slots)
    a, b = AdaptiveEMA(num_slots, dtype=dtype), AdaptiveEMA(num_slots, dtype=dtype)
    b.compiled = False
    level = torch.ones(num_slots, dtype=torch.float64)
    for t in range(300):
        if t % 71 == 0:
            level = level * torch.exp(2.0 * torch.randn(num_slots, generator=g, dtype=level.dtype))
        y = level * torch.exp(0.3 * torch.randn(num_slots, generator=g, dtype=level.dtype))
        y = y.to(dtype)
        y[torch.rand(num_slots, generator=g) < 0.05] = math.nan
        y[torch.rand(num_slots, generator=g) < 0.03] = 0.0
        mask = torch.rand(num_slots, generator=g) < 0.8 if t % 3 == 0 else None
        if t == 150:
            a.reset(), b.reset()
        if log:
            ra, rb = a.update_log(y, mask), b.update_log(y, mask)
        else:
            ra, rb = a.update(y, mask), b.update(y, mask)
        assert torch.equal(ra.view(torch.uint8), rb.view(torch.uint8))
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)), k


def test_upper_bound_log_is_a_cold_factor_until_measured_then_z_spreads() -> None:
    """``exp(estimate + margin)``: NaN while unset; the cold factor exactly until the spread is
    measured (R needs two observations); at least the cold factor until ``cold_obs``
    observations; then ``z`` spreads of one new log observation, below the cold factor for a
    steady magnitude."""
    ema = AdaptiveEMA(2)
    kw = {"cold_factor": 1e3, "cold_obs": 4}
    assert ema.upper_bound_log(12.0, **kw).isnan().all()
    ema.update_log(torch.tensor([2.0, 0.0]))  # a zero is no observation: slot 1 stays unset
    bound = ema.upper_bound_log(12.0, **kw)
    torch.testing.assert_close(bound[0], torch.tensor(2e3), rtol=1e-6, atol=0)
    assert bound[1].isnan()
    for _ in range(2):
        ema.update_log(torch.tensor([2.2, 5.0]))
        assert (ema.upper_bound_log(12.0, **kw)[0] >= 2.0 * 1e3 * 0.99).all()  # still cold
    for v in (2.1, 2.0, 2.1, 2.0, 2.1):
        ema.update_log(torch.tensor([v, 5.0]))
    bound = ema.upper_bound_log(12.0, **kw)
    spread = (ema.noise_var + ema.std_error.square()).sqrt()
    torch.testing.assert_close(bound, (ema.estimate + 12.0 * spread).exp())
    assert (bound < 1e3 * ema.estimate.exp()).all() and bound[0] > ema.estimate[0].exp()


def test_update_log_and_raise_rounds_the_bound_to_the_target_dtype() -> None:
    """A float64 estimator raising a float32 target (and the reverse): the bound rounded to the
    target's dtype, as a float64 reference estimator's bound cast once."""
    for est, tgt in ((torch.float64, torch.float32), (torch.float32, torch.float64)):
        ema, twin = AdaptiveEMA(2, dtype=est), AdaptiveEMA(2, dtype=est)
        target = torch.zeros(3, dtype=tgt)
        for t in range(6):
            obs = torch.tensor([2.0, 5.0], dtype=est) * (1 + 0.1 * t)
            ema.update_log_and_raise(obs, None, target, torch.tensor([2, 0]), z=3.0,
                                     cold_factor=10.0, cold_obs=2)  # fmt: skip
            twin.update_log(obs)
        want = twin.upper_bound_log(3.0, cold_factor=10.0, cold_obs=2).to(tgt)
        assert target.dtype == tgt and target[1] == 0.0
        assert target[2] >= want[0] and target[0] >= want[1]


@pytest.mark.parametrize("masked", [False, True])
def test_update_log_and_raise_is_update_log_then_a_raise_of_the_selected_elements(masked):
    """The reference (the CPU's path) is ``update_log``, then ``fmax`` of the selected
    elements with :meth:`upper_bound_log`, bit for bit; no other element is written, and a NaN
    bound (an unset slot) keeps the element."""
    g = torch.Generator().manual_seed(2)
    kw = {"z": 12.0, "cold_factor": 1e3, "cold_obs": 5}
    a, b = AdaptiveEMA(3), AdaptiveEMA(3)
    index = torch.tensor([5, 1, 3])
    target = torch.tensor([-1.0, math.nan, -2.0, 7.0, -3.0, 1e30])
    expected = target.clone()
    for t in range(40):
        obs = torch.exp(3.0 * (t // 20) + 0.2 * torch.randn(3, generator=g))
        obs[2] = math.nan if t < 10 else obs[2]  # slot 2 unset for a while
        mask = torch.rand(3, generator=g) < 0.7 if masked else None
        a.update_log_and_raise(obs, mask, target, index, **kw)
        b.update_log(obs, mask)
        held = expected[index]
        raised = torch.fmax(held, b.upper_bound_log(**kw))
        expected[index] = raised if mask is None else torch.where(mask, raised, held)
        assert torch.equal(target.view(torch.int32), expected.view(torch.int32)), t
    assert torch.equal(target[[0, 2, 4]], torch.tensor([-1.0, -2.0, -3.0]))
    assert target[5] == 1e30 and 7.0 < target[3] < 1e30
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), k
