"""profile_startup.py's --quick mode runs a real `trimtab train` process on the CPU and splits
its wall time into consecutive parts (so the script cannot rot)."""

from __future__ import annotations

import json


def test_quick_run_splits_the_wall_time(load_bench, tmp_path, capsys):
    bench = load_bench("profile_startup")
    out = tmp_path / "startup.json"
    record = bench.main(["--quick", "--out", str(out), "--key", "t"])
    phases = record["phases_s"]
    assert list(phases) == [name for name, _, _ in bench.PHASES]
    assert all(s >= 0 for s in phases.values())
    assert abs(sum(phases.values()) - record["wall_s"]) < 1e-6  # consecutive, nothing missed
    assert phases["imports"] > 0.1 and phases["run"] > 0  # torch alone takes longer to import
    assert phases["run"] >= record["run_timings_s"]["loop_s"]
    assert json.loads(out.read_text())["t"]["quick"] is True
    assert "s  imports" in capsys.readouterr().out
