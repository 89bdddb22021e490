"""The run report's tables: reading a run's CSV files without pandas, the per-fold and pooled
tables, the folds' aggregate and the verdict, on fabricated run directories of the summary
schema (:func:`fabricate` writes one; :mod:`test_report_plots` builds reports from it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trimtab.rl.report.build import _read_csv, aggregate_folds, fold_flags, format_fold_table
from trimtab.rl.report.tables import verdict

BASELINES = ("buy_and_hold", "flat", "momentum", "reversal", "ma_crossover", "random", "oracle")


def _stats(x: np.ndarray) -> dict[str, Any]:
    """What the producer writes of a daily log-return series (the report only formats them)."""
    s = np.expm1(x)
    sd = s.std(ddof=1)
    log_eq = np.concatenate([[0.0], np.cumsum(x)])
    mdd = float(-np.expm1(np.min(log_eq - np.maximum.accumulate(log_eq))))
    sharpe = float(s.mean() / sd * math.sqrt(252)) if sd > 0 else None
    return {"sharpe": sharpe, "total_return": float(np.expm1(x.sum())), "max_drawdown": mdd}


def fabricate(
    run: Path,
    *,
    folds: int = 3,
    days: int = 130,
    execution: str = "next_open",
    ir_ci: tuple[float, float] = (-0.2, 0.8),
    pooled: bool = True,
    assets: int = 2,
    seed: int = 0,
) -> dict[str, Any]:
    """A finished market run directory with the new schema: ``folds/fold_K.csv``, ``oos.csv``
    (``pooled``) and ``summary.json``; returns the summary. Every paired difference's
    information-ratio interval is ``ir_ci`` (the verdict reads nothing else); the agent holds
    each of ``assets`` assets long, short or not for a few days at a time."""
    rng = np.random.default_rng(seed)
    (run / "folds").mkdir(parents=True)
    dates = np.arange(np.datetime64("2019-01-02"), np.datetime64("2030-01-01"))
    dates = dates[np.is_busday(dates)][: folds * days]
    cat: dict[str, list[Any]] = {}
    rows = []
    for k in range(folds):
        d = dates[k * days : (k + 1) * days]
        cols: dict[str, np.ndarray] = {"date": np.array([str(x) for x in d], dtype=object)}
        cols["agent_log_return"] = rng.normal(3e-4, 0.01, days)
        for name in BASELINES:
            cols[f"{name}_log_return"] = (
                np.zeros(days) if name == "flat" else rng.normal(2e-4, 0.012, days)
            )
        cols["turnover"] = np.abs(rng.normal(0.1, 0.05, days))
        for a in range(assets):
            held = rng.choice([-0.5, 0.0, 0.5], days // 5 + 1)
            cols[f"weight_{'ABCDEFGHIJ'[a] * 3}"] = np.repeat(held, 5)[:days]
        lines = [",".join(cols)] + [",".join(str(v[i]) for v in cols.values()) for i in range(days)]
        (run / "folds" / f"fold_{k}.csv").write_text("\n".join(lines) + "\n")
        np.save(run / "folds" / f"fold_{k}_random_draws.npy", rng.normal(0, 0.01, (20, days)))
        for c, v in cols.items():
            cat.setdefault(c, []).extend(v.tolist())
        cat.setdefault("fold", []).extend([k] * days)
        agent = _stats(cols["agent_log_return"])
        base = {n: {**_stats(cols[f"{n}_log_return"]), "turnover": 0.05} for n in BASELINES}
        rows.append({
            "fold": k, "train_start": "2018-01-02", "train_end": "2018-12-31",
            "test_start": str(d[0]), "test_end": str(d[-1]), **agent,
            "turnover": float(cols["turnover"].mean()), "hit_rate": 0.52, "n_days": days,
            "sortino": 1.0, "calmar": 0.8, "exposure": 0.6, "steps": 1000, "nonfinite": 0,
            "ruin": None, "data_flags": ["AAA: 2 extreme moves (2019-03-04, 2019-03-05)"] if k == 1
            else [], "execution": execution, "optimistic": execution == "same_close",
            "baselines": base, "breakeven_bps": {"flat": 12.5, "buy_and_hold": None},
            "buy_hold_sharpe": base["buy_and_hold"]["sharpe"],
            "buy_hold_return": base["buy_and_hold"]["total_return"],
            "buy_hold_max_drawdown": base["buy_and_hold"]["max_drawdown"],
        })  # fmt: skip
    summary: dict[str, Any] = {
        "run_dir": str(run), "env": "market", "folds": rows, "halted": None,
        "stability": "adaptive", "seed": 0, "seconds": 1.0,
        "identity": {"version": "0", "commit": None, "command": "trimtab train"},
        "data_warnings": ["AAA: 2 extreme one-day moves: check the data"],
        "data_issues": [{"kind": "extreme", "asset": "AAA", "first": "2019-03-04",
                         "last": "2019-03-05", "message": "2 extreme moves"}],
    }  # fmt: skip
    if pooled:
        n = folds * days
        lines = [",".join(cat)] + [",".join(str(v[i]) for v in cat.values()) for i in range(n)]
        (run / "oos.csv").write_text("\n".join(lines) + "\n")
        x = np.array(cat["agent_log_return"])
        summary["oos"] = {
            "days": n, "start": cat["date"][0], "end": cat["date"][-1], **_stats(x),
            "sharpe_ci95": [-0.4, 1.6], "sortino": 0.9, "calmar": 0.5, "annual_return": 0.04,
            "turnover": 0.1, "exposure": 0.6, "hit_rate": 0.51, "periods_per_year": 252,
            "risk_free_pct": 2.0, "cost_bps": 5.0, "borrow_pct": 0.5, "execution": execution,
            "optimistic": execution == "same_close",
            "breakeven_bps": {"flat": 10.0, "buy_and_hold": None},
        }  # fmt: skip
        summary["baselines"] = {
            n: {**_stats(np.array(cat[f"{n}_log_return"])), "sharpe_ci95": [-1.0, 1.0],
                "annual_return": 0.01, "sortino": 0.1, "calmar": 0.1}
            for n in BASELINES
        }  # fmt: skip
        best = max(b["sharpe"] for b in summary["baselines"].values() if b["sharpe"] is not None)
        summary["baselines"]["reversal"]["sharpe"] = best + 0.1  # the best simple baseline
        summary["baselines"]["flat"]["sharpe"] = None
        summary["baselines"]["random"].update(
            draws=20, agent_percentile=73.0, sharpe_p05=-0.9, sharpe_p95=0.8
        )
        summary["vs_baselines"] = {
            n: {"annual_return": 0.03, "annual_return_ci95": None,
                "information_ratio": 0.31, "information_ratio_ci95": list(ir_ci),
                "p_positive": 0.8}
            for n in BASELINES
        }  # fmt: skip
    summary["aggregate"] = aggregate_folds(rows, summary.get("oos"))
    (run / "summary.json").write_text(json.dumps(summary))
    return summary


def test_read_csv_reads_numbers_empty_cells_and_non_finite_values(tmp_path):
    """The metrics log's cells as MetricsLog writes them: numbers, "" for None, nan and inf;
    a column holding another value comes back as strings; an empty file as no columns."""
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss/c51,bound/x,note\n500,1.5,,a\n1000,nan,inf,b\n1500,-2e-3,-inf,\n")
    cols = _read_csv(path)
    assert list(cols) == ["step", "loss/c51", "bound/x", "note"]
    assert cols["step"].dtype == np.float64 and cols["step"].tolist() == [500.0, 1000.0, 1500.0]
    loss = cols["loss/c51"]
    assert loss[0] == 1.5 and math.isnan(loss[1]) and loss[2] == -2e-3
    bound = cols["bound/x"]
    assert math.isnan(bound[0]) and bound[1] == math.inf and bound[2] == -math.inf
    assert cols["note"].tolist() == ["a", "b", ""]
    (tmp_path / "empty.csv").write_text("")
    assert _read_csv(tmp_path / "empty.csv") == {}


def test_table_shows_costs_every_baseline_its_interval_and_the_random_draws(tmp_path):
    summary = fabricate(tmp_path / "run")
    text = format_fold_table(summary)
    assert text.splitlines()[0] == (
        "fills: next open; costs 5.0 bp per unit turnover, borrow 0.5%/yr, cash 2.0%/yr "
        "(risk-free of every Sharpe); Sharpe annualised with 252 bars/yr"
    )
    for name in ("buy & hold", "flat (cash)", "momentum", "reversal", "MA crossover",
                 "random (median draw)", "oracle (knows the regime)"):  # fmt: skip
        assert f"| {name} |" in text  # its pooled row
        assert f"| agent − {name} |" in text  # its paired difference
    agent = next(line for line in text.splitlines() if line.startswith("| agent |"))
    assert "[-0.40, +1.60]" in agent  # the agent's Sharpe with its interval
    assert "| +3.0% | +0.31 [-0.20, +0.80] | 80% |" in text
    assert "20 draws" in text and "73rd percentile" in text
    assert "| all | 3 folds |" in text
    # per fold: the best other baseline, the breakeven costs, the data flags
    assert "AAA: 2 extreme moves (2019-03-04, 2019-03-05)" in text
    assert "| 12.5 / n/a |" in text
    assert "Breakeven cost, pooled: 10.0 bp per unit turnover against flat, n/a" in text


def test_optimistic_fills_are_labelled_in_the_header_each_fold_and_the_verdict(tmp_path):
    summary = fabricate(tmp_path / "run", execution="same_close")
    text = format_fold_table(summary)
    assert text.startswith("fills: OPTIMISTIC: filled at the close that was just seen")
    fold_lines = [line for line in text.splitlines() if line[:4] in ("| 0 ", "| 1 ", "| 2 ")]
    assert len(fold_lines) == 3
    assert all("optimistic fills (same close)" in line for line in fold_lines)
    assert verdict(summary).startswith("OPTIMISTIC FILLS")


@pytest.mark.parametrize(
    ("ci", "claim"),
    [
        ((-0.2, 0.8), "not distinguishable from zero"),
        ((-1.5, 0.0), "not distinguishable from zero"),  # an interval touching 0 holds it
        ((0.1, 0.9), "the agent beats it on these days"),
        ((-1.2, -0.3), "the agent does worse than it"),
    ],
)
def test_verdict_claims_an_edge_only_where_the_interval_excludes_zero(tmp_path, ci, claim):
    summary = fabricate(tmp_path / "run", ir_ci=ci)
    line = verdict(summary)
    assert "best simple baseline (reversal)" in line  # the highest pooled Sharpe of the rules
    assert claim in line
    assert ("beats" in line) == (ci[0] > 0)
    assert line in format_fold_table(summary)


def test_verdict_names_the_baselines_an_edge_does_not_cover(tmp_path):
    summary = fabricate(tmp_path / "run", ir_ci=(0.1, 0.9))
    summary["vs_baselines"]["momentum"]["information_ratio_ci95"] = [-0.3, 0.5]
    line = verdict(summary)
    assert "beats it" in line and "not distinguishable from momentum" in line
    # the annual-return interval, where given, must agree before an edge is claimed
    summary["vs_baselines"]["reversal"]["annual_return_ci95"] = [-0.01, 0.05]
    assert "not distinguishable from zero" in verdict(summary)


def test_aggregate_max_drawdown_is_no_smaller_than_any_folds(tmp_path):
    """The pooled curve's drawdown where given, else the worst fold's: never their mean,
    which is smaller than the worst fold's whenever the folds differ."""
    summary = fabricate(tmp_path / "run")
    rows, oos = summary["folds"], summary["oos"]
    worst = max(r["max_drawdown"] for r in rows)
    assert worst > np.mean([r["max_drawdown"] for r in rows])
    pooled = aggregate_folds(rows, oos)
    assert pooled["max_drawdown"] == oos["max_drawdown"] >= worst
    assert pooled["max_drawdown_of"] == "pooled curve"
    alone = aggregate_folds(rows)
    assert alone["max_drawdown"] == worst and alone["max_drawdown_of"] == "worst fold"
    assert aggregate_folds([]) is None


