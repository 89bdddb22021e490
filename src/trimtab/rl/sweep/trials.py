"""``trimtab sweep``: a sweep's trials as Ray tasks (or one after another in this process), each
an ordinary run directory; finished trials are skipped on a rerun, every failure is reported.

Ray tasks rather than Tune trials: a trial here is one ``train(cfg)`` whose run directory is
already its result, checkpoint and log, and its ``summary.json`` already says whether it
finished. Tune would add a second results store, experiment state and restore logic next to
the one the run directory has, a search/scheduler layer a grid does not use, and heavier
dependencies (``ray[tune]`` pulls pandas, pyarrow, fsspec, tensorboardX...). ``ray.remote``
with ``num_cpus``/``num_gpus`` and ``ray.wait`` is all a grid × seeds needs, on one machine
or a cluster, and core ``ray`` is the only install.
"""

from __future__ import annotations

import contextlib
import json
import platform
import shutil
import time
import traceback
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from trimtab.rl.sweep.spec import SweepError, Trial, same_config
from trimtab.rl.sweep.table import merge, selection, trial_metrics, write_outputs

__all__ = [
    "SweepResult",
    "TrialResult",
    "read_summary",
    "require_ray",
    "run_sweep",
    "run_trial",
    "trial_steps",
]

#: a file in a sweep's directory that says so: only such a directory has trials removed
MARKER = ".trimtab-sweep"
_MARKER_TEXT = "a trimtab sweep: each folder CELL/seedN (or seedN) is a run directory\n"
#: keys every summary.json the runner writes has (it is written atomically, once, at the end)
_COMPLETE = ("run_dir", "folds", "halted", "seconds")
INSTALL_HINT = "pip install 'trimtab[sweep]' (or pip install ray)"


@dataclass
class TrialResult:
    trial: Trial
    status: str  # "done" | "halted" (the sentinel stopped it; a result) | "failed"
    summary: dict[str, Any] | None = None
    error: str | None = None
    seconds: float | None = None
    node: str = ""
    skipped: bool = False  # finished by an earlier run of the sweep

    def record(self) -> dict[str, Any]:
        t = self.trial
        return {"cell": t.label, "dir": t.cell, "seed": t.seed, "run_dir": str(t.run_dir),
                "status": self.status, "skipped": self.skipped, "error": self.error,
                "seconds": self.seconds, "node": self.node,
                "metrics": trial_metrics(self.summary) if self.summary else {}}  # fmt: skip


@dataclass
class SweepResult:
    results: list[TrialResult]
    cells: list[dict[str, Any]]  # the merged table, one row per cell
    seconds: float  # wall time of this invocation
    selection: dict[str, Any] | None = None  # the best trial and its deflated Sharpe ratio

    @property
    def failed(self) -> list[TrialResult]:
        return [r for r in self.results if r.status == "failed"]


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary if it finished (``summary.json`` complete), else None."""
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and all(k in data for k in _COMPLETE) else None


def run_trial(cfg_data: dict[str, Any], run_dir: str, root: str | None = None) -> dict[str, Any]:
    """One trial, in a Ray worker or in this process: a clean run directory, ``train(cfg)``,
    and the outcome as plain data (a failure's error and traceback, never an exception).
    ``root`` is the sweep's directory (default: the run directory's grandparent, OUT/CELL/seedN)."""
    from trimtab.rl.run.runner import drive

    return drive(trial_steps(cfg_data, run_dir, root))


def trial_steps(
    cfg_data: dict[str, Any],
    run_dir: str,
    root: str | None = None,
    report: Callable[[Path], Any] | None = None,
) -> Generator[None, None, dict[str, Any]]:
    """:func:`run_trial` as a generator that yields after every batched env step of the run
    (:func:`trimtab.rl.run.runner.train_steps`): the trials of a population
    (``engine="population"``) are stepped in turn in one process. ``report``: what writes the
    run's report (default: the run itself)."""
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import from_dict
    from trimtab.rl.run.runner import train_steps
    from trimtab.rl.train import TrainingHalted

    path = Path(run_dir)
    t0 = time.perf_counter()
    node = platform.node()
    root = Path(root) if root is not None else path.parent.parent
    if not root.exists():  # a node that does not share the driver's filesystem
        root.mkdir(parents=True)
        (root / MARKER).write_text(_MARKER_TEXT)
    if path.exists():  # half-written by an interrupted or failed attempt: start it afresh
        if not (root / MARKER).exists():
            error = f"{path} is not in a trimtab sweep directory: not removed"
            return {"status": "failed", "error": error, "seconds": 0.0, "node": node}
        shutil.rmtree(path)
    try:
        summary = yield from train_steps(from_dict(TrainConfig, cfg_data), report=report)
    except TrainingHalted:
        summary = read_summary(path)  # a halted run writes its summary before raising
    except Exception as e:  # a trial's failure, whatever it is, is reported, never lost
        path.mkdir(parents=True, exist_ok=True)
        tb = traceback.format_exc()
        (path / "sweep_error.txt").write_text(tb)
        return {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": tb,
                "seconds": time.perf_counter() - t0, "node": node}  # fmt: skip
    status = "halted" if summary and summary["halted"] else "done"
    return {"status": status, "summary": summary, "seconds": time.perf_counter() - t0,
            "node": node}  # fmt: skip


