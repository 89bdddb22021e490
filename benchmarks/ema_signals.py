"""The signal bank of ``bench_ema_bank.py``: 35 seeded signal families, each with its true
level, split before any result was seen into the groups the estimator is tuned on, seen, and fresh.

Each family is parameterised and seeded (its parameters are drawn per seed). The first 21 were
split by family, before any result was seen, into ``tune`` and ``held_out``; but traces of the
``held_out`` ones were read while the estimator was changed, so they no longer test
generalisation and are reported as tuning data ("seen"). The ``fresh`` half (14 families, new
kinds and new parameter ranges drawn from seeds no earlier run used) was committed, with the
commit recorded as ``FRESH_COMMIT`` and in the JSON, before the estimator was run on any of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

# The commit that added the fresh half, before the estimator was run on it.
FRESH_COMMIT = "7265cf4"

Tensor = torch.Tensor


class Draw:
    """Seeded draws for one run of a family (float64, CPU)."""

    def __init__(self, gen: torch.Generator, steps: int) -> None:
        self.gen, self.steps = gen, steps

    def u(self) -> float:
        return float(torch.rand((), generator=self.gen, dtype=torch.float64))

    def sign(self) -> float:
        return 1.0 if self.u() < 0.5 else -1.0

    def randn(self) -> Tensor:
        return torch.randn(self.steps, generator=self.gen, dtype=torch.float64)

    def rand(self) -> Tensor:
        return torch.rand(self.steps, generator=self.gen, dtype=torch.float64)

    def student_t(self, dof: float) -> Tensor:
        """Student-t noise of ``dof`` degrees of freedom scaled to unit variance (dof > 2)."""
        chi2 = torch.distributions.Gamma(dof / 2.0, 0.5).sample((self.steps,))
        # Gamma.sample draws from the global generator: reseed it from ours, so runs repeat.
        return self.randn() / (chi2 / dof).sqrt() * math.sqrt((dof - 2.0) / dof)

    def regimes(self, mean_len: float) -> Tensor:
        """Regime index per step: switches at a rate 1/mean_len, at least one in the run."""
        switch = self.rand() < 1.0 / mean_len
        switch[int(self.steps * (0.2 + 0.6 * self.u()))] = True
        switch[0] = False
        return torch.cumsum(switch.long(), 0)


# A family: (draw) -> (obs, true mean or None, true log-median or None). Additive families have a
# mean only; positive ones (noise multiplicative, lognormal) have both.
Maker = Callable[[Draw], tuple[Tensor, Tensor | None, Tensor | None]]


def _additive(level: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, None]:
    return level + noise, level, None


def _positive(log_level: Tensor, d: Draw, sd: float) -> tuple[Tensor, Tensor, Tensor]:
    """Lognormal noise of log-sd ``sd`` around ``exp(log_level)`` (its median)."""
    obs = (log_level + sd * d.randn()).exp()
    return obs, (log_level + 0.5 * sd * sd).exp(), log_level


def _t(d: Draw) -> Tensor:
    return torch.arange(d.steps, dtype=torch.float64)


def stationary(d: Draw):
    return _additive(torch.full((d.steps,), 10.0 * d.u() - 5.0, dtype=torch.float64), d.randn())


def step(d: Draw):
    at = int(d.steps * (0.25 + 0.5 * d.u()))
    return _additive(torch.where(_t(d) >= at, 5.0 * d.sign(), 0.0).double(), d.randn())


def random_walk(d: Draw):
    return _additive(torch.cumsum(0.1 * d.randn(), 0), d.randn())


def drift(d: Draw):
    """One slow cycle of a sine over the run, amplitude 3σ (bench_ema's ``drift``)."""
    phase = 2.0 * math.pi * d.u()
    return _additive(3.0 * torch.sin(2.0 * math.pi * _t(d) / d.steps + phase), d.randn())


def spikes(d: Draw):
    """Constant level; with probability 0.005 per step the observation is level ± 20σ."""
    level = torch.full((d.steps,), 10.0 * d.u() - 5.0, dtype=torch.float64)
    obs = level + d.randn()
    hit = d.rand() < 0.005
    signs = torch.where(d.rand() < 0.5, -1.0, 1.0).double()
    return torch.where(hit, level + 20.0 * signs, obs), level, None


def one_sided_outliers(d: Draw):
    """Constant level; with probability 0.01 per step the observation is level + 8…30σ."""
    level = torch.full((d.steps,), 10.0 * d.u() - 5.0, dtype=torch.float64)
    hit = d.rand() < 0.01
    size = 8.0 + 22.0 * d.rand()
    return torch.where(hit, level + size, level + d.randn()), level, None


def ramp(d: Draw):
    """A linear ramp over the whole run, from 0 to ±(5…20)σ."""
    return _additive(d.sign() * (5.0 + 15.0 * d.u()) * _t(d) / d.steps, d.randn())


def _burst(d: Draw, length: int, height: float):
    at = int(d.steps * (0.2 + 0.6 * d.u()))
    on = (_t(d) >= at) & (_t(d) < at + length)
    return _additive(torch.where(on, height * d.sign(), 0.0).double(), d.randn())


def burst_short(d: Draw):
    """A real level change of 8σ lasting 8 steps, on a constant level."""
    return _burst(d, 8, 8.0)


def burst(d: Draw):
    """A real level change of 5σ lasting 1% of the run (the issue's burst)."""
    return _burst(d, max(d.steps // 100, 3), 5.0)


def burst_long(d: Draw):
    """A real level change of 3σ lasting 5% of the run."""
    return _burst(d, max(d.steps // 20, 5), 3.0)


def student_t(d: Draw):
    """Heavy-tailed noise (Student-t, 2.5 d.o.f., unit variance) around a constant level."""
    level = torch.full((d.steps,), 10.0 * d.u() - 5.0, dtype=torch.float64)
    return _additive(level, d.student_t(2.5))


def ar1_noise(d: Draw):
    """Autocorrelated noise (AR(1), φ = 0.7, unit variance) around a constant level."""
    e, phi = d.randn(), 0.7
    x = torch.empty_like(e)
    x[0] = e[0]
    for i in range(1, len(e)):
        x[i] = phi * x[i - 1] + math.sqrt(1.0 - phi * phi) * e[i]
    return _additive(torch.full_like(e, 3.0 * d.u()), x)


def level_regimes(d: Draw):
    """Piecewise-constant level: jumps of 2…10σ at a rate of one per ~600 steps."""
    k = d.regimes(600.0)
    jumps = (2.0 + 8.0 * torch.rand(int(k.max()) + 1, generator=d.gen, dtype=torch.float64)) * (
        torch.randint(0, 2, (int(k.max()) + 1,), generator=d.gen).double() * 2 - 1
    )
    jumps[0] = 0.0
    return _additive(torch.cumsum(jumps, 0)[k], d.randn())


def noise_regimes(d: Draw):
    """Constant level; the noise sd switches between 1 and 8 at a rate of one per ~600 steps."""
    k = d.regimes(600.0)
    sd = torch.where(k % 2 == 0, 1.0, 8.0).double()
    level = torch.full((d.steps,), 10.0 * d.u() - 5.0, dtype=torch.float64)
    return _additive(level, sd * d.randn())


def mult_noise(d: Draw):
    """Positive: lognormal noise (log-sd 0.5) around a constant level 10^(-3…3)."""
    log_level = torch.full((d.steps,), math.log(10.0) * (6.0 * d.u() - 3.0), dtype=torch.float64)
    return _positive(log_level, d, 0.5)


def mult_regimes(d: Draw):
    """Positive: level ×40, then to 1/200 of that, then ×40 (thirds of the run), noise
    proportional to the level (log-sd 0.3): the issue's first signal."""
    third = (_t(d) * 3 / d.steps).long().clamp(max=2)
    factors = torch.tensor([0.0, math.log(40.0), math.log(40.0 / 200.0)], dtype=torch.float64)
    base = math.log(10.0) * (4.0 * d.u() - 2.0)
    return _positive(base + factors.cumsum(0)[third], d, 0.3)


def scale_shifts(d: Draw):
    """Positive: level shifts by ×10^k, k uniform in [-3, 3], one per ~750 steps, log-sd 0.3."""
    k = d.regimes(750.0)
    n = int(k.max()) + 1
    logs = math.log(10.0) * (6.0 * torch.rand(n, generator=d.gen, dtype=torch.float64) - 3.0)
    logs[0] = 0.0
    return _positive(torch.cumsum(logs, 0)[k], d, 0.3)


def shrink(d: Draw):
    """Positive: a level that shrinks by 10^(2…4) over the run (gradients as training
    converges), log-sd 0.4."""
    decades = 2.0 + 2.0 * d.u()
    return _positive(-math.log(10.0) * decades * _t(d) / d.steps, d, 0.4)


def p99_burst(d: Draw):
    """Positive: the level ×10 for 1% of the run (a burst of a p99), log-sd 0.3."""
    at = int(d.steps * (0.2 + 0.6 * d.u()))
    on = (_t(d) >= at) & (_t(d) < at + max(d.steps // 100, 3))
    return _positive(torch.where(on, math.log(10.0), 0.0).double(), d, 0.3)


def p99_growth(d: Draw):
    """Positive: a level that grows ×10^(1…3) over the run along a slow S-curve, log-sd 0.3."""
    decades = 1.0 + 2.0 * d.u()
    x = (_t(d) / d.steps - 0.5) * 8.0
    return _positive(math.log(10.0) * decades * torch.sigmoid(x), d, 0.3)


def p99_heavy(d: Draw):
    """Positive: heavy-tailed multiplicative noise (log-scale Student-t, 3 d.o.f., log-sd 0.3)
    around a constant level: its mean is infinite, so it is scored on the log scale only."""
    log_level = torch.full((d.steps,), math.log(10.0) * (4.0 * d.u() - 2.0), dtype=torch.float64)
    return (log_level + 0.3 * d.student_t(3.0)).exp(), None, log_level


# --- the fresh held-out half ------------------------------------------------------------------
# Written and committed (the commit is in the JSON as ``fresh_commit``) before AdaptiveEMA was run
# on any of them; every parameter is drawn per seed from the range stated in its docstring, from
# seeds no earlier run used. The estimator is tuned on the 21 families above only.
def _u(d: Draw, lo: float, hi: float) -> float:
    return lo + (hi - lo) * d.u()


def _ar1(d: Draw, phi: float) -> Tensor:
    """Unit-variance AR(1) noise of coefficient ``phi``."""
    e = d.randn() * math.sqrt(1.0 - phi * phi)
    x = torch.empty_like(e)
    x[0] = e[0] / math.sqrt(1.0 - phi * phi)
    for i in range(1, len(e)):
        x[i] = phi * x[i - 1] + e[i]
    return x


def _windows(d: Draw, count: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """``count`` windows (start, length), lengths uniform in [lo, hi], starts in [10%, 90%)."""
    out = []
    for _ in range(count):
        length = int(_u(d, lo, hi + 1))
        out.append((int(d.steps * _u(d, 0.1, 0.9)), max(length, 1)))
    return out


def fresh_noise_step(d: Draw):
    """Constant level 0…5; the noise sd changes once, at 20…80% of the run, from 1 to
    10^U(-1, 1.3) (a fall to 1/10 … a rise to ×20)."""
    at = int(d.steps * _u(d, 0.2, 0.8))
    sd = torch.where(_t(d) >= at, 10.0 ** _u(d, -1.0, 1.3), 1.0).double()
    return _additive(torch.full((d.steps,), _u(d, 0.0, 5.0), dtype=torch.float64), sd * d.randn())


def fresh_bursts(d: Draw):
    """2…5 bursts of a real level change, each U(5, 60) steps long and ±U(2, 12)σ high."""
    level = torch.zeros(d.steps, dtype=torch.float64)
    for at, length in _windows(d, int(_u(d, 2, 6)), 5, 60):
        level[at : at + length] = d.sign() * _u(d, 2.0, 12.0)
    return _additive(level, d.randn())


def fresh_ar_noise(d: Draw):
    """AR(1) noise of coefficient U(0.3, 0.9), unit variance, around a constant level 0…5."""
    return _additive(torch.full((d.steps,), _u(d, 0.0, 5.0), dtype=torch.float64),
                     _ar1(d, _u(d, 0.3, 0.9)))  # fmt: skip


def fresh_outlier_mix(d: Draw):
    """Constant level; with probability U(0.002, 0.03) per step the observation is level ±
    U(5, 50)σ, the sign of each outlier drawn (a contaminated normal)."""
    level = torch.full((d.steps,), _u(d, -5.0, 5.0), dtype=torch.float64)
    hit = d.rand() < _u(d, 0.002, 0.03)
    size = (5.0 + 45.0 * d.rand()) * torch.where(d.rand() < 0.5, -1.0, 1.0).double()
    return torch.where(hit, level + size, level + d.randn()), level, None


def fresh_sine(d: Draw):
    """A sinusoid of period U(200, 1500) steps and amplitude U(1, 5)σ."""
    period, amp, phase = _u(d, 200.0, 1500.0), _u(d, 1.0, 5.0), _u(d, 0.0, 2.0 * math.pi)
    return _additive(amp * torch.sin(2.0 * math.pi * _t(d) / period + phase), d.randn())


def fresh_piecewise_trend(d: Draw):
    """Piecewise-linear level: a new slope U(-0.02, 0.02)σ/step at switches one per ~U(300,
    1000) steps."""
    k = d.regimes(_u(d, 300.0, 1000.0))
    slopes = 0.04 * torch.rand(int(k.max()) + 1, generator=d.gen, dtype=torch.float64) - 0.02
    return _additive(torch.cumsum(slopes[k], 0), d.randn())


def fresh_t_regimes(d: Draw):
    """Student-t noise of U(2.2, 5) d.o.f. (unit variance) around a level that jumps by
    ±U(2, 8)σ one per ~U(400, 1200) steps."""
    k = d.regimes(_u(d, 400.0, 1200.0))
    n = int(k.max()) + 1
    jumps = (2.0 + 6.0 * torch.rand(n, generator=d.gen, dtype=torch.float64)) * (
        torch.randint(0, 2, (n,), generator=d.gen).double() * 2 - 1
    )
    jumps[0] = 0.0
    return _additive(torch.cumsum(jumps, 0)[k], d.student_t(_u(d, 2.2, 5.0)))


def fresh_level_noise_regimes(d: Draw):
    """Regimes one per ~U(300, 1000) steps; at each the level moves by ±U(0, 6) and the noise
    sd is redrawn in 10^U(-0.5, 0.7) (level and noise regimes at once, not tied)."""
    k = d.regimes(_u(d, 300.0, 1000.0))
    n = int(k.max()) + 1
    moves = 12.0 * torch.rand(n, generator=d.gen, dtype=torch.float64) - 6.0
    moves[0] = 0.0
    sds = 10.0 ** (1.2 * torch.rand(n, generator=d.gen, dtype=torch.float64) - 0.5)
    return _additive(torch.cumsum(moves, 0)[k], sds[k] * d.randn())


def fresh_p99_regimes(d: Draw):
    """Positive: the level moves by ×10^U(-2, 2) one per ~U(300, 1000) steps, log-sd U(0.1, 0.6)
    (a p99 across regime shifts)."""
    k = d.regimes(_u(d, 300.0, 1000.0))
    n = int(k.max()) + 1
    logs = math.log(10.0) * (4.0 * torch.rand(n, generator=d.gen, dtype=torch.float64) - 2.0)
    logs[0] = 0.0
    return _positive(torch.cumsum(logs, 0)[k], d, _u(d, 0.1, 0.6))


def fresh_p99_spiky(d: Draw):
    """Positive: a constant level 10^U(-3, 3), log-sd U(0.2, 0.5); with probability
    U(0.002, 0.02) per step the value is ×10^U(1, 3) (one-sided spikes, not the level)."""
    log_level = torch.full((d.steps,), math.log(10.0) * _u(d, -3.0, 3.0), dtype=torch.float64)
    sd = _u(d, 0.2, 0.5)
    obs, mean, median = _positive(log_level, d, sd)
    hit = d.rand() < _u(d, 0.002, 0.02)
    spike = (math.log(10.0) * (1.0 + 2.0 * d.rand())).exp()
    return torch.where(hit, obs * spike, obs), mean, median


def fresh_p99_decay(d: Draw):
    """Positive: a loss-like decay ``(1 + t/τ)^-k``, τ = U(20, 500) steps, k such that the level
    falls by 10^U(1, 5) over the run, log-sd U(0.2, 0.8)."""
    tau, decades = _u(d, 20.0, 500.0), _u(d, 1.0, 5.0)
    k = decades * math.log(10.0) / math.log1p(d.steps / tau)
    return _positive(-k * torch.log1p(_t(d) / tau), d, _u(d, 0.2, 0.8))


def fresh_p99_ar(d: Draw):
    """Positive: a constant level 10^U(-2, 2) with log-scale AR(1) noise, coefficient
    U(0.3, 0.9), log-sd U(0.2, 0.5) (the p99 of overlapping or correlated batches)."""
    log_level = math.log(10.0) * _u(d, -2.0, 2.0)
    sd, phi = _u(d, 0.2, 0.5), _u(d, 0.3, 0.9)
    log_y = log_level + sd * _ar1(d, phi)
    level = torch.full((d.steps,), log_level, dtype=torch.float64)
    return log_y.exp(), (level + 0.5 * sd * sd).exp(), level


def fresh_p99_noise_regimes(d: Draw):
    """Positive: a constant level 10^U(-2, 2); the log-sd switches between U(0.1, 0.3) and
    U(2, 5) times that, one switch per ~U(300, 1000) steps. Scored on the log scale only (the
    linear mean's log-sd of up to 1.5 makes its linear MSE a measure of a few values)."""
    k = d.regimes(_u(d, 300.0, 1000.0))
    low = _u(d, 0.1, 0.3)
    sd = torch.where(k % 2 == 0, low, low * _u(d, 2.0, 5.0)).double()
    log_level = torch.full((d.steps,), math.log(10.0) * _u(d, -2.0, 2.0), dtype=torch.float64)
    return (log_level + sd * d.randn()).exp(), None, log_level


def fresh_p99_bursts(d: Draw):
    """Positive: 1…4 bursts of the level ×10^U(0.5, 2), each U(10, 100) steps long, on a
    constant level, log-sd U(0.2, 0.4)."""
    log_level = torch.zeros(d.steps, dtype=torch.float64)
    for at, length in _windows(d, int(_u(d, 1, 5)), 10, 100):
        log_level[at : at + length] = math.log(10.0) * _u(d, 0.5, 2.0)
    return _positive(log_level, d, _u(d, 0.2, 0.4))


# The split, fixed by family before any result was seen: the first column is tuned on.
FAMILIES: dict[str, tuple[str, Maker]] = {
    # tune
    "stationary": ("tune", stationary),
    "random_walk": ("tune", random_walk),
    "spikes": ("tune", spikes),
    "ramp": ("tune", ramp),
    "burst_short": ("tune", burst_short),
    "ar1_noise": ("tune", ar1_noise),
    "level_regimes": ("tune", level_regimes),
    "mult_noise": ("tune", mult_noise),
    "scale_shifts": ("tune", scale_shifts),
    "p99_growth": ("tune", p99_growth),
    # held out
    "step": ("held_out", step),
    "drift": ("held_out", drift),
    "burst": ("held_out", burst),
    "burst_long": ("held_out", burst_long),
    "student_t": ("held_out", student_t),
    "one_sided_outliers": ("held_out", one_sided_outliers),
    "noise_regimes": ("held_out", noise_regimes),
    "mult_regimes": ("held_out", mult_regimes),
    "shrink": ("held_out", shrink),
    "p99_burst": ("held_out", p99_burst),
    "p99_heavy": ("held_out", p99_heavy),
    # fresh held out (see above): committed before any result of theirs was seen
    "fresh_noise_step": ("fresh", fresh_noise_step),
    "fresh_bursts": ("fresh", fresh_bursts),
    "fresh_ar_noise": ("fresh", fresh_ar_noise),
    "fresh_outlier_mix": ("fresh", fresh_outlier_mix),
    "fresh_sine": ("fresh", fresh_sine),
    "fresh_piecewise_trend": ("fresh", fresh_piecewise_trend),
    "fresh_t_regimes": ("fresh", fresh_t_regimes),
    "fresh_level_noise_regimes": ("fresh", fresh_level_noise_regimes),
    "fresh_p99_regimes": ("fresh", fresh_p99_regimes),
    "fresh_p99_spiky": ("fresh", fresh_p99_spiky),
    "fresh_p99_decay": ("fresh", fresh_p99_decay),
    "fresh_p99_ar": ("fresh", fresh_p99_ar),
    "fresh_p99_noise_regimes": ("fresh", fresh_p99_noise_regimes),
    "fresh_p99_bursts": ("fresh", fresh_p99_bursts),
}
HALVES = ("tune", "held_out", "fresh")


def make(name: str, steps: int, seed: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One run of family ``name``: (observations, true mean or None, true log-median or None)."""
    index = list(FAMILIES).index(name)
    # the fresh half draws from seeds no earlier run of the bank used (another base and stride)
    key = 104729 * seed + 1_000_003 + index if FAMILIES[name][0] == "fresh" else 7919 * seed + index
    gen = torch.Generator().manual_seed(key)
    torch.manual_seed(key)  # torch.distributions draws from the global one
    return FAMILIES[name][1](Draw(gen, steps))
