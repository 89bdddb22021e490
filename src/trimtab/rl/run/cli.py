"""The trainer's sub-commands: ``trimtab train``, ``trimtab report``, ``trimtab eval``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from trimtab.rl.configio import ConfigError, apply_overrides, from_dict, load_toml
from trimtab.rl.envs.registry import env_kind
from trimtab.rl.help_format import DefaultsFormatter, config_flag

__all__ = ["TRAINER_DEPENDENCIES", "add_commands", "user_errors"]


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's to fix: printed as one line, never a traceback."""
    from trimtab.rl.data.load import DataError
    from trimtab.rl.report.build import ReportError
    from trimtab.rl.run.checkpoint import CheckpointError
    from trimtab.rl.sweep.spec import SweepError
    from trimtab.rl.train import RunDirError
    from trimtab.state import LayoutMismatchError

    return (ConfigError, DataError, RunDirError, CheckpointError, LayoutMismatchError, ReportError,
            SweepError)  # fmt: skip


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        formatter_class=DefaultsFormatter,
        help="walk-forward distributional DQN on the embedded market, OHLCV files or a Gym env",
        description="Train fold after fold; each fold is tested out of sample on the next window "
        "(a Gymnasium env is one fold, evaluated greedily at its end).",
        epilog="Every config key, its type, default and meaning: trimtab config [--device cuda].",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="TOML file with [run], [env], [agent], and [data], [walkforward] (market) or [gym]",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set agent.lr=3e-4 (repeatable)",
    )
    config_flag(p, "--device", key="run.device", help="cpu | cuda | cuda:N")
    config_flag(p, "--seed", key="run.seed", type=int, help="the agent's and the envs' seed")
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        metavar="SEED",
        help="one run per seed (a sweep of one config: OUT/seedN, Ray tasks), then their "
        "table with mean ± s.e.; rerun with the same --out to continue",
    )
    p.add_argument(
        "--serial",
        action="store_true",
        help="with --seeds: no Ray, the runs one after another in this process",
    )
    p.add_argument(
        "--population",
        action="store_true",
        help="with --seeds: no Ray, every seed at once in this process, stepped in turn, each "
        "on a CUDA stream of its own (on a GPU their steps overlap: the sweeps guide)",
    )
    p.add_argument(
        "--cpus", type=int, help="with --seeds: CPUs of the local Ray instance (default: all)"
    )
    p.add_argument("--data", nargs="+", metavar="PATH", help="OHLCV CSV/Parquet files or folders")
    config_flag(p, "--env", key="env.name", help="market or gym:ENV_ID, e.g. gym:CartPole-v1")
    config_flag(p, "--folds", key="walkforward.folds", type=int, help="walk-forward folds")
    config_flag(p, "--steps-per-fold", key="walkforward.steps_per_fold", type=int,
                help="gradient steps per fold")  # fmt: skip
    config_flag(p, "--stability", key="run.stability", choices=["adaptive", "fixed", "off"],
                help="the stability mode")  # fmt: skip
    config_flag(p, "--on-nonfinite", key="run.on_nonfinite",
                choices=["halt", "skip", "sanitize"],
                help="what a NaN/Inf the sentinel finds does")  # fmt: skip
    config_flag(p, "--autocast", key="run.autocast", choices=["none", "bf16", "fp16"],
                help="forward passes in this precision")  # fmt: skip
    p.add_argument(
        "--stress", action="store_true", help="the stress preset of the synthetic market"
    )
    p.add_argument(
        "--out",
        help="run directory (default runs/<time>-<stability>-s<seed>); "
        "with --seeds the directory of the seeds' run directories",
    )
    p.add_argument(
        "--resume", type=Path, metavar="RUN_DIR",
        help="continue an interrupted run (or RUN_DIR/checkpoints/fold_K.pt: after fold K)",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--dist-backend",
        choices=["gloo", "nccl"],
        help="under torchrun with several processes: the torch.distributed backend (default: "
        "nccl on cuda, gloo on the cpu)",
    )
    p.set_defaults(func=cmd_train)  # fmt: skip

    r = sub.add_parser(
        "report",
        formatter_class=DefaultsFormatter,
        help="rebuild report.html and the plots of a run directory",
    )
    r.add_argument("run_dir", type=Path)
    r.set_defaults(func=cmd_report)

    c = sub.add_parser(
        "config",
        formatter_class=DefaultsFormatter,
        help="print every config key with its type, default and meaning",
        description="Every key of the config file (and of --set), read from the config "
        "dataclasses: its type, its default (the value it takes on --device where the device "
        "profile decides) and what it does.",
    )
    c.add_argument("--device", default="cpu", help="resolve the device profile for this device")
    c.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    c.set_defaults(func=cmd_config)

    e = sub.add_parser(
        "eval",
        formatter_class=DefaultsFormatter,
        help="evaluate a saved agent greedily on other market data",
    )
    e.add_argument(
        "checkpoint", type=Path, metavar="RUN_DIR|CHECKPOINT",
        help="a run directory (its checkpoints/last.pt) or a checkpoint file",
    )  # fmt: skip
    e.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="OHLCV files (default: its own market, out of and in sample apart)",
    )
    e.add_argument("--device", default="cpu", help="where the agent runs: cpu | cuda | cuda:N")
    e.add_argument("--json", type=Path, help="also write the metrics to this JSON file")
    e.set_defaults(func=cmd_eval)  # fmt: skip


def build_config(args: argparse.Namespace) -> Any:
    from trimtab.rl.config import TrainConfig

    return from_dict(TrainConfig, config_data(args))  # the device profile resolves inside


