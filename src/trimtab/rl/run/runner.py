"""``trimtab train``: one loop for every environment, read top to bottom like CleanRL's.

Per fold of an environment adapter (walk-forward market folds, or one Gymnasium "fold"): act,
env step, scale the reward, store, sample, learn, log, checkpoint; at the fold's end, evaluate
the greedy policy. Seeding, logging, checkpoints, resume, halting and the summary live here
once; every learning step goes through :mod:`trimtab.rl.agent.learner`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trimtab._impl import triton_available
from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.learner import Learner, build_learner
from trimtab.rl.config import TrainConfig
from trimtab.rl.envs.protocol import EnvAdapter, FoldPlan
from trimtab.rl.envs.registry import make_adapter
from trimtab.rl.report.build import build_report, report_pool, run_identity
from trimtab.rl.run import checkpoint as ckpt
from trimtab.rl.run.collect import Collector
from trimtab.rl.run.console import close_bar, fold_bar, print_fold, show_row
from trimtab.rl.run.ddp import NullLog, Ranks, fold_state_for
from trimtab.rl.run.memory import check_memory, is_out_of_memory, out_of_memory
from trimtab.rl.run.rundir import (
    MetricsLog,
    Progress,
    RunDirError,
    RunInterrupted,
    TrainingHalted,
    TrainingInterrupted,
    default_out,
    load_checkpoint,
    prepare_run_dir,
    resolve_device,
    save_checkpoint,
    write_fold_curve,
)

if TYPE_CHECKING:
    from trimtab.kernels.precompile import Precompile

__all__ = ["drive", "fold_seeds", "train", "train_steps"]

#: metrics.csv columns of the learner's info dict (those the learner returns)
_INFO_COLUMNS = {"loss/total": "loss", "loss/c51": "c51_loss", "loss/iqn": "iqn_loss",
                 "q_mean": "q_mean"}  # fmt: skip


def fold_seeds(seed: int, fold: int) -> tuple[int, int]:
    """The seeds of fold ``fold`` of a run seeded ``seed``: its envs, and its replay sampling.
    (``run.seed`` also seeds torch, the agent and, unless ``data.market_seed``, the market.)"""
    return seed * 1009 + fold, seed * 7919 + fold


def captures_collection(cfg: TrainConfig, adapter: EnvAdapter, device: torch.device) -> bool:
    """Whether a fold's collection is captured in a CUDA graph: on a CUDA device, with envs
    that live there (market, ``env.impl = "torch"``), unless ``run.cuda_graph = "off"``."""
    return cfg.run.cuda_graph != "off" and device.type == "cuda" and adapter.on_device


def start_precompile(cfg: TrainConfig, device: torch.device) -> Precompile | None:
    """On CUDA with ``run.precompile = "auto"``: the kernel variants of the device's manifest
    compiling in worker processes (:mod:`trimtab.kernels.precompile`); else None."""
    if cfg.run.precompile == "off" or device.type != "cuda" or not triton_available():
        return None
    from trimtab.kernels.precompile import Precompile

    try:
        with torch.cuda.device(device):
            return Precompile.start()
    except Exception as e:  # a speed-up only: the run compiles as it launches instead
        why = f"{type(e).__name__}: {e}"
        print(f"warning: the kernel precompile did not start ({why}); the run compiles its "
              "kernels as it launches them", file=sys.stderr, flush=True)  # fmt: skip
        return None


def finish_precompile(compiling: Precompile | None, show: bool) -> dict[str, Any] | None:
    """Wait for the workers; a line on stderr when they compiled something or failed (the run
    then compiles what is missing as it goes). Returns what the summary and run.log keep."""
    if compiling is None:
        return None
    done = compiling.wait()
    if done.get("failed"):
        print(f"warning: {len(done['failed'])} of {done['variants']} kernel variants did not "
              f"precompile ({done['failed'][0]}); the run compiles them as it launches them",
              file=sys.stderr, flush=True)  # fmt: skip
    if show and done.get("compiled"):
        print(f"compiled {done['compiled']} Triton kernel variants in {done['workers']} "
              f"processes in {done['seconds']:.1f} s (once per machine)", file=sys.stderr,
              flush=True)  # fmt: skip
    return done


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    checkpoint: str | Path | None = None,
    stop_after: int | None = None,
    setup: Callable[[Learner], None] | None = None,
    ranks: Ranks | None = None,
    plot_workers: int = 0,
) -> dict[str, Any]:
    """Run (or resume) a training run on ``cfg.env.name``; returns the summary written to disk.
    (:func:`train_steps` run to its end: the same run, one batched env step at a time.)

    ``ranks``: this process's place in a multi-process run (:mod:`trimtab.rl.run.ddp`; ``cfg`` is
    then :meth:`Ranks.config`'s): DDP on the agent, rank 0 alone writes the run directory.

    ``resume`` continues from ``checkpoint`` (default ``RUN_DIR/checkpoints/last.pt``; a fold
    checkpoint of the same run restarts after that fold); a run stopped before its first
    checkpoint starts over in place. A finished run is left as it is.
    ``stop_after`` (raise :class:`TrainingInterrupted` at the end of the batched env step in
    which that many gradient steps are done) and ``setup`` (called with the built
    :class:`~trimtab.rl.agent.learner.Learner`) are test hooks.
    """
    steps = train_steps(cfg, resume=resume, checkpoint=checkpoint, stop_after=stop_after,
                        setup=setup, ranks=ranks, plot_workers=plot_workers)  # fmt: skip
    return drive(steps)


def drive(steps: Generator[None, None, Any]) -> Any:
    """Run ``steps`` (:func:`train_steps`, or a sweep trial's) to its end; its return value.
    A Ctrl-C that lands between two of its steps is delivered at the step where it stands, so
    the run ends as one interrupted inside a step does (its message, its clean-up)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        except KeyboardInterrupt:
            if inspect.getgeneratorstate(steps) != inspect.GEN_SUSPENDED:
                raise  # raised inside the step: the run has answered it
            steps.throw(KeyboardInterrupt())


def train_steps(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    checkpoint: str | Path | None = None,
    stop_after: int | None = None,
    setup: Callable[[Learner], None] | None = None,
    ranks: Ranks | None = None,
    report: Callable[[Path], Any] | None = None,
    plot_workers: int = 0,
) -> Generator[None, None, dict[str, Any]]:
    """:func:`train` as a generator that yields after every batched env step of the training
    loop (and its gradient steps) and returns the summary: a driver can interleave several
    runs in one process (:mod:`trimtab.rl.run.population`). Closing it early runs the clean-up
    an interrupted run does (the adapter closed, the run directory's lock released).
    ``report(run_dir)`` writes the report once the summary is written (default
    :func:`~trimtab.rl.report.build.build_report`; a population hands it to a worker process:
    :class:`trimtab.rl.run.population.ReportPool`). ``plot_workers``: with the default report,
    that many worker processes (:func:`~trimtab.rl.report.build.report_pool`), started with
    the run, draw its plots side by side at its end (``trimtab train`` on a GPU, where the
    host's other cores are idle while it trains); 0 draws them here."""
    if not cfg.run.out:
        cfg = replace(cfg, run=replace(cfg.run, out=default_out(cfg)))
    if ranks is not None:  # rank 0's default name (it holds the time) for every rank
        cfg = replace(cfg, run=replace(cfg.run, out=ranks.out(cfg.run.out)))
    entered = time.perf_counter()  # summary["timings"]: where a run's wall time goes
    device = resolve_device(cfg.run.device)
    torch.set_num_threads(cfg.run.threads)
    with contextlib.ExitStack() as undo:  # what a failure before the run starts undoes
        # a machine's first CUDA run: the kernels compile in worker processes while it sets up
        compiling = start_precompile(cfg, device)
        if compiling is not None:
            undo.callback(compiling.cancel)
        adapter = make_adapter(cfg, device)  # bad data or env id: an error before any run dir
        undo.callback(adapter.close)
        for warning in adapter.summary([]).get("data_warnings", []):
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        # a config that cannot fit: one line with the estimate, before any run dir
        parts = check_memory(cfg, adapter, device)
        # locked until this run ends (several processes: by rank 0)
        run_dir, lock = (
            prepare_run_dir(cfg, resume) if ranks is None else ranks.prepare(cfg, resume)
        )
        undo.pop_all()  # the run has started: its own ``finally`` closes the adapter and lock
    plotting = None
    try:
        precompiled = finish_precompile(compiling, cfg.run.progress)
        if report is None and plot_workers > 0 and (ranks is None or ranks.is_main):
            # after the compile workers (a machine's first run): these import while it trains
            plotting = report_pool(plot_workers)
            report = functools.partial(build_report, pool=plotting)
        return (yield from _run(cfg, adapter, run_dir, device, resume, checkpoint, stop_after,
                                setup, ranks, entered, precompiled, report))  # fmt: skip
    except (MemoryError, RuntimeError) as e:  # out of memory: one line naming the keys to lower
        if not is_out_of_memory(e):
            raise
        raise out_of_memory(e, parts, device, run_dir) from None
    except KeyboardInterrupt as e:  # before the loop (setting up): say where, and what next
        if isinstance(e, RunInterrupted):
            raise
        raise RunInterrupted(
            f"interrupted before training started; continue with `trimtab train --resume {run_dir}`"
        ) from None
    finally:
        if plotting is not None:
            plotting.shutdown(wait=False, cancel_futures=True)
        adapter.close()
        lock.release()


def _run(
    cfg: TrainConfig,
    adapter: EnvAdapter,
    run_dir: Path,
    device: torch.device,
    resume: bool,
    checkpoint: str | Path | None,
    stop_after: int | None,
    setup: Callable[[Learner], None] | None,
    ranks: Ranks | None,
    entered: float,
    precompiled: dict[str, Any] | None = None,
    report: Callable[[Path], Any] | None = None,
) -> Generator[None, None, dict[str, Any]]:
    main = ranks is None or ranks.is_main  # who writes the run directory
    identity = run_identity()  # the source this process runs (the tree may change meanwhile)
    torch.manual_seed(cfg.run.seed)
    parts = {} if ranks is None else ranks.parts()  # DDP; bounds and flags over the ranks
    with Lifecycle() as life:
        learner = build_learner(cfg, adapter.obs_dim, adapter.branch_sizes, device, **parts)
    if setup is not None:
        setup(learner)
    prog, fold_state = Progress(), None
    path = None if checkpoint is None else Path(checkpoint)
    if resume and path is None and not (run_dir / "checkpoints" / "last.pt").is_file():
        print(f"{run_dir} has no checkpoint yet: starting it over", file=sys.stderr, flush=True)
    elif resume:
        prog, fold_state = load_checkpoint(run_dir, learner, path)
        # this rank's part (and its random streams)
        fold_state = fold_state_for(fold_state, ranks, path or "last.pt", learner)
        summary_path = run_dir / "summary.json"
        written = summary_path.is_file() and (not main or (run_dir / "report.html").is_file())
        if prog.fold >= adapter.n_folds and written:  # nothing to do: write nothing
            summary = json.loads(summary_path.read_text())
            print(f"{run_dir} is a finished run ({prog.fold} folds, {prog.global_step} steps); "
                  "nothing to resume, nothing changed", flush=True)  # fmt: skip
            return {**summary, "run_dir": str(run_dir), "folds": prog.fold_rows}
        if prog.fold >= adapter.n_folds:  # stopped while writing its summary or report
            print(f"{run_dir} finished training: writing its summary and report", flush=True)
    purge = prog.global_step if resume else None  # 0: all rows
    log = MetricsLog(run_dir, purge_step=purge) if main else NullLog()
    if main:
        with (run_dir / "run.log").open("a") as fh:
            fh.write("fold boundary does:\n" + "".join(f"  {x}\n" for x in life.describe()))
            if precompiled is not None:
                fh.write(f"kernel precompile: {json.dumps(precompiled)}\n")
            fh.writelines(f"warning: {w}\n" for w in adapter.summary([]).get("data_warnings", []))
    halted: str | None = None
    looping = time.perf_counter()
    spent = {"evaluate_s": 0.0, "checkpoint_s": 0.0}  # of the loop's time (see _finish)
    try:
        while prog.fold < adapter.n_folds:
            if prog.fold_step == 0 and prog.env_steps == 0 and prog.fold > 0:
                life.fold_boundary()  # moments, target nets, slots, sentinel: all together
            plan = adapter.plan(prog.fold)
            halted = yield from _train_fold(cfg, adapter, plan, learner, prog, log, run_dir,
                                            fold_state, stop_after, ranks, spent)  # fmt: skip
            fold_state = None
            if halted:
                break
            # evaluate the greedy policy (market: out of sample on the next window)
            t0 = time.perf_counter()
            row, curves = adapter.evaluate(learner.agent, plan.index)
            spent["evaluate_s"] += time.perf_counter() - t0
            row.update(steps=prog.fold_step, nonfinite=learner.nonfinite_count())
            prog.fold_rows.append(row)
            if curves is not None and main:
                write_fold_curve(run_dir, plan.index, curves)
            print_fold(row, cfg.run.progress and main)
            prog.fold += 1
            prog.fold_step = prog.env_steps = 0
            if main:
                t0 = time.perf_counter()
                save_checkpoint(run_dir, cfg, learner, prog, fold_end=plan.index,
                                normalizer=adapter.normalizer_state())  # fmt: skip
                spent["checkpoint_s"] += time.perf_counter() - t0
    except KeyboardInterrupt:
        redo = prog.global_step - prog.saved_step
        raise RunInterrupted(
            f"interrupted at step {prog.global_step}; continue with `trimtab train --resume "
            f"{run_dir}` (it redoes the {redo} step(s) since the last checkpoint, step "
            f"{prog.saved_step})"
        ) from None
    except OSError as e:  # a full disk while logging: the checkpoints are atomic, so intact
        raise RunDirError(
            f"writing to {run_dir} failed at step {prog.global_step}: {e.strerror or e}; the "
            f"last good checkpoint (step {prog.saved_step}) is kept: free space, then "
            f"`trimtab train --resume {run_dir}`"
        ) from None
    finally:
        log.close()
    try:
        return _finish(cfg, adapter, learner, prog, life, run_dir, main, ranks, halted,
                       identity, device, entered, looping, precompiled, report,
                       spent)  # fmt: skip
    except KeyboardInterrupt:
        raise RunInterrupted(
            f"interrupted while writing the summary and report; `trimtab train --resume "
            f"{run_dir}` writes them"
        ) from None


def _finish(
    cfg: TrainConfig,
    adapter: EnvAdapter,
    learner: Learner,
    prog: Progress,
    life: Lifecycle,
    run_dir: Path,
    main: bool,
    ranks: Ranks | None,
    halted: str | None,
    identity: dict[str, Any],
    device: torch.device,
    entered: float,
    looping: float,
    precompiled: dict[str, Any] | None,
    report: Callable[[Path], Any] | None,
    spent: dict[str, float],
) -> dict[str, Any]:
    """The run's summary, sentinel report and report, written once training is over (or
    halted); a run stopped in here is finished by ``--resume``. ``timings.report_s``: the
    report's time here (a population's hand-off to a worker process, which builds it);
    ``spent``: the seconds of the loop that its folds' greedy evaluations and its checkpoints
    (mid-fold and end-of-fold) took, ``evaluate_s`` and ``checkpoint_s``."""
    summary = {
        "run_dir": str(run_dir),
        "env": cfg.env.name,
        "folds": prog.fold_rows,
        "halted": halted,
        "stability": cfg.run.stability,
        # the bounds' cadence as resolved on this device (run.measure_every "auto": 8 on the
        # CPU, 1 on CUDA); None where nothing is measured
        "measure_every": learner.stability.measure_every
        if cfg.run.stability == "adaptive"
        else None,
        "seed": cfg.run.seed,
        "identity": identity,
        "device": str(device),
        "env_steps": prog.global_env_steps,
        "updates": prog.global_step,
        "seconds": round(prog.elapsed(), 1),
        "fold_boundary": life.describe(),
        # the market's pooled backtest reads the folds' curves back from the run directory
        **adapter.summary(prog.fold_rows, run_dir if main else None),
    }
    if ranks is not None:  # env steps and updates above are per rank (rank 0's envs)
        summary["world_size"] = ranks.world_size
    if precompiled is not None:  # the kernel variants compiled by workers before the run
        summary["precompile"] = precompiled
    # This process's wall time by part: data and env, the learner (CUDA set-up included) and
    # the run directory; the loop (training, evaluation, checkpoints), and of it the folds'
    # evaluations and the checkpoints; the report. What it spent before train() (interpreter,
    # imports) is the rest of its wall time.
    timings = {"setup_s": looping - entered, "loop_s": time.perf_counter() - looping, **spent}
    summary["timings"] = {k: round(v, 2) for k, v in timings.items()}
    if main:
        ckpt.atomic_write_json(run_dir / "sentinel.json", learner.sentinel_report())
        ckpt.atomic_write_json(run_dir / "summary.json", summary)
        t0 = time.perf_counter()
        (build_report if report is None else report)(run_dir)
        summary["timings"]["report_s"] = round(time.perf_counter() - t0, 2)
        ckpt.atomic_write_json(run_dir / "summary.json", summary)
    if halted:
        raise TrainingHalted(halted)
    return summary


def _train_fold(
    cfg: TrainConfig,
    adapter: EnvAdapter,
    plan: FoldPlan,
    learner: Learner,
    prog: Progress,
    log: MetricsLog,
    run_dir: Path,
    fold_state: dict[str, Any] | None,
    stop_after: int | None,
    ranks: Ranks | None,
    spent: dict[str, float],
) -> Generator[None, None, str | None]:
    """Train one fold to its plan, yielding after every batched env step and its gradient
    steps; returns the sentinel's halt message, if it fired. ``spent["checkpoint_s"]`` gains
    the seconds its checkpoints take."""
    agent, device = learner.agent, torch.device(cfg.run.device)
    env_seed, sample_seed = fold_seeds(cfg.run.seed, plan.index)
    obs = adapter.open_fold(plan.index, env_seed)
    # a fresh buffer per fold (market features are renormalised)
    replay = agent.make_replay(adapter.reward_parts)
    generator = torch.Generator(device=device).manual_seed(sample_seed)
    # act -> env step -> check -> store, one batched env step per call: captured in a CUDA graph
    # where the envs live on a CUDA device (trimtab.rl.run.collect)
    collector = Collector(agent, adapter, learner, replay, cfg.env.reward_scale,
                          capture=captures_collection(cfg, adapter, device))  # fmt: skip
    if fold_state is not None:  # resume mid-fold exactly where the checkpoint was written
        adapter.load_state_dict(fold_state["env"])
        replay.load_state_dict(fold_state["replay"])
        generator.set_state(fold_state["generator"])
        obs = fold_state["obs"].to(device)
        collector.load_episodes(fold_state["episodes"])
    collector.start(obs, prog.global_env_steps)
    main = ranks is None or ranks.is_main
    bar = fold_bar(cfg, plan, prog.fold_step) if main else None
    every = cfg.run.checkpoint_every
    while not plan.done(prog.fold_step, prog.env_steps):
        # collect: act (ε-greedy), env step, sentinel check of what the env returned, store in
        # replay (rewards scaled by env.reward_scale; episode returns stay unscaled)
        collector.step(prog.global_env_steps)
        before = prog.env_steps
        prog.env_steps += adapter.n_envs
        prog.global_env_steps += adapter.n_envs
        if prog.env_steps < plan.learning_starts:
            yield
            continue
        updates_before = prog.global_step
        for _ in range(adapter.updates_due(before, prog.env_steps)):
            # sample, learn: one guarded gradient step (the learner owns every stability part)
            # (captured on CUDA: the sample, the step and the priority update, one graph)
            info = learner.learn_from(replay, generator, cfg.agent.batch_size)
            prog.fold_step += 1
            prog.global_step += 1
            # check: the sentinel's flag, read on the host every run.check_every steps
            halted = learner.poll()
            if halted:
                close_bar(bar)
                return halted
            # log: the one host read, with the sentinel's halt check
            if prog.global_step % cfg.run.log_every == 0:
                row = _log_row(prog, info, learner, collector.episodes())
                collector.clear()
                log.write(row)
                halted = learner.halt_message()
                if halted:
                    close_bar(bar)
                    return halted
                show_row(bar, row)
            if bar is not None:
                bar.update(1)
            if plan.updates_done(prog.fold_step):
                break
        # checkpoint: between batched env steps, so that a resume starts at one
        if prog.global_step // every > updates_before // every:
            halted = learner.halt_message()  # no checkpoint holds a step after a fire
            if halted:
                close_bar(bar)
                return halted
            t0 = time.perf_counter()  # the fold's state copied to the host, and the file
            fold = {"env": adapter.state_dict(), "replay": replay.state_dict(),
                    "generator": generator.get_state(), "obs": collector.obs.cpu(),
                    "episodes": collector.episodes().cpu()}  # fmt: skip
            if ranks is not None:  # every rank's, on rank 0 (each resumes its own)
                fold = ranks.gather_fold_state(fold, learner)
            if main:
                save_checkpoint(run_dir, cfg, learner, prog, fold_state=fold)
            spent["checkpoint_s"] += time.perf_counter() - t0
        if stop_after is not None and prog.global_step >= stop_after:
            close_bar(bar)
            raise TrainingInterrupted(f"stopped after {prog.global_step} steps (test hook)")
        yield  # a driver of several runs steps the next one (train: straight on)
    close_bar(bar)
    return learner.halt_message()


def _log_row(
    prog: Progress, info: dict[str, torch.Tensor], learner: Learner, episodes: torch.Tensor
) -> dict[str, float | None]:
    values = {col: info[key] for col, key in _INFO_COLUMNS.items() if key in info}
    values["episode_return"] = episodes[0] / episodes[1].clamp_min(1)
    values["episodes"] = episodes[1]
    values.update(learner.log_values())
    host = torch.stack([v.detach().double().reshape(()) for v in values.values()]).cpu()
    row: dict[str, float | None] = {"step": prog.global_step, "fold": prog.fold,
                                    "env_steps": float(prog.global_env_steps)}  # fmt: skip
    row.update({n: float(h) for n, h in zip(values, host.tolist())})
    if row.pop("episodes") == 0:  # no episode ended in the interval: no return to report
        row["episode_return"] = None
    row["epsilon"] = learner.agent.epsilon(prog.global_env_steps)
    return row
