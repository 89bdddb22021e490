"""A run directory and what the runner writes into it: ``config.toml``, ``metrics.csv`` with
TensorBoard scalars, checkpoints with the run's progress, per-fold curves and the run's errors.

One process at a time: a run holds an exclusive lock on ``RUN_DIR/.lock`` from before it looks
at the directory until it ends, so two runs (or two ``--resume``) never write one directory.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trimtab.rl.agent.dqn import NetworkLayoutError
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import to_dict, to_toml
from trimtab.rl.run import checkpoint as ckpt

__all__ = [
    "MetricsLog",
    "Progress",
    "RunDirError",
    "RunLock",
    "TrainingHalted",
    "TrainingInterrupted",
    "default_out",
    "load_checkpoint",
    "prepare_run_dir",
    "resolve_device",
    "save_checkpoint",
    "write_fold_curve",
]


class RunDirError(ValueError):
    """The output directory holds another run, or a run to resume is not there."""


class TrainingHalted(RuntimeError):
    """The sentinel fired under ``on_nonfinite = "halt"``; ``sentinel.json`` names the slot."""


class TrainingInterrupted(RuntimeError):
    """Raised by the ``stop_after`` test hook, as a crash would stop a run."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C: the message names the run directory and the steps a resume will redo."""


@dataclass
class Progress:
    """Where the run is: restored from a checkpoint on ``--resume``. Env steps are transitions
    summed over the envs stepped together (CleanRL's ``global_step``)."""

    fold: int = 0
    fold_step: int = 0  # gradient steps done in this fold
    env_steps: int = 0  # env steps done in this fold (drives learning_starts)
    global_step: int = 0  # gradient steps over all folds
    global_env_steps: int = 0  # env steps over all folds (drives ε)
    fold_rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # wall-clock seconds of every process of the run, to the checkpoint
    saved_step: int = 0  # global_step of the last checkpoint written (or resumed from)

    def __post_init__(self) -> None:
        self._since = time.perf_counter()  # not a field: this process's start

    def elapsed(self) -> float:
        """Seconds of the run so far: earlier processes' (to their checkpoint) plus this one's."""
        return self.seconds + time.perf_counter() - self._since


def resolve_device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RunDirError(
            f"--device {name} was asked for but this machine has no CUDA device; use --device cpu"
        )
    return torch.device(name)


