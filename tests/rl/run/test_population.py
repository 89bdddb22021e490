"""Several runs in one process as one population (``trimtab train --seeds ... --population``,
``trimtab sweep --population``): each member is the run it would be alone, bitwise on the CPU,
with its own run directory and report; a failing member is a result, not the end of the others;
an interrupted population closes every member as an interrupted run closes."""

from __future__ import annotations

import json

import pytest
import tomli_w
import torch
from rl_helpers import TINY

from trimtab.cli import main
from trimtab.rl.run.population import interleave

CPU = torch.device("cpu")


def _drawing(n: int, seed: int, log: list):
    """A run that seeds the torch stream, then draws from it once a step."""

    def steps():
        torch.manual_seed(seed)
        out = []
        for _ in range(n):
            out.append(torch.rand(()).item())
            log.append(seed)
            yield
        return out

    return steps


def test_members_take_turns_and_keep_their_random_streams():
    log: list[int] = []
    alone = [list(_run_alone(_drawing(n, s, []))) for n, s in ((3, 1), (5, 2))]
    done: list[int] = []
    got = interleave([_drawing(3, 1, log), _drawing(5, 2, log)], [CPU, CPU],
                     on_done=lambda i, r: done.append(i))  # fmt: skip
    assert got == alone  # each member's draws are its own stream's, as alone
    assert log[:6] == [1, 2, 1, 2, 1, 2] and log[6:] == [2, 2]  # one step each, in turn
    assert done == [0, 1]
    torch.manual_seed(7)
    before = torch.rand(())
    torch.manual_seed(7)
    interleave([_drawing(2, 3, [])], [CPU])
    assert torch.rand(()) == before  # the caller's stream is left as it was


def _run_alone(start):
    steps = start()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def test_a_failing_member_closes_the_others():
    closed = []

    def long_run():
        try:
            while True:
                yield
        finally:
            closed.append("long")

    def failing():
        yield
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        interleave([long_run, failing], [CPU, CPU])
    assert closed == ["long"]
    with pytest.raises(ValueError, match="2 runs but 1 devices"):
        interleave([long_run, failing], [CPU])


@pytest.fixture
def base(tmp_path):
    data = {**TINY, "run": {**TINY["run"], "log_every": 2}}
    path = tmp_path / "tiny.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def test_a_population_of_seeds_is_each_seed_alone(tmp_path, base, capsys):
    """The seeds trained as one population write what each seed's run alone writes: the same
    metrics, folds and sentinel report, bitwise (the CPU), and the seeds' table."""
    alone, pop = tmp_path / "alone", tmp_path / "pop"
    common = ["train", "--config", str(base), "--seeds", "0", "1", "2"]
    assert main([*common, "--serial", "--out", str(alone)]) == 0
    assert main([*common, "--population", "--out", str(pop)]) == 0
    printed = capsys.readouterr().out
    assert "one population of 3 runs in this process on cpu" in printed
    for seed in (0, 1, 2):
        a, p = alone / f"seed{seed}", pop / f"seed{seed}"
        assert (a / "metrics.csv").read_text() == (p / "metrics.csv").read_text()
        sa, sp = (json.loads((d / "summary.json").read_text()) for d in (a, p))
        assert sa["folds"] == sp["folds"] and sp["seed"] == seed
        assert (a / "sentinel.json").read_text() == (p / "sentinel.json").read_text()
        assert (p / "report.html").is_file()
    table = json.loads((pop / "sweep.json").read_text())
    assert [t["status"] for t in table["trials"]] == ["done"] * 3


def test_a_failing_trial_is_a_result_of_the_population(tmp_path, base, capsys):
    """A member whose run fails (here: a replay that cannot fit in memory, refused as it sets
    up) is reported as failed; the others finish."""
    out = tmp_path / "sweep"
    argv = ["sweep", "--config", str(base), "--out", str(out), "--population", "--grid",
            "agent.replay_capacity=1000,1000000000000"]  # fmt: skip
    rc = main(argv)
    captured = capsys.readouterr()
    table = json.loads((out / "sweep.json").read_text())
    statuses = sorted(t["status"] for t in table["trials"])
    assert rc == 1 and statuses == ["done", "failed"], captured.err
    assert "replay" in captured.err


