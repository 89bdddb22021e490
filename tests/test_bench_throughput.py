"""benchmarks/bench_throughput.py: its quick mode runs every kind of row and computes rates."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_quick_rows_have_rates_and_the_ratio_to_off(load_bench, tmp_path):
    bench = load_bench("bench_throughput")
    out = tmp_path / "t.json"
    record = bench.main(["--device", "cpu", "--quick", "--out", str(out), "--key", "q"])
    rows = record["rows"]
    assert {(r["env"], r["mode"]) for r in rows} == {
        ("market", "adaptive"),
        ("market", "off"),
        ("cartpole", "adaptive"),
        ("cartpole", "off"),
    }
    for r in rows:
        assert "error" not in r, r
        assert r["env_steps_per_s"] == pytest.approx(r["env_steps"] / r["loop_s"])
        assert r["rate_vs_off"] > 0
    market = [r for r in rows if r["env"] == "market"]
    assert all(r["updates"] == 20 for r in market)  # one fold of --steps gradient steps
    cartpole = [r for r in rows if r["env"] == "cartpole"]
    assert all(r["env_steps"] == 8 * 20 for r in cartpole)  # collection alone
    assert json.loads(out.read_text())["q"]["rows"] == rows


def test_market_rows_learn_after_eight_batched_steps_and_one_fold(load_bench):
    bench = load_bench("bench_throughput")
    sets = bench.market_sets(1024, 500)
    assert "walkforward.learning_starts=8192" in sets and "walkforward.folds=1" in sets
    cart = bench.cartpole_sets(4096, 100)
    assert "gym.learning_starts=409600" in cart and "gym.total_steps=409600" in cart
