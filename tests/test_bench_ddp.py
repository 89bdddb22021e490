"""The DDP benchmark runs end to end in its quick mode (a tiny market, 2 ranks under torchrun),
so it cannot rot: the run's summary, the samples counted over ranks and the JSON record."""

from __future__ import annotations

import json
from pathlib import Path


def test_bench_ddp_quick(load_bench, tmp_path: Path) -> None:
    bench = load_bench("bench_ddp")
    out = tmp_path / "ddp.json"
    result = bench.main(["--quick", "--layouts", "2x1", "--repeats", "1", "--out", str(out),
                         "--runs", str(tmp_path / "runs")])  # fmt: skip
    [row] = result["runs"]
    assert row["rc"] == 0 and row["world_size"] == 2 and row["updates_per_rank"] == 8
    assert row["samples"] == 2 * 8 * 16  # ranks x steps x batch: the same total as 1 x 16
    assert json.loads(out.read_text())["commit"] == result["commit"]
