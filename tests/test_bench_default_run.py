"""benchmarks/default_run.py's record of what a cold run compiled."""

from __future__ import annotations

import json
import os
import time


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
