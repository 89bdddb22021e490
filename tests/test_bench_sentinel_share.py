"""The sentinel-share benchmark runs end to end (a few steps) so it cannot rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).parents[1] / "benchmarks" / "bench_sentinel_share.py"


def test_bench_sentinel_share_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_sentinel_share", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "share.json"
    bench.main(["--quick", "--modes", "off", "--out", str(out)])
    (record,) = json.loads(out.read_text()).values()
    assert record["commit"] and record["quick"]
    times = record["modes"]["off"]["cpu_ms_per_step"]
    assert set(times) == set(bench.VARIANTS) and all(t > 0 for t in times.values())
    assert len(record["modes"]["off"]["rounds_ms"]["full"]) == 2
    from trimtab.rl.checks import Checks
    from trimtab.sentinel import Sentinel

    assert Sentinel.check.__name__ == "check" and Checks._fold.__name__ == "_fold"  # restored
