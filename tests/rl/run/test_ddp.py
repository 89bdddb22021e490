"""``trimtab train`` under torchrun with 2 gloo processes on the CPU: a NaN in rank 1's targets
halts both ranks with one report naming rank 1's slot and step; both ranks resume the halted
run to its end, consistent at every checkpoint, rank 0 alone writing; a mid-fold checkpoint
refuses another number of processes; bad setups are named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trimtab.rl.configio import ConfigError
from trimtab.rl.run import checkpoint as ckpt
from trimtab.rl.run.ddp import Ranks, fold_state_for

WORKER = Path(__file__).with_name("_ddp_worker.py")
NAN_RANK, NAN_STEP, STEPS = 1, 9, 16  # as in the worker


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(WORKER), str(out)]  # fmt: skip
    # A rank left waiting in a collective would hang: the timeout makes that a failure.
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_two_ranks_resume_consistently_and_rank_0_alone_writes(runs) -> None:
    out, ranks = runs
    # the ranks' weights and state vectors are compared at every mid-fold checkpoint (steps
    # 4, 8 before the halt; 12 after the resume): a divergence raises there, so a finished
    # run is a consistent one; both ranks resumed their own fold state from one checkpoint
    for r in ranks:
        assert r["c"] == {"updates": STEPS, "halted": None, "world_size": 2}
    summary = json.loads((out / "b" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["updates"] == STEPS
    assert summary["halted"] is None
    assert len((out / "b" / "metrics.csv").read_text().splitlines()) == 1 + STEPS // 4


def test_a_nan_on_rank_1_halts_both_ranks_with_one_report(runs) -> None:
    out, ranks = runs
    assert ranks[0]["b"] == ranks[1]["b"]  # the same message on both ranks
    assert ranks[0]["b"] is not None and "'targets'" in ranks[0]["b"]
    assert f"on rank {NAN_RANK} of 2" in ranks[0]["b"]
    assert ranks[0]["b_report"] == ranks[1]["b_report"]  # the same records on both ranks
    fired = json.loads((out / "b_sentinel.json").read_text())["fired"]  # as rank 0 wrote it
    assert fired == ranks[0]["b_report"]
    assert (fired[0]["name"], fired[0]["step"], fired[0]["rank"]) == ("targets", NAN_STEP, 1)


def test_a_mid_fold_checkpoint_refuses_another_world_size(runs) -> None:
    out, _ = runs
    blob = ckpt.load(out / "midfold.pt", fingerprint=None)
    assert blob["fold_state"]["world_size"] == 2 and len(blob["fold_state"]["ranks"]) == 2
    with pytest.raises(ckpt.CheckpointError, match="written mid-fold by 2 process"):
        fold_state_for(blob["fold_state"], None, out / "midfold.pt", None)
    assert fold_state_for(None, None, "fold_0.pt", None) is None  # a fold checkpoint: any world


def test_bad_setups_are_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from trimtab.cli import main

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert main(["train", "--dist-backend", "gloo", "--out", str(tmp_path / "r")]) == 2
    assert "--dist-backend is for runs launched by torchrun" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="torchrun"):
        Ranks.init("cpu")
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # a CPU build of torch has no NCCL; a CUDA build refuses NCCL on the CPU
    with pytest.raises(ConfigError, match=r"not available in this torch build|runs on CUDA"):
        Ranks.init("cpu", "nccl")
    with pytest.raises(ConfigError, match="cuda:LOCAL_RANK"):
        Ranks.init("cuda:1")
    with pytest.raises(ConfigError, match="choose one of"):
        Ranks.init("cpu", "mpi")
    # more ranks on this node than GPUs: NCCL would refuse a shared GPU (no CUDA: said first)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(torch.cuda.device_count() + 1))
    with pytest.raises(ConfigError, match=r"NCCL refuses two ranks|sees no CUDA device"):
        Ranks.init("cuda", "nccl")
