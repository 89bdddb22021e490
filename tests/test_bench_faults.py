"""The fault-injection benchmark runs end to end in --quick mode, so it cannot rot, and every
quick scenario passes: nothing lost, nothing silent."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_faults_quick(load_bench, tmp_path, capsys):
    bench = load_bench("faults")
    out = tmp_path / "faults.json"
    record = bench.main(["--quick", "--runs", str(tmp_path / "runs"), "--out", str(out)])
    assert json.loads(out.read_text())["quick"]["commit"]
    assert len(record["results"]) == 9
    for r in record["results"]:
        assert r["trials"] >= 1 and r["passed"] == r["trials"], r
    assert "kill -9" in capsys.readouterr().out
