"""The stress benchmark runs end to end (one seed, tiny market and net) so it cannot rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).parents[1] / "benchmarks" / "stress.py"


def test_stress_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("stress", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "stress.json"
    bench.main(["--quick", "--device", "cpu", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {(r["market"], r["stability"]) for r in rows} == {
        (m, s) for m in ("default", "stress") for s in ("adaptive", "fixed", "off")
    }
    assert all(len(r["sharpe"]) == r["folds_total"] or r["halted"] for r in rows)
