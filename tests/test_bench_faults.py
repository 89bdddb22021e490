"""The fault-injection benchmark runs end to end in --quick mode, so it cannot rot, and every
quick scenario passes: nothing lost, nothing silent."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).parents[1] / "benchmarks" / "faults.py"


def test_faults_quick(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("faults", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "faults.json"
    record = bench.main(["--quick", "--runs", str(tmp_path / "runs"), "--out", str(out)])
    assert json.loads(out.read_text())["quick"]["commit"]
    assert len(record["results"]) == 8
    for r in record["results"]:
        assert r["trials"] >= 1 and r["passed"] == r["trials"], r
    assert "kill -9" in capsys.readouterr().out