def default_out(cfg: TrainConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"runs/{stamp}-{cfg.run.stability}-s{cfg.run.seed}"


class RunLock:
    """An exclusive ``flock`` on ``RUN_DIR/.lock``, held until :meth:`release` (or the process
    ends: the kernel drops it, so a killed run never leaves a stale lock)."""

    NAME = ".lock"

    def __init__(self, run_dir: Path) -> None:
        self.fd = os.open(run_dir / self.NAME, os.O_RDWR | os.O_CREAT, ckpt.FILE_MODE)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self.fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise RunDirError(
                    f"{run_dir} is in use by another trimtab process (it holds {self.NAME}); "
                    "wait for it to end, or choose another --out"
                ) from None
            raise

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = -1


def prepare_run_dir(cfg: TrainConfig, resume: bool) -> tuple[Path, RunLock]:
    """Lock the run directory, then: a new (or empty) one gets the resolved ``config.toml``; a
    run to resume must have a checkpoint. Filesystem trouble is a :class:`RunDirError`."""
    out = Path(cfg.run.out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} is a file, not a directory; choose another --out")
    if resume and not out.is_dir():
        raise RunDirError(f"{out} is not a run directory: it does not exist")
    try:
        if not resume:
            out.mkdir(parents=True, exist_ok=True)
        lock = RunLock(out)
    except OSError as e:
        raise RunDirError(
            f"cannot write the run directory {out}: {e.strerror or e}; choose a writable --out"
        ) from None
    try:
        if resume:  # a run stopped before its first checkpoint starts over (runner.train)
            if not (out / "config.toml").is_file():
                raise RunDirError(f"{out} is not a run directory: it has no config.toml")
            return out, lock
        if any(p.name != RunLock.NAME for p in out.iterdir()):  # checked under the lock
            raise RunDirError(
                f"{out} already holds files; choose another --out, remove it, or continue that "
                f"run with `trimtab train --resume {out}`"
            )
        try:
            ckpt.atomic_write_text(out / "config.toml", to_toml(cfg))
        except OSError as e:
            raise RunDirError(
                f"cannot write the run directory {out}: {e.strerror or e}; choose a writable --out"
            ) from None
    except BaseException:
        lock.release()
        raise
    return out, lock


class MetricsLog:
    """``metrics.csv`` (one row per ``log_every`` gradient steps) plus TensorBoard scalars.

    On resume, rows and events after the checkpoint's step are dropped (``purge_step``), so a
    resumed run's log equals an uninterrupted one's rather than repeating steps.
    """

    def __init__(self, run_dir: Path, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / "metrics.csv"
        self.columns: list[str] | None = None
        if purge_step is not None and self.path.is_file():
            with self.path.open() as fh:
                rows = list(csv.reader(fh))
            if rows:
                self.columns = rows[0]
                keep = [r for r in rows[1:] if int(r[0]) <= purge_step]
                with self.path.open("w", newline="") as fh:
                    csv.writer(fh).writerows([rows[0], *keep])
        # TensorBoard purges events at purge_step and after; the checkpoint's own step stays
        tb_purge = None if purge_step is None else purge_step + 1
        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=tb_purge)

    def write(self, row: dict[str, float | None]) -> None:
        """One row; None (e.g. no episode ended in the interval) is an empty cell."""
        if self.columns is None:
            self.columns = list(row)
            with self.path.open("w", newline="") as fh:
                csv.writer(fh).writerow(self.columns)
        with self.path.open("a", newline="") as fh:
            csv.writer(fh).writerow(["" if row.get(c) is None else row[c] for c in self.columns])
        step = int(row["step"])
        for k, v in row.items():
            if k not in ("step", "fold") and isinstance(v, float) and np.isfinite(v):
                self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        self.tb.close()


def save_checkpoint(
    run_dir: Path,
    cfg: TrainConfig,
    learner: Any,
    prog: Progress,
    *,
    fold_state: dict[str, Any] | None = None,
    normalizer: Any = None,
    fold_end: int | None = None,
) -> None:
    """``checkpoints/last.pt`` (and ``fold_K.pt`` at a fold's end): the learner's state at the
    top level (``agent``, ``stability``, ...), the config, progress, the torch RNG, and mid-fold
    everything the fold's loop needs to continue exactly (``fold_state``)."""
    learned = learner.state_dict()
    progress = {**asdict(prog), "seconds": prog.elapsed(), "saved_step": prog.global_step}
    state = {
        **learned,
        "learner_keys": list(learned),
        "config": to_dict(cfg),
        "progress": progress,
        "torch_rng": torch.get_rng_state(),
        "normalizer": normalizer,  # the feature normaliser of a finished market fold
        "fold_state": fold_state,
    }
    path = run_dir / "checkpoints"
    try:
        if fold_end is not None:
            ckpt.save(path / f"fold_{fold_end}.pt", state, fingerprint=learner.fingerprint)
        ckpt.save(path / "last.pt", state, fingerprint=learner.fingerprint)
    except OSError as e:  # a full disk: the write went to a temporary file, now removed
        raise RunDirError(
            f"writing a checkpoint to {path} failed at step {prog.global_step}: "
            f"{e.strerror or e}; the last good checkpoint (step {prog.saved_step}) is kept: "
            f"free space, then `trimtab train --resume {run_dir}`"
        ) from None
    prog.saved_step = prog.global_step


def load_checkpoint(
    run_dir: Path, learner: Any, path: Path | None = None
) -> tuple[Progress, dict[str, Any] | None]:
    """Restore the learner and the torch RNG from ``path`` (default ``last.pt``), verified (its
    digest, finite weights and moments, this run's layout); the progress and the fold state
    (None at a fold boundary). A refusal names the fold checkpoints that can be resumed."""
    path = run_dir / "checkpoints" / "last.pt" if path is None else Path(path)
    try:
        blob = verified(path, learner.fingerprint)
    except ckpt.CheckpointError as e:
        good = [p for p in _fold_checkpoints(run_dir) if p != path and _loads(p, learner)]
        hint = (
            f"; resumable instead: {', '.join(p.name for p in good)} (e.g. `trimtab train "
            f"--resume {good[-1]}`)"
            if good
            else "; no fold checkpoint of this run is resumable either: start a new run"
        )
        raise ckpt.CheckpointError(f"{e}{hint}") from None
    try:
        learner.load_state_dict({k: blob[k] for k in blob["learner_keys"]})
    except NetworkLayoutError as e:  # an edited config: no checkpoint of the run would load
        raise ckpt.CheckpointError(
            f"checkpoint {path} was saved with {e.saved}, but the run's config builds {e.built}: "
            f"set {e.fix} in {run_dir / 'config.toml'} to resume it, or start a new run"
        ) from None
    torch.set_rng_state(blob["torch_rng"])
    prog = Progress(**blob["progress"])
    prog.saved_step = prog.global_step
    return prog, blob["fold_state"]


def verified(path: Path, fingerprint: str | None) -> dict[str, Any]:
    """A checkpoint's state, refused (:class:`CheckpointError`) if unreadable, corrupted, of
    another layout, or holding a non-finite weight or optimizer moment."""
    blob = ckpt.load(path, fingerprint=fingerprint)
    agent = blob["agent"]
    tensors = [(f"online.{k}", v) for k, v in agent["online"].items()]
    tensors += [(f"target.{k}", v) for k, v in agent["target"].items()]
    for i, st in agent["optimizer"].get("state", {}).items():
        tensors += [(f"optimizer.state[{i}].{k}", v) for k, v in st.items()]
    for name, t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.isfinite().all():
            raise ckpt.CheckpointError(
                f"checkpoint {path} holds non-finite values in {name}: it was written after "
                "training went non-finite"
            )
    return blob


def _fold_checkpoints(run_dir: Path) -> list[Path]:
    found = (run_dir / "checkpoints").glob("fold_*.pt")
    return sorted(found, key=lambda p: int(p.stem.split("_")[1]) if p.stem[5:].isdigit() else -1)


def _loads(path: Path, learner: Any) -> bool:
    try:
        verified(path, learner.fingerprint)
    except ckpt.CheckpointError:
        return False
    return True


def _cell(v: object) -> str:
    return v if isinstance(v, str) else f"{v:.10g}"


def write_fold_curve(run_dir: Path, fold: int, curves: dict[str, np.ndarray]) -> None:
    """``folds/fold_K.csv`` of the 1-D curves (text cells as they are, numbers to 10
    digits); each 2-D array (a baseline's many draws) as ``folds/fold_K_NAME.npy``."""
    cols = {k: v for k, v in curves.items() if np.ndim(v) == 1}
    n = len(next(iter(cols.values())))
    lines = [",".join(cols)]
    lines += [",".join(_cell(c[i]) for c in cols.values()) for i in range(n)]
    ckpt.atomic_write_text(run_dir / "folds" / f"fold_{fold}.csv", "\n".join(lines) + "\n")
    for name, arr in curves.items():
        if np.ndim(arr) == 2:
            path = run_dir / "folds" / f"fold_{fold}_{name}.npy"
            tmp = path.with_suffix(".npy.tmp")
            with tmp.open("wb") as fh:
                np.save(fh, arr)
            tmp.replace(path)
