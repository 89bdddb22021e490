"""``trimtab sweep``: a bad spec fails in one line before any trial; on a local Ray instance the
merged table equals the per-run summaries, a rerun skips finished trials and restarts a
half-written one, and a failing trial is reported with its error and run directory."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest
import tomli_w
from rl_helpers import TINY

from trimtab.cli import main
from trimtab.rl.sweep.spec import split_values


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(tomli_w.dumps(TINY))
    return path


BAD_SPECS = [
    (["--grid", "agent.nope=1,2"], r"unknown config key agent\.nope"),
    (["--grid", "run.stability=adaptive,bogus"], r"cell run\.stability=bogus: .*must be one of"),
    (["--grid", "run.seed=1,2"], r"run\.seed cannot be swept .*--seeds"),
    (["--grid", "run.stability"], r"must look like section\.key=value"),
    (["--grid", "run.stability=off,off"], r"two cells are the same"),
    (["--set", "walkforward.folds=0"], r"folds=0 must be >= 1"),
    (["--set", 'run.device="cuda:1"'], r'set run\.device = "cuda"'),
    (["--seeds", "0", "0"], r"--seeds must be distinct"),
]


@pytest.mark.parametrize(("flags", "pattern"), BAD_SPECS)
def test_bad_spec_is_one_line_before_any_trial(tmp_path, base, capsys, flags, pattern):
    import re

    out = tmp_path / "sweep"
    rc = main(["sweep", "--config", str(base), "--out", str(out), *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(pattern, err), err
    assert not out.exists()


def test_sweep_file_and_flags_expand_to_cells_times_seeds(tmp_path, base, capsys):
    assert split_values('[-1,1],[-1,0,1], "a,b"') == ["[-1,1]", "[-1,0,1]", '"a,b"']
    spec = tmp_path / "sweep.toml"
    spec.write_text(tomli_w.dumps({
        "out": str(tmp_path / "s"), "config": base.name, "seeds": [3, 4],
        "grid": {"run": {"stability": ["adaptive", "off"]}},
        "cells": [{"env.levels": [-1.0, 1.0]}, {"env.commission_bps": 5.0}],
    }))  # fmt: skip
    assert main(["sweep", str(spec), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "8 trials"
    assert lines[0].startswith("env.levels=[-1.0,1.0] run.stability=adaptive  seed 3  ")
    assert lines[0].endswith("/s/env.levels=-1.0+1.0_run.stability=adaptive/seed3")
    # a --grid flag replaces the file's values of its key; --seeds replaces the file's seeds
    main(["sweep", str(spec), "--grid", "run.stability=fixed", "--seeds", "9", "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "2 trials" and "run.stability=fixed  seed 9" in lines[1]


def test_without_ray_it_says_how_to_install(tmp_path, base, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    assert main(["sweep", "--config", str(base), "--out", str(tmp_path / "s")]) == 2
    assert "pip install 'trimtab[sweep]'" in capsys.readouterr().err
    code = (
        "import sys, trimtab, trimtab.cli, trimtab.rl.sweep.trials; assert 'ray' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _trial_sharpe(run_dir) -> float:
    """The pooled out-of-sample Sharpe (a run from before the pooled backtest: fold mean)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    if "oos" in summary:
        return summary["oos"]["sharpe"]
    return statistics.mean(f["sharpe"] for f in summary["folds"])