REFUSED = [
    (["--seeds", "0", "1", "--serial", "--population"], r"--serial and --population: give one"),
    (["--seeds", "0", "1", "--population", "--cpus", "2"], r"--cpus places Ray tasks"),
    (["--population"], r"--serial, --population and --cpus say how the runs of --seeds run"),
]


@pytest.mark.parametrize(("flags", "pattern"), REFUSED)
def test_flags_that_cannot_go_with_population_are_one_line(tmp_path, base, capsys, flags,
                                                             pattern):  # fmt: skip
    import re

    out = tmp_path / "seeds"
    rc = main(["train", "--config", str(base), "--out", str(out), *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(pattern, err), err
    assert not out.exists()


def test_a_cuda_population_runs_each_member_on_its_own_stream(tmp_path, capsys):
    """On a GPU: three CartPole members with their envs on the device (collection and learn
    step captured), each on a stream of its own; each finishes its plan and writes its report."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from trimtab.rl.run import population

    streams = []
    turn = population._advance
    population._advance = lambda m: (streams.append(torch.cuda.current_stream()), turn(m))[1]
    try:
        out = tmp_path / "pop"
        argv = ["train", "--env", "gym:CartPole-v1", "--device", "cuda", "--seeds", "1", "2",
                "3", "--population", "--out", str(out), "--set", 'env.impl="torch"',
                "--set", "env.n_envs=16", "--set", "gym.total_steps=16000",
                "--set", "gym.learning_starts=2000", "--set", "gym.train_every=16",
                "--set", "gym.eval_episodes=8"]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
    finally:
        population._advance = turn
    assert len({s.stream_id for s in streams}) == 3  # one stream per member
    assert torch.cuda.default_stream().stream_id not in {s.stream_id for s in streams}
    assert torch.cuda.current_stream() == torch.cuda.default_stream()  # set back after the turns
    for seed in (1, 2, 3):
        s = json.loads((out / f"seed{seed}" / "summary.json").read_text())
        assert (s["env_steps"], s["updates"], s["halted"]) == (16000, 876, None)
        assert s["train_return_last100"] > 8 and (out / f"seed{seed}" / "report.html").is_file()


def test_an_interrupt_between_two_steps_reaches_the_run(monkeypatch):
    """``drive`` (what ``train`` and a trial run) delivers a Ctrl-C that lands between two steps
    into the run where it stands, so the run answers it as one inside a step (here: its own
    message); one raised inside a step is the run's answer already."""
    from trimtab.rl.run import runner

    answered = []

    def run():
        try:
            while True:
                yield
        except KeyboardInterrupt:
            answered.append("run")
            raise RuntimeError("interrupted at its step") from None

    calls = {"n": 0}
    real_next = next

    def next_or_interrupt(steps):
        calls["n"] += 1
        if calls["n"] == 3:  # between the second and the third step: the run is suspended
            raise KeyboardInterrupt
        return real_next(steps)

    monkeypatch.setattr(runner, "next", next_or_interrupt, raising=False)
    with pytest.raises(RuntimeError, match="interrupted at its step"):
        runner.drive(run())
    assert answered == ["run"]

    def interrupted_inside():
        yield
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "next", real_next, raising=False)
    with pytest.raises(KeyboardInterrupt):
        runner.drive(interrupted_inside())


def test_the_report_pool_writes_reports_in_workers_and_lists_failures(tmp_path, base):
    """A population on a GPU hands its members' reports to worker processes: the report of a
    finished run is written there; a run directory whose report fails is listed, not raised."""
    from rl_helpers import tiny

    from trimtab.rl.run.population import ReportPool
    from trimtab.rl.run.runner import train

    run = tmp_path / "run"
    train(tiny(run))
    (run / "report.html").unlink()
    broken = tmp_path / "broken"
    broken.mkdir()
    with ReportPool(2) as pool:
        pool.submit(run)
        pool.submit(broken)
    assert (run / "report.html").is_file()
    assert [(d, e.split(":")[0]) for d, e in pool.failed] == [(broken, "ReportError")]