def require_ray() -> Any:
    """The ``ray`` module, or a :class:`SweepError` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise SweepError(
            f"trimtab sweep runs on Ray, which is not installed: {INSTALL_HINT}; "
            "or run the trials one after another in this process with --serial"
        ) from None
    return ray


def claim(out: Path, trials: Sequence[Trial]) -> tuple[list[TrialResult], list[Trial]]:
    """Make ``out`` a sweep directory; the trials it finished earlier and those left to run.

    A finished trial run with another config is an error, so a rerun cannot mix two sweeps."""
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).exists():
        if any(out.iterdir()):
            raise SweepError(
                f"{out} holds files and is not a trimtab sweep directory; choose another --out"
            )
        (out / MARKER).write_text(_MARKER_TEXT)
    done, todo = [], []
    for t in trials:
        summary = read_summary(t.run_dir)
        if summary is None:
            todo.append(t)
            continue
        diff = _config_diff(t)
        if diff:
            raise SweepError(
                f"{t.run_dir} finished with another config ({diff[0]}); this is another sweep: "
                "choose another --out"
            )
        status = "halted" if summary["halted"] else "done"
        done.append(TrialResult(t, status, summary, seconds=summary["seconds"], skipped=True))
    return done, todo


def _config_diff(t: Trial) -> list[str]:
    from trimtab.rl.config import saved_config
    from trimtab.rl.configio import ConfigError, load_toml

    try:
        diff = same_config(saved_config(load_toml(t.run_dir / "config.toml")), t.cfg)
    except ConfigError as e:
        return [str(e)]
    return [d for d in diff if not d.startswith("run.out:")]  # a sweep directory may move


def run_sweep(
    trials: Sequence[Trial],
    out: Path,
    *,
    engine: str = "ray",
    address: str | None = None,
    cpus: int | None = None,
    gpus_per_trial: float = 0.25,
    echo: Callable[[str], None] = print,
) -> SweepResult:
    """Run ``trials`` (skipping those ``out`` finished), then write the merged table.

    ``engine="ray"`` runs them as Ray tasks: in the Ray session already started, else on
    ``address`` (a cluster), else on a local instance of ``cpus`` (default: every core) and
    every GPU. Each task asks for ``run.threads`` CPUs and, for a CUDA run, ``gpus_per_trial``
    of a GPU. ``engine="serial"`` runs them one after another in this process;
    ``engine="population"`` runs them all at once in this process, stepped in turn, each on a
    CUDA stream of its own (:mod:`trimtab.rl.run.population`)."""
    t0 = time.perf_counter()
    out = Path(out)
    done, todo = claim(out, trials)
    results = list(done)
    echo(f"sweep {out}: {len(trials)} trials, {len(done)} finished earlier (skipped), "
         f"{len(todo)} to run")  # fmt: skip

    def finished(r: TrialResult) -> None:
        results.append(r)
        _show(r, len(results) - len(done), len(todo), echo)
        _save(out, results, trials)

    if todo and engine == "serial":
        for t in todo:
            finished(_result(t, run_trial(_data(t), str(t.run_dir), str(out.resolve()))))
    elif todo and engine == "ray":
        _run_on_ray(todo, out, address, cpus, gpus_per_trial, finished, echo)
    elif todo and engine == "population":
        _run_population(todo, out, finished, echo)
    elif todo:
        raise SweepError(f"engine {engine!r}: must be 'ray', 'serial' or 'population'")
    order = {id(t): i for i, t in enumerate(trials)}
    results.sort(key=lambda r: order[id(r.trial)])
    cells = _save(out, results, trials, plot=True)
    return SweepResult(results, cells, time.perf_counter() - t0, selection(results))


def _data(t: Trial) -> dict[str, Any]:
    from trimtab.rl.configio import to_dict

    return to_dict(t.cfg)


def _result(t: Trial, raw: dict[str, Any]) -> TrialResult:
    return TrialResult(t, raw["status"], raw.get("summary"), raw.get("error"),
                       raw.get("seconds"), raw.get("node", ""))  # fmt: skip


def _show(r: TrialResult, k: int, n: int, echo: Callable[[str], None]) -> None:
    t = r.trial
    head = f"[{k}/{n}] {t.label} seed {t.seed}: {r.status}"
    if r.status == "failed":
        echo(f"{head}: {r.error}  ({t.run_dir})")
        return
    metrics = trial_metrics(r.summary or {})
    shown = " ".join(f"{m} {v}" if isinstance(v, str) else f"{m} {v:+.3g}"
                     for m, v in metrics.items())  # fmt: skip
    echo(f"{head} {shown} in {r.seconds or 0:.1f}s  ({t.run_dir})")


def _save(
    out: Path, results: list[TrialResult], trials: Sequence[Trial], plot: bool = False
) -> list[dict[str, Any]]:
    cells = merge(results, trials)
    write_outputs(out, cells, [r.record() for r in results], plot=plot, sel=selection(results))
    return cells


def _run_population(
    todo: Sequence[Trial],
    out: Path,
    finished: Callable[[TrialResult], None],
    echo: Callable[[str], None],
) -> None:
    import torch

    from trimtab.rl.run.population import ReportPool, interleave
    from trimtab.rl.run.rundir import resolve_device

    devices = [torch.device(resolve_device(t.cfg.run.device)) for t in todo]
    where = sorted({str(d) for d in devices})
    echo(f"one population of {len(todo)} runs in this process on {', '.join(where)}")
    root = str(out.resolve())
    # on a GPU the members finish together: their reports are built by worker processes, side
    # by side, instead of one after another in here
    pool = ReportPool(len(todo)) if any(d.type == "cuda" for d in devices) else None
    with pool or contextlib.nullcontext():
        report = pool.submit if pool is not None else None
        starts = [partial(trial_steps, _data(t), str(t.run_dir), root, report) for t in todo]
        interleave(starts, devices, on_done=lambda i, raw: finished(_result(todo[i], raw)))
    for run_dir, error in pool.failed if pool is not None else []:
        echo(f"warning: the report of {run_dir} failed ({error}); `trimtab report {run_dir}` "
             "writes it")  # fmt: skip


def _run_on_ray(
    todo: Sequence[Trial],
    out: Path,
    address: str | None,
    cpus: int | None,
    gpus_per_trial: float,
    finished: Callable[[TrialResult], None],
    echo: Callable[[str], None],
) -> None:
    ray = require_ray()
    started = not ray.is_initialized()
    if started:
        if address is None:
            ray.init(num_cpus=cpus, include_dashboard=False)
        else:
            try:
                ray.init(address=address)
            except ConnectionError as e:
                raise SweepError(f"--address {address}: no Ray cluster there ({e})") from None
    pending: dict[Any, Trial] = {}
    try:
        resources = ray.cluster_resources()
        cuda = [t for t in todo if t.cfg.run.device.startswith("cuda")]
        if cuda and resources.get("GPU", 0) < gpus_per_trial:
            raise SweepError(
                f"{len(cuda)} trials ask for CUDA but the Ray cluster has "
                f'{resources.get("GPU", 0):g} GPUs; set run.device = "cpu"'
            )
        echo(f"on Ray: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs")
        task = ray.remote(run_trial)
        for t in todo:
            gpus = gpus_per_trial if t.cfg.run.device.startswith("cuda") else 0
            # no automatic retry: a crashed worker's trial is reported, and a rerun restarts it
            opts = {"num_cpus": t.cfg.run.threads, "num_gpus": gpus, "max_retries": 0}
            ref = task.options(**opts).remote(_data(t), str(t.run_dir), str(out.resolve()))
            pending[ref] = t
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                t = pending.pop(ref)
                try:
                    raw = ray.get(ref)
                except ray.exceptions.RayError as e:  # the worker died: no result came back
                    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    raw = {"status": "failed", "error": f"{type(e).__name__}: {first}"}
                _keep_locally(t, raw)
                finished(_result(t, raw))
    finally:
        for ref in pending:  # interrupted: stop the trials still queued or running
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def _keep_locally(t: Trial, raw: dict[str, Any]) -> None:
    """On a cluster without a shared filesystem the run directory is on the worker's node: keep
    its summary (or error) here too, so a rerun of the sweep skips the trial all the same."""
    from trimtab.rl.configio import to_toml
    from trimtab.rl.run.checkpoint import atomic_write_json, atomic_write_text

    if raw["status"] != "failed" and raw.get("summary") and read_summary(t.run_dir) is None:
        atomic_write_text(t.run_dir / "config.toml", to_toml(t.cfg))
        atomic_write_json(t.run_dir / "summary.json", raw["summary"])
    elif raw["status"] == "failed" and not (t.run_dir / "sweep_error.txt").exists():
        t.run_dir.mkdir(parents=True, exist_ok=True)
        (t.run_dir / "sweep_error.txt").write_text(raw.get("traceback") or raw["error"])
