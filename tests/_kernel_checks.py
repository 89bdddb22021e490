"""What the env-step kernels' tests check alike: that a kernel module is a leaf, that a CPU env
never imports Triton, and the kernel's PTX as compiled for an H100 on this machine."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType


def imported_modules(module: ModuleType) -> list[str]:
    """Every module ``module``'s source imports (``import x`` and ``from x import ...``)."""
    tree = ast.parse(Path(module.__file__ or "").read_text())
    mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    return mods + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]


def assert_leaf(module: ModuleType, roots: set[str]) -> None:
    """``module`` imports from ``roots`` only, and of trimtab only its sibling leaves in
    ``trimtab.kernels`` (design invariant 8)."""
    mods = imported_modules(module)
    assert {m.split(".")[0] for m in mods} <= roots | {"trimtab"}, mods
    assert all(m.startswith("trimtab.kernels") for m in mods if m.startswith("trimtab")), mods


def assert_runs_without_triton(code: str) -> None:
    """``code`` (which steps a CPU env) runs in a fresh interpreter and leaves Triton unimported
    (STYLE: Triton loads lazily, on first kernel use)."""
    code += "import sys\nassert 'triton' not in sys.modules\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def compiled_ptx(script: str, tmp_path: Path) -> dict[str, str]:
    """What ``script`` writes as JSON to the path it is given (the PTX of its compiles, by
    name), run in a fresh interpreter with Triton's interpreter off and a cache of its own."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "ptx.json"
    result = subprocess.run([sys.executable, "-c", script, str(out)], env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())
