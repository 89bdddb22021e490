"""benchmarks/bsuite_suite.py end to end on a few capped trials: the sweeps run, each arm and
experiment is scored by bsuite's own analysis, the targets are computed, and a capped run says
it is not bsuite's score."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bsuite_suite


def test_a_capped_suite_is_scored_and_labelled(tmp_path):
    out = tmp_path / "r.json"
    record = bsuite_suite.main([
        "--experiments", "cartpole", "cartpole_scale", "--arms", "adaptive", "off",
        "--ids", "2", "--serial", "--sweep-dir", str(tmp_path / "sweep"),
        "--plots", str(tmp_path / "plots"), "--out", str(out),
        "--set", "gym.total_steps=300", "--set", "gym.learning_starts=100",
        "--set", "gym.eval_episodes=1", "--set", "agent.hidden=16",
        "--set", "agent.head_hidden=16",
    ])  # fmt: skip
    assert record["trials"] == 8 and record["failed_sweeps"] == 0
    assert record["full_budget"] is False  # capped: not bsuite's score, and it says so
    cell = record["cells"]["adaptive"]["cartpole_scale"]
    assert cell["ids"] == 2 and cell["complete_ids"] == 0 and len(cell["per_seed"]) == 2
    assert 0 <= cell["score"] <= 1 and "plot" not in cell  # bsuite plots whole budgets only
    t = record["targets"]["cartpole_scale"]
    assert {"ratio", "ratio_met", "minus_off", "above_off"} <= set(t)
    assert json.loads(out.read_text())  # standard JSON, one named record
