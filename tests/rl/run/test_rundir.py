"""Issue 11, the run directory: filesystem errors, the lock, verified checkpoints, resume that
restores everything, a finished run left alone, permissions, the Ctrl-C message."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from rl_helpers import generic, tiny

from trimtab.cli import main
from trimtab.rl.run import checkpoint as ckpt
from trimtab.rl.run.checkpoint import CheckpointError
from trimtab.rl.run.rundir import RunDirError, RunLock
from trimtab.rl.train import TrainingInterrupted, train

STEPS = 24  # one fold of 24 steps, a checkpoint every 4


def cfg(out: Path, **run: object):
    return tiny(out, STEPS, checkpoint_every=4, **run)


def _cli(*args: str) -> int:
    return main(["train", "--no-progress", *args])


@pytest.mark.parametrize("kind", ["file", "proc"])
def test_unusable_out_is_one_line_before_any_work(tmp_path, capsys, kind):
    out = tmp_path / "f" if kind == "file" else Path("/proc/trimtab-run")
    if kind == "file":
        out.write_text("x")
    assert _cli("--out", str(out), "--steps-per-fold", "4", "--folds", "1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(out) in err


def test_a_locked_run_dir_refuses_a_second_writer(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(cfg(out), stop_after=8)
    lock = RunLock(out)  # another process holds the run
    try:
        with pytest.raises(RunDirError, match="in use by another trimtab process"):
            train(cfg(out), resume=True)
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        held = RunLock(fresh)
        with pytest.raises(RunDirError, match="in use"):
            train(cfg(fresh))
        held.release()
    finally:
        lock.release()
    train(cfg(out), resume=True)  # released: the run continues


def test_full_disk_at_a_checkpoint_keeps_the_last_good_one(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real = ckpt.atomic_write_bytes
    calls = []

    def full(path, data):
        calls.append(path)
        if len(calls) >= 3:  # config.toml, the checkpoint of step 4, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(ckpt, "atomic_write_bytes", full)
    with pytest.raises(RunDirError, match=r"No space left on device; the last good checkpoint "
                                          r"\(step 4\) is kept"):  # fmt: skip
        train(cfg(out))
    monkeypatch.setattr(ckpt, "atomic_write_bytes", real)
    assert not list((out / "checkpoints").glob(".*.tmp"))
    summary = train(cfg(out), resume=True)
    assert summary["updates"] == STEPS


def _interrupted(out: Path, at: int = 10) -> None:
    with pytest.raises(TrainingInterrupted):
        train(cfg(out), stop_after=at)


def test_a_corrupted_checkpoint_is_refused_naming_the_resumable_ones(tmp_path, capsys):
    out = tmp_path / "run"
    full = tiny(out, 8, checkpoint_every=4)
    from dataclasses import replace

    full = replace(full, walkforward=replace(full.walkforward, folds=2))
    with pytest.raises(TrainingInterrupted):
        train(full, stop_after=12)  # fold 0 done (fold_0.pt), mid fold 1
    path = out / "checkpoints" / "last.pt"
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 5000] = bytes(b ^ 0x5A for b in data[mid : mid + 5000])  # 5 KB flipped
    path.write_bytes(bytes(data))
    assert _cli("--resume", str(out)) == 2
    err = capsys.readouterr().err
    assert "corrupted" in err and "resumable instead: fold_0.pt" in err and err.count("\n") == 1
    assert _cli("--resume", str(out / "checkpoints" / "fold_0.pt")) == 0
    assert len(json.loads((out / "summary.json").read_text())["folds"]) == 2


def _saved_before_assetwise(out: Path) -> None:
    """Make ``out``, a run of the whole-observation network on the portfolio's reward, what an
    earlier trimtab saved: ``agent.assetwise`` and ``env.reward`` in neither its config.toml nor
    its checkpoints."""
    toml = out / "config.toml"
    for line in ("\nassetwise = false\n", '\nreward = "portfolio"\n'):
        assert line in toml.read_text()
        toml.write_text(toml.read_text().replace(line, "\n"))
    for path in (out / "checkpoints").glob("*.pt"):
        blob = torch.load(path, weights_only=True)
        state = blob["state"]
        del state["config"]["agent"]["assetwise"], state["agent"]["config"]["assetwise"]
        del state["config"]["env"]["reward"]
        ckpt.save(path, state, fingerprint=blob["fingerprint"])


def test_a_run_saved_before_assetwise_resumes_and_evaluates_as_it_was_built(tmp_path):
    """A run directory saved before ``agent.assetwise`` and ``env.reward`` existed lacks the
    keys: it was built with the whole-observation network on the portfolio's reward, so it
    resumes and evaluates as that, not as today's defaults (the assetwise network on each
    asset's part of the return)."""
    from dataclasses import replace

    from trimtab.rl.config import TrainConfig, saved_config
    from trimtab.rl.configio import from_dict

    assert from_dict(TrainConfig, {}).agent.assetwise is True  # a new run's config
    assert saved_config({}).agent.assetwise is False  # a saved one without the key
    assert saved_config({"agent": {"assetwise": True}}).agent.assetwise is True
    assert saved_config({}).env.reward == "portfolio"  # a market run saved before env.reward
    assert saved_config({"env": {"reward": "per_asset"}}).env.reward == "per_asset"
    assert saved_config({"env": {"name": "gym:CartPole-v1"}}).env.reward == "per_asset"
    assert saved_config({}).walkforward.train_window == "rolling"  # saved before the key
    grown = {"walkforward": {"train_window": "expanding"}}
    assert saved_config(grown).walkforward.train_window == "expanding"

    def two_folds(out: Path):
        c = generic(tiny(out, 8, checkpoint_every=4))
        env = replace(c.env, reward="portfolio")
        return replace(c, env=env, walkforward=replace(c.walkforward, folds=2))

    full = train(two_folds(tmp_path / "full"))
    out = tmp_path / "old"
    with pytest.raises(TrainingInterrupted):
        train(two_folds(out), stop_after=12)  # fold 0 done (fold_0.pt), mid fold 1
    fold_0 = out / "checkpoints" / "fold_0.pt"
    assert main(["eval", str(fold_0), "--json", str(tmp_path / "before.json")]) == 0
    _saved_before_assetwise(out)
    assert main(["eval", str(fold_0), "--json", str(tmp_path / "after.json")]) == 0
    assert (tmp_path / "after.json").read_text() == (tmp_path / "before.json").read_text()
    assert _cli("--resume", str(out)) == 0
    resumed = json.loads((out / "summary.json").read_text())
    for f_a, f_b in zip(full["folds"], resumed["folds"], strict=True):  # the same network
        assert f_a["sharpe"] == f_b["sharpe"] and f_a["total_return"] == f_b["total_return"]
    assert main(["eval", str(out), "--json", str(tmp_path / "last.json")]) == 0
    assert json.loads((tmp_path / "last.json").read_text())["days"] > 0


