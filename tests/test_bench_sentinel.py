"""The sentinel benchmark's --quick mode runs end to end (so the script cannot rot)."""

from __future__ import annotations

import json


def test_quick_run_writes_json(load_bench, tmp_path, capsys):
    bench = load_bench("bench_sentinel")
    out = tmp_path / "sentinel.json"
    bench.main(["--quick", "--out", str(out), "--reps", "2"])
    report = json.loads(out.read_text())
    assert report["benchmark"] == "sentinel" and report["quick"] is True
    assert report["tensors"] == 48 and report["bytes"] > 0
    assert any(name.startswith("Sentinel.check") for name in report["results"])
    assert all(r["ms"] > 0 and r["gbps"] > 0 for r in report["results"].values())
    assert "| Sentinel.check [" in capsys.readouterr().out
