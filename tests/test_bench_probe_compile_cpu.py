"""benchmarks/experiments/probe_compile_cpu.py: its quick mode compiles the regions, keeps the
trunk-output hook fed, and records the eager and compiled step side by side."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest


def test_the_hook_count_watches_and_passes_on_what_arrives(load_bench):
    bench = load_bench("probe_compile_cpu")
    got = []
    checks = SimpleNamespace(trunk_grad=got.append)
    m = {"learner": SimpleNamespace(stability=SimpleNamespace(checks=checks)),
         "trunk_grads": Counter()}  # fmt: skip
    bench.count_trunk_grads(m)
    g = bench.torch.ones(2)
    checks.trunk_grad(g)
    checks.trunk_grad(None)
    assert got == [g, None]  # None still reaches the check: nothing is skipped
    assert m["trunk_grads"] == {"gradient": 1, "none": 1}


@pytest.mark.slow
def test_quick_compiles_the_regions_with_the_trunk_gradient_intact(load_bench, tmp_path):
    bench = load_bench("probe_compile_cpu")
    out = tmp_path / "probe.json"
    record = bench.main(["--quick", "--out", str(out), "--key", "t"])
    rec = json.loads(out.read_text())["t"]
    assert rec["commit"] and rec["date"] and set(rec["modes"]) == {"off"}
    assert set(rec["regions"]) == set(bench.REGIONS)
    row = rec["modes"]["off"]
    assert row["eager_ms"] > 0 and row["compiled_ms"] > 0
    assert rec["inductor_startup_s"] > 0 and row["compile_s"] > 0
    assert row["ratio"] == pytest.approx(row["compiled_ms"] / row["eager_ms"])
    assert row["graphs"] >= 3 and row["graphs_while_timed"] == 0  # compiled, and only once
    steps = rec["warmup"] + rec["rounds"] * rec["steps"]
    assert row["trunk_grad_hook"] == {"eager": {"gradient": steps},
                                      "compiled": {"gradient": steps}}  # fmt: skip
    # the same batches from the same weights: only the compiled kernels' rounding differs
    assert 0 <= row["loss_max_abs_diff"] < 1e-4 * row["loss_mean_abs"]
    assert rec["table"][0]["mode"] == "off" and record["modes"]["off"]["ratio"] == row["ratio"]
