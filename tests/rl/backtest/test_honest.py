"""Issue 11, honest numbers: eval separates the days an agent trained on, empty episode returns
stay empty, undefined Sharpe ratios say so, and the summary says what ran."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

from rl_helpers import tiny

from trimtab.cli import main
from trimtab.rl.train import train


def _two_folds(out):
    cfg = tiny(out, 24)
    return replace(cfg, walkforward=replace(cfg.walkforward, folds=2))


def test_eval_without_data_is_out_of_sample_and_matches_training(tmp_path, capsys):
    out = tmp_path / "run"
    summary = train(_two_folds(out))
    capsys.readouterr()
    assert main(["eval", str(out / "checkpoints/last.pt"), "--json", str(tmp_path / "e.json")]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "e.json").read_text())
    last = summary["folds"][-1]
    # the headline is the last test window, exactly as training scored it
    assert result["window"] == "out of sample" and result["start"] == last["test_start"]
    assert result["end"] == last["test_end"]
    assert round(last["sharpe"], 4) == result["sharpe"]
    assert result["in_sample"]["end"] < result["start"]
    assert printed.count("Sharpe") == 2 and "in sample" in printed and "training windows" in printed
    assert f"Sharpe {last['sharpe']:+.2f}" in printed


def test_episode_return_is_empty_when_no_episode_ended(tmp_path):
    out = tmp_path / "run"
    train(tiny(out, 24))  # 16-day episodes: the first rows come before any episode ends
    with (out / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    returns = [r["episode_return"] for r in rows]
    assert returns[0] == "" and any(r != "" for r in returns)
    assert all(r == "" or float(r) != 0.0 for r in returns)


def test_constant_prices_warn_and_give_no_sharpe(tmp_path, capsys):
    import pandas as pd

    dates = pd.bdate_range("2018-01-01", periods=330)
    paths = []
    for name in ("A", "B"):
        lines = ["Date,Open,High,Low,Close,Volume"] + [f"{d.date()},5,5,5,5,0" for d in dates]
        (tmp_path / f"{name}.csv").write_text("\n".join(lines) + "\n")
        paths.append(str(tmp_path / f"{name}.csv"))
    code = main(["train", "--data", *paths, "--folds", "1", "--steps-per-fold", "8",
                 "--out", str(tmp_path / "run"), "--set", "walkforward.learning_starts=12",
                 "--set", "agent.hidden=16", "--no-progress"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0
    assert "A's price does not change on 329 of 329 days" in err and "volume is zero" in err
    assert "| undefined | undefined |" in out
    assert "extreme" not in err


def test_summary_and_report_say_what_ran_with_an_aggregate(tmp_path):
    out = tmp_path / "run"
    summary = train(_two_folds(out))
    saved = json.loads((out / "summary.json").read_text())
    assert saved["identity"]["version"] and "command" in saved["identity"]
    assert saved["seed"] == 0 and saved["aggregate"]["folds"] == 2
    sharpes = [f["sharpe"] for f in summary["folds"]]
    assert abs(saved["aggregate"]["sharpe"] - sum(sharpes) / 2) < 1e-12
    compounded = (1 + summary["folds"][0]["total_return"]) * (
        1 + summary["folds"][1]["total_return"]
    )
    assert abs(saved["aggregate"]["total_return"] - (compounded - 1)) < 1e-12
    page = (out / "report.html").read_text()
    for text in ("B&amp;H Sharpe", "max DD", "config.toml", "Seed <b>0</b>",
                 "mean ± s.e.", saved["identity"]["version"]):  # fmt: skip
        assert text in page, text
    from trimtab.rl.report.build import format_fold_table

    assert "| all | 2 folds |" in format_fold_table(saved)
