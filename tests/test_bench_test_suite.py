"""benchmarks/test_suite.py, the README's test time: its quick mode writes a record (it times
tests/test_readme.py, which does not run this file: no recursion)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_test_suite_timer_runs_quick(tmp_path):
    """benchmarks/test_suite.py --quick: a record with the times and pytest's counts."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "t.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, str(ROOT / "benchmarks/test_suite.py"), "--quick", "--key", "q",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads(out.read_text())["q"]
    assert rec["quick"] and rec["passed"] >= 3 and rec["wall_s"] > 0 and rec["commit"]
