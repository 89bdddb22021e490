"""The walk-forward trainer end to end, on a tiny market: outputs, resume equality, user errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trimtab.cli import main
from trimtab.rl.config import CPU_MEASURE_EVERY, TrainConfig
from trimtab.rl.configio import from_dict
from trimtab.rl.train import TrainingInterrupted, train

TINY = {
    "run": {"progress": False, "checkpoint_every": 10, "log_every": 5},
    "data": {"synthetic_days": 420},
    "env": {"n_envs": 4, "episode_days": 16},
    "walkforward": {"folds": 2, "steps_per_fold": 30, "learning_starts": 16},  # 4 x 4 envs
    "agent": {"batch_size": 16, "hidden": 16, "n_atoms": 11, "n_tau": 4, "n_tau_target": 4,
              "iqn_embed": 8, "replay_capacity": 2000, "target_update_period": 10},
}  # fmt: skip


def tiny(out: Path, **run: object) -> TrainConfig:
    cfg = from_dict(TrainConfig, {**TINY, "run": {**TINY["run"], "out": str(out), **run}})
    return cfg


def test_tiny_run_writes_every_output(tmp_path):
    out = tmp_path / "run"
    summary = train(tiny(out))
    for name in (
        "config.toml",
        "metrics.csv",
        "summary.json",
        "sentinel.json",
        "report.html",
        "run.log",
        "checkpoints/last.pt",
        "checkpoints/fold_0.pt",
        "checkpoints/fold_1.pt",
        "folds/fold_0.csv",
        "plots/equity.png",
        "plots/losses.png",
        "plots/bounds.png",
    ):
        assert (out / name).is_file(), name  # fmt: skip
    saved = json.loads((out / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    keys = {"fold", "train_start", "train_end", "test_start", "test_end", "sharpe",
            "total_return", "max_drawdown", "turnover", "buy_hold_sharpe", "buy_hold_return",
            "steps", "nonfinite"}  # fmt: skip
    assert len(saved["folds"]) == 2 and all(keys <= set(f) for f in saved["folds"])
    assert saved["halted"] is None and saved["stability"] == "adaptive"
    assert saved["measure_every"] == CPU_MEASURE_EVERY  # "auto" on the CPU
    assert saved["folds"][0]["test_start"] > saved["folds"][0]["train_end"]  # out of sample
    # walkforward.train_window "expanding": fold 1 trains on fold 0's days and its test window
    assert saved["folds"][1]["train_start"] == saved["folds"][0]["train_start"]
    assert saved["folds"][1]["train_end"] < saved["folds"][1]["test_start"]
    # the fold boundary's actions are logged
    log = (out / "run.log").read_text()
    assert "hard sync from its online network" in log and "unset slots" in log
    # TensorBoard can read the event file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    assert "loss/total" in acc.Tags()["scalars"]
    assert len(acc.Scalars("loss/total")) == 60 // 5
    html = (out / "report.html").read_text()
    assert "Out-of-sample results per fold" in html and "plots/equity.png" in html


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    full = train(tiny(tmp_path / "a"))
    cfg_b = tiny(tmp_path / "b")
    with pytest.raises(TrainingInterrupted):
        train(cfg_b, stop_after=45)  # last checkpoint: step 40, in fold 1
    resumed = train(cfg_b, resume=True)
    for f_a, f_b in zip(full["folds"], resumed["folds"], strict=True):
        assert f_a["sharpe"] == f_b["sharpe"] and f_a["total_return"] == f_b["total_return"]
    a = torch.load(tmp_path / "a/checkpoints/last.pt", weights_only=False)["state"]["agent"]
    b = torch.load(tmp_path / "b/checkpoints/last.pt", weights_only=False)["state"]["agent"]
    for k, v in a["online"].items():
        assert torch.equal(v, b["online"][k]), k
    # rows after the checkpoint were rewritten, not doubled, and every value is the same
    assert (tmp_path / "a/metrics.csv").read_text() == (tmp_path / "b/metrics.csv").read_text()


def test_checkpoint_of_another_layout_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(tiny(out), stop_after=10)
    path = out / "checkpoints/last.pt"
    blob = torch.load(path, weights_only=False)
    blob["fingerprint"] = "0123456789abcdef"
    torch.save(blob, path)
    assert main(["train", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "0123456789abcdef" in err and "layout" in err and "Traceback" not in err


def test_bad_data_file_is_one_line_and_leaves_no_run_dir(tmp_path, capsys):
    bad = tmp_path / "AAA.csv"
    bad.write_text(
        "Date,Open,High,Low,Close,Volume\n2020-01-02,1,1,1,1,10\n2020-01-03,1,1,1,-1,10\n"
    )
    out = tmp_path / "run"
    assert main(["train", "--data", str(bad), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trimtab: error:") and "AAA.csv" in err and "line 3" in err
    assert len(err.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--set", "walkforward.folds=0"], "folds=0 must be >= 1"),
        (["--set", "agent.gamma=2.0"], "gamma=2.0 must be a number in"),
        (["--set", "env.commission_bps=cheap"], "env.commission_bps: expected a number"),
        (["--set", "env.reward_scale=0"], "reward_scale=0.0 must be a finite number > 0"),
        (["--set", "agent.nope=1"], "unknown config key agent.nope"),
        (["--stability", "fixed", "--device", "cuda:7"], "no CUDA device|cuda"),
    ],
)
def test_config_errors_are_one_line(tmp_path, capsys, args, pattern):
    if "cuda:7" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trimtab: error:") and pytest.importorskip("re").search(pattern, err)
    assert not out.exists()


def test_existing_run_dir_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert main(["train", "--out", str(out), "--no-progress"]) == 2
    assert "--resume" in capsys.readouterr().err and (out / "keep.txt").read_text() == "x"


def test_report_and_eval_commands(tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny(out))
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0 and (out / "report.html").is_file()
    assert (
        main(["eval", str(out / "checkpoints/fold_1.pt"), "--json", str(tmp_path / "e.json")]) == 0
    )
    result = json.loads((tmp_path / "e.json").read_text())
    assert {"sharpe", "buy_hold_sharpe", "days"} <= set(result) and result["days"] > 100
    # a run directory is read through its checkpoints/last.pt: the finished run's last fold
    assert main(["eval", str(out), "--json", str(tmp_path / "d.json")]) == 0
    assert json.loads((tmp_path / "d.json").read_text())["sharpe"] == result["sharpe"]
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "nowhere")]) == 2
    assert "does not exist: give a run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["eval", str(tmp_path / "empty")]) == 2
    assert "no checkpoints/last.pt" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["fixed", "off"])
def test_other_stability_modes_run(tmp_path, mode):
    summary = train(
        replace(tiny(tmp_path / mode), run=replace(tiny(tmp_path / mode).run, stability=mode))
    )
    assert summary["stability"] == mode and len(summary["folds"]) == 2
    assert summary["measure_every"] is None  # nothing measured


def test_a_plot_of_all_nan_columns_is_written_without_warnings(tmp_path):
    """A run that halts before its first finite metric: the plot is written, no NaN warning."""
    import warnings

    import numpy as np

    from trimtab.rl.report import build as report

    prefix = next(p for p, spec in report.PREFIXES.items() if spec[3])  # a log-scale plot
    metrics = {"step": np.arange(3.0), f"{prefix}a": np.full(3, np.nan)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = report.plot_prefix(metrics, prefix, tmp_path)
    assert path is not None and path.is_file()


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    cfg = tiny(tmp_path / "run")
    train(replace(cfg, run=replace(cfg.run, progress=True)))
    err = capsys.readouterr().err
    assert "\r" not in err  # no redrawn bar in a log file
    lines = [ln for ln in err.splitlines() if ln.startswith("fold ")]
    # a line per tenth of each fold's 30 steps (3, 6, ..., 30), two folds
    assert len(lines) == 20, err
    assert lines[0].startswith("fold 0: 3/30 steps (10%") and lines[-1].startswith("fold 1: 30/30")


def test_assetwise_agent_on_per_asset_rewards_trains_resumes_and_is_refused_off_market(tmp_path):
    """agent.assetwise with env.reward = per_asset (the market's defaults) end to end: finite
    metrics, a resume from its checkpoint gives the uninterrupted run's metrics; either key set
    by hand is refused where it would do nothing (a Gymnasium run), and "auto" resolves to the
    whole-observation network there."""
    from trimtab.rl.configio import ConfigError

    over = {"agent": {**TINY["agent"], "assetwise": True},
            "env": {**TINY["env"], "reward": "per_asset"}}  # fmt: skip
    make = lambda out: from_dict(  # noqa: E731
        TrainConfig, {**TINY, **over, "run": {**TINY["run"], "out": str(out)}}
    )
    full = train(make(tmp_path / "full"))
    assert all(torch.isfinite(torch.tensor(f["sharpe"])) for f in full["folds"])
    with pytest.raises(TrainingInterrupted):
        train(make(tmp_path / "cut"), stop_after=45)  # last checkpoint: step 40, in fold 1
    resumed = train(make(tmp_path / "cut"), resume=True)
    for f_a, f_b in zip(full["folds"], resumed["folds"], strict=True):
        assert f_a["sharpe"] == f_b["sharpe"] and f_a["total_return"] == f_b["total_return"]
    a = (tmp_path / "full" / "metrics.csv").read_text()
    assert a == (tmp_path / "cut" / "metrics.csv").read_text()
    for key in ({"agent": {"assetwise": True}}, {"env": {"reward": "portfolio"}}):
        with pytest.raises(ConfigError, match="does nothing in a Gymnasium run"):
            env = {**key.get("env", {}), "name": "gym:CartPole-v1"}
            from_dict(TrainConfig, {**key, "env": env})
    assert TrainConfig().agent.assetwise is True
    assert from_dict(TrainConfig, {"env": {"name": "gym:CartPole-v1"}}).agent.assetwise is False


def test_binned_features_train_evaluate_and_are_refused_off_market(tmp_path, capsys):
    """env.feature_bins end to end: the observation widens to each feature and its bins, a
    checkpoint evaluates with its saved edges to the fold's own out-of-sample figure, and the
    key is refused where it would do nothing."""
    from trimtab.rl.configio import ConfigError

    out = tmp_path / "run"
    cfg = from_dict(TrainConfig, {**TINY, "env": {**TINY["env"], "feature_bins": 3},
                                  "run": {**TINY["run"], "out": str(out)}})  # fmt: skip
    summary = train(cfg)
    from trimtab.rl.run import checkpoint as ckpt

    state = ckpt.load(out / "checkpoints/fold_1.pt", fingerprint=None)
    n_assets, n_features = 4, len(cfg.env.features)
    assert state["agent"]["obs_dim"] == n_assets * n_features * (1 + 3) + n_assets
    assert state["normalizer"]["bins"] == 3
    assert main(["eval", str(out), "--json", str(tmp_path / "e.json")]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["sharpe"] == pytest.approx(summary["folds"][-1]["sharpe"], abs=1e-4)  # 4 places
    for bad, says in ((-1, r"must be an integer in 0\.\.64"), (65, "in 0..64"), (2.5, "integer")):
        with pytest.raises(ConfigError, match=rf"feature_bins.*{says}"):
            from_dict(TrainConfig, {"env": {"feature_bins": bad}})
    with pytest.raises(ConfigError, match=r"env\.feature_bins = 3: does nothing in a Gymnasium"):
        from_dict(TrainConfig, {"env": {"name": "gym:CartPole-v1", "feature_bins": 3}})


def test_gamma_auto_is_one_bar_on_the_market_and_a_long_horizon_elsewhere():
    from trimtab.rl.agent.dqn import GAMMA_AUTO, AgentConfig, DQNAgent
    from trimtab.rl.configio import ConfigError

    assert TrainConfig().agent.gamma == GAMMA_AUTO[True] == 0.0
    gym = from_dict(TrainConfig, {"env": {"name": "gym:CartPole-v1"}})
    assert gym.agent.gamma == GAMMA_AUTO[False] == 0.99
    assert from_dict(TrainConfig, {"agent": {"gamma": 0.9}}).agent.gamma == 0.9  # a number stays
    alone = DQNAgent(6, [3, 3], AgentConfig(batch_size=8, hidden=8, n_atoms=5), "cpu")
    assert alone.config.gamma == 0.99 and alone.make_replay().gamma == 0.99
    for bad in (1.5, -0.1, "one"):
        with pytest.raises(ConfigError, match="gamma"):
            AgentConfig(gamma=bad)