@pytest.mark.slow
def test_sweep_on_local_ray_merges_resumes_and_reports_failures(tmp_path, base, capsys):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False)  # the sweep runs in the session it finds
    try:
        out = tmp_path / "sweep"
        argv = ["sweep", "--config", str(base), "--out", str(out),
                "--grid", "run.stability=adaptive,off", "--seeds", "0", "1"]  # fmt: skip
        assert main(argv) == 0
        assert "4 to run" in capsys.readouterr().out
        table = json.loads((out / "sweep.json").read_text())
        assert [c["cell"] for c in table["cells"]] == ["run.stability=adaptive",
                                                       "run.stability=off"]  # fmt: skip
        for cell in table["cells"]:
            per_seed = [_trial_sharpe(out / cell["dir"] / f"seed{s}") for s in (0, 1)]
            got = cell["metrics"]["oos_sharpe"]
            assert (cell["done"], cell["failed"], got["n"]) == (2, 0, 2)
            assert math.isclose(got["mean"], statistics.mean(per_seed), rel_tol=1e-12)
            assert math.isclose(got["se"], statistics.stdev(per_seed) / math.sqrt(2), rel_tol=1e-9)
        csv_lines = (out / "sweep.csv").read_text().splitlines()
        assert csv_lines[0].startswith("cell,run.stability,trials,done,halted,failed,oos_sharpe_")
        assert len(csv_lines) == 3 and (out / "sweep.png").stat().st_size > 0

        # interrupted: one trial half-written (a torn summary and a stray file); rerun
        torn = out / "run.stability=off" / "seed1"
        (torn / "summary.json").write_text("{")
        (torn / "stray").write_text("x")
        kept = out / "run.stability=adaptive" / "seed0" / "summary.json"
        before = kept.stat().st_mtime_ns
        assert main(argv) == 0
        printed = capsys.readouterr().out
        assert "3 finished earlier (skipped), 1 to run" in printed
        assert "[1/1] run.stability=off seed 1: done" in printed
        assert kept.stat().st_mtime_ns == before and not (torn / "stray").exists()
        again = json.loads((out / "sweep.json").read_text())
        assert again["cells"] == table["cells"]  # seeded: the restarted trial repeats itself
        skipped = {(t["dir"], t["seed"]): t["skipped"] for t in again["trials"]}
        assert sum(skipped.values()) == 3 and not skipped[("run.stability=off", 1)]
        # the same directory with another base config: refused, nothing run or removed
        assert main([*argv, "--set", "agent.lr=5e-4"]) == 2
        assert "finished with another config (agent.lr" in capsys.readouterr().err
        assert kept.stat().st_mtime_ns == before

        # a failing trial: reported with its error and run directory, its traceback kept
        bad = tmp_path / "bad.csv"
        bad.write_text("not,a,market\n1,2,3\n")
        out2 = tmp_path / "failing"
        rc = main(["sweep", "--config", str(base), "--out", str(out2),
                   "--set", f'data.paths=["{bad}"]'])  # fmt: skip
        err = capsys.readouterr().err
        run_dir = out2 / "base" / "seed0"
        assert rc == 1 and "DataError" in err and str(run_dir) in err
        (trial,) = json.loads((out2 / "sweep.json").read_text())["trials"]
        assert trial["status"] == "failed" and trial["run_dir"] == str(run_dir)
        assert trial["error"].startswith("DataError: ")
        assert "Traceback" in (run_dir / "sweep_error.txt").read_text()
    finally:
        ray.shutdown()


