"""``trimtab train`` under torchrun on CUDA: every rank's learn step free of host syncs, and a
NaN in rank 1's targets halting both ranks with one report naming rank 1's slot and step, no
rank left waiting. One process per GPU on NCCL; on a one-GPU machine the NaN test runs 2 ranks
sharing the GPU through gloo and the sync test 1 rank on NCCL (gloo's CUDA collectives go
through host memory: benchmarks/bench_ddp_gpu.py measures what they cost the host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

WORKER = Path(__file__).with_name("_ddp_gpu_worker.py")
NAN_RANK, NAN_STEP = 1, 9  # as in the worker


def _launch(mode: str, procs: int, out: Path) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(procs), str(WORKER), mode, str(out)]  # fmt: skip
    # A rank left waiting in a collective would hang: the timeout makes that a failure.
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(procs)]


def test_a_nan_on_rank_1_halts_both_ranks_with_one_report(tmp_path: Path) -> None:
    ranks = _launch("nan", 2, tmp_path)
    expected = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    assert [r["backend"] for r in ranks] == [expected, expected]
    message = ranks[0]["halted"]
    assert message is not None and ranks[1]["halted"] == message  # one report, both ranks
    assert "'targets'" in message and f"on rank {NAN_RANK} of 2" in message
    assert ranks[0]["report"] == ranks[1]["report"]
    first = ranks[0]["report"][0]
    assert (first["name"], first["step"], first["rank"]) == ("targets", NAN_STEP, NAN_RANK)
    fired = json.loads((tmp_path / "nan" / "sentinel.json").read_text())["fired"]
    assert fired == ranks[0]["report"]  # as rank 0 wrote it


def test_every_ranks_learn_step_is_sync_free(tmp_path: Path) -> None:
    from _ddp_gpu_worker import SYNC_STEPS, WARMUP

    procs = min(2, torch.cuda.device_count())  # NCCL: one rank per GPU
    ranks = _launch("sync", procs, tmp_path)
    for r in ranks:
        assert r["backend"] == "nccl" and r["halted"] is None and r["updates"] == SYNC_STEPS
        # set_sync_debug_mode("error") raised in none of the steps after the warm-up
        assert r["checked"] == list(range(WARMUP + 1, SYNC_STEPS + 1)), r["checked"]
        # no host sync that the debug mode misses either (DDP's runtime statistics wait on
        # CUDA events every 100th iteration by default: AgentDDP turns them off), counted by
        # torch's GPU trace, which saw the control's event and stream synchronisations
        assert r["control"] == {"event": 1, "stream": 1, "device": 0}, r["control"]
        assert r["in_steps"] == {"event": 0, "stream": 0, "device": 0}, r["in_steps"]
        # and the host ran ahead of a device sleep through each timed step
        sleep = min(r["sleep_ms"])
        assert max(r["first_ms"]) < sleep / 2, (r["first_ms"], sleep)
