"""The EMA benchmark runs end to end in --quick mode, so it cannot rot."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_ema.py"


def test_bench_ema_quick_writes_results(tmp_path: Path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("bench_ema", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "ema.json"
    bench.main(["--quick", "--out", str(out), "--device", "cpu"])
    report = json.loads(out.read_text())
    for field in ("date", "commit", "machine", "torch", "steps", "seeds", "results"):
        assert field in report, field
    assert set(report["results"]) == set(bench.SIGNALS)
    for row in report["results"].values():
        assert math.isfinite(row["adaptive"]) and row["adaptive"] > 0
        assert row["best_fixed_alpha"] in bench.FIXED_ALPHAS
    table = capsys.readouterr().out
    assert "| signal | adaptive |" in table and "stationary" in table
