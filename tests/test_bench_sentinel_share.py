"""The sentinel-share benchmark runs end to end (a few steps) so it cannot rot."""

from __future__ import annotations

import json


def test_bench_sentinel_share_quick(load_bench, tmp_path):
    bench = load_bench("bench_sentinel_share")
    out = tmp_path / "share.json"
    bench.main(["--quick", "--modes", "off", "--out", str(out)])
    (record,) = json.loads(out.read_text()).values()
    assert record["commit"] and record["quick"]
    times = record["modes"]["off"]["cpu_ms_per_step"]
    assert set(times) == set(bench.VARIANTS) and all(t > 0 for t in times.values())
    assert len(record["modes"]["off"]["rounds_ms"]["full"]) == 2
    from trimtab.rl.agent.checks import Checks
    from trimtab.sentinel import Sentinel

    assert Sentinel.check.__name__ == "check" and Checks._fold.__name__ == "_fold"  # restored