def test_a_config_edited_to_another_network_is_refused_naming_both_and_the_key(tmp_path, capsys):
    out = tmp_path / "run"
    _interrupted(out)  # the market's default: the assetwise network
    toml = out / "config.toml"
    toml.write_text(toml.read_text().replace("\nassetwise = true\n", "\nassetwise = false\n"))
    assert _cli("--resume", str(out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert (
        f"checkpoint {out / 'checkpoints' / 'last.pt'} was saved with AssetwiseQNetwork "
        "(agent.assetwise = true), but the run's config builds BranchingQNetwork "
        f"(agent.assetwise = false): set agent.assetwise = true in {toml}"
    ) in err


def test_non_finite_weights_in_a_checkpoint_are_refused(tmp_path):
    out = tmp_path / "run"
    _interrupted(out)
    path = out / "checkpoints" / "last.pt"
    blob = torch.load(path, weights_only=False)
    state = blob["state"]
    next(iter(state["agent"]["online"].values())).view(-1)[0] = math.nan
    ckpt.save(path, state, fingerprint=blob["fingerprint"])  # a valid digest of bad weights
    with pytest.raises(CheckpointError, match=r"non-finite values in online\."):
        train(cfg(out), resume=True)


def test_resume_restores_sentinel_counters_tensorboard_and_seconds(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(cfg(a))
    _interrupted(b)  # last checkpoint at step 8
    saved = torch.load(b / "checkpoints/last.pt", weights_only=False)["state"]["progress"]
    resumed = train(cfg(b), resume=True)
    sa = json.loads((a / "sentinel.json").read_text())
    sb = json.loads((b / "sentinel.json").read_text())
    assert sa["steps"] == sb["steps"] and sb["steps"]["forward"] == STEPS
    assert resumed["seconds"] >= saved["seconds"] > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def steps(run: Path) -> list[int]:
        acc = EventAccumulator(str(run / "tb"))
        acc.Reload()
        return sorted(e.step for e in acc.Scalars("loss/total"))

    assert steps(a) == steps(b) and 8 in steps(b)


def test_resume_of_a_finished_run_changes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    train(cfg(out))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert _cli("--resume", str(out)) == 0
    assert "finished run" in capsys.readouterr().out
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert before == after


@pytest.mark.parametrize("lost", ["summary.json", "report.html"])
def test_resume_after_training_writes_the_missing_summary_and_report(tmp_path, capsys, lost):
    """A stop after the last checkpoint, while the summary or report was being written: the
    resume writes them (the same folds), rather than calling the run finished."""
    out = tmp_path / "run"
    first = train(cfg(out))
    (out / lost).unlink()
    assert _cli("--resume", str(out)) == 0
    assert "writing its summary and report" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["folds"] == json.loads(json.dumps(first["folds"]))
    assert (out / "report.html").is_file()


def test_a_stop_while_writing_the_summary_says_resume_writes_it(tmp_path, monkeypatch):
    from trimtab.rl.run import runner

    def stop(run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "build_report", stop)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt, match=r"writing the summary and report.*--resume"):
        train(cfg(out))


def test_output_files_get_normal_permissions(tmp_path):
    out = tmp_path / "run"
    train(cfg(out))
    mode = 0o666 & ~ckpt._umask()
    for name in ("config.toml", "summary.json", "sentinel.json", "checkpoints/last.pt"):
        assert (out / name).stat().st_mode & 0o777 == mode, name


def test_ctrl_c_names_the_run_dir_and_the_steps_to_redo(tmp_path, capsys, monkeypatch):
    from trimtab.rl.agent.learner import Learner

    real, n = Learner.learn, [0]

    def learn(self, *args, **kwargs):
        n[0] += 1
        if n[0] == 11:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Learner, "learn", learn)
    out = tmp_path / "run"
    code = _cli("--out", str(out), "--steps-per-fold", "24", "--folds", "1",
                "--set", "run.checkpoint_every=4")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 130 and str(out) in err and "2 step(s) since the last checkpoint, step 8" in err


def test_sigterm_stops_like_ctrl_c_and_resume_gives_the_uninterrupted_metrics(
    tmp_path, capsys, monkeypatch
):
    """A scheduler's or ``docker stop``'s SIGTERM, delivered to the process mid-run: the run's
    message (where, what a resume redoes, the command), exit 143, checkpoints kept; ``--resume``
    then ends with the uninterrupted run's metrics.csv and summary."""
    from trimtab.rl.agent.learner import Learner
    from trimtab.rl.configio import to_toml

    a, b = tmp_path / "a", tmp_path / "b"
    train(cfg(a))
    real, n = Learner.learn, [0]

    def learn(self, *args, **kwargs):
        n[0] += 1
        if n[0] == 11:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, in the main thread
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Learner, "learn", learn)
    toml = tmp_path / "b.toml"
    toml.write_text(to_toml(cfg(b)))
    before = signal.getsignal(signal.SIGTERM)
    assert _cli("--config", str(toml)) == 143
    err = capsys.readouterr().err
    assert err.startswith("trimtab: terminated (SIGTERM)") and str(b) in err, err
    assert "--resume" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back
    assert (b / "checkpoints" / "last.pt").is_file()
    monkeypatch.setattr(Learner, "learn", real)
    assert _cli("--resume", str(b)) == 0
    assert (a / "metrics.csv").read_text() == (b / "metrics.csv").read_text()
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert [f["sharpe"] for f in sa["folds"]] == [f["sharpe"] for f in sb["folds"]]


