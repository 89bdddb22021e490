"""The signal-bank and false-alarm benchmarks run end to end in --quick mode, so they cannot rot;
the bank's split is fixed by family and covers every family of the issue."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bank(load_bench):
    return load_bench("bench_ema_bank")


def test_bank_split_is_fixed_and_covers_both_banks(bank) -> None:
    halves = {h for h, _ in bank.FAMILIES.values()}
    assert halves == set(bank.HALVES) and len(bank.FAMILIES) >= 15
    for half in bank.HALVES:
        names = [n for n, (h, _) in bank.FAMILIES.items() if h == half]
        assert len(names) >= 7, (half, names)
        # each half has positive families, so update_log is scored on both
        assert any(bank.make(n, 50, 0)[2] is not None for n in names), half
    # bench_ema.py's five signals and the kinds are all in the bank
    for name in ("stationary", "step", "random_walk", "drift", "spikes", "mult_regimes",
                 "burst", "student_t", "ramp"):  # fmt: skip
        assert name in bank.FAMILIES, name
    # seeded: the same draw twice
    a, b = bank.make("level_regimes", 200, 3), bank.make("level_regimes", 200, 3)
    assert a[0].equal(b[0]) and a[1].equal(b[1])
    # the fresh half is its own: fresh names, its commit recorded
    fresh = [n for n, (h, _) in bank.FAMILIES.items() if h == "fresh"]
    assert len(fresh) >= 10 and all(n.startswith("fresh_") for n in fresh)
    assert len(bank.FRESH_COMMIT) >= 7


def test_bench_ema_bank_quick_writes_results(bank, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ema_bank.json"
    bank.main(["--quick", "--out", str(out), "--device", "cpu"])
    report = json.loads(out.read_text())
    for field in ("date", "commit", "machine", "torch", "steps", "seeds", "split", "results",
                  "fresh_commit"):  # fmt: skip
        assert field in report, field
    for row in report["update_cost_cpu"]:
        assert row["update_us"] > 0 and row["update_log_us"] > 0
    assert set(report["results"]) == {"update", "update_log"}
    assert set(report["results"]["update"]) | set(report["results"]["update_log"]) == set(
        bank.FAMILIES
    )
    for rows in report["results"].values():
        for row in rows.values():
            assert math.isfinite(row["adaptive"]) and row["adaptive"] > 0
            assert row["best_fixed_alpha"] in bank.FIXED_ALPHAS
    table = capsys.readouterr().out
    assert (
        "held_out half" in table and "fresh half" in table and "| family | adaptive MSE |" in table
    )


def test_bench_ema_alarm_quick_writes_results(load_bench, tmp_path: Path, capsys) -> None:
    alarm = load_bench("bench_ema_alarm")
    out = tmp_path / "ema_alarm.json"
    alarm.main(["--quick", "--out", str(out), "--device", "cpu"])
    report = json.loads(out.read_text())
    for field in ("date", "commit", "machine", "excursion_z", "summary", "results"):
        assert field in report, field
    summary = report["summary"]
    assert summary["checks"] > 0 and summary["fires"] == 0
    # the measured exceedance falls with k as the Gumbel tail does (not tested against a time)
    counts = [row["count"] for row in summary["by_k"].values()]
    assert counts == sorted(counts, reverse=True) and counts[0] > 0
    assert "Gumbel" in capsys.readouterr().out
