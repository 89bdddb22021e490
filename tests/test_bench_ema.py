"""The EMA benchmark runs end to end in --quick mode, so it cannot rot."""

from __future__ import annotations

import json
import math
from pathlib import Path


def test_bench_ema_quick_writes_results(load_bench, tmp_path: Path, capsys) -> None:
    bench = load_bench("bench_ema")
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