def test_a_run_stopped_before_its_first_checkpoint_starts_over_on_resume(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    train(cfg(a))
    with pytest.raises(TrainingInterrupted):
        train(cfg(b), stop_after=2)  # before the first checkpoint (step 4)
    assert not (b / "checkpoints" / "last.pt").exists()
    assert _cli("--resume", str(b)) == 0
    assert "no checkpoint yet: starting it over" in capsys.readouterr().err
    assert (a / "metrics.csv").read_text() == (b / "metrics.csv").read_text()


class _Planted:
    """Unpickling this runs a command (writes a marker file): what a malicious .pt carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["eval", "resume"])
def test_a_checkpoint_carrying_code_is_refused_unrun(tmp_path, capsys, how):
    out = tmp_path / "run"
    _interrupted(out)
    marker = tmp_path / "ran"
    path = out / "checkpoints" / "last.pt"
    blob = torch.load(path, weights_only=True)
    blob["state"]["extra"] = _Planted(marker)  # inside an otherwise valid checkpoint
    torch.save(blob, path)
    if how == "eval":
        code = main(["eval", str(path)])
    else:
        code = _cli("--resume", str(out))
    err = capsys.readouterr().err
    assert code == 2 and not marker.exists(), err
    assert "holds something other than tensors and plain data" in err
    assert "posix.system" in err and err.count("\n") == 1


def test_gym_checkpoints_hold_the_envs_as_plain_data(tmp_path):
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import from_dict
    from trimtab.rl.envs.adapters import GymAdapter

    cfg = from_dict(TrainConfig, {"env": {"name": "gym:CartPole-v1", "n_envs": 2}})
    a = GymAdapter(cfg, torch.device("cpu"))
    a.open_fold(0, seed=3)
    for _ in range(5):
        a.step(torch.zeros(2, 1, dtype=torch.int64))
    path = tmp_path / "envs.pt"
    torch.save(a.state_dict(), path)
    b = GymAdapter(cfg, torch.device("cpu"))
    b.load_state_dict(torch.load(path, weights_only=True))  # no pickled object in it
    for _ in range(30):  # the same draws and dynamics, through episode ends and resets
        act = torch.ones(2, 1, dtype=torch.int64)
        sa, sb = a.step(act), b.step(act)
        assert torch.equal(sa.obs, sb.obs) and torch.equal(sa.reward, sb.reward)


def test_plot_workers_draw_the_report_of_a_run(tmp_path):
    """``plot_workers`` (what ``trimtab train`` asks for on a GPU): worker processes started with
    the run draw its plots, every one of them into the report."""
    out = tmp_path / "run"
    summary = train(cfg(out), plot_workers=2)
    html = (out / "report.html").read_text()
    for name in ("equity_pooled.png", "equity.png", "losses.png"):
        assert f"plots/{name}" in html and (out / "plots" / name).is_file(), name
    assert summary["timings"]["report_s"] >= 0


def test_trimtab_train_draws_the_plots_in_workers_on_a_gpu_only(tmp_path):
    from trimtab.rl.run.cli import PLOT_WORKERS, plot_workers

    assert plot_workers(cfg(tmp_path / "a", device="cuda"), None) == PLOT_WORKERS > 1
    assert plot_workers(cfg(tmp_path / "b", device="cuda:1"), None) == PLOT_WORKERS
    assert plot_workers(cfg(tmp_path / "c"), None) == 0  # the CPU: its cores train
    assert plot_workers(cfg(tmp_path / "d", device="cuda"), object()) == 0  # torchrun's ranks
