"""Issue 11, a bad tick: data that loads, an env that cannot lose more than everything, and the
sentinel on every source of data (env output, replay batch) before anything consumes it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from rl_helpers import random_batch, tiny, wired_learner

from trimtab.rl.agent.checks import BATCH_FIELDS, ENV_FIELDS
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import from_dict
from trimtab.rl.train import TrainingHalted, train

MODES = ["adaptive", "fixed", "off"]
POLICIES = ["halt", "skip", "sanitize"]


def write_market(folder: Path, days: int = 330, tick_every: int = 0, seed: int = 0) -> list[str]:
    """Two assets of a random walk; every ``tick_every``-th day asset A closes x1000 (and is
    back the next day), its High and Close together, as an unadjusted split would be."""
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2018-01-01", periods=days)
    paths = []
    for name in ("A", "B"):
        close = 100 * np.exp(np.cumsum(0.01 * rng.standard_normal(days)))
        if tick_every and name == "A":
            close[tick_every::tick_every] *= 1000
        lines = ["Date,Open,High,Low,Close,Volume"]
        lines += [f"{d.date()},{c},{c},{c},{c},1000" for d, c in zip(dates, close)]
        path = folder / f"{name}.csv"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def market_config(out: Path, paths: list[str], **run: object) -> TrainConfig:
    base = tiny(out, **run)
    from trimtab.rl.configio import to_dict

    data = to_dict(base)
    data["data"] = {"paths": paths}
    data["walkforward"]["folds"] = 1
    return from_dict(TrainConfig, data)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", MODES)
def test_bad_ticks_train_in_every_mode_and_policy(tmp_path, mode, policy):
    """Issue 11's crash: a short position through a x1000 day made log(1 + w.r) NaN and
    c51_projection cast it to an index. Now it is ruin (a finite reward), and training goes on."""
    paths = write_market(tmp_path, tick_every=7)
    cfg = market_config(tmp_path / "run", paths, stability=mode, on_nonfinite=policy)
    seen: list = []
    summary = train(cfg, setup=seen.append)
    learner = seen[0]
    assert summary["halted"] is None
    assert all(torch.isfinite(p).all() for p in learner.params)
    assert any("extreme one-day move" in w for w in summary["data_warnings"])


@pytest.mark.parametrize("slot", [f"env.{n}" for n in ENV_FIELDS]
                         + [f"replay.{n}" for n in BATCH_FIELDS])  # fmt: skip
def test_a_nan_at_each_source_halts_naming_it(tmp_path, slot):
    def poison(learner):
        learner.stability.checks.fault = (slot, 2, math.nan)

    with pytest.raises(TrainingHalted, match=rf"'{slot}' fired first: nan .* step 2 of"):
        train(tiny(tmp_path / "run", on_nonfinite="halt"), setup=poison)


@pytest.mark.parametrize("policy", ["skip", "sanitize"])
@pytest.mark.parametrize("slot", ["env.reward", "env.obs", "replay.reward"])
def test_skip_and_sanitize_train_through_a_nan_source(tmp_path, slot, policy):
    seen: list = []

    def poison(learner):
        seen.append(learner)
        learner.stability.checks.fault = (slot, 2, math.nan)

    summary = train(tiny(tmp_path / "run", on_nonfinite=policy), setup=poison)
    assert summary["halted"] is None
    assert all(torch.isfinite(p).all() for p in seen[0].params)
    assert seen[0].sentinel_report()["fired"][0]["name"] == slot


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("field", ["reward", "next_obs", "discount", "obs"])
def test_skip_on_a_nan_batch_moves_nothing(mode, field):
    learner = wired_learner(tiny(Path("unused"), stability=mode, on_nonfinite="skip"))
    opt = learner.agent.optimizer
    for i in range(3):
        torch.manual_seed(i)
        learner.learn(random_batch())
    before = [p.detach().clone() for p in learner.params]
    moments = [opt.state[p]["exp_avg"].clone() for p in learner.params]
    batch = random_batch()
    batch[field].view(-1)[3] = math.nan
    info = learner.learn(batch)
    assert float(info["found_inf"]) == 1.0
    assert all(torch.equal(p, b) for p, b in zip(learner.params, before))
    assert all(torch.equal(opt.state[p]["exp_avg"], m) for p, m in zip(learner.params, moments))
    info = learner.learn(random_batch())
    assert float(info["found_inf"]) == 0.0  # the flag is the step's own, not sticky
    assert learner.sentinel_report()["fired"][0]["name"] == f"replay.{field}"


@pytest.mark.parametrize("mode", MODES)
def test_sanitize_zeroes_a_nan_batch_after_the_check(mode):
    learner = wired_learner(tiny(Path("unused"), stability=mode, on_nonfinite="sanitize"))
    batch = random_batch()
    batch["reward"][5] = math.inf
    before = [p.detach().clone() for p in learner.params]
    info = learner.learn(batch)
    assert batch["reward"][5] == 0.0 and torch.isfinite(info["loss"])
    assert all(torch.isfinite(p).all() for p in learner.params)
    assert any(not torch.equal(p, b) for p, b in zip(learner.params, before))
    fired = learner.sentinel_report()["fired"]
    assert fired[0]["name"] == "replay.reward" and fired[0]["kind"] == "inf"


def test_a_bad_tick_only_in_the_test_window_is_flagged(tmp_path, capsys):
    """Issue 11: a test window earning a x1000 day printed 'return +28876.7%' with no flag."""
    from trimtab.cli import main

    paths = write_market(tmp_path, tick_every=0)
    lines = Path(paths[0]).read_text().splitlines()
    cells = lines[-15].split(",")  # one day near the end: in the last (test) window
    cells[1:5] = [str(float(cells[4]) * 1000)] * 4
    lines[-15] = ",".join(cells)
    Path(paths[0]).write_text("\n".join(lines) + "\n")
    cfg = market_config(tmp_path / "run", paths)
    summary = train(cfg)
    row = summary["folds"][0]
    # the spike and its reversal: one bad-tick issue, dated, flagging the test window
    assert len(row["data_flags"]) == 1 and cells[0] in row["data_flags"][0]
    assert "bad tick" in row["data_flags"][0]
    from trimtab.rl.report.build import format_fold_table

    assert "bad tick" in format_fold_table(summary)
    code = main(["train", "--data", *paths, "--folds", "1", "--steps-per-fold", "12",
                 "--out", str(tmp_path / "cli"), "--set", "walkforward.learning_starts=12",
                 "--set", "agent.hidden=16", "--set", "agent.replay_capacity=1000"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and "bad tick" in out and "check the data" in out
    assert "warning:" in err and cells[0] in err
