"""The trainer benchmark runs end to end (tiny net, few steps) so it cannot rot."""

from __future__ import annotations

import json

from trimtab.rl.config import CPU_MEASURE_EVERY


def test_bench_trainer_quick(load_bench, tmp_path):
    bench = load_bench("bench_trainer")
    out = tmp_path / "trainer.json"
    result = bench.main(["--quick", "--device", "cpu", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["modes"].keys() == {"off", "fixed", "adaptive"} and saved["commit"]
    for r in saved["modes"].values():
        assert r["env_steps_per_s"] > 0 and r["grad_steps_per_s"] > 0
    assert result["guard_overhead"] > 0
    assert all(r["grad_step_cpu_ms"] > 0 for r in saved["modes"].values())  # CPU: CPU time too
    assert saved["guard_overhead_cpu_time"] > 0
    assert len(saved["guard_overhead_cpu_time_rounds"]) == 2  # one ratio per round


def test_bench_trainer_other_cadences_go_into_a_named_record(load_bench, tmp_path):
    bench = load_bench("bench_trainer")
    out = tmp_path / "trainer.json"
    out.write_text('{"earlier": {"kept": true}}')
    bench.main(["--quick", "--device", "cpu", "--out", str(out), "--every", "1", "--key", "k"])
    saved = json.loads(out.read_text())
    assert saved["earlier"] == {"kept": True}
    rec = saved["k"]
    assert "adaptive, measure_every=1" in rec["modes"]
    assert rec["measure_every"] == CPU_MEASURE_EVERY  # "auto" on the CPU
    assert rec["guard_overhead_cpu_time [adaptive, measure_every=1]"] > 0
    assert rec["command"].endswith("--key k")
