"""The reward-scale benchmark runs end to end in its quick mode (tiny runs), so it cannot rot:
the units check, the tuned arm's scaled support, the records, table and plots, and the merging
of partial results from separate calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks" / "scale.py"


def test_scale_quick_two_calls_merge(tmp_path, load_bench):
    bench = load_bench("scale")
    runs = tmp_path / "runs"
    common = ["--quick", "--scales", "1000", "--runs", str(runs), "--engine", "inline"]
    a = bench.main(
        [*common, "--envs", "market", "--arms", "adaptive", "--out", str(tmp_path / "a.json")]
    )
    # the market's metrics are the env's own: x1 and x1024 with a support scaled alike agree
    check = a["units_check"]["market"]
    assert check["equal"] and check["values"]["x1"]["total_return"]
    [rec] = a["records"]
    assert rec["env"] == "market" and rec["status"] == "done" and rec["commit"]
    summary = json.loads((Path(rec["run_dir"]) / "summary.json").read_text())
    assert rec["fold_sharpe"] == [f["sharpe"] for f in summary["folds"]]
    b = bench.main([*common, "--envs", "cartpole", "--arms", "tuned", "--no-units-check",
                    "--variant", "lr3", "--set", "agent.lr=3e-4",
                    "--out", str(tmp_path / "b.json")])  # fmt: skip
    [rec] = b["records"]
    assert rec["arm"] == "tuned (lr3)"
    cfg = (Path(rec["run_dir"]) / "config.toml").read_text()
    assert 'stability = "fixed"' in cfg and "v_max = 100000.0" in cfg  # ±100 x 1000
    assert "reward_scale = 1000.0" in cfg and "lr = 0.0003" in cfg
    out = tmp_path / "merged.json"
    doc = bench.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                      "--out", str(out)])  # fmt: skip
    arms = {(r["env"], r["arm"]) for r in doc["records"]}
    assert arms == {("market", "adaptive"), ("cartpole", "tuned (lr3)")}
    assert doc["units_check"]["market"]["equal"]
    assert "| tuned (lr3) | " in out.with_suffix(".md").read_text()
    assert sorted(Path(p).name for p in doc["plots"]) == ["merged_cartpole.png",
                                                          "merged_market.png"]  # fmt: skip
    # a rerun reads finished trials back instead of training them again (its files untouched)
    stamps = {f: f.stat().st_mtime_ns for f in Path(rec["run_dir"]).rglob("*") if f.is_file()}
    again = bench.main([*common, "--envs", "cartpole", "--arms", "tuned", "--no-units-check",
                        "--variant", "lr3", "--set", "agent.lr=3e-4",
                        "--out", str(out)])  # fmt: skip
    assert len(again["records"]) == 2  # merged into the existing file
    [reread] = [r for r in again["records"] if r["env"] == "cartpole"]
    assert reread["value"] == rec["value"]
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps  # nothing retrained or rewritten
    # the same run directory with another config is refused, not read back
    with pytest.raises(SystemExit, match="another config"):
        bench.main([*common, "--envs", "cartpole", "--arms", "tuned", "--no-units-check",
                    "--variant", "lr3", "--out", str(out)])  # fmt: skip


def test_merge_keeps_a_result_over_a_later_unfinished_record(load_bench):
    bench = load_bench("scale_report")
    done = {"env": "cartpole", "arm": "off", "scale": 1.0, "seed": 1, "steps": "s",
            "status": "done", "value": 500.0}  # fmt: skip
    late = {**done, "status": "incomplete", "value": None}
    newer = {**done, "value": 480.0}
    assert bench.merge_records([done], [late]) == [done]
    assert bench.merge_records([done], [late], [newer]) == [newer]
    cells = bench.aggregate([done, {**newer, "seed": 2}, {**done, "seed": 3, "value": 490.0}])
    [c] = cells
    assert c["n"] == 3 and c["mean"] == 490.0 and abs(c["se"] - 10 / 3**0.5) < 1e-9


def test_tuned_at_x1_is_fixed_at_x1_run_once(load_bench):
    """±V x 1 is the base support: the grid runs that trial once, as ``fixed``, and the table
    shows it under ``tuned`` too, marked as the same run."""
    bench = load_bench("scale")
    args = bench.parse(["--envs", "cartpole", "--quick", "--runs", "/tmp/unused",
                             "--scales", "1", "30", "--seeds", "1"])  # fmt: skip
    trials = bench.build_trials(args)
    assert [(t.arm, t.scale) for t in trials] == [
        ("adaptive", 1.0), ("adaptive", 30.0), ("fixed", 1.0), ("fixed", 30.0),
        ("off", 1.0), ("off", 30.0), ("tuned", 30.0)]  # fmt: skip
    recs = [{"env": "cartpole", "steps": "s", "arm": a, "scale": sc, "seed": 1,
             "status": "done", "value": v}
            for a, sc, v in (("fixed", 1.0, 480.0), ("tuned", 30.0, 300.0))]  # fmt: skip
    report = load_bench("scale_report")
    cells = {(c["arm"], c["scale"]): c for c in report.aggregate(recs)}
    assert cells[("tuned", 1.0)]["mean"] == 480.0 and cells[("tuned", 1.0)]["same_as"] == "fixed"
    assert "480.0 (1, = fixed)" in report.markdown(list(cells.values()))


def test_market_records_carry_buy_and_hold_and_the_table_shows_it(load_bench):
    report = load_bench("scale_report")
    folds = [{"sharpe": s, "total_return": 0.0, "buy_hold_sharpe": b}
             for s, b in ((0.5, 0.2), (-0.1, 0.4), (float("nan"), 0.6))]  # fmt: skip
    fields = report.market_fields({"folds": folds})
    assert fields["value"] == 0.2 and abs(fields["buy_hold"] - 0.4) < 1e-12
    recs = [{"env": "market", "steps": "s", "arm": a, "scale": 1.0, "seed": seed,
             "status": "done", **fields, "buy_hold": 0.4 + seed}
            for a in ("adaptive", "off") for seed in (1, 2)]  # fmt: skip
    table = report.markdown(report.aggregate(recs))
    assert "| buy & hold | +1.90 ± 0.50 (2) |" in table
