from __future__ import annotations

import json


def test_quick_mode_runs_and_writes_json(load_bench, tmp_path):
    mod = load_bench("bench_optim")
    out = tmp_path / "optim.json"
    mod.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert {"device", "torch", "triton", "date", "commit", "rows"} <= set(result)
    assert {r["optimizer"] for r in result["rows"]} >= {"trimtab", "trimtab-nostats", "foreach"}
    assert all(r["mode"] in ("graph", "eager") for r in result["rows"])
    assert all(r["median_s"] > 0 for r in result["rows"])
