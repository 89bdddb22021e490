"""A run directory and what the runner writes into it: ``config.toml``, ``metrics.csv`` with
TensorBoard scalars, checkpoints with the run's progress, per-fold curves and the run's errors.
"""

from __future__ import annotations

import csv
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trimtab.rl import checkpoint as ckpt
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import to_dict, to_toml

__all__ = [
    "MetricsLog",
    "Progress",
    "RunDirError",
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


def resolve_device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RunDirError(
            f"--device {name} was asked for but this machine has no CUDA device; use --device cpu"
        )
    return torch.device(name)


def default_out(cfg: TrainConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"runs/{stamp}-{cfg.run.stability}-s{cfg.run.seed}"


def prepare_run_dir(cfg: TrainConfig, resume: bool) -> Path:
    """A new (or empty) run directory with the resolved ``config.toml``, or the run to resume."""
    out = Path(cfg.run.out)
    if resume:
        if not (out / "checkpoints" / "last.pt").is_file():
            raise RunDirError(f"{out} has no checkpoints/last.pt to resume from")
        return out
    if out.exists() and any(out.iterdir()):
        raise RunDirError(
            f"{out} already holds files; choose another --out, remove it, or continue that run "
            f"with `trimtab train --resume {out}`"
        )
    out.mkdir(parents=True, exist_ok=True)
    ckpt.atomic_write_text(out / "config.toml", to_toml(cfg))
    return out


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
        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)

    def write(self, row: dict[str, float]) -> None:
        if self.columns is None:
            self.columns = list(row)
            with self.path.open("w", newline="") as fh:
                csv.writer(fh).writerow(self.columns)
        with self.path.open("a", newline="") as fh:
            csv.writer(fh).writerow([row.get(c, "") for c in self.columns])
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
    state = {
        **learned,
        "learner_keys": list(learned),
        "config": to_dict(cfg),
        "progress": asdict(prog),
        "torch_rng": torch.get_rng_state(),
        "normalizer": normalizer,  # the feature normaliser of a finished market fold
        "fold_state": fold_state,
    }
    path = run_dir / "checkpoints"
    ckpt.save(path / "last.pt", state, fingerprint=learner.fingerprint)
    if fold_end is not None:
        ckpt.save(path / f"fold_{fold_end}.pt", state, fingerprint=learner.fingerprint)


def load_checkpoint(run_dir: Path, learner: Any) -> tuple[Progress, dict[str, Any] | None]:
    """Restore the learner and the torch RNG from ``last.pt``; the progress and the fold state
    (None at a fold boundary). A checkpoint of another state-vector layout is refused."""
    blob = ckpt.load(run_dir / "checkpoints" / "last.pt", fingerprint=learner.fingerprint)
    learner.load_state_dict({k: blob[k] for k in blob["learner_keys"]})
    torch.set_rng_state(blob["torch_rng"])
    return Progress(**blob["progress"]), blob["fold_state"]


def write_fold_curve(run_dir: Path, fold: int, curves: dict[str, np.ndarray]) -> None:
    lines = [",".join(curves)]
    cols = list(curves.values())
    lines += [",".join(f"{c[i]:.10g}" for c in cols) for i in range(len(cols[0]))]
    ckpt.atomic_write_text(run_dir / "folds" / f"fold_{fold}.csv", "\n".join(lines) + "\n")