def test_table_counts_halted_runs_and_takes_each_kind_of_metric(tmp_path):
    """A halted run counts with the folds it finished; a Gymnasium run gives eval_return; one
    seed has no standard error; the CSV, JSON and plot are written."""
    from pathlib import Path

    from trimtab.rl.sweep.spec import Trial
    from trimtab.rl.sweep.table import format_table, merge, write_outputs
    from trimtab.rl.sweep.trials import TrialResult

    def trial(cell, seed):
        return Trial(cell, (("run.stability", cell),), seed, None, Path(f"/x/{cell}/seed{seed}"))

    market = [{"sharpe": 1.0, "total_return": 0.1}, {"sharpe": 2.0, "total_return": 0.3}]
    trials = [trial("adaptive", 0), trial("adaptive", 1), trial("off", 0), trial("off", 1)]
    results = [
        TrialResult(trials[0], "done", {"folds": market, "halted": None}),
        TrialResult(trials[1], "halted", {"folds": market[:1], "halted": "trunk fired"}),
        TrialResult(trials[2], "done", {"folds": [], "eval": {"mean_return": 200.0}}),
        TrialResult(trials[3], "failed", error="DataError: bad"),
    ]
    cells = merge(results, trials)
    adaptive, off = cells
    assert (adaptive["done"], adaptive["halted"], off["done"], off["failed"]) == (1, 1, 1, 1)
    sharpe = adaptive["metrics"]["oos_sharpe"]  # per seed: mean over folds 1.5 and 1.0
    assert sharpe["mean"] == 1.25 and math.isclose(sharpe["se"], 0.25) and sharpe["n"] == 2
    assert off["metrics"] == {"eval_return": {"mean": 200.0, "se": None, "n": 1,
                                              "seeds": {"0": 200.0}}}  # fmt: skip
    text = format_table(cells)
    # no pooled backtest in these summaries: oos_sharpe is the fold mean, like fold_sharpe
    pm = "+1.25 ± 0.25 | +1.25 ± 0.25 | +0.15 ± 0.05"
    assert f"| run.stability=adaptive | 2 | 1 | 1 | 0 | {pm} | - |" in text
    assert "| run.stability=off | 2 | 1 | 0 | 1 | - | - | - | +200 |" in text
    write_outputs(tmp_path, cells, [r.record() for r in results])
    head = (tmp_path / "sweep.csv").read_text().splitlines()[0]
    assert head.endswith("eval_return_mean,eval_return_se,eval_return_n")
    assert (tmp_path / "sweep.png").stat().st_size > 0
    failed = json.loads((tmp_path / "sweep.json").read_text())["trials"][3]
    assert (failed["status"], failed["error"]) == ("failed", "DataError: bad")


