"""A market run's backtest end to end: baselines on the same days, the pooled out-of-sample
curve (dated, drawdown over the whole curve), the embargo, execution in every fold row."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import numpy as np
import pytest
from rl_helpers import tiny

from trimtab.rl.backtest.execution import fill_returns
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import ConfigError, from_dict
from trimtab.rl.run.walkforward import load_market, make_folds
from trimtab.rl.train import train

SIMPLE = ("buy_and_hold", "momentum", "reversal", "ma_crossover", "random")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bt") / "run"
    cfg = tiny(out, 24)
    cfg = replace(cfg, walkforward=replace(cfg.walkforward, folds=2),
                  backtest=replace(cfg.backtest, random_draws=20, bootstrap_draws=200))  # fmt: skip
    summary = train(cfg)
    return out, summary, json.loads((out / "summary.json").read_text())


def test_summary_has_the_pooled_backtest_and_every_baseline(run):
    _, _, s = run
    oos = s["oos"]
    assert oos["execution"] == "next_open" and oos["optimistic"] is False
    assert oos["cost_bps"] == pytest.approx(5.0) and oos["periods_per_year"] == 252
    lo, hi = oos["sharpe_ci95"]
    assert lo <= oos["sharpe"] <= hi
    assert oos["days"] == sum(f["n_days"] for f in s["folds"])
    for name in (*SIMPLE, "flat", "oracle"):
        assert name in s["baselines"] and name in s["vs_baselines"], name
        assert name in s["folds"][0]["baselines"]
    assert s["baselines"]["flat"]["sharpe"] == 0.0  # flat earns the cash rate: no excess
    r = s["baselines"]["random"]
    assert r["draws"] == 20 and 0 <= r["agent_percentile"] <= 100
    assert set(oos["breakeven_bps"]) == {"flat", "buy_and_hold"}


def test_pooled_drawdown_is_over_the_whole_curve(run):
    _, _, s = run
    # the pooled curve compounds across folds: equal drawdowns agree to rounding (~1e-12 relative)
    assert s["oos"]["max_drawdown"] >= max(f["max_drawdown"] for f in s["folds"]) * (1 - 1e-9)


def test_curves_are_dated_and_pooled_in_oos_csv(run):
    out, _, s = run
    with (out / "oos.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == s["oos"]["days"]
    assert rows[0]["date"] == s["folds"][0]["test_start"]
    assert rows[-1]["date"] == s["folds"][-1]["test_end"]
    np.datetime64(rows[0]["date"])  # an ISO date
    with (out / "folds" / "fold_0.csv").open() as fh:
        fold = list(csv.DictReader(fh))
    assert fold[0]["date"] == s["folds"][0]["test_start"] and "oracle_log_return" in fold[0]
    agent = np.array([float(r["agent_log_return"]) for r in rows])
    assert float(np.expm1(agent.sum())) == pytest.approx(s["oos"]["total_return"])


def test_embargo_keeps_training_days_away_from_the_test_window(tmp_path):
    cfg = tiny(tmp_path / "r", 24)
    folds = make_folds(load_market(cfg).n_days, cfg)
    assert folds[0].embargo == cfg.agent.n_step  # "auto"
    assert folds[0].fit_end == folds[0].train_end - cfg.agent.n_step
    cfg7 = replace(cfg, walkforward=replace(cfg.walkforward, embargo=7))
    assert make_folds(load_market(cfg7).n_days, cfg7)[0].fit_end == folds[0].train_end - 7


def test_an_expanding_window_trains_on_every_day_before_the_test_window(tmp_path):
    cfg = tiny(tmp_path / "r", 24)
    assert cfg.walkforward.train_window == "expanding"  # the default
    n = load_market(cfg).n_days
    grown = make_folds(n, cfg)
    rolling = make_folds(
        n, replace(cfg, walkforward=replace(cfg.walkforward, train_window="rolling"))
    )
    # the same test windows and embargo; each fold's training starts at the first window's start
    assert [(f.train_end, f.test_end, f.fit_end) for f in grown] == [
        (f.train_end, f.test_end, f.fit_end) for f in rolling
    ]
    assert {f.train_start for f in grown} == {rolling[0].train_start}
    assert [f.train_start for f in rolling] == sorted({f.train_start for f in rolling})
    assert all(f.train_end - f.train_start == rolling[0].train_end - rolling[0].train_start
               for f in rolling)  # fmt: skip
    # the runs train on them: the fold rows' training dates
    for window, starts in (("expanding", 1), ("rolling", cfg.walkforward.folds)):
        run = replace(cfg, walkforward=replace(cfg.walkforward, train_window=window))
        run = replace(run, run=replace(run.run, out=str(tmp_path / window)))
        first = [row["train_start"] for row in train(run)["folds"]]
        assert len(first) == cfg.walkforward.folds and len(set(first)) == starts


def test_market_fills_follow_env_execution():
    base = tiny("unused")
    same = replace(base, env=replace(base.env, execution="same_close"))
    a, b = load_market(base), load_market(same)
    np.testing.assert_allclose(a.fills.log_returns, b.fills.log_returns)
    assert not np.allclose(a.fills.post, b.fills.post)  # the open splits the bar
    want = fill_returns(a.data.log_returns(), a.data.open, a.data.close, "next_open")
    np.testing.assert_allclose(a.fills.pre[1:], want.pre[1:])


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("env", {"execution": "at_vwap"}, "execution"),
        ("env", {"borrow_pct": float("nan")}, "borrow_pct"),
        ("env", {"commission_bps": -1.0}, "commission_bps"),
        ("walkforward", {"embargo": -2}, "embargo"),
        ("walkforward", {"train_window": "anchored"}, "train_window"),
        ("backtest", {"ma_fast": 50, "ma_slow": 20}, "ma_fast"),
        ("data", {"max_gap_days": -1}, "max_gap_days"),
    ],
)
def test_bad_backtest_config_is_refused(key, value, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(TrainConfig, {key: value})
