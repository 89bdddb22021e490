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
