"""benchmarks/population.py: the seeds as one population and as separate processes, each row
with every seed's greedy return, saved row by row into one record."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_quick_population_beside_processes(load_bench, tmp_path):
    bench = load_bench("population")
    out = tmp_path / "population.json"
    got = bench.main(["--quick", "--device", "cpu", "--seeds", "1", "2", "--out", str(out),
                      "--key", "k", "--runs", str(tmp_path / "runs")])  # fmt: skip
    ways = [r["way"] for r in got["rows"]]
    assert ways == ["population", "processes"]
    for row in got["rows"]:
        assert row["rc"] == 0 and [s["seed"] for s in row["seeds"]] == [1, 2]
        assert all(s["greedy_return"] > 0 and s["updates"] > 0 for s in row["seeds"])
    # one population is each seed alone: the same greedy returns both ways (the CPU)
    pop, procs = ([s["greedy_return"] for s in r["seeds"]] for r in got["rows"])
    assert pop == procs
    record = json.loads(out.read_text())["k"]
    assert [s["way"] for s in record["summary"]] == ways and record["seeds"] == [1, 2]
