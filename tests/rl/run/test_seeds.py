"""``trimtab train --seeds``: one ordinary run directory per seed (a sweep of one cell, OUT/seedN)
on one market, then a table of the seeds with their mean ± s.e.; a rerun skips finished
seeds; flags that cannot go with it are refused in one line before anything is written."""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest
import tomli_w
from rl_helpers import TINY

from trimtab.cli import build_parser, main
from trimtab.rl.run.cli import config_data
from trimtab.rl.sweep.cli import seed_trials
from trimtab.rl.sweep.spec import same_config


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(tomli_w.dumps(TINY))
    return path


def test_seeds_are_one_trial_each_of_one_config(tmp_path, base, monkeypatch):
    out = tmp_path / "seeds"
    argv = ["train", "--config", str(base), "--seeds", "3", "0", "7", "--out", str(out),
            "--stability", "off", "--set", "agent.lr=1e-3"]  # fmt: skip
    args = build_parser().parse_args(argv)
    trials, where = seed_trials(args, config_data(args))
    assert where == out and [t.seed for t in trials] == [3, 0, 7]
    assert [t.run_dir for t in trials] == [(out / f"seed{s}").resolve() for s in (3, 0, 7)]
    for t in trials:
        assert (t.cfg.run.seed, t.cfg.run.out) == (t.seed, str(t.run_dir))
        assert (t.cfg.run.stability, t.cfg.agent.lr, t.cfg.run.progress) == ("off", 1e-3, False)
        assert t.cfg.data.market_seed == 0  # the seeds train and test on one market
        diff = same_config(trials[0].cfg, t.cfg)
        assert all(d.startswith(("run.seed:", "run.out:")) for d in diff), diff
    assert not out.exists()  # building the trials writes nothing
    monkeypatch.chdir(tmp_path)  # without --out: a new folder under runs/
    args = build_parser().parse_args(argv[:7])
    trials, where = seed_trials(args, config_data(args))
    assert re.fullmatch(r"runs/\d{8}-\d{6}-adaptive-3seeds", str(where)), where
    assert trials[1].run_dir == (tmp_path / where / "seed0").resolve()


REFUSED = [
    (["--seeds", "0", "1", "--resume", "RUN"], r"--seeds starts runs, --resume continues one"),
    (["--seeds", "0", "--seed", "1"], r"--seed and --seeds: give one of them"),
    (["--seeds", "1", "1"], r"--seeds must be distinct"),
    (["--serial"], r"--serial, --population and --cpus say how the runs of --seeds run"),
    (["--cpus", "2"], r"--population and --cpus say how the runs of --seeds run"),
    (["--seeds", "0", "--dist-backend", "gloo"], r"not under torchrun"),
    (["--seeds", "0", "--device", "cuda:1"], r'set run\.device = "cuda"'),
    (["--seeds", "0", "--set", "agent.nope=1"], r"unknown config key agent\.nope"),
]


@pytest.mark.parametrize(("flags", "pattern"), REFUSED)
def test_flags_that_cannot_go_with_seeds_are_one_line(tmp_path, base, capsys, flags, pattern):
    out = tmp_path / "seeds"
    flags = [str(tmp_path / "run") if f == "RUN" else f for f in flags]
    rc = main(["train", "--config", str(base), "--out", str(out), *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(pattern, err), err
    assert not out.exists()


def test_a_folder_of_other_files_is_not_taken(tmp_path, base, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    rc = main(["train", "--config", str(base), "--seeds", "0", "--serial", "--out", str(out)])
    assert rc == 2 and "is not a trimtab sweep directory" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def _sharpe(summary: dict) -> float:
    """The pooled out-of-sample Sharpe (a run from before the pooled backtest: fold mean)."""
    if "oos" in summary:
        return summary["oos"]["sharpe"]
    return statistics.mean(f["sharpe"] for f in summary["folds"])


def test_two_seeds_serially_then_their_table_and_a_rerun_skips_them(tmp_path, base, capsys):
    out = tmp_path / "seeds"
    argv = ["train", "--config", str(base), "--seeds", "0", "1", "--serial", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "2 trials, 0 finished earlier (skipped), 2 to run" in printed
    summaries = [json.loads((out / f"seed{s}" / "summary.json").read_text()) for s in (0, 1)]
    assert [s["seed"] for s in summaries] == [0, 1]
    # one market: buy & hold earns the same on both seeds' test days
    bh = [s["folds"][0]["buy_hold_sharpe"] for s in summaries]
    assert bh[0] == bh[1]
    sharpes = [_sharpe(s) for s in summaries]
    lines = printed.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| seed | status |"))
    assert lines[head].startswith("| seed | status | Sharpe | return |")
    assert lines[head + 2].startswith(f"| 0 | done | {sharpes[0]:+.3f} |")
    assert lines[head + 3].startswith(f"| 1 | done | {sharpes[1]:+.3f} |")
    se = statistics.stdev(sharpes) / math.sqrt(2)
    mean_row = f"| mean ± s.e. | n=2 | {statistics.mean(sharpes):+.3f} ± {se:.3f} |"
    assert lines[head + 4].startswith(mean_row), lines[head + 4]
    assert "deflated Sharpe ratio of the best of 2 trials (seed " in lines[head + 6]
    table = json.loads((out / "sweep.json").read_text())
    assert [t["run_dir"] for t in table["trials"]] == [str(out / "seed0"), str(out / "seed1")]

    assert main(argv) == 0  # the same command again: nothing to run, the same table
    again = capsys.readouterr().out
    assert "2 finished earlier (skipped), 0 to run" in again
    assert again.splitlines()[-9:-1] == lines[-9:-1]
