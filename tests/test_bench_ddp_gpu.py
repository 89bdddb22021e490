"""The CUDA DDP benchmark runs end to end in its quick mode (a tiny net; 2 ranks, on NCCL or
sharing one GPU through gloo), so it cannot rot: every variant timed on every rank, the host
waits probed, the JSON record written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_ddp_gpu_quick(load_bench, tmp_path: Path) -> None:
    bench = load_bench("bench_ddp_gpu")
    out = tmp_path / "ddp_gpu.json"
    result = bench.main(["--quick", "--world", "2", "--out", str(out)])
    many = "world2_nccl" if torch.cuda.device_count() >= 2 else "world2_gloo"
    assert set(result["world1_nccl"]["variants"]) == {*bench.TIMED, "ddp_torch_default"}
    assert set(result[many]["variants"]) == {"ddp", "ddp_rc", "ddp_torch_default"}
    for v in result[many]["variants"].values():
        assert len(v["host_waits_per_rank"]) == 2 and v["probed_steps"] == 2 * 2
    assert json.loads(out.read_text())["commit"] == result["commit"]
