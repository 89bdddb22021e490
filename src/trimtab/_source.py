"""Which source a process runs: the one answer that run directories and benchmark records
both write (``summary.json``'s identity, a result's ``commit``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["source_commit"]

_PACKAGE = Path(__file__).resolve().parent


def source_commit() -> str | None:
    """The commit of the trimtab source this process imported.

    ``TRIMTAB_COMMIT`` if set (a copy without its history, as a device machine receives, names
    its commit so). Else the git ``HEAD`` of the checkout that holds this package, with
    ``-dirty`` when a tracked file of the package differs from it (results and notes elsewhere
    in the checkout do not count). None when there is no such commit: an installed wheel, no
    git, or a source tree that the checkout around it does not track (an exported copy of
    another commit inside an ignored folder, which git would otherwise misname as ``HEAD``)."""
    env = os.environ.get("TRIMTAB_COMMIT")
    if env:
        return env

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(_PACKAGE), *args], capture_output=True,
                              text=True, timeout=10)  # fmt: skip

    try:
        head = run("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        if run("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return None  # git answers for a checkout that does not track this tree
        dirty = run("status", "--porcelain", "--untracked-files=no", "--", ".").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")
