"""The stress benchmark runs end to end (one seed, tiny market and net) so it cannot rot: its
cells through the sweep runner, on Ray where installed (the first test), else one by one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


@pytest.mark.slow
def test_stress_quick(load_bench, tmp_path):
    """Through the sweep runner on a local Ray instance; the run directories kept under --runs."""
    bench = load_bench("stress")
    out = tmp_path / "stress.json"
    engine = [] if importlib.util.find_spec("ray") else ["--serial"]
    bench.main(["--quick", "--device", "cpu", "--runs", str(tmp_path / "runs"), "--out", str(out),
                *engine])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    for r in rows:  # the row is its run's summary
        summary = json.loads((Path(r["run_dir"]) / "summary.json").read_text())
        assert r["sharpe"] == [round(f["sharpe"], 3) for f in summary["folds"]]
    assert {(r["market"], r["stability"]) for r in rows} == {
        (m, s) for m in ("default", "stress") for s in ("adaptive", "fixed", "off")
    }
    assert all(len(r["sharpe"]) == r["folds_total"] or r["halted"] for r in rows)


def test_stress_autocast_is_recorded_and_old_files_merge(load_bench, tmp_path, capsys):
    bench = load_bench("stress")
    old_row = {"seed": 7, "stability": "off", "market": "stress", "folds_total": 2,
               "folds_finite": 2, "halted": None, "first_fire": None, "sharpe": [0.5, -0.5],
               "buy_hold_sharpe": [0.1, 0.2], "ms_per_step": 9.0}  # fmt: skip
    old = tmp_path / "old.json"  # written before the autocast field existed
    old.write_text(json.dumps({"rows": [old_row]}))
    out = tmp_path / "stress.json"
    bench.main(["--quick", "--device", "cpu", "--markets", "stress", "--modes", "off", "--serial",
                "--autocast", "fp16", "--merge", str(old), "--out", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(r["seed"], r.get("autocast")) for r in rows] == [(0, "fp16"), (7, None)]
    assert rows[0]["steps_per_fold"] == 10
    table = capsys.readouterr().out
    assert "| stress | fp16 | off | " in table
    assert "| stress | none | off | 1/1 | - | +0.00 | +0.15 | 9.0 |" in table


def test_stress_set_overrides_every_cell_and_is_tabulated(load_bench, tmp_path, capsys):
    bench = load_bench("stress")
    out = tmp_path / "stress.json"
    bench.main(["--quick", "--device", "cpu", "--markets", "stress", "--modes", "off", "--serial",
                "--set", "agent.trunk=\"mlp\"", "--out", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["overrides"] == ['agent.trunk="mlp"']
    assert '| stress (agent.trunk="mlp") | none | off | ' in capsys.readouterr().out
