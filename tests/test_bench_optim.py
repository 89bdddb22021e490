from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_optim.py"


def test_quick_mode_runs_and_writes_json(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_optim", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "optim.json"
    mod.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert {"device", "torch", "triton", "date", "commit", "rows"} <= set(result)
    assert {r["optimizer"] for r in result["rows"]} >= {"trimtab", "trimtab-nostats", "foreach"}
    assert all(r["mode"] in ("graph", "eager") for r in result["rows"])
    assert all(r["median_s"] > 0 for r in result["rows"])
