"""Provenance for benchmark JSON: which commit, machine, versions and date a figure came from.

The device machine receives a copy of the working tree without ``.git``; the caller passes
the commit there as ``TRIMTAB_COMMIT`` (``benchmarks/gpu_tier.sh`` does).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = ["commit", "provenance"]


def commit() -> str:
    """``TRIMTAB_COMMIT`` if set, else ``git rev-parse HEAD`` of this checkout, else unknown."""
    env = os.environ.get("TRIMTAB_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).resolve().parent,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def provenance(device: torch.device | str | None = None) -> dict[str, Any]:
    """Date, commit, machine, Python/torch/Triton versions and the device's name."""
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    dev = torch.device(device) if device is not None else None
    name = (
        torch.cuda.get_device_name(dev)
        if dev is not None and dev.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton_version,
        "device_name": name,
    }
