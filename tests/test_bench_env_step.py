"""The env-step benchmark's --quick mode runs end to end on the CPU (the references; the
kernels need CUDA), so the script cannot rot."""

from __future__ import annotations

import json


def test_quick_run_writes_json(load_bench, tmp_path, capsys):
    bench = load_bench("bench_env_step")
    out = tmp_path / "env_step.json"
    bench.main(["--quick", "--device", "cpu", "--out", str(out), "--reps", "2"])
    report = json.loads(out.read_text())
    assert report["benchmark"] == "env_step" and report["quick"] is True
    rows = report["rows"]
    assert {(r["env"], r["dtype"]) for r in rows} == {
        (env, dt) for env in ("market", "cartpole") for dt in ("torch.float32", "torch.float64")
    }
    assert all(r["impl"] == "torch" and r["n_envs"] == 64 for r in rows)
    assert all(r["ms"] > 0 and r["gbps"] > 0 and r["speedup_vs_torch"] == 1.0 for r in rows)
    market64 = next(r for r in rows if r["env"] == "market" and r["dtype"] == "torch.float64")
    assert market64["bytes"] == bench.market_bytes(64, bench.torch.float64, True) > 64 * 400
    assert "| market | torch | 64 |" in capsys.readouterr().out


def test_quick_run_writes_nothing_without_out(load_bench, tmp_path, monkeypatch):
    bench = load_bench("bench_env_step")
    monkeypatch.chdir(tmp_path)
    report = bench.main(["--quick", "--device", "cpu", "--reps", "1"])
    assert len(report["rows"]) == 4 and not list(tmp_path.iterdir())
