"""The API reference pages: the public names of each page, resolved to where they are defined,
for mkdocstrings to render."""

from __future__ import annotations

import importlib
from typing import Any

#: page -> (title, what it holds, [(public name, fallbacks "module:attr" while the layout moves)])
API: dict[str, tuple[str, str, list[tuple[str, list[str]]]]] = {
    "library": (
        "`trimtab`: the library",
        "The library for any PyTorch loop. `import trimtab` needs only torch and numpy; Triton "
        "kernels (`trimtab.kernels`, leaves) load on first use on a CUDA tensor.",
        [
            ("trimtab.guard:Guard", []),
            ("trimtab.guard:GuardParts", []),
            ("trimtab.guard:SentinelChecks", []),
            ("trimtab.bounds:AdaptiveBounds", []),
            ("trimtab.bounds:BoundClamp", []),
            ("trimtab.clamp:clamp_finite_", []),
            ("trimtab.clamp:guard_", []),
            ("trimtab.clamp:scale_finite_", []),
            ("trimtab.clip:AdaptiveGradClip", []),
            ("trimtab.sentinel:Sentinel", []),
            ("trimtab.sentinel:Rule", []),
            ("trimtab.sentinel:NonFiniteError", []),
            ("trimtab.nonfinite:NonFinitePolicy", []),
            ("trimtab.state:StateVector", []),
            ("trimtab.state:Slot", []),
            ("trimtab.state:LayoutMismatchError", []),
            ("trimtab.estimate:AdaptiveEMA", []),
            ("trimtab.quantile:abs_quantile", []),
            ("trimtab.quantile:abs_quantiles", []),
            ("trimtab.engagement:EngagementCorrection", []),
            ("trimtab.lifecycle:Lifecycle", []),
            ("trimtab._impl:KernelFallbackWarning", []),
            ("trimtab.distributed:RankConsistent", []),
            ("trimtab.optim:Adam", []),
        ],
    ),
    "config": (
        "`trimtab.rl.config`, `trimtab.rl.configio`",
        "The trainer's one frozen config and its TOML input and output. Every key is listed in "
        "the [config reference](../config.md).",
        [
            ("trimtab.rl.config:TrainConfig", []),
            ("trimtab.rl.config:RunConfig", []),
            ("trimtab.rl.config:EnvConfig", []),
            ("trimtab.rl.config:DataConfig", []),
            ("trimtab.rl.config:WalkForwardConfig", []),
            ("trimtab.rl.config:BacktestConfig", []),
            ("trimtab.rl.config:GymConfig", []),
            ("trimtab.rl.configio:load_toml", []),
            ("trimtab.rl.configio:from_dict", []),
            ("trimtab.rl.configio:apply_overrides", []),
            ("trimtab.rl.configio:to_toml", []),
            ("trimtab.rl.configio:ConfigError", []),
        ],
    ),
    "data": (
        "`trimtab.rl.data`",
        "Loading CSV and Parquet market files, calendars and time zones, data checks and "
        "warnings, the synthetic market, features.",
        [
            ("trimtab.rl.data:load_ohlcv", []),
            ("trimtab.rl.data:MarketData", []),
            ("trimtab.rl.data:DataError", ["trimtab.rl.data_issues:DataError"]),
            ("trimtab.rl.data:DataIssue", ["trimtab.rl.data_issues:DataIssue"]),
            ("trimtab.rl.data:periods_per_year", ["trimtab.rl.calendar:periods_per_year"]),
            ("trimtab.rl.data:parse_dates", ["trimtab.rl.calendar:parse_dates"]),
            ("trimtab.rl.data:MarketSpec", ["trimtab.rl.market:MarketSpec"]),
            ("trimtab.rl.data:simulate", ["trimtab.rl.market:simulate"]),
            ("trimtab.rl.data:compute_features", ["trimtab.rl.features:compute_features"]),
            ("trimtab.rl.data:FeatureNormalizer", ["trimtab.rl.features:FeatureNormalizer"]),
        ],
    ),
    "envs": (
        "`trimtab.rl.envs`",
        "The market environment, the Gymnasium and torch CartPole adapters, the env registry, "
        "env state as data.",
        [
            ("trimtab.rl.envs:BatchedTradingEnv", ["trimtab.rl.env:BatchedTradingEnv"]),
            ("trimtab.rl.envs:TradingGymEnv", ["trimtab.rl.env:TradingGymEnv"]),
            ("trimtab.rl.envs:BatchedCartPole", ["trimtab.rl.cartpole:BatchedCartPole"]),
            ("trimtab.rl.envs:make_adapter", ["trimtab.rl.adapters:make_adapter"]),
            ("trimtab.rl.envs:MarketAdapter", ["trimtab.rl.adapters:MarketAdapter"]),
            ("trimtab.rl.envs:GymAdapter", ["trimtab.rl.adapters:GymAdapter"]),
            ("trimtab.rl.envs:TorchCartPoleAdapter", ["trimtab.rl.adapters:TorchCartPoleAdapter"]),
            ("trimtab.rl.envs:env_state", ["trimtab.rl.gym_state:env_state"]),
            ("trimtab.rl.envs:restore_env", ["trimtab.rl.gym_state:restore_env"]),
        ],
    ),
    "agent": (
        "`trimtab.rl.agent`",
        "The agent and its config, the networks, the losses, the replay, the learner with its "
        "stability wiring, and the captured CUDA-graph step.",
        [
            ("trimtab.rl.agent:Agent", ["trimtab.rl.agent:DQNAgent"]),
            ("trimtab.rl.agent:AgentConfig", []),
            ("trimtab.rl.agent:BranchingQNetwork", ["trimtab.rl.networks:BranchingQNetwork"]),
            ("trimtab.rl.agent:c51_projection", ["trimtab.rl.losses:c51_projection"]),
            ("trimtab.rl.agent:c51_loss", ["trimtab.rl.losses:c51_loss"]),
            ("trimtab.rl.agent:quantile_huber_loss", ["trimtab.rl.losses:quantile_huber_loss"]),
            ("trimtab.rl.agent:n_step_returns", ["trimtab.rl.losses:n_step_returns"]),
            ("trimtab.rl.agent:ReplayBuffer", ["trimtab.rl.replay:ReplayBuffer"]),
            ("trimtab.rl.agent:Learner", ["trimtab.rl.learner:Learner"]),
            ("trimtab.rl.agent:build_learner", ["trimtab.rl.learner:build_learner"]),
            ("trimtab.rl.agent:build_stability", ["trimtab.rl.stability:build_stability"]),
            ("trimtab.rl.agent:CapturedStep", ["trimtab.rl.graphed:CapturedStep"]),
        ],
    ),
    "backtest": (
        "`trimtab.rl.backtest`",
        "Execution and costs, the baselines, the pooled out-of-sample statistics with their "
        "intervals, selection over many trials.",
        [
            ("trimtab.rl.backtest:Fills", ["trimtab.rl.backtest.execution:Fills"]),
            ("trimtab.rl.backtest:Costs", ["trimtab.rl.backtest.execution:Costs"]),
            ("trimtab.rl.backtest:fill_returns", ["trimtab.rl.backtest.execution:fill_returns"]),
            ("trimtab.rl.backtest:simulate", ["trimtab.rl.backtest.baselines:simulate"]),
            ("trimtab.rl.backtest:buy_and_hold", ["trimtab.rl.backtest.baselines:buy_and_hold"]),
            ("trimtab.rl.backtest:random_levels", ["trimtab.rl.backtest.baselines:random_levels"]),
            ("trimtab.rl.backtest:oracle_levels", ["trimtab.rl.backtest.baselines:oracle_levels"]),
            ("trimtab.rl.backtest:fold_backtest", ["trimtab.rl.backtest.pooled:fold_backtest"]),
            ("trimtab.rl.backtest:pool", ["trimtab.rl.backtest.pooled:pool"]),
            ("trimtab.rl.backtest:sharpe", ["trimtab.rl.backtest.stats:sharpe"]),
            ("trimtab.rl.backtest:sharpe_ci", ["trimtab.rl.backtest.stats:sharpe_ci"]),
            (
                "trimtab.rl.backtest:stationary_bootstrap",
                ["trimtab.rl.backtest.stats:stationary_bootstrap"],
            ),
            (
                "trimtab.rl.backtest:paired_difference",
                ["trimtab.rl.backtest.stats:paired_difference"],
            ),
            ("trimtab.rl.backtest:breakeven_bps", ["trimtab.rl.backtest.stats:breakeven_bps"]),
            ("trimtab.rl.backtest:max_drawdown", ["trimtab.rl.backtest.stats:max_drawdown"]),
            (
                "trimtab.rl.backtest:deflated_sharpe",
                ["trimtab.rl.backtest.selection:deflated_sharpe"],
            ),
        ],
    ),
    "run": (
        "`trimtab.rl.run`",
        "The runner, walk-forward folds, evaluation, checkpoints, the run directory, DDP, "
        "collection, and the `trimtab train` command.",
        [
            ("trimtab.rl.run:train", ["trimtab.rl.runner:train"]),
            ("trimtab.rl.run:make_folds", ["trimtab.rl.walkforward:make_folds"]),
            ("trimtab.rl.run:evaluate_fold", ["trimtab.rl.walkforward:evaluate_fold"]),
            ("trimtab.rl.run:evaluate_checkpoint", ["trimtab.rl.evaluate:evaluate_checkpoint"]),
            ("trimtab.rl.run:save", ["trimtab.rl.checkpoint:save"]),
            ("trimtab.rl.run:load", ["trimtab.rl.checkpoint:load"]),
            ("trimtab.rl.run:CheckpointError", ["trimtab.rl.checkpoint:CheckpointError"]),
            ("trimtab.rl.run:prepare_run_dir", ["trimtab.rl.rundir:prepare_run_dir"]),
            ("trimtab.rl.run:MetricsLog", ["trimtab.rl.rundir:MetricsLog"]),
            ("trimtab.rl.run:TrainingHalted", ["trimtab.rl.rundir:TrainingHalted"]),
            ("trimtab.rl.run:Collector", ["trimtab.rl.collect:Collector"]),
            ("trimtab.rl.run:Ranks", ["trimtab.rl.ddp:Ranks"]),
            ("trimtab.rl.run:AgentDDP", ["trimtab.rl.ddp:AgentDDP"]),
        ],
    ),
    "report": (
        "`trimtab.rl.report`",
        "The run's HTML report, its plots and its tables.",
        [
            ("trimtab.rl.report:build_report", []),
            ("trimtab.rl.report:market_figures", ["trimtab.rl.report_plots:market_figures"]),
            ("trimtab.rl.report:format_fold_table", ["trimtab.rl.report_tables:format_fold_table"]),
            ("trimtab.rl.report:verdict", ["trimtab.rl.report_tables:verdict"]),
        ],
    ),
    "sweep": (
        "`trimtab.rl.sweep`",
        "Sweeps as Ray tasks, the sweep spec, the sweep table, multi-seed runs.",
        [
            ("trimtab.rl.sweep:run_sweep", []),
            ("trimtab.rl.sweep:run_trial", []),
            ("trimtab.rl.sweep:SweepResult", []),
            ("trimtab.rl.sweep:SweepSpec", ["trimtab.rl.sweep_spec:SweepSpec"]),
            ("trimtab.rl.sweep:load_sweep_file", ["trimtab.rl.sweep_spec:load_sweep_file"]),
            ("trimtab.rl.sweep:format_table", ["trimtab.rl.sweep_table:format_table"]),
        ],
    ),
}


