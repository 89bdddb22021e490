"""The CartPole op-count probe runs end to end and says where adaptive's extra ops are."""

from __future__ import annotations

import json


def test_probe_cartpole_ops_counts_acts_and_both_kinds_of_learn_step(load_bench, tmp_path):
    bench = load_bench("probe_cartpole_ops")
    out = tmp_path / "ops.json"
    bench.main(["--out", str(out), "--key", "t"])
    rec = json.loads(out.read_text())["t"]
    off, adaptive = rec["modes"]["off"], rec["modes"]["adaptive"]
    assert off["measure_every"] == 1 and off["ops_other_step"] == off["ops_measuring_step"]
    assert adaptive["measure_every"] > 1
    # a measuring step folds the bounds, the clip and Adam's statistics: many more ops
    assert adaptive["ops_measuring_step"] > 2 * adaptive["ops_other_step"]
    assert adaptive["ops_per_act"] > off["ops_per_act"] > 0  # the trunk clamp
    mean = sum(adaptive["per_step_by_file"].values())
    assert abs(mean - adaptive["ops_per_step"]) < 1e-6 * mean
