"""The quantile benchmark runs end to end (tiny sizes, CPU) so it cannot rot."""

from __future__ import annotations

import json


def test_bench_quantile_quick(load_bench, tmp_path):
    bench = load_bench("bench_quantile")
    out = tmp_path / "quantile.json"
    result = bench.main(["--quick", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["rows"] == result["rows"] and saved["torch"] and saved["date"]
    methods = {r["method"] for r in saved["rows"]}
    assert {"trimtab", "trimtab exact", "reference", "torch.kthvalue"} <= methods
    for r in saved["rows"]:
        assert r["ms"] > 0 and r["gb_per_s"] > 0
        if r["method"].startswith(("trimtab", "reference", "torch.kthvalue", "torch.sort")):
            assert r["rel_err"] <= 2.0**-15, r  # exact or within the kernel's documented bound
