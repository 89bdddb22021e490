"""The support-loop benchmark runs (quick mode) and its loop is the trainer's: from the
cold-start floor the C51 support grows toward r / (1 - γ) within a few hundred updates."""

from __future__ import annotations


def test_support_loop_quick_grows_toward_the_fixed_point(load_bench):
    bench = load_bench("support_loop")
    doc = bench.main(["--quick"])
    assert abs(doc["fixed_point"] - 100.0) < 1e-9 and doc["updates"] == 600
    first, last = doc["per_block"][0], doc["per_block"][-1]
    assert abs(first["min"] - 1e-3) < 1e-9  # the cold-start floor
    assert 80.0 < last["last"] < 100.0  # grown from the floor toward 100, from below