def _defined_at(obj: Any, mod_name: str, attr: str) -> str:
    return f"{getattr(obj, '__module__', mod_name)}.{getattr(obj, '__qualname__', attr)}"


def resolve(public: str, fallbacks: list[str]) -> tuple[str, str]:
    """``(public dotted name, where it is defined)`` of the first of ``public`` and
    ``fallbacks`` that imports, else of the same names defined in a submodule of the public
    name's package (the trainer's packages keep their objects in submodules). The definition's
    path is what mkdocstrings reads statically."""
    cands = [public, *fallbacks]
    for cand in cands:
        mod_name, attr = cand.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        obj = getattr(mod, attr, None)
        if obj is not None and hasattr(obj, "__qualname__"):
            return public.replace(":", "."), _defined_at(obj, mod_name, attr)
    pkg_name = public.split(":")[0]
    try:
        pkg = importlib.import_module(pkg_name)
    except ImportError:
        pkg = None
    if pkg is not None and hasattr(pkg, "__path__"):
        import pkgutil

        names = [c.split(":")[1] for c in cands]
        for info in pkgutil.iter_modules(pkg.__path__, pkg_name + "."):
            sub = importlib.import_module(info.name)
            for attr in names:
                obj = getattr(sub, attr, None)
                if obj is not None and getattr(obj, "__module__", None) == info.name:
                    return f"{info.name}.{attr}", _defined_at(obj, info.name, attr)
    raise RuntimeError(
        f"docs: API reference: none of {cands} imports; update the API table in docs/gen/api.py"
    )


def api_pages() -> dict[str, str]:
    pages: dict[str, str] = {}
    index = [
        "# API reference\n",
        "Generated from the docstrings of the public API (mkdocstrings). The library first, then "
        "the trainer's packages. Module docstrings say what each is for; a class's docstring "
        "gives its algorithm and its source.\n",
    ]
    for name, (title, what, entries) in API.items():
        index.append(f"- [{title}]({name}.md): {what}")
        out = [f"# {title}\n", what + "\n"]
        for public, fallbacks in entries:
            shown, where = resolve(public, fallbacks)
            short = shown.rsplit(".", 1)[1]
            out.append(f"## {short}\n")
            if where.rsplit(".", 1)[0] != shown.rsplit(".", 1)[0]:
                out.append(f"Defined in `{where.rsplit('.', 1)[0]}`.\n")
            out.append(f"::: {where}\n    options:\n      show_root_heading: false\n")
        pages[f"reference/api/{name}.md"] = "\n".join(out)
    pages["reference/api/index.md"] = "\n".join(index) + "\n"
    return pages
