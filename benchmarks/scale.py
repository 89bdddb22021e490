"""Reward scale: one config across training rewards x0.001 ... x1000 (bsuite's ``*_scale``
experiments), four stability arms and several seeds, on CartPole-v1 and the embedded market.

    python benchmarks/scale.py [--envs cartpole market] [--scales 0.001 0.03 1 30 1000]
        [--arms adaptive fixed off tuned] [--seeds 1 2 3] [--steps 500000] [--fold-steps 800]
        [--device cpu|cuda] [--jobs N] [--time-limit SECONDS] [--runs DIR] [--out JSON]
        [--set [ENV:]KEY=VALUE ...]
    python benchmarks/scale.py --merge a.json b.json --out scale.json   # tables, plots only
    python benchmarks/scale.py --quick --runs /tmp/r --out /tmp/scale.json   # a smoke test

Arms: ``adaptive``, ``fixed`` and ``off`` are ``run.stability``; ``tuned`` is ``fixed`` with the
C51 support set by hand for the scale, ``±V x scale``, V the base config's ``agent.v_max``
(CartPole: 100 = r_max / (1 - γ); market: 10, the ×1 default), the best a user could do by
retuning. ``env.reward_scale`` multiplies the training rewards only: CartPole's greedy return
(100 episodes) and the market's out-of-sample fold metrics are in the env's own units, which a
units check verifies exactly (``off`` with a support scaled by 1024, a power of two, is the same
run at x1 and x1024: equal metrics). Each trial is an ordinary run directory
``RUNS/ENV/ARM-xSCALE/seedN``; an interrupted trial resumes from its last checkpoint on the next
call, a finished one is read back, so a grid can be split over several calls (``--time-limit``
stops a call cleanly) and partial JSON files merged (``--merge``). On Ray (installed) the trials
are Ray tasks of :func:`trimtab.rl.sweep.trials.run_sweep`; without it, ``--jobs`` processes at once
(one CPU thread each), or one after another in this process with ``--jobs 1``.
Writes the JSON (every trial with machine, date, commit), a markdown table (``.md``) and one plot
per env (``_ENV.png``: the metric against scale, log x axis, one line per arm, seeds as dots).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trimtab.benchmarking import benchmark_parser, invocation, provenance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_report import ARMS, fill_from_runs, market_fields, merge_records, write

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "scale.json"
SCALES = (0.001, 0.03, 1.0, 30.0, 1000.0)
ENVS = ("cartpole", "market")
#: a power of two: x1 and x1024 with a support scaled alike are the same run, bit for bit
UNITS_SCALE = 1024.0


@dataclass(frozen=True)
class Trial:
    env: str
    arm: str
    scale: float
    seed: int
    cfg: Any  # the validated TrainConfig (run.out = run_dir)
    run_dir: Path

    @property
    def cell(self) -> str:
        return f"{self.arm}-x{self.scale:g}".replace(" ", "").replace("(", "-").replace(")", "")

    @property
    def key(self) -> tuple:
        return (self.env, self.arm, self.scale, self.seed, steps_key(self.cfg))


def steps_key(cfg: Any) -> str:
    """The training length a trial ran (records of different lengths are never averaged)."""
    if cfg.env.name.startswith("gym:"):
        return f"{cfg.gym.total_steps} env steps, {cfg.gym.eval_episodes} greedy episodes"
    return f"{cfg.walkforward.folds} folds x {cfg.walkforward.steps_per_fold} steps"


# --- the grid ---------------------------------------------------------------------------------
def base_data(env: str, args: argparse.Namespace) -> dict[str, Any]:
    """The config every arm and scale of ``env`` shares (before the cell's own keys)."""
    from trimtab.rl.configio import apply_overrides, load_toml

    if env == "cartpole":
        data = load_toml(ROOT / "examples" / "cartpole.toml")
        steps = args.steps
        data["gym"]["total_steps"] = steps
        data["agent"]["eps_decay_steps"] = steps // 2  # CleanRL: ε over half of the run
        if args.quick:
            data["gym"].update(learning_starts=200, eval_episodes=2)
    else:
        data = {"walkforward": {"steps_per_fold": args.fold_steps}}
        if args.quick:
            data["walkforward"].update(folds=2, learning_starts=64)
            data["data"] = {"synthetic_days": 300}
            data["env"] = {"n_envs": 4, "episode_days": 16}
    run = data.setdefault("run", {})
    run.update(device=args.device, progress=False, threads=1)
    if args.quick:
        run["log_every"] = 10
    sets = [s.split(":", 1)[1] if ":" in s.split("=", 1)[0] else s for s in args.sets
            if ":" not in s.split("=", 1)[0] or s.split(":", 1)[0] == env]  # fmt: skip
    return apply_overrides(data, sets)


def support_of(data: dict[str, Any]) -> float:
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import from_dict

    agent = from_dict(TrainConfig, data).agent
    if agent.v_min != -agent.v_max:
        raise SystemExit(f"the tuned arm scales a symmetric support; got [{agent.v_min}, "
                         f"{agent.v_max}]: set agent.v_min = -agent.v_max")  # fmt: skip
    return agent.v_max


def cell_data(base: dict[str, Any], arm: str, scale: float, v: float) -> dict[str, Any]:
    data = copy.deepcopy(base)
    data.setdefault("env", {})["reward_scale"] = scale
    data["run"]["stability"] = "fixed" if arm == "tuned" else arm
    if arm == "tuned":
        data.setdefault("agent", {}).update(v_min=-v * scale, v_max=v * scale)
    return data


def build_trials(args: argparse.Namespace) -> list[Trial]:
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import ConfigError, from_dict

    trials = []
    for env in args.envs:
        base = base_data(env, args)
        v = support_of(base)
        for arm in args.arms:  # arm-major: a grid cut short by --time-limit has whole arms
            label = f"{arm} ({args.variant})" if args.variant else arm
            for scale in args.scales:
                if arm == "tuned" and scale == 1.0:
                    continue  # ±V x 1 is the base support: fixed's very run (aggregate())
                for seed in args.seeds:
                    trial = Trial(env, label, float(scale), seed, None, Path())
                    run_dir = args.runs / env / trial.cell / f"seed{seed}"
                    data = cell_data(base, arm, scale, v)
                    data["run"].update(seed=seed, out=str(run_dir))
                    try:
                        cfg = from_dict(TrainConfig, data)
                    except (ConfigError, ValueError) as e:
                        raise SystemExit(f"{env} {arm} x{scale:g}: {e}") from None
                    trials.append(Trial(env, label, float(scale), seed, cfg, run_dir))
    return trials


# --- running ----------------------------------------------------------------------------------
def _measure_every(cfg: Any) -> int | None:
    """The run's measure_every as resolved on its device (None where nothing is measured)."""
    import torch

    from trimtab.rl.config import measure_every

    if cfg.run.stability != "adaptive":
        return None
    return measure_every(cfg.run, torch.device(cfg.run.device))


def record(t: Trial, status: str, summary: dict | None, seconds: float, error: str = "") -> dict:
    rec = {"env": t.env, "arm": t.arm, "scale": t.scale, "seed": t.seed,
           "steps": steps_key(t.cfg), "run_dir": str(t.run_dir), "status": status,
           "seconds": round(seconds, 1), **provenance(t.cfg.run.device),
           "config": {"bound_quantile": t.cfg.run.bound_quantile,
                      "clamp_headroom": t.cfg.run.clamp_headroom, "ablate": list(t.cfg.run.ablate),
                      "v_max": t.cfg.agent.v_max, "device": t.cfg.run.device,
                      "measure_every": _measure_every(t.cfg)}}  # fmt: skip
    if error:
        rec["error"] = error[-2000:]
    if not summary:
        return rec
    rec["seconds"] = summary.get("seconds", rec["seconds"])  # the run's own, over resumes
    rec["halted"] = summary.get("halted")
    rec["run_commit"] = (summary.get("identity") or {}).get("commit")  # the source it ran
    if t.env == "cartpole" and summary.get("eval"):
        rec["value"] = float(summary["eval"]["mean_return"])
        rec["train_return_last100"] = summary.get("train_return_last100")
    if t.env == "market":
        rec.update(market_fields(summary))
    if "value" not in rec and status == "done":
        rec["status"] = "failed"
        rec["error"] = "the run finished without the metric (no eval / no fold Sharpe)"
    return rec


def _read_summary(run_dir: Path) -> dict | None:
    from trimtab.rl.sweep.trials import read_summary

    return read_summary(run_dir)


def _status(summary: dict) -> str:
    return "halted" if summary.get("halted") else "done"


def _fresh_or_resume(t: Trial) -> bool:
    """True to resume ``t.run_dir`` (a run stopped midway); a directory with no config of its own
    (killed while being created) is removed and the run started afresh."""
    if not t.run_dir.exists():
        return False
    if (t.run_dir / "config.toml").is_file():
        return True
    shutil.rmtree(t.run_dir)
    return False


def run_inline(t: Trial) -> dict:
    """One trial in this process: read back, resume, or run it."""
    from trimtab.rl.train import TrainingHalted, train

    t0 = time.perf_counter()
    summary = _read_summary(t.run_dir)
    if summary is None:
        try:
            summary = train(t.cfg, resume=_fresh_or_resume(t))
        except TrainingHalted:
            summary = _read_summary(t.run_dir)
        except Exception as e:  # a trial's failure is a result, never lost
            return record(t, "failed", None, time.perf_counter() - t0, f"{type(e).__name__}: {e}")
    return record(t, _status(summary), summary, time.perf_counter() - t0)


class Pool:
    """Trials as ``trimtab train`` processes, ``jobs`` at once; at ``deadline`` the running ones
    are stopped (each resumes from its last checkpoint on the next call)."""

    def __init__(self, jobs: int, deadline: float | None) -> None:
        self.jobs, self.deadline = jobs, deadline
        self.procs: set[subprocess.Popen] = set()

    def _late(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def run(self, t: Trial) -> dict:
        from trimtab.rl.configio import to_toml

        t0 = time.perf_counter()
        summary = _read_summary(t.run_dir)
        if summary is not None:
            return record(t, _status(summary), summary, 0.0)
        if self._late():
            return record(t, "not started", None, 0.0)
        cmd = [sys.executable, "-m", "trimtab", "train"]
        if _fresh_or_resume(t):
            cmd += ["--resume", str(t.run_dir)]
        else:
            toml = t.run_dir.parent / f"{t.run_dir.name}.toml"
            toml.parent.mkdir(parents=True, exist_ok=True)
            toml.write_text(to_toml(t.cfg))
            cmd += ["--config", str(toml)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)  # fmt: skip
        self.procs.add(proc)
        try:
            left = None if self.deadline is None else max(1.0, self.deadline - time.monotonic())
            out, _ = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # checkpoints are atomic: it resumes next call
            proc.communicate()
            return record(t, "incomplete", None, time.perf_counter() - t0)
        finally:
            self.procs.discard(proc)
        summary = _read_summary(t.run_dir)
        if summary is None:
            return record(
                t, "failed", None, time.perf_counter() - t0, out or f"rc {proc.returncode}"
            )
        return record(t, _status(summary), summary, time.perf_counter() - t0)

    def map(self, trials: list[Trial], done: Any) -> list[dict]:
        with ThreadPoolExecutor(max_workers=self.jobs) as ex:
            futures = [ex.submit(self.run, t) for t in trials]
            try:
                out = []
                for f in futures:
                    out.append(f.result())
                    done(out[-1])
                return out
            except KeyboardInterrupt:
                for p in list(self.procs):
                    os.killpg(p.pid, signal.SIGTERM)
                raise


def run_on_ray(trials: list[Trial], args: argparse.Namespace) -> list[dict]:
    """Every env's trials through :func:`trimtab.rl.sweep.trials.run_sweep` on Ray (one sweep
    directory per env, ``RUNS/ENV``: the same run directories as the process engine)."""
    from trimtab.rl.sweep.spec import Trial as SweepTrial
    from trimtab.rl.sweep.trials import run_sweep

    out = []
    for env in args.envs:
        mine = [t for t in trials if t.env == env]
        sweep = [SweepTrial(t.cell, (("arm", t.arm), ("env.reward_scale", t.scale)), t.seed,
                            t.cfg, t.run_dir) for t in mine]  # fmt: skip
        result = run_sweep(sweep, args.runs / env, engine="ray", cpus=args.jobs,
                           gpus_per_trial=1.0 / max(1, args.jobs))  # fmt: skip
        by_dir = {str(r.trial.run_dir): r for r in result.results}
        for t in mine:
            r = by_dir[str(t.run_dir)]
            out.append(record(t, r.status, r.summary, r.seconds or 0.0, r.error or ""))
    return out


def check_run_dirs(trials: list[Trial]) -> None:
    """A run directory already there must hold this trial's config (it is read back or
    resumed): another config is another experiment, refused before anything runs."""
    from trimtab.rl.config import saved_config
    from trimtab.rl.configio import ConfigError, load_toml
    from trimtab.rl.sweep.spec import same_config

    for t in trials:
        path = t.run_dir / "config.toml"
        if not path.is_file():
            continue
        try:
            diff = same_config(saved_config(load_toml(path)), t.cfg)
        except ConfigError as e:
            diff = [str(e)]
        diff = [d for d in diff if not d.startswith("run.out:")]
        if diff:
            raise SystemExit(
                f"{t.run_dir} holds a run with another config ({diff[0]}); choose another "
                "--runs, or name the change with --variant"
            )


def engine_of(args: argparse.Namespace) -> str:
    if args.engine != "auto":
        return args.engine
    try:
        import ray  # noqa: F401
    except ImportError:
        return "pool" if args.jobs > 1 else "inline"
    return "ray"


# --- the units check --------------------------------------------------------------------------
def check_units(env: str, args: argparse.Namespace) -> dict[str, Any]:
    """``off`` with no IQN loss and the support scaled with the rewards (by 1024, a power of
    two: every product is exact) trains the same network at x1 and x1024; the metrics must be
    equal, which holds only if they are computed from the env's own rewards."""
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import from_dict
    from trimtab.rl.train import train

    small = argparse.Namespace(**{**vars(args), "quick": True, "sets": [], "device": "cpu",
                                  "steps": 600, "fold_steps": 6})  # fmt: skip
    base = base_data(env, small)
    v = support_of(base)
    values = {}
    for scale in (1.0, UNITS_SCALE):
        data = cell_data(base, "tuned", scale, v)
        data["run"].update(
            stability="off", seed=7, out=str(args.runs / "units" / env / f"x{scale:g}")
        )
        data.setdefault("agent", {})["iqn_weight"] = 0.0
        cfg = from_dict(TrainConfig, data)
        shutil.rmtree(cfg.run.out, ignore_errors=True)
        s = train(cfg)
        if env == "cartpole":
            values[f"x{scale:g}"] = {"greedy_return": s["eval"]["mean_return"]}
        else:
            values[f"x{scale:g}"] = {
                k: [f[k] for f in s["folds"]] for k in ("sharpe", "total_return")
            }
    same = values["x1"] == values[f"x{UNITS_SCALE:g}"]
    return {"env": env, "values": values, "equal": same}


# --- main -------------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = benchmark_parser(
        __doc__,
        None,
        quick="a smoke test: tiny runs, 2 scales",
        device="cpu",
        out_help=f"the results file (default {DEFAULT_OUT}; --quick: RUNS/scale.json)",
    )
    p.add_argument("--envs", nargs="+", choices=ENVS, default=list(ENVS))
    p.add_argument("--scales", nargs="+", type=float, default=None)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="CartPole env steps (500000)")
    p.add_argument("--fold-steps", type=int, default=None,
                   help="market gradient steps per fold (800, 4 folds)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="trials at once (default: cores - 1)")  # fmt: skip
    p.add_argument(
        "--engine",
        choices=("auto", "ray", "pool", "inline"),
        default="auto",
        help="auto: Ray if installed, else processes (--jobs > 1) or this process",
    )
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop after this long; stopped trials resume on the next call")  # fmt: skip
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "scale")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="[ENV:]KEY=VALUE",
                   help="override a config key of every trial (or of one env's)")  # fmt: skip
    p.add_argument(
        "--variant",
        default="",
        metavar="NAME",
        help="name the --set overrides: arms become 'ARM (NAME)' in the records, "
        "table and plot (and their run directories), so variants share one JSON",
    )
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                   help="merge these partial results into --out (no training)")  # fmt: skip
    p.add_argument("--no-units-check", action="store_true", help="skip the units check")
    p.add_argument("--units-check-only", action="store_true",
                   help="run the units check of --envs into --out, and no trial")  # fmt: skip
    args = p.parse_args(argv)
    if args.quick:
        args.scales = args.scales or [0.001, 1000.0]
        args.seeds = args.seeds or [1]
        args.steps = args.steps or 600
        args.fold_steps = args.fold_steps or 6
        args.engine = "inline" if args.engine == "auto" else args.engine
    args.scales = args.scales or list(SCALES)
    args.seeds = args.seeds or [1, 2, 3]
    args.steps = args.steps or 500_000
    args.fold_steps = args.fold_steps or 800
    if args.out is None:
        args.out = args.runs / "scale.json" if args.quick else DEFAULT_OUT
    if any(s <= 0 or not math.isfinite(s) for s in args.scales):
        p.error("--scales must be finite numbers > 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    old = json.loads(args.out.read_text()) if args.out.is_file() else {}
    units = old.get("units_check", {})
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        for part in parts:
            units.update(part.get("units_check", {}))
        records = merge_records(old.get("records", []), *[p["records"] for p in parts])
        fill_from_runs(records)
        doc = write(
            args.out, records, {"command": invocation(__file__, argv), "units_check": units}
        )
        print(doc["table"])
        return doc
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    trials = [] if args.units_check_only else build_trials(args)
    check_run_dirs(trials)
    engine = engine_of(args)
    print(f"{len(trials)} trials ({engine}, {args.jobs} at once): runs under {args.runs}")
    if not args.no_units_check:
        for env in args.envs:
            units[env] = check_units(env, args)
            print(
                f"units check, {env}: metrics at x1 and x{UNITS_SCALE:g} "
                f"{'equal' if units[env]['equal'] else 'DIFFER'}: {units[env]['values']}"
            )
    for d in {t.run_dir.parent.parent for t in trials}:  # a sweep directory, as Ray's runner's
        d.mkdir(parents=True, exist_ok=True)
        (d / ".trimtab-sweep").write_text("a trimtab sweep: each folder CELL/seedN is a run "
                                          "directory\n")  # fmt: skip

    def show(r: dict) -> None:
        v = "" if r.get("value") is None else f" {r['value']:.3g}"
        print(f"  {r['env']} {r['arm']} x{r['scale']:g} seed {r['seed']}: {r['status']}{v} "
              f"({r['seconds']:.0f} s)", flush=True)  # fmt: skip

    if not trials:
        new = []
    elif engine == "ray":
        new = run_on_ray(trials, args)
    elif engine == "pool":
        new = Pool(args.jobs, deadline).map(trials, show)
    else:
        new = []
        for t in trials:
            if deadline is not None and time.monotonic() >= deadline:
                new.append(record(t, "not started", None, 0.0))
            else:
                new.append(run_inline(t))
            show(new[-1])
    records = merge_records(old.get("records", []), new)
    doc = write(args.out, records, {"command": invocation(__file__, argv), "units_check": units})
    print(doc["table"])
    left = [r for r in new if r["status"] in ("incomplete", "not started")]
    print(f"written {args.out} (+ .md, {len(doc['plots'])} plots); {len(left)} trials left "
          "(rerun the same command to continue)" if left else f"written {args.out}")  # fmt: skip
    return doc


if __name__ == "__main__":
    main()
