"""benchmarks/cartpole.py's bookkeeping: variants aggregate apart, curves read from metrics.csv."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cartpole


def test_variants_aggregate_apart_and_solved_counts_per_arm():
    rows = [
        {"mode": "adaptive", "variant": "h2", "seed": 1, "seconds": 10.0, "greedy_return": 500.0,
         "solved": True},
        {"mode": "adaptive", "variant": "h2", "seed": 2, "seconds": 12.0, "greedy_return": 400.0,
         "solved": False},
        {"mode": "adaptive", "variant": "h1", "seed": 1, "seconds": 11.0, "greedy_return": 300.0,
         "solved": False},
        {"mode": "off", "seed": 1, "seconds": 9.0, "rc": 1, "error": "boom"},
    ]  # fmt: skip
    agg = cartpole.aggregate(rows)
    assert set(agg) == {"adaptive (h2)", "adaptive (h1)", "off"}
    h2 = agg["adaptive (h2)"]
    assert h2["n"] == 2 and h2["mean"] == 450.0 and h2["solved"] == 1
    assert math.isclose(h2["stderr"], 50.0)
    assert agg["adaptive (h1)"]["values"] == [300.0] and math.isnan(agg["adaptive (h1)"]["stderr"])
    assert agg["off"]["n"] == 0  # a failed run counts in no mean


def test_curves_read_every_fifth_row_and_keep_missing_values(tmp_path):
    lines = ["step,env_steps,loss/c51,episode_return"]
    lines += [f"{i},{1000 * i},{4.0 - 0.1 * i},{'' if i == 5 else i}" for i in range(12)]
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    got = cartpole._curves(tmp_path / "metrics.csv", ("loss/c51", "episode_return"))
    assert [p[0] for p in got["loss/c51"]] == [0.0, 5000.0, 10000.0]
    assert math.isclose(got["loss/c51"][1][1], 3.5)
    assert got["episode_return"][1][1] is None
    assert cartpole._curves(tmp_path / "absent.csv", ("loss/c51",)) == {}
