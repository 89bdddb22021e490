"""The sentinel benchmark's --quick mode runs end to end (so the script cannot rot)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).parents[1] / "benchmarks" / "bench_sentinel.py"


def test_quick_run_writes_json(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_sentinel", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "sentinel.json"
    bench.main(["--quick", "--out", str(out), "--reps", "2"])
    report = json.loads(out.read_text())
    assert report["benchmark"] == "sentinel" and report["quick"] is True
    assert report["tensors"] == 48 and report["bytes"] > 0
    assert any(name.startswith("Sentinel.check") for name in report["results"])
    assert all(r["ms"] > 0 and r["gbps"] > 0 for r in report["results"].values())
    assert "| Sentinel.check [" in capsys.readouterr().out
