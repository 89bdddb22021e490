"""benchmarks/default_run.py's record of what a cold run compiled."""

from __future__ import annotations

import json
import os
import time

import pytest


def test_compiled_kernels_counts_variants_by_name_in_the_order_written(load_bench, tmp_path):
    bench = load_bench("default_run")
    t0 = time.time()
    for i, (name, age) in enumerate([("_clip_kernel", 3.0), ("radix_kernel", 1.0),
                                     ("radix_kernel", 2.0)]):  # fmt: skip
        d = tmp_path / f"hash{i}"
        d.mkdir()
        meta = d / f"{name}.json"
        meta.write_text(json.dumps({"name": name, "num_warps": 4}))
        os.utime(meta, (t0 + age, t0 + age))
        (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {}}))  # not a variant
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.json").write_text("{not json")  # a partial write: skipped
    out = bench.compiled_kernels(tmp_path, t0)
    assert out["variants"] == 3
    assert out["by_name"] == {"radix_kernel": 2, "_clip_kernel": 1}
    assert [n for _, n in out["written_s"]] == ["radix_kernel", "radix_kernel", "_clip_kernel"]
    assert [t for t, _ in out["written_s"]] == [1.0, 2.0, 3.0]


def test_probe_compile_runs_a_short_cpu_run_and_records_no_compile(
    load_bench, tmp_path, monkeypatch
):
    """On the CPU nothing is compiled (the torch references run): the record holds the run and
    an empty list; the script refuses a Triton already imported unless told its cache."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))  # restored afterwards
    probe = load_bench("probe_compile")
    sets = ["walkforward.folds=2", "walkforward.steps_per_fold=20",
            "walkforward.learning_starts=64", "data.synthetic_days=400"]  # fmt: skip
    argv = ["--device", "cpu", "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "probe.json"), "--key", "k"]  # fmt: skip
    for s in sets:
        argv += ["--set", s]
    record = probe.main(argv)
    assert record["variants"] == 0 and record["compiles"] == [] and record["train_s"] > 0
    saved = json.loads((tmp_path / "probe.json").read_text())["k"]
    assert saved["sets"] == sets and saved["wall_s"] >= saved["train_s"]
    with pytest.raises(SystemExit, match="already imported"):
        probe.main(["--device", "cpu"])