def test_an_old_summary_formats_without_pooled_results():
    """A summary written before the pooled backtest: per-fold table only, old flags read."""
    row = {"fold": 0, "test_start": "2020-01-01", "test_end": "2020-06-30", "sharpe": 0.4,
           "buy_hold_sharpe": None, "total_return": 0.02, "buy_hold_return": 0.01,
           "max_drawdown": 0.05, "turnover": 0.1, "hit_rate": 0.5, "steps": 10, "nonfinite": 0,
           "extreme_moves": ["AAA 2020-02-03 +40%"], "ruin": None}  # fmt: skip
    text = format_fold_table({"env": "market", "folds": [row, {**row, "fold": 1}]})
    assert "| undefined |" in text and "1 extreme move(s) in test window" in text
    assert "Pooled" not in text and "| all | 2 folds |" in text
    assert fold_flags({**row, "ruin": "2020-03-01"}).endswith("ruin on 2020-03-01")
    # an agent that never held a position has no hit rate in any fold: nor has the aggregate
    flat = {**row, "hit_rate": None}
    text = format_fold_table({"env": "market", "folds": [flat, {**flat, "fold": 1}]})
    assert "| all | 2 folds |" in text and "undefined" in text.split("| all |")[1]


def test_each_folds_printed_line_names_buy_and_hold_the_best_baseline_and_its_flags(
    tmp_path, capsys
):
    from trimtab.rl.run.console import print_fold

    row = fabricate(tmp_path / "run", execution="same_close")["folds"][1]
    row["ruin"] = "2019-09-03"
    print_fold(row, True)
    line = capsys.readouterr().out
    best = max(("momentum", "reversal", "ma_crossover", "random"),
               key=lambda n: row["baselines"][n]["sharpe"])  # fmt: skip
    name = {"ma_crossover": "MA crossover", "random": "random (median draw)"}.get(best, best)
    assert f"vs buy & hold {row['buy_hold_sharpe']:+.2f}" in line
    assert f"best baseline {name} {row['baselines'][best]['sharpe']:+.2f}" in line
    assert "[! data: AAA: 2 extreme moves (2019-03-04, 2019-03-05) -- check the data]" in line
    assert "ruin on 2019-09-03" in line and "[OPTIMISTIC: filled at the close" in line
    print_fold(row, False)
    assert capsys.readouterr().out == ""


def test_the_command_line_reads_as_typed():
    from trimtab.rl.report.build import command_line

    main = "/venv/lib/python3.11/site-packages/trimtab/__main__.py"
    assert command_line([main, "train", "--out", "a b"]) == "trimtab train --out 'a b'"
    assert command_line(["/venv/bin/trimtab", "eval", "r"]) == "trimtab eval r"
    assert command_line(["my_script.py", "--x"]) == "my_script.py --x"
