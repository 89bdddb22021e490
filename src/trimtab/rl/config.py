"""The trainer's one frozen config: TOML file, command-line overrides, saved with every run.

``trimtab train --config run.toml --set agent.lr=3e-4 --folds 6`` resolves to a
:class:`TrainConfig`, validated field by field, and written to ``RUN_DIR/config.toml``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch

from trimtab._headroom import check_headroom
from trimtab.rl.agent.dqn import GAMMA_AUTO, SAVED_BEFORE, AgentConfig
from trimtab.rl.backtest.execution import Execution
from trimtab.rl.configio import ConfigError, check_fields, from_dict
from trimtab.rl.data.features import (
    DEFAULT_FEATURES,
    FEATURE_BINS,
    FEATURE_NAMES,
    MAX_FEATURE_BINS,
)
from trimtab.rl.envs.registry import env_kind

__all__ = [
    "AUTOCAST_DTYPES",
    "CPU_MEASURE_EVERY",
    "CUDA_DEFAULTS",
    "DEFAULT_CHECK_EVERY",
    "DEVICE_PROFILES",
    "BacktestConfig",
    "DataConfig",
    "EnvConfig",
    "GymConfig",
    "RunConfig",
    "TrainConfig",
    "WalkForwardConfig",
    "device_profile",
    "embargo_days",
    "measure_every",
    "saved_config",
    "uses_cuda_graph",
]

Stability = Literal["adaptive", "fixed", "off"]
EnvImpl = Literal["gymnasium", "torch"]
#: the Gymnasium envs that env.impl = "torch" runs as batched torch envs on the run's device
TORCH_ENVS = ("gym:CartPole-v1",)
Autocast = Literal["none", "bf16", "fp16"]
#: run.autocast values and their torch dtypes (None: full float32)
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    "none": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
CudaGraph = Literal["auto", "on", "off"]
#: run.measure_every = "auto" on the CPU: learn steps per measurement
#: of the adaptive bounds. Chosen by the CPU step's cost (a measuring step costs about three
#: times one that does not; docs: guides/stability.md#measuring-every-k-th-step-on-the-cpu),
#: not by any return.
CPU_MEASURE_EVERY = 16

#: run.check_every's default: learn steps between host reads of the sentinel's flag (as
#: run.log_every's default, so a default run reads the host no more often than it logs)
DEFAULT_CHECK_EVERY = 50
ABLATIONS = ("support", "target_clamp", "trunk_clamp", "grad_clip", "weight_clamp", "decay")


#: The device profiles: the values that ``"auto"`` takes for the keys whose best value depends
#: on the device (docs: results/default-run.md), resolved inside :class:`TrainConfig`, so a config
#: built in Python and one built by the CLI are the same run. On CUDA a Gymnasium env stepped on
#: the device (env.impl = "torch") gets more envs and larger batches: a batched env step and a
#: learn step cost about the same wall time on a GPU at these sizes (both are launch-bound), so
#: they buy data per second. The market keeps the CPU profile on every device: its folds hold a
#: few hundred days, and on them more envs and larger batches per learn step score lower out of
#: sample (benchmarks/results/agent_vs_baselines.json, records p0_gpu and n0_h100), at the same
#: wall time. Host Gymnasium envs gain nothing from more copies. A value set explicitly is never
#: changed.
DEVICE_PROFILES: dict[str, dict[str, int]] = {
    "cpu": {"env.n_envs": 16, "agent.batch_size": 64},
    "cuda": {"env.n_envs": 64, "agent.batch_size": 256},
}
#: the CUDA profile (kept under its old name for scripts that read it)
CUDA_DEFAULTS = DEVICE_PROFILES["cuda"]


def device_profile(device: str, env_name: str = "market", impl: str = "gymnasium") -> dict:
    """The values of :data:`DEVICE_PROFILES` for a run on ``device`` ("cpu", "cuda", "cuda:N")
    of env ``env_name``: the market takes the CPU profile on every device (measured); on CUDA
    another env takes the CUDA batch size, and the CUDA env count where its envs live on the
    device (``impl = "torch"``); a bsuite env is one env."""
    cuda = str(device).startswith("cuda") and env_name != "market"
    out = dict(DEVICE_PROFILES["cuda" if cuda else "cpu"])
    if cuda and env_name.startswith("gym:") and impl != "torch":
        out["env.n_envs"] = DEVICE_PROFILES["cpu"]["env.n_envs"]
    if env_name.startswith("bsuite:"):  # one env, episode after episode: bsuite's rules
        out["env.n_envs"] = 1
    return out


#: gym.total_steps = "auto": the env steps of a Gymnasium run (a bsuite run has no cap: its
#: experiment's episode budget ends it)
GYM_TOTAL_STEPS = 500_000


def _check(bad: list[str], section: str) -> None:
    if bad:
        raise ConfigError(f"invalid [{section}] config: " + "; ".join(bad))


@dataclass(frozen=True)
class RunConfig:
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    seed: int = 0  # seeds the agent and the environments (the market has data.market_seed)
    out: str = ""  # run directory ("" = runs/<time>-<stability>-s<seed>); must be new or empty
    # adaptive | fixed | off (docs: guides/stability.md#stability-modes)
    stability: Stability = "adaptive"
    # what a non-finite value (NaN, ±Inf) that the sentinel finds does: "halt" the run with its
    # report naming the first bad tensor and step (exit 3), "skip" the update (weights and
    # optimizer state untouched, bit for bit), or "sanitize" (NaN/±Inf elements become 0)
    on_nonfinite: Literal["halt", "skip", "sanitize"] = "halt"
    checkpoint_every: int = 2000  # gradient steps between checkpoints (and at every fold end)
    log_every: int = 50  # gradient steps between metrics.csv rows
    progress: bool = True  # tqdm progress bars per fold
    # adaptive mechanisms to switch off, for ablations: any of "support", "target_clamp",
    # "trunk_clamp", "grad_clip", "weight_clamp", "decay" (docs:
    # guides/stability.md#stability-modes)
    ablate: tuple[str, ...] = ()
    # CPU threads for torch. 1 by default: the default net is small, and on a 2-core machine
    # two OpenMP threads competing with any other process slowed a step 50x (measured).
    threads: int = 1
    # Mixed precision of the agent's forward passes and loss (training, target and acting
    # forwards) under torch.autocast: "none" (float32), "bf16" (float32's range, 8-bit
    # mantissa) or "fp16" (max 65504; no GradScaler, on purpose: the overflow people meet).
    # Weights, gradients, optimizer moments and the stability machinery stay float32.
    # (docs: guides/stability.md#mixed-precision)
    autocast: Autocast = "none"
    # adaptive mode: the quantile of |x| every measured bound estimates (the C51 support and
    # target bound, the trunk bound, Adam's weight bound, the gradient clip's window); each
    # bound's engagement test expects a fraction 1 - bound_quantile above it (docs:
    # guides/stability.md#where-a-clamp-binds)
    bound_quantile: float = 0.99
    # adaptive mode: the trunk and target clamps bind at clamp_headroom x their measured bound (1:
    # at the quantile itself, cutting 1 - bound_quantile of the values on every step; 2, the
    # default: on excursions only, docs: guides/stability.md#where-a-clamp-binds); the support is
    # the bound itself, and the engagement test counts exceedances of the bound
    clamp_headroom: float = 2.0
    # adaptive mode: the gradient clip binds at clip_headroom x its measured bound (1, the default:
    # at the bound, about 1 - bound_quantile of steps clipped; > 1: on excursions only); its
    # engagement test counts the norms above the bound either way. An ablation of the open question
    # in docs: guides/stability.md#where-a-clamp-binds; refused in the other modes.
    clip_headroom: float = 1.0
    # adaptive mode: Adam's weight clamp binds at weight_headroom x the group's measured p99 |w| (2,
    # the default: on excursions only; 1: at the p99, cutting the top 1% of the weights every step,
    # which held CartPole's C51 loss up: docs: guides/stability.md#where-a-clamp-binds); its
    # engagement test counts the weights above the bound either way; refused elsewhere
    weight_headroom: float = 2.0
    # The guarded learn step captured in a CUDA graph and replayed per step (docs:
    # guides/stability.md#cuda-graphs): "auto" = on a CUDA device, eager on the CPU; "on" = capture
    # (refused on the CPU); "off" = eager everywhere. Same numbers either way (tested on the GPU).
    cuda_graph: CudaGraph = "auto"
    # A machine's first CUDA run: "auto" compiles the Triton kernel variants this package's
    # manifest lists for the device (the default run's) in worker processes at once, while the
    # run sets up, instead of one after another as it launches them (docs:
    # getting-started/install.md#on-a-gpu); nothing where no manifest matches the Triton version
    # and GPU, or where this machine's cache already holds them; "off": compile as launched.
    # A CPU run compiles no kernels either way.
    precompile: Literal["auto", "off"] = "auto"
    # Gradient steps between the host's "did anything fire?" questions to the sentinel (its
    # flag is also read at each metrics row, before each checkpoint and at each fold end).
    # Under "halt" a fire is found up to check_every - 1 steps late on the CPU, a question
    # later on a GPU (Sentinel.peek: no wait for the device); the report names its step.
    check_every: int = DEFAULT_CHECK_EVERY
    # adaptive mode: learn steps per measurement of the measured bounds (the targets' and the
    # trunk's quantiles, the gradient clip's refit, Adam's weight statistics, with their
    # engagement tests and folds, and the sentinel's thresholds on the buffers it watches);
    # every clamp and the clip bind at the bound in force, and the sentinel checks, on every
    # step. "auto": CPU_MEASURE_EVERY on the CPU (where they cost about as much as the rest of
    # the step), 1 on CUDA (in a captured step they cost ~nothing; an eager GPU step keeps the
    # captured one's numbers). An integer > 1 needs an eager step (cuda_graph = "off" on
    # CUDA). docs: guides/stability.md#measuring-every-k-th-step-on-the-cpu.
    measure_every: int | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        check_fields(self, "run")  # types, Literal values, finite numbers
        bad = []
        if not 0.5 <= self.bound_quantile < 1.0:
            bad.append(
                f"bound_quantile={self.bound_quantile} must be in [0.5, 1): a bound is a high "
                "quantile of |x| (0.99: its clamp engages on about 1% of what it sees)"
            )
        # (key, its default, what binds there, and in a word): each applies to adaptive mode only
        for key, default, what, word in (
            ("clamp_headroom", 2.0, "adaptive trunk and target clamps", "clamp"),
            ("clip_headroom", 1.0, "adaptive gradient clip", "clip"),
            ("weight_headroom", 2.0, "adaptive weight clamp", "clamp"),
        ):
            value = getattr(self, key)
            try:
                check_headroom(value, key, word)
            except ValueError as e:
                bad.append(str(e))
                continue
            if value != default and self.stability != "adaptive":
                bad.append(
                    f"{key}={value} applies to the {what}; stability={self.stability!r} "
                    f"has none (a hand-set bound, or nothing): set stability='adaptive' or "
                    f"leave {key} at {default:g}"
                )
        if self.cuda_graph not in ("auto", "on", "off"):
            bad.append(f"cuda_graph={self.cuda_graph!r} must be 'auto', 'on' or 'off'")
        elif self.cuda_graph == "on" and self.device == "cpu":
            bad.append(
                "cuda_graph='on' captures the learn step in a CUDA graph, which needs "
                "device='cuda'; on the CPU set cuda_graph='auto' or 'off'"
            )
        if self.measure_every != "auto":
            if type(self.measure_every) is not int or self.measure_every < 1:
                bad.append(
                    f"measure_every={self.measure_every!r} must be 'auto' or an integer >= 1 "
                    "(learn steps per measurement of the adaptive bounds)"
                )
            elif self.stability != "adaptive":
                bad.append(
                    f"measure_every={self.measure_every} applies to the measured bounds; "
                    f"stability={self.stability!r} measures none: set stability='adaptive' or "
                    "leave measure_every at 'auto'"
                )
            elif self.measure_every > 1 and self.cuda_graph == "on":
                bad.append(
                    f"measure_every={self.measure_every} picks the measuring steps on the host, "
                    "and a captured CUDA graph replays one step: set cuda_graph='off', or "
                    "measure_every=1 (or 'auto') to capture"
                )
        if type(self.check_every) is not int or self.check_every < 1:
            bad.append(f"check_every={self.check_every!r} must be an integer >= 1 (learn steps)")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            bad.append(f"device={self.device!r} must be 'cpu', 'cuda' or 'cuda:N'")
        if self.autocast not in AUTOCAST_DTYPES:
            bad.append(f"autocast={self.autocast!r} must be one of {list(AUTOCAST_DTYPES)}")
        unknown = sorted(set(self.ablate) - set(ABLATIONS))
        if unknown:
            bad.append(f"ablate={unknown}: known mechanisms are {list(ABLATIONS)}")
        if self.checkpoint_every < 1 or self.log_every < 1 or self.threads < 1:
            bad.append("checkpoint_every, log_every and threads must be >= 1")
        _check(bad, "run")


@dataclass(frozen=True)
class DataConfig:
    paths: tuple[str, ...] = ()  # OHLCV files or folders; empty = the embedded synthetic market
    # users' files: what an empty row (every value cell empty) does: "drop" it, "ffill" it
    # flat from the previous close, or "error"; gaps longer than max_gap_days are reported
    # either way (and an error under "error")
    gaps: Literal["drop", "ffill", "error"] = "drop"
    # users' files: the most missing bars in a row (business days for daily bars) that pass
    # without a gap warning
    max_gap_days: int = 5
    synthetic_days: int = 2520  # business days of the embedded market (10 years)
    # the embedded market's seed, its own key so that several run.seed values train on one
    # market and can be compared
    market_seed: int = 0
    stress: bool = False  # the stress preset: a crash segment late in the data

    def __post_init__(self) -> None:
        check_fields(self, "data")  # types, Literal values, finite numbers
        bad = []
        if type(self.max_gap_days) is not int or self.max_gap_days < 0:
            bad.append(f"max_gap_days={self.max_gap_days!r} must be an integer >= 0")
        if self.synthetic_days < 100:
            bad.append(f"synthetic_days={self.synthetic_days} must be >= 100")
        if type(self.market_seed) is not int or self.market_seed < 0:
            bad.append(f"market_seed={self.market_seed!r} must be an integer >= 0")
        _check(bad, "data")


@dataclass(frozen=True)
class EnvConfig:
    # "market", "gym:ID" for a Gymnasium env (e.g. gym:CartPole-v1), or "bsuite:ID" for a
    # bsuite id under bsuite's rules (e.g. bsuite:cartpole_scale/3; the [bsuite] extra)
    name: str = "market"
    # market only: target position per asset (short, flat, long)
    levels: tuple[float, ...] = (-1.0, 0.0, 1.0)
    # market only: where a decision on the close of bar t is filled: "next_open" (the open of bar
    # t+1), "next_close" (a whole bar late) or "same_close" (the close just seen: a price nobody
    # could trade at, labelled optimistic in every table). docs: guides/data.md#execution-and-costs
    execution: Execution = "next_open"
    # market only, per unit of turnover (sum |dw|; a round trip of the whole book is 2): the
    # broker's commission and half the bid-ask spread (with slippage), in basis points. 5 bp
    # all in is what liquid large-cap equities and ETFs cost a small fund
    commission_bps: float = 2.0
    half_spread_bps: float = 3.0  # half the bid-ask spread, with slippage (bp per turnover)
    # market only, annual percent: the fee on short notional (general collateral) and the rate
    # cash earns (also every Sharpe ratio's risk-free rate)
    borrow_pct: float = 0.5
    cash_pct: float = 2.0  # the annual % rate cash earns, and every Sharpe's risk-free rate
    # every env: training rewards (what the replay stores) are the env's rewards times this;
    # metrics, episode returns and evaluation always use the unscaled rewards (a stress knob:
    # market rewards x100 as in a P&L unit)
    reward_scale: float = 1.0
    # market only: what each asset's action branch learns from: "per_asset", its own asset's
    # part of the step's net log return (what its position earned and paid; the parts sum to the
    # portfolio's, to first order), or "portfolio", the whole portfolio's net log return shared by
    # every branch. Metrics and evaluation use the portfolio's return either way.
    # docs: guides/walk-forward.md#what-the-agent-was-given
    reward: Literal["per_asset", "portfolio"] = "per_asset"
    # environments stepped together (market or Gymnasium); "auto" = the device profile's
    # (DEVICE_PROFILES: 16; 64 for a Gymnasium env stepped on a CUDA device, env.impl = "torch")
    n_envs: int | Literal["auto"] = "auto"
    episode_days: int = 64  # trading days per training episode (market only)
    # market only: the per-asset features the agent observes, by name, from
    # trimtab.rl.data.features.FEATURE_NAMES, by default ret_1 and mkt_vol_10
    # (docs: guides/walk-forward.md#what-the-agent-was-given)
    features: tuple[str, ...] = DEFAULT_FEATURES
    # market only: each feature is also given as this many piecewise-linear components over its
    # bins (edges: quantiles of the training window), so that the network can gate one input by
    # another's level; 0 gives the standardised features alone
    # (docs: guides/walk-forward.md#what-the-agent-was-given)
    feature_bins: int = FEATURE_BINS
    # Gymnasium envs only: "gymnasium" steps Gymnasium's own envs on the host; "torch" steps the
    # same dynamics as one batched torch env on the run's device (no host sync per step; the
    # envs in TORCH_ENVS: gym:CartPole-v1, trimtab.rl.envs.cartpole)
    impl: EnvImpl = "gymnasium"

    def __post_init__(self) -> None:
        check_fields(self, "env")  # types, Literal values, finite numbers
        bad = []
        try:  # a kind the registry knows (trimtab.rl.envs.registry)
            env_kind(self.name, self.impl)
        except ConfigError as e:
            bad.append(str(e))
        if self.impl == "torch" and self.name not in TORCH_ENVS:
            bad.append(f"impl='torch' runs {list(TORCH_ENVS)} only, not name={self.name!r}")
        if len(self.levels) < 2 or any(abs(x) > 1 for x in self.levels):
            bad.append(f"levels={self.levels} need >= 2 values in [-1, 1]")
        for key in ("commission_bps", "half_spread_bps", "borrow_pct", "cash_pct"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                bad.append(f"{key}={v!r} must be a finite number >= 0")
        if (self.n_envs != "auto" and self.n_envs < 1) or self.episode_days < 2:
            bad.append("need n_envs >= 1, episode_days >= 2")
        unknown = [n for n in self.features if n not in FEATURE_NAMES]
        if unknown or not self.features or len(set(self.features)) != len(self.features):
            bad.append(
                f"features={list(self.features)} must be distinct names from "
                f"{list(FEATURE_NAMES)}, at least one"
                + (f" (unknown: {unknown})" if unknown else "")
            )
        if type(self.feature_bins) is not int or not 0 <= self.feature_bins <= MAX_FEATURE_BINS:
            bad.append(
                f"feature_bins={self.feature_bins!r} must be an integer in 0..{MAX_FEATURE_BINS}"
            )
        if not (self.reward_scale > 0 and math.isfinite(self.reward_scale)):
            bad.append(f"reward_scale={self.reward_scale} must be a finite number > 0")
        _check(bad, "env")


@dataclass(frozen=True)
class WalkForwardConfig:
    folds: int = 4  # fold k is tested on window k + 1 (and trains as train_window says)
    window_days: int = 0  # days per window; 0 = split the data evenly into folds + 1 windows
    # what fold k trains on: "expanding", windows 0 to k (anchored walk-forward: every day
    # before its test window, less the embargo); "rolling", window k alone. The test windows
    # are the same either way. docs: guides/walk-forward.md#folds
    train_window: Literal["rolling", "expanding"] = "expanding"
    steps_per_fold: int = 2500  # gradient steps per fold
    # env steps, summed over the env.n_envs envs (as every env-step count of the trainer: ε,
    # gym.total_steps), collected in a fold before its first update (each fold has a fresh
    # replay buffer); 8000 = 500 batched steps of the default 16 envs
    learning_starts: int = 8000
    updates_per_step: int = 1  # gradient steps per batched env step once learning has started
    # days cut from the end of each training window before its test window (purging): no
    # training reward or n-step target reaches within this many days of a test day; "auto" =
    # agent.n_step
    embargo: int | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        check_fields(self, "walkforward")  # types, Literal values, finite numbers
        bad = []
        if self.embargo != "auto" and (type(self.embargo) is not int or self.embargo < 0):
            bad.append(f"embargo={self.embargo!r} must be 'auto' or an integer >= 0 (days)")
        if self.folds < 1:
            bad.append(f"folds={self.folds} must be >= 1")
        if self.window_days < 0 or self.steps_per_fold < 1 or self.learning_starts < 0:
            bad.append("need window_days >= 0, steps_per_fold >= 1, learning_starts >= 0")
        if self.updates_per_step < 1:
            bad.append("updates_per_step must be >= 1")
        _check(bad, "walkforward")


@dataclass(frozen=True)
class BacktestConfig:
    """The market's out-of-sample statistics and baselines
    (docs: guides/walk-forward.md#what-the-backtest-computes)."""

    # draws of the turnover-matched random strategy (the agent's percentile among them)
    random_draws: int = 200
    # stationary-bootstrap resamples behind every 95% interval, and their mean block length
    # in bars (0 = the Politis-White automatic choice)
    bootstrap_draws: int = 2000
    block_days: int = 0  # the bootstrap's mean block length in bars (0 = automatic)
    # the baselines' look-backs in bars: momentum's k-day return, the MA crossover's windows
    momentum_days: int = 20
    ma_fast: int = 20  # the MA crossover's fast window (bars)
    ma_slow: int = 100  # the MA crossover's slow window (bars)

    def __post_init__(self) -> None:
        check_fields(self, "backtest")  # types, Literal values, finite numbers
        bad = []
        for key in ("random_draws", "bootstrap_draws", "momentum_days", "ma_fast", "ma_slow"):
            v = getattr(self, key)
            if type(v) is not int or v < 1:
                bad.append(f"{key}={v!r} must be an integer >= 1")
        if type(self.block_days) is not int or self.block_days < 0:
            bad.append(f"block_days={self.block_days!r} must be an integer >= 0 (0 = automatic)")
        if not bad and self.ma_fast >= self.ma_slow:
            bad.append(f"ma_fast={self.ma_fast} must be shorter than ma_slow={self.ma_slow}")
        _check(bad, "backtest")


@dataclass(frozen=True)
class GymConfig:
    """Training on a Gymnasium env (``env.name = "gym:ID"``) or a bsuite id
    (``"bsuite:ID"``): one long run, one "fold"; the number of envs stepped together is
    ``env.n_envs``."""

    # env steps, summed over the env.n_envs envs; "auto" = GYM_TOTAL_STEPS (500000) for a
    # Gymnasium env, no cap for bsuite (the experiment's own episode budget ends the run; a
    # number caps its env steps as well)
    total_steps: int | Literal["auto"] = "auto"
    learning_starts: int = 10_000  # env steps (summed, as [walkforward]) before the first update
    train_every: int = 4  # env steps (summed) per gradient step
    eval_episodes: int = 100  # greedy episodes at the end

    def __post_init__(self) -> None:
        check_fields(self, "gym")  # types, Literal values, finite numbers
        bad = []
        steps = 1 if self.total_steps == "auto" else self.total_steps
        if min(steps, self.train_every, self.eval_episodes) < 1:
            bad.append("total_steps, train_every and eval_episodes must be >= 1")
        if self.learning_starts < 0:
            bad.append("learning_starts must be >= 0")
        _check(bad, "gym")


@dataclass(frozen=True)
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    walkforward: WalkForwardConfig = field(default_factory=WalkForwardConfig)
    backtest: BacktestConfig = field(default_factory=BacktestConfig)
    gym: GymConfig = field(default_factory=GymConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self) -> None:
        # the device profile: each "auto" becomes its value on run.device (DEVICE_PROFILES)
        profile = device_profile(self.run.device, self.env.name, self.env.impl)
        if self.env.n_envs == "auto":
            env = dataclasses.replace(self.env, n_envs=profile["env.n_envs"])
            object.__setattr__(self, "env", env)
        if self.agent.batch_size == "auto":
            agent = dataclasses.replace(self.agent, batch_size=profile["agent.batch_size"])
            object.__setattr__(self, "agent", agent)
        walked = env_kind(self.env.name, self.env.impl).walk_forward
        if self.agent.assetwise == "auto":  # the market's observation is one block per asset
            object.__setattr__(self, "agent", dataclasses.replace(self.agent, assetwise=walked))
        if self.agent.gamma == "auto":  # a market position is worth one bar (GAMMA_AUTO)
            gamma = GAMMA_AUTO[walked]
            object.__setattr__(self, "agent", dataclasses.replace(self.agent, gamma=gamma))
        refused = inapplicable_keys(self)
        if refused:
            walked = env_kind(self.env.name, self.env.impl).walk_forward
            kind = "market" if walked else "Gymnasium"
            one = len(refused) == 1
            raise ConfigError(
                f"{'; '.join(refused)}: {'does' if one else 'do'} nothing in a {kind} run "
                f"(env.name = {self.env.name!r}); remove {'it' if one else 'them'} from the "
                "config file, --set or the flags (--folds, --steps-per-fold, --data, --stress), "
                f"or set env.name to the env {'it is' if one else 'they are'} for"
            )


#: [env] keys of a market run that an earlier trimtab did not have, and the value such a run
#: was built with: before ``env.reward`` every branch learnt from the portfolio's return
SAVED_BEFORE_MARKET_ENV: dict[str, Any] = {"reward": "portfolio"}
#: [walkforward] keys that an earlier trimtab did not have, and the value its runs were built
#: with: before ``walkforward.train_window`` every fold trained on its own window alone
SAVED_BEFORE_WALKFORWARD: dict[str, Any] = {"train_window": "rolling"}


def saved_config(data: Mapping[str, Any]) -> TrainConfig:
    """The config of a saved run (its ``config.toml``, or the one in a checkpoint): as
    ``from_dict(TrainConfig, data)``, except that a key which the run's trimtab did not have yet
    takes the value that run was built with, not today's default
    (:data:`~trimtab.rl.agent.dqn.SAVED_BEFORE`, :data:`SAVED_BEFORE_MARKET_ENV`,
    :data:`SAVED_BEFORE_WALKFORWARD`): a run saved before ``agent.assetwise`` existed loads as
    ``false``, a market run saved before ``env.reward`` as ``"portfolio"``, one saved before
    ``walkforward.train_window`` as ``"rolling"``."""
    env = dict(data.get("env", {}))
    out = {**data, "agent": {**SAVED_BEFORE, **data.get("agent", {})}}
    if env_kind(env.get("name", EnvConfig.name), env.get("impl", EnvConfig.impl)).walk_forward:
        out["env"] = {**SAVED_BEFORE_MARKET_ENV, **env}
        out["walkforward"] = {**SAVED_BEFORE_WALKFORWARD, **data.get("walkforward", {})}
    return from_dict(TrainConfig, out)


#: what to set instead, for a key of the other kind of env
_COUNTERPARTS = {
    "walkforward.learning_starts": "gym.learning_starts",
    "walkforward.steps_per_fold": "gym.total_steps",
    "walkforward.updates_per_step": "gym.train_every",
    "gym.learning_starts": "walkforward.learning_starts",
    "gym.total_steps": "walkforward.steps_per_fold",
    "gym.train_every": "walkforward.updates_per_step",
}
#: [env] keys that a Gymnasium run uses; the others configure the market (env.impl = "torch"
#: on the market is refused by EnvConfig itself)
_ENV_SHARED = ("name", "n_envs", "reward_scale", "impl")


def _changed(section: Any, default: Any, prefix: str, keep: tuple[str, ...] = ()) -> list[str]:
    out = []
    for f in fields(section):
        value = getattr(section, f.name)
        if f.name not in keep and value != getattr(default, f.name):
            key = f"{prefix}.{f.name}"
            hint = f" (its counterpart: {_COUNTERPARTS[key]})" if key in _COUNTERPARTS else ""
            out.append(f"{key} = {value!r}{hint}")
    return out


def inapplicable_keys(cfg: TrainConfig) -> list[str]:
    """Keys set away from their default that ``cfg.env.name``'s kind of run would not use:
    [data], [walkforward] and the market's [env] keys for a Gymnasium env, [gym] for the
    market. (A key set to its default value is indistinguishable from one not set.)"""
    if not env_kind(cfg.env.name, cfg.env.impl).walk_forward:
        # the assetwise network reads the market's observation layout (an asset's block)
        assetwise = ["agent.assetwise"] if cfg.agent.assetwise is True else []
        return (
            assetwise
            + _changed(cfg.data, DataConfig(), "data")
            + _changed(cfg.env, EnvConfig(), "env", keep=_ENV_SHARED)
            + _changed(cfg.walkforward, WalkForwardConfig(), "walkforward")
            + _changed(cfg.backtest, BacktestConfig(), "backtest")
        )
    return _changed(cfg.gym, GymConfig(), "gym")


def uses_cuda_graph(run: RunConfig, device: torch.device) -> bool:
    """Whether ``run.cuda_graph`` captures the learn step on ``device``: ``"auto"`` on CUDA,
    ``"on"`` (refused on the CPU), never with ``"off"``."""
    if run.cuda_graph == "on" and device.type != "cuda":
        raise ConfigError(
            f"run.cuda_graph = 'on' captures the learn step in a CUDA graph, which needs a CUDA "
            f"device; this run is on {device}: set run.device = 'cuda', or run.cuda_graph = "
            "'auto' (captures on CUDA only) or 'off'"
        )
    return run.cuda_graph == "on" or (run.cuda_graph == "auto" and device.type == "cuda")


def measure_every(run: RunConfig, device: torch.device) -> int:
    """``run.measure_every`` resolved on ``device``: ``"auto"`` is :data:`CPU_MEASURE_EVERY` on
    the CPU and 1 on CUDA (captured or not: an eager GPU run is the captured one's numbers); an
    integer > 1 beside a captured step (:func:`uses_cuda_graph`) is refused (the graph replays
    one step)."""
    captured = uses_cuda_graph(run, device)
    if run.measure_every == "auto":
        return CPU_MEASURE_EVERY if device.type == "cpu" else 1
    if run.measure_every > 1 and captured:
        raise ConfigError(
            f"run.measure_every = {run.measure_every} picks the measuring steps on the host, and "
            f"the learn step on {device} is captured in a CUDA graph (run.cuda_graph = "
            f"{run.cuda_graph!r}), which replays one step: set run.cuda_graph = 'off', or "
            "run.measure_every = 1 or 'auto'"
        )
    return run.measure_every


def embargo_days(cfg: TrainConfig) -> int:
    """``walkforward.embargo`` resolved: ``"auto"`` is ``agent.n_step`` (an n-step target reads
    that many days ahead of its decision)."""
    wf = cfg.walkforward
    return cfg.agent.n_step if wf.embargo == "auto" else int(wf.embargo)
