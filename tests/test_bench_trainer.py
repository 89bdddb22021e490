"""The trainer benchmark runs end to end (tiny net, few steps) so it cannot rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).parents[1] / "benchmarks" / "bench_trainer.py"


def test_bench_trainer_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_trainer", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "trainer.json"
    result = bench.main(["--quick", "--device", "cpu", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["modes"].keys() == {"off", "fixed", "adaptive"} and saved["commit"]
    for r in saved["modes"].values():
        assert r["env_steps_per_s"] > 0 and r["grad_steps_per_s"] > 0
    assert result["guard_overhead"] > 0
