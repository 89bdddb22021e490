"""The embedded default market: seeded synthetic OHLCV of 4 assets with persistent regimes.

It needs no download, is identical for a given seed, and has structure an agent can learn,
so a good agent beats buy & hold out of sample; a stress preset turns a late segment into a
crash with volatility x20 and mean daily return x100 of the calm regime.

Model (daily, asset ``a``, regime ``k_t`` shared by all assets)
    k_t follows a Markov chain: stay with probability ``1 - 1/duration_k``, else move to
    ``j != k`` with probability proportional to ``exit_weights[k][j]``. k_0 = calm.
    r_{t,a} = mu_k m_a + phi_k (r_{t-1,a} - mu_k m_a) + sigma_k s_a sqrt(1 - phi_k^2) e_{t,a}
    e_t = L_k z_t,  L_k L_k^T = (1 - rho_k) I + rho_k 1 1^T,  z_{t,a} ~ t_nu / sqrt(nu/(nu-2))
    so r has stationary mean mu_k m_a, volatility sigma_k s_a, lag-1 autocorrelation phi_k,
    cross-asset correlation rho_k and Student-t tails; m_a, s_a are per-asset drift and
    volatility multipliers. phi_k > 0 is momentum, phi_k < 0 mean reversion: the sign of the
    profitable bet on yesterday's return flips with the regime, and the regime shows in
    realised volatility, volume and 20-day return.

    ========  ========  ========  ========  ========  ==================
    regime    mu/day    sigma     phi       rho       mean duration (d)
    ========  ========  ========  ========  ========  ==================
    calm      +0.0002   0.005     -0.30     0.20      150
    trending  +0.0008   0.012     +0.30     0.40      80
    volatile  -0.0004   0.025     -0.30     0.50      40
    crash     -0.0040   0.045     +0.25     0.85      15
    ========  ========  ========  ========  ========  ==================

Bars
    close_t = close_{t-1} exp(r_t), close_{-1} = 100. open_t = close_{t-1} exp(g_t) with an
    overnight move g_t = theta r_t + N(0, (0.1 sigma)^2): a share theta (``overnight_share``,
    0.3) of the day's return, its predictable part included, happens before the open, so the
    open carries information and a fill there misses that share of the edge. The intraday
    move is r_t - g_t. high/low extend max/min(open, close) by |N(0, (0.5 sigma)^2)|;
    volume = 1e6 (1 + |r_t| / (sigma_calm s_a))^0.7 exp(N(0, 0.2^2)). Close-to-close returns
    come from the model above alone: these draws shape the bars, not the closes.
Stress (``stress_start_frac`` set)
    From day ``floor(stress_start_frac T)`` to ``floor(stress_end_frac T)`` the regime is
    crash (its phi and rho) with mu = -stress_return_mult |mu_calm| and sigma =
    stress_vol_mult sigma_calm (defaults 100 and 20, both times m_a, s_a): a long or short
    position's mean daily reward is x100 that of calm days and its spread x20.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trimtab.rl.data.load import MarketData

REGIME_NAMES = ("calm", "trending", "volatile", "crash")


@dataclass(frozen=True)
class Regime:
    """One regime's parameters (daily units); see the module docstring's table."""

    name: str
    drift: float
    vol: float
    ar: float
    corr: float
    duration: float

    def __post_init__(self) -> None:
        if not (self.vol > 0 and -1 < self.ar < 1 and 0 <= self.corr < 1 and self.duration >= 1):
            raise ValueError(
                f"invalid regime {self}: need vol > 0, |ar| < 1, 0 <= corr < 1, duration >= 1"
            )


DEFAULT_REGIMES = (
    Regime("calm", 0.0002, 0.005, -0.30, 0.20, 150.0),
    Regime("trending", 0.0008, 0.012, 0.30, 0.40, 80.0),
    Regime("volatile", -0.0004, 0.025, -0.30, 0.50, 40.0),
    Regime("crash", -0.0040, 0.045, 0.25, 0.85, 15.0),
)
DEFAULT_EXIT_WEIGHTS = (
    (0.0, 0.55, 0.40, 0.05),
    (0.55, 0.0, 0.35, 0.10),
    (0.45, 0.25, 0.0, 0.30),
    (0.25, 0.10, 0.65, 0.0),
)

DEFAULT_DRIFT_MULT = (1.0, 0.8, 1.2, 0.6)
DEFAULT_VOL_MULT = (0.8, 1.0, 1.25, 1.5)


@dataclass(frozen=True)
class MarketSpec:
    """Everything that determines a synthetic market; same spec, same market, bit for bit."""

    n_assets: int = 4
    n_days: int = 2520
    seed: int = 0
    start_date: str = "2010-01-04"
    regimes: tuple[Regime, ...] = DEFAULT_REGIMES
    exit_weights: tuple[tuple[float, ...], ...] = DEFAULT_EXIT_WEIGHTS
    drift_mult: tuple[float, ...] = ()  # () -> DEFAULT_DRIFT_MULT, cycled to n_assets
    vol_mult: tuple[float, ...] = ()  # () -> DEFAULT_VOL_MULT, cycled to n_assets
    tail_df: float = 4.0
    overnight_share: float = 0.3
    stress_start_frac: float | None = None
    stress_end_frac: float = 1.0
    stress_vol_mult: float = 20.0
    stress_return_mult: float = 100.0
    asset_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        k = len(self.regimes)
        if len(self.exit_weights) != k or any(len(row) != k for row in self.exit_weights):
            raise ValueError(f"exit_weights must be {k}x{k}, one row per regime")
        for name, default in (("drift_mult", DEFAULT_DRIFT_MULT), ("vol_mult", DEFAULT_VOL_MULT)):
            if not getattr(self, name):
                cycled = tuple(default[i % len(default)] for i in range(self.n_assets))
                object.__setattr__(self, name, cycled)
            if len(getattr(self, name)) != self.n_assets:
                raise ValueError(f"{name} needs one value per asset ({self.n_assets})")
        if self.n_days < 2 or self.tail_df <= 2:
            raise ValueError("need n_days >= 2 and tail_df > 2 (finite variance)")
        if not 0 <= self.overnight_share <= 1:
            raise ValueError(f"overnight_share={self.overnight_share} must be in [0, 1]")
        s = self.stress_start_frac
        if s is not None and not 0 <= s < self.stress_end_frac <= 1:
            raise ValueError("need 0 <= stress_start_frac < stress_end_frac <= 1")
        if self.asset_names and len(self.asset_names) != self.n_assets:
            raise ValueError("asset_names needs one name per asset")

    @classmethod
    def stress(cls, start_frac: float = 0.8, end_frac: float = 0.9, **kw: object) -> MarketSpec:
        """The stress preset: the default market with a crash over ``[start_frac, end_frac)``."""
        return cls(stress_start_frac=start_frac, stress_end_frac=end_frac, **kw)  # type: ignore[arg-type]

    def transition_matrix(self) -> np.ndarray:
        """Row-stochastic ``[K, K]`` regime transition matrix."""
        w = np.asarray(self.exit_weights, dtype=np.float64)
        np.fill_diagonal(w, 0.0)
        stay = np.array([1.0 - 1.0 / r.duration for r in self.regimes])
        p = w / w.sum(1, keepdims=True) * (1.0 - stay)[:, None]
        np.fill_diagonal(p, stay)
        return p

    def expected_return(self, regime: np.ndarray, last: np.ndarray) -> np.ndarray:
        """``E[r_{t+1} | regime k_t, r_t]`` ``[T, A]`` if the regime stays: the model's
        ``mu_k m_a + phi_k (r_t - mu_k m_a)`` (what the oracle baseline bets on)."""
        mu = np.array([r.drift for r in self.regimes])[regime][:, None] * np.asarray(
            self.drift_mult
        )
        phi = np.array([r.ar for r in self.regimes])[regime][:, None]
        return mu + phi * (np.asarray(last, np.float64) - mu)

    def stress_range(self) -> tuple[int, int] | None:
        """Day range ``[start, end)`` of the stress segment, or None."""
        if self.stress_start_frac is None:
            return None
        return int(self.stress_start_frac * self.n_days), int(self.stress_end_frac * self.n_days)


@dataclass(frozen=True, eq=False)
class SyntheticMarket:
    """A simulated market: its data, the regime index of each day and the spec it came from."""

    data: MarketData
    regimes: np.ndarray  # [T] int, index into spec.regimes (crash during stress)
    stressed: np.ndarray  # [T] bool, True on stress-segment days
    spec: MarketSpec


def simulate(spec: MarketSpec | None = None) -> SyntheticMarket:
    """Simulate the market described by ``spec`` (the default market when None)."""
    spec = spec or MarketSpec()
    rng = np.random.default_rng(spec.seed)
    t_len, n = spec.n_days, spec.n_assets
    # Every random draw has a fixed shape and order, so one spec always yields one market.
    u_regime = rng.random(t_len)
    z = rng.standard_t(spec.tail_df, size=(t_len, n)) / np.sqrt(spec.tail_df / (spec.tail_df - 2))
    u_bar = rng.standard_normal((4, t_len, n))

    p_cum = np.cumsum(spec.transition_matrix(), axis=1)
    regime = np.zeros(t_len, dtype=np.int64)
    for t in range(1, t_len):
        regime[t] = min(int(np.searchsorted(p_cum[regime[t - 1]], u_regime[t])), len(p_cum) - 1)
    stressed = np.zeros(t_len, dtype=bool)
    crash = REGIME_NAMES.index("crash") if len(spec.regimes) == 4 else len(spec.regimes) - 1
    span = spec.stress_range()
    if span is not None:
        stressed[span[0] : span[1]] = True
        regime[stressed] = crash

    mu = np.array([r.drift for r in spec.regimes])[regime][:, None] * np.asarray(spec.drift_mult)
    sig = np.array([r.vol for r in spec.regimes])[regime][:, None] * np.asarray(spec.vol_mult)
    phi = np.array([r.ar for r in spec.regimes])[regime]
    calm = spec.regimes[0]
    if span is not None:
        mu[stressed] = -spec.stress_return_mult * abs(calm.drift) * np.asarray(spec.drift_mult)
        sig[stressed] = spec.stress_vol_mult * calm.vol * np.asarray(spec.vol_mult)
    chol = [np.linalg.cholesky((1 - r.corr) * np.eye(n) + r.corr) for r in spec.regimes]
    eps = np.einsum("tij,tj->ti", np.stack(chol)[regime], z)

    r = np.zeros((t_len, n))
    r[0] = mu[0] + sig[0] * eps[0]
    innov = sig * np.sqrt(1.0 - phi**2)[:, None] * eps
    for t in range(1, t_len):
        r[t] = mu[t] + phi[t] * (r[t - 1] - mu[t]) + innov[t]

    close = 100.0 * np.exp(np.cumsum(r, axis=0))
    prev = np.concatenate([np.full((1, n), 100.0), close[:-1]])
    open_ = prev * np.exp(spec.overnight_share * r + 0.1 * sig * u_bar[0])
    high = np.maximum(open_, close) * np.exp(np.abs(0.5 * sig * u_bar[1]))
    low = np.minimum(open_, close) * np.exp(-np.abs(0.5 * sig * u_bar[2]))
    base_sig = calm.vol * np.asarray(spec.vol_mult)
    volume = 1e6 * np.exp(0.7 * np.log1p(np.abs(r) / base_sig) + 0.2 * u_bar[3])

    start = np.datetime64(spec.start_date, "D")
    dates = np.busday_offset(start, np.arange(t_len), roll="forward")
    names = spec.asset_names or tuple(f"SYN{i}" for i in range(n))
    source = f"synthetic(seed={spec.seed}{', stress' if span is not None else ''})"
    data = MarketData(dates, names, open_, high, low, close, volume, close, source=source)
    return SyntheticMarket(data=data, regimes=regime, stressed=stressed, spec=spec)
