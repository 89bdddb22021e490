"""benchmarks/population.py: the seeds as one population, as separate processes and one after
another in one process, each row with every seed's greedy return, saved row by row into one
record."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.mark.slow
def test_quick_population_beside_processes(load_bench, tmp_path):
    bench = load_bench("population")
    out = tmp_path / "population.json"
    got = bench.main(["--quick", "--device", "cpu", "--seeds", "1", "2", "--out", str(out),
                      "--key", "k", "--runs", str(tmp_path / "runs"),
                      "--ways", "population", "processes", "serial"])  # fmt: skip
    ways = [r["way"] for r in got["rows"]]
    assert ways == ["population", "processes", "serial"]
    for row in got["rows"]:
        assert row["rc"] == 0 and [s["seed"] for s in row["seeds"]] == [1, 2]
        assert all(s["greedy_return"] > 0 and s["updates"] > 0 for s in row["seeds"])
    # one population is each seed alone: the same greedy returns every way (the CPU)
    pop, procs, serial = ([s["greedy_return"] for s in r["seeds"]] for r in got["rows"])
    assert pop == procs == serial
    record = json.loads(out.read_text())["k"]
    assert [s["way"] for s in record["summary"]] == ways and record["seeds"] == [1, 2]


@pytest.mark.slow
def test_quick_probe_population_rows(load_bench, tmp_path):
    """benchmarks/experiments/probe_population.py: a population row per table-cache size and
    stream arrangement, and the seeds alone, each seed's greedy and training returns."""
    probe = load_bench("probe_population")
    out = tmp_path / "probe.json"
    got = probe.main(["--quick", "--device", "cpu", "--seeds", "1", "2", "--alone", "2",
                      "--table-cache", "1", "64", "--streams", "own", "serial",
                      "--out", str(out), "--key", "k",
                      "--runs", str(tmp_path / "runs")])  # fmt: skip
    assert [r["way"] for r in got["rows"]] == [
        "population, table caches 1, streams own",
        "population, table caches 1, streams serial",
        "population, table caches 64, streams own",
        "population, table caches 64, streams serial",
        "alone, one after another",
    ]
    for row in got["rows"]:
        assert row["rc"] == 0, row.get("stderr")
        assert all(s["greedy_return"] > 0 and "train_return_last100" in s for s in row["seeds"])
    # the CPU: the same numbers whatever the caches' size, and seed 2 alone as in a population
    tiny, tiny_serial, default, serial, alone = (
        [s["greedy_return"] for s in r["seeds"]] for r in got["rows"]
    )
    assert tiny == tiny_serial == default == serial and alone == default[1:]
    assert json.loads(out.read_text())["k"]["seeds"] == [1, 2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_member_step_counts_the_kernels_of_a_batched_env_step(load_bench, tmp_path):
    """benchmarks/experiments/profile_member_step.py --quick: a run's steps under the profiler,
    its kernels counted (a captured collection and learn step launch dozens)."""
    bench = load_bench("profile_member_step")
    out = tmp_path / "m.json"
    result = bench.main(["--quick", "--out", str(out), "--key", "t"])
    assert result["kernels_per_step"] > 20 and result["kernel_us_per_step"] > 0
    assert json.loads(out.read_text())["t"]["device_name"] == torch.cuda.get_device_name()


def test_profile_population_profiles_a_window_of_the_members_turns(load_bench, tmp_path):
    """benchmarks/experiments/profile_population.py --quick on the CPU: a population of two run
    by the CLI, its turns counted, one window profiled and the next timed."""
    bench = load_bench("profile_population")
    out = tmp_path / "p.json"
    result = bench.main(["--quick", "--device", "cpu", "--out", str(out), "--key", "t"])
    assert result["members"] == 2 and result["us_per_turn"] > 0
    assert result["profiled_us_per_turn"] > 0
    names = [r["function"] for r in result["cprofile"]["cumtime"]]
    assert any("learn_from" in n for n in names), names[:10]
    record = json.loads(out.read_text())["t"]
    assert record["command"].startswith("benchmarks/experiments/profile_population.py --quick")


def test_profile_population_says_when_the_run_ends_before_its_windows(load_bench):
    bench = load_bench("profile_population")
    with pytest.raises(SystemExit, match="before the windows closed"):
        bench.main(["--device", "cpu", "--config", str(bench.CONFIG), "--seeds", "1",
                    "--skip", "100000", "--steps", "1", "--set", "gym.total_steps=256",
                    "--set", "gym.learning_starts=64", "--set", "gym.eval_episodes=2",
                    "--set", "env.n_envs=4", "--set", "gym.train_every=4",
                    "--set", "agent.batch_size=16"])  # fmt: skip
