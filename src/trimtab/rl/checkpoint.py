"""Atomic files: a checkpoint or report is either wholly the new one or wholly the old one.

Write to a temporary file in the same directory, flush and fsync it, rename it over the target
(atomic on POSIX), then fsync the directory so the rename itself survives a crash.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "atomic_write_bytes", "atomic_write_text", "load", "save"]

#: Bumped when the checkpoint's top-level layout changes (2: the one runner's layout, with
#: ``learner_keys`` and ``fold_state``; env steps counted summed over envs).
CHECKPOINT_FORMAT = 2


class CheckpointError(ValueError):
    """A checkpoint cannot be read, or was written by a run of another layout."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def save(path: str | Path, state: dict[str, Any], *, fingerprint: str) -> None:
    """Save ``state`` with the state-vector layout ``fingerprint`` that loading will demand."""
    buf = io.BytesIO()
    torch.save({"format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "state": state}, buf)
    atomic_write_bytes(path, buf.getvalue())


def load(
    path: str | Path, *, fingerprint: str | None, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Load a checkpoint; refuse one of another format or state-vector layout.

    ``fingerprint=None`` accepts any layout (for inspection tools); training passes its own.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        blob = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # torch raises many types for a corrupt file; all mean "unreadable"
        raise CheckpointError(
            f"checkpoint {path} could not be read ({type(e).__name__}: {e}); "
            "it may be truncated or not a trimtab checkpoint"
        ) from None
    if not isinstance(blob, dict) or blob.get("format") != CHECKPOINT_FORMAT:
        found = blob.get("format") if isinstance(blob, dict) else None
        raise CheckpointError(
            f"checkpoint {path} is not a trimtab checkpoint of format {CHECKPOINT_FORMAT} "
            f"(found format {found}): it was written by another trimtab version or another "
            "program; use the version that wrote it, or start a new run"
        )
    if fingerprint is not None and blob["fingerprint"] != fingerprint:
        raise CheckpointError(
            f"checkpoint {path} was written with state-vector layout {blob['fingerprint']}, "
            f"but this run's layout is {fingerprint}: the stability configuration differs. "
            "Resume with the config.toml saved in that run directory, or start a new run."
        )
    return blob["state"]
