"""The trainer's public names: ``train`` (the one runner of :mod:`trimtab.rl.runner`, for the
market and Gymnasium environments), its errors, and the fold table printed after a run."""

from __future__ import annotations

from trimtab.rl.report import format_fold_table
from trimtab.rl.rundir import RunDirError, TrainingHalted, TrainingInterrupted
from trimtab.rl.runner import train

__all__ = ["RunDirError", "TrainingHalted", "TrainingInterrupted", "format_fold_table", "train"]
