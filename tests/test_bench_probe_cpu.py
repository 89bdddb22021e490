"""The CPU-path probe runs end to end (without --compile, which needs a C++ compiler and a
minute) and records what the README quotes from it."""

from __future__ import annotations

import json


def test_probe_cpu_paths_records_the_fold_and_the_optimizer(load_bench, tmp_path):
    bench = load_bench("probe_cpu_paths")
    out = tmp_path / "probe.json"
    bench.main(["--out", str(out), "--key", "t"])
    rec = json.loads(out.read_text())["t"]
    assert rec["commit"] and rec["date"]
    fold, adam = rec["fold"], rec["adam"]
    assert fold["eager_us"] > 0 and fold["torchscript_us"] > 0 and "compiled_us" not in fold
    assert adam["step_ms"] > 0 and adam["off_torch_adam_step_ms"] > 0
    assert adam["aten_ops_per_step"] > 100 and adam["python_between_ops_ms"] > 0


def test_profile_cpu_step_times_every_part_of_the_step_per_mode(load_bench, tmp_path):
    bench = load_bench("profile_cpu_step")
    out = tmp_path / "profile.json"
    bench.main(["--quick", "--modes", "off", "adaptive", "--out", str(out), "--key", "t"])
    rec = json.loads(out.read_text())["t"]
    assert rec["commit"] and rec["date"] and set(rec["modes"]) == {"off", "adaptive"}
    for mode, row in rec["modes"].items():
        parts = row["parts_ms"]
        assert row["step_cpu_ms"] > 0 and row["aten_ops_per_step"] > 100, mode
        assert set(parts) == {label for label, _, _ in bench.PARTS} | {"the rest", "step"}
        assert all(v > 0 for k, v in parts.items() if k != "the rest"), (mode, parts)
        # the parts add up to the step (what is left is the step's own glue)
        assert abs(parts["the rest"]) < 0.5 * parts["step"], (mode, parts)
    table = {r["part"]: r for r in rec["parts"]}
    assert table["optimizer step"]["adaptive_ms"] == round(
        rec["modes"]["adaptive"]["parts_ms"]["optimizer step"], 3
    )
    # adaptive clips; off does not (its clip part is a call that returns at once)
    assert rec["modes"]["adaptive"]["parts_ms"]["gradient clip"] > (
        5 * rec["modes"]["off"]["parts_ms"]["gradient clip"]
    )
