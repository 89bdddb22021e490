"""The CleanRL side-by-side benchmark runs end to end in --quick mode so it cannot rot: trimtab's
side always; CleanRL's c51.py beside it only where its own venv is given (CLEANRL_PYTHON), and
otherwise the peer is skipped with a message that says why."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

PEER = Path(__file__).parents[2] / "shared" / "peers" / "cleanrl"  # ../shared beside the repo


@pytest.mark.slow
def test_bench_cleanrl_quick(load_bench, tmp_path, capsys):
    bench = load_bench("bench_cleanrl")
    python = os.environ.get("CLEANRL_PYTHON")
    peer = ["--cleanrl", str(PEER), "--cleanrl-python", python] if python else []
    out = tmp_path / "cleanrl.json"
    args = ["--quick", "--modes", "off", "--runs", str(tmp_path / "runs"), "--out", str(out),
            "--set", "env.n_envs=2"]  # fmt: skip
    record = bench.main([*args, *peer])
    printed = capsys.readouterr().out
    saved = next(iter(json.loads(out.read_text()).values()))
    assert saved["commit"] and saved["date"] and saved["steps"] == 3000 and saved["quick"]
    runs = {(r["side"], r["impl"], r["mode"]): r for r in record["runs"]}
    for impl in ("gymnasium", "torch"):
        r = runs["trimtab", impl, "off"]
        assert r["rc"] == 0 and r["env_steps_per_s"] > 0 and r["updates"] >= 200
        assert r["cpu_s"] > 0  # the run's process tree's CPU seconds
        assert 8 <= r["greedy"] <= 500 and 8 <= r["train_return_last100"] <= 500
        # --set reaches trimtab's run (the example has 16 envs)
        assert "n_envs = 2" in (Path(r["run_dir"]) / "config.toml").read_text()
    assert saved["sets"] == ["env.n_envs=2"]
    if saved["cleanrl_skipped"]:
        assert "CleanRL peer skipped: " in printed and len(runs) == 2
    else:
        r = runs["cleanrl", "gymnasium", "c51.py"]
        assert (
            r["rc"] == 0
            and r["episodes"] > 50
            and runs["trimtab", "torch", "off"]["wall_vs_cleanrl"] > 0
        )
    assert "steps/s" in printed


def test_the_peer_is_refused_with_the_reason(load_bench):
    bench = load_bench("bench_cleanrl")
    assert "no --cleanrl" in bench.peer_problem(None, None)
    assert "c51.py does not exist" in bench.peer_problem(Path("/nonexistent"), "python")
    # the time to solve: the first time the last 5000 steps' episodes average >= 475
    stamped = [(1.0, 100, 20.0), (2.0, 4000, 480.0), (3.0, 9000, 480.0), (4.0, 9500, 500.0)]
    assert bench.time_to_solve(stamped) is None  # fewer than 5 episodes in any window
    stamped = [(float(i), 1000 * i, 20.0 if i < 6 else 500.0) for i in range(1, 16)]
    assert bench.time_to_solve(stamped) == 10.0  # steps 6000-10000: five episodes of 500
    # trimtab's metrics rows, one per 5000 env steps, each a mean over its episodes
    rows = [(1.0, 5000, 20.0), (2.0, 10000, 470.0), (3.0, 15000, 480.0)]
    assert bench.time_to_solve(rows) is None and bench.time_to_solve(rows, 1) == 3.0
