"""Atomic files: a checkpoint or report is either wholly the new one or wholly the old one.

Write to a temporary file in the same directory, flush and fsync it, rename it over the target
(atomic on POSIX), then fsync the directory so the rename itself survives a crash. Files get
the permissions of any file the user creates (0666 less the umask), not mkstemp's 0600.

A checkpoint carries a SHA-256 digest of every value it holds (tensors by their bytes), checked
on load: bytes corrupted on disk inside a tensor load without any error from torch, so the
digest is what refuses them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "atomic_write_bytes", "atomic_write_text", "load", "save"]

#: Bumped when the checkpoint's top-level layout changes (2: the one runner's layout, with
#: ``learner_keys`` and ``fold_state``; env steps counted summed over envs; 3: a digest of the
#: state, the sentinel's records and counters, the run's seconds).
CHECKPOINT_FORMAT = 3


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The permissions of a new file: what open() would give it (mkstemp's are 0600).
FILE_MODE = 0o666 & ~_umask()


class CheckpointError(ValueError):
    """A checkpoint cannot be read, or was written by a run of another layout."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
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
    blob = {"format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "state": state,
            "sha256": digest(state)}  # fmt: skip
    torch.save(blob, buf)
    atomic_write_bytes(path, buf.getvalue())


def digest(obj: Any) -> str:
    """SHA-256 of a nested state (dicts, sequences, tensors, arrays, bytes, scalars), in order."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, (bytes, bytearray)):
        h.update(b"B" + bytes(obj))
    elif hasattr(obj, "tobytes") and hasattr(obj, "dtype"):  # numpy arrays and scalars
        h.update(f"N{obj.dtype}{getattr(obj, 'shape', ())}".encode() + obj.tobytes())
    else:
        h.update(f"V{obj!r}".encode())


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
        # weights_only: tensors and plain data only; an object whose unpickling would run code
        # (a planted os.system, any class) is refused before any of it is built
        blob = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises many types for a corrupt file; all mean "unreadable"
        if "Weights only load failed" not in str(e):
            raise CheckpointError(
                f"checkpoint {path} could not be read ({type(e).__name__}: {e}); "
                "it may be truncated or not a trimtab checkpoint"
            ) from None
        what = next((ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln), "an object")
        raise CheckpointError(
            f"checkpoint {path} holds something other than tensors and plain data ({what}); "
            "trimtab never writes that, and loading it could run code: refused, nothing in it "
            "was run. Use checkpoints that trimtab wrote."
        ) from None
    if not isinstance(blob, dict) or blob.get("format") != CHECKPOINT_FORMAT:
        found = blob.get("format") if isinstance(blob, dict) else None
        raise CheckpointError(
            f"checkpoint {path} is not a trimtab checkpoint of format {CHECKPOINT_FORMAT} "
            f"(found format {found}): it was written by another trimtab version or another "
            "program; use the version that wrote it, or start a new run"
        )
    if blob.get("sha256") != digest(blob["state"]):
        raise CheckpointError(
            f"checkpoint {path} is corrupted: its contents do not match the digest written with "
            "them (a disk or copy error)"
        )
    if fingerprint is not None and blob["fingerprint"] != fingerprint:
        raise CheckpointError(
            f"checkpoint {path} was written with state-vector layout {blob['fingerprint']}, "
            f"but this run's layout is {fingerprint}: the stability configuration differs. "
            "Resume with the config.toml saved in that run directory, or start a new run."
        )
    return blob["state"]
