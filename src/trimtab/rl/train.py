"""The trainer's public names: ``train`` (the one runner of :mod:`trimtab.rl.run.runner`, for the
market and Gymnasium environments), its errors, and the fold table printed after a run."""

from __future__ import annotations

from trimtab.rl.report.build import format_fold_table
from trimtab.rl.run.rundir import RunDirError, TrainingHalted, TrainingInterrupted
from trimtab.rl.run.runner import train

__all__ = ["RunDirError", "TrainingHalted", "TrainingInterrupted", "format_fold_table", "train"]