def _fake_summary(sharpe: float, best: str, days: int = 500) -> dict:
    """A finished market run's summary.json in the pooled-backtest schema: flat and the oracle
    beat every simple baseline (neither may count as the best), ``best`` is the best of them."""

    def stats(s):
        return {"sharpe": s, "sharpe_ci95": [s - 1, s + 1], "total_return": s / 10,
                "max_drawdown": 0.1, "sortino": s, "calmar": s, "turnover": 0.2,
                "exposure": 0.5, "days": days, "execution": "next_open",
                "optimistic": False}  # fmt: skip

    simple = {"buy_and_hold": 0.5, "momentum": 0.2, "reversal": -0.3, "ma_crossover": 0.1,
              "random": 0.0}  # fmt: skip
    simple[best] = 0.8
    baselines = {n: stats(s) for n, s in {**simple, "flat": 5.0, "oracle": 9.0}.items()}
    vs = {n: {"annual_return": 0.01, "annual_return_ci95": [-0.1, 0.1],
              "information_ratio": sharpe - b["sharpe"], "information_ratio_ci95": [-1, 1],
              "p_positive": 0.5} for n, b in baselines.items()}  # fmt: skip
    oos = {**stats(sharpe), "periods_per_year": 252, "skew": -0.5, "kurtosis": 6.0}
    folds = [{"fold": k, "sharpe": sharpe + d, "total_return": 0.0, "n_days": days // 2}
             for k, d in enumerate((-0.25, 0.25))]  # fmt: skip
    return {"run_dir": "", "folds": folds, "halted": None, "seconds": 1.0, "oos": oos,
            "baselines": baselines, "vs_baselines": vs}  # fmt: skip


def test_table_from_pooled_summaries_has_baselines_and_the_deflated_sharpe(tmp_path, base,
                                                                            capsys):  # fmt: skip
    """Finished runs in the pooled-backtest schema (fabricated): a rerun trains nothing, and the
    table has the pooled Sharpe, buy & hold, the best simple baseline (never flat or the
    oracle), the agent against it, the oracle, and the best trial's deflated Sharpe ratio."""
    from trimtab.rl.backtest.selection import deflated_sharpe, per_bar
    from trimtab.rl.configio import to_toml
    from trimtab.rl.run.checkpoint import atomic_write_json
    from trimtab.rl.sweep.trials import MARKER

    out = tmp_path / "sweep"
    argv = ["sweep", "--config", str(base), "--out", str(out), "--serial",
            "--grid", "run.stability=adaptive,off", "--seeds", "0", "1", "2"]  # fmt: skip
    from trimtab.cli import build_parser
    from trimtab.rl.sweep.cli import build_trials

    trials, _ = build_trials(build_parser().parse_args(argv))
    sharpes = {("adaptive", 0): 1.0, ("adaptive", 1): 1.5, ("adaptive", 2): 2.0,
               ("off", 0): 0.2, ("off", 1): 0.4, ("off", 2): 0.3}  # fmt: skip
    out.mkdir()
    (out / MARKER).write_text("")
    for t in trials:
        key = (t.cfg.run.stability, t.seed)
        best = "random" if key == ("off", 2) else "momentum"
        t.run_dir.mkdir(parents=True)
        (t.run_dir / "config.toml").write_text(to_toml(t.cfg))
        atomic_write_json(t.run_dir / "summary.json", _fake_summary(sharpes[key], best))
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "6 finished earlier (skipped), 0 to run" in printed
    table = json.loads((out / "sweep.json").read_text())
    adaptive, off = table["cells"]
    m = adaptive["metrics"]
    assert m["oos_sharpe"]["mean"] == 1.5 and m["oos_sharpe"]["n"] == 3  # pooled, not folds
    assert m["fold_sharpe"]["seeds"] == {"0": 1.0, "1": 1.5, "2": 2.0}  # mean of ±0.25
    assert m["buy_hold_sharpe"]["mean"] == 0.5 and m["oracle_sharpe"]["mean"] == 9.0
    assert m["best_baseline_sharpe"]["seeds"] == {"0": 0.8, "1": 0.8, "2": 0.8}
    assert m["vs_best"]["seeds"]["2"] == 2.0 - 0.8  # against momentum, not flat or the oracle
    assert adaptive["best_baseline"]["name"] == "momentum"
    seeds = {"0": "momentum", "1": "momentum", "2": "random"}  # the most frequent is shown
    assert off["best_baseline"] == {"name": "momentum", "n": 3, "seeds": seeds}

    # the best of all 6 trials (adaptive seed 2) deflated over the 6, per bar
    per = [per_bar(s, 252) for s in sharpes.values()]
    dsr = deflated_sharpe(per_bar(2.0, 252), per, 500, -0.5, 6.0)
    sel = table["selection"]
    assert (sel["n_trials"], sel["seed"], sel["sharpe"]) == (6, 2, 2.0)
    assert sel["dir"] == "run.stability=adaptive"
    assert math.isclose(sel["dsr"], dsr, rel_tol=1e-12) and adaptive["dsr"] == sel["dsr"]
    assert off["dsr"] == deflated_sharpe(per_bar(0.4, 252), per, 500, -0.5, 6.0) < sel["dsr"]
    assert not sel["normal_assumed"] and 0 < sel["expected_max_sharpe"] < 2.0

    row = next(line for line in printed.splitlines() if line.startswith("| run.stability=off"))
    assert "| +0.3 ± 0.0577 |" in row and "| momentum 2/3 |" in row
    assert f"| {off['dsr']:.3f} |" in row
    assert "deflated Sharpe ratio of the best of 6 trials (run.stability=adaptive seed 2" in printed
    assert f": {dsr:.3f} (best Sharpe from luck alone" in printed
    lines = (out / "sweep.csv").read_text().splitlines()
    head = lines[0].split(",")
    for col in ("buy_hold_sharpe_mean", "best_baseline_sharpe_mean", "best_baseline",
                "vs_best_mean", "oracle_sharpe_mean", "n_trials", "dsr"):  # fmt: skip
        assert col in head, head
    off_row = dict(zip(head, lines[2].split(",")))
    assert off_row["best_baseline"] == "momentum" and off_row["n_trials"] == "6"
    assert float(off_row["dsr"]) == off["dsr"]