def config_data(args: argparse.Namespace) -> dict[str, Any]:
    """The config file, the flags and the --set overrides as nested tables (not validated)."""
    data: dict[str, Any] = load_toml(args.config) if args.config else {}
    flags = {
        "run.device": args.device, "run.seed": args.seed, "run.stability": args.stability,
        "run.on_nonfinite": args.on_nonfinite, "run.out": args.out, "env.name": args.env,
        "run.autocast": args.autocast,
        "walkforward.folds": args.folds, "walkforward.steps_per_fold": args.steps_per_fold,
    }  # fmt: skip
    for key, value in flags.items():
        if value is not None:
            section, name = key.split(".")
            data.setdefault(section, {})[name] = value
    if args.data:
        data.setdefault("data", {})["paths"] = list(args.data)
    if args.stress:
        data.setdefault("data", {})["stress"] = True
    if args.no_progress:
        data.setdefault("run", {})["progress"] = False
    return apply_overrides(data, args.overrides)


#: what ``pip install 'trimtab[train]'`` adds to the library's torch, numpy and Triton (a
#: command that misses one says so in one line: ``trimtab.cli``)
TRAINER_DEPENDENCIES = ("gymnasium", "pandas", "pyarrow", "matplotlib", "tensorboard", "tqdm",
                        "tomli_w", "tomli")  # fmt: skip
#: the ones every run imports (a Gymnasium env, Parquet files, TensorBoard: only some runs)
_EVERY_RUN = ("tomli_w", "tqdm", "matplotlib", "pandas")


def _trainer_dependencies() -> None:
    """Find what every run needs before it makes its run directory, so a missing one is a
    one-line error and no half-made run directory. Found, not imported: matplotlib and pandas
    take about a second to import, which a run pays where it uses them (its report; a
    population's reports are built by worker processes)."""
    import importlib.util

    for name in _EVERY_RUN:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


#: worker processes drawing a single GPU run's report plots (``trimtab train --device cuda``)
PLOT_WORKERS = 4


def plot_workers(cfg: Any, ranks: Any) -> int:
    """Worker processes for the report's plots of ``trimtab train``: on a GPU the host's cores
    idle while the run trains, so workers started with it draw the plots side by side at its end
    (a market run's seven, ~2 s in one process); none on the CPU, whose cores train, nor for
    torchrun's ranks."""
    return PLOT_WORKERS if ranks is None and cfg.run.device.startswith("cuda") else 0


def cmd_train(args: argparse.Namespace) -> int:
    _trainer_dependencies()
    if args.seeds is not None:  # several runs: a sweep of one cell (cli_sweep)
        from trimtab.rl.sweep.cli import cmd_train_seeds

        return cmd_train_seeds(args, config_data(args))
    if args.serial or args.population or args.cpus is not None:
        raise ConfigError(
            "--serial, --population and --cpus say how the runs of --seeds run; drop them for "
            "a single run"
        )
    from trimtab.rl.train import format_fold_table

    if args.resume is not None:
        given = [k for k in ("config", "device", "seed", "data", "env", "folds", "steps_per_fold",
                             "stability", "on_nonfinite", "autocast", "out")
                 if getattr(args, k)]  # fmt: skip
        if given or args.overrides or args.stress:
            raise ConfigError(
                f"--resume continues with the run's own config.toml; drop {given or '--set'}"
            )
        from dataclasses import replace

        from trimtab.rl.config import saved_config

        run_dir, checkpoint = args.resume, None
        if args.resume.is_file():  # a checkpoint of the run: RUN_DIR/checkpoints/NAME.pt
            run_dir, checkpoint = args.resume.parent.parent, args.resume
        cfg = saved_config(load_toml(run_dir / "config.toml"))
        run = replace(cfg.run, out=str(run_dir), progress=cfg.run.progress and not args.no_progress)
        cfg = replace(cfg, run=run)
        resume = True
    else:
        cfg = build_config(args)
        resume, checkpoint = False, None
    from trimtab.rl.run.ddp import Ranks, world_size_from_env
    from trimtab.rl.train import train

    ranks = None
    if world_size_from_env() > 1:  # torchrun --nproc-per-node N: DDP, one learner per rank
        ranks = Ranks.init(cfg.run.device, args.dist_backend)
        cfg = ranks.config(cfg)
    elif args.dist_backend:
        raise ConfigError(
            "--dist-backend is for runs launched by torchrun with several processes "
            "(`torchrun --nproc-per-node N -m trimtab train ...`); drop it for one process"
        )
    try:
        summary = train(cfg, resume=resume, checkpoint=checkpoint, ranks=ranks,
                        plot_workers=plot_workers(cfg, ranks))  # fmt: skip
    finally:
        if ranks is not None:
            ranks.close()
    if ranks is not None and not ranks.is_main:
        return 0
    if not env_kind(cfg.env.name, cfg.env.impl).walk_forward:  # one run: its greedy returns
        print(json.dumps(summary["eval"], indent=2))
    else:
        print(format_fold_table(summary))
    print(f"run directory: {summary['run_dir']}  (report: {summary['run_dir']}/report.html)")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from trimtab.rl.config_reference import format_reference, reference

    print(format_reference(reference(args.device), args.format, args.device), end="")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from trimtab.rl.report.build import build_report

    print(build_report(args.run_dir))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from trimtab.rl.run.evaluate import evaluate_checkpoint, format_window

    result = evaluate_checkpoint(args.checkpoint, args.data, args.device)
    print(f"checkpoint {result['checkpoint']}")
    print(format_window(result))
    if "in_sample" in result:
        print(format_window(result["in_sample"]) + "  (training windows included)")
    if args.json:
        from trimtab.rl.run.checkpoint import atomic_write_json

        atomic_write_json(args.json, result)
    return 0
