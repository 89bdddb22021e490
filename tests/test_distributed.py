"""trimtab.distributed on 2 gloo processes on the CPU: the same bounds and weights on both ranks
after N steps, a NaN on rank 1 halting both at one step with one report naming rank 1, and
sharded clip and optimizer statistics (by hand, and under FullyShardedDataParallel) equal to
those of one process holding whole tensors."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("_distributed_worker.py")
WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Run the worker on 2 processes once; every test reads their results."""
    tmp = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    args = [str(WORLD), str(tmp / "store"), str(tmp)]
    out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(r), *args], env=env, **out)
        for r in range(WORLD)
    ]
    # A rank left waiting in a collective would hang here: the timeout turns it into a failure.
    try:
        logs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log}"
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))  # type: ignore[union-attr]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)  # type: ignore[union-attr]
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))  # type: ignore[arg-type]
    return a == b


def test_bounds_and_weights_are_identical_on_both_ranks(ranks: list[dict]) -> None:
    r0, r1 = (r["consistent"] for r in ranks)
    assert r0["halted_at"] is None and r0["report"] == []
    assert not math.isnan(float(r0["bounds"][0])) and not math.isnan(float(r0["bounds"][1]))
    for key in ("bounds", "ema", "clip", "adam", "weights"):
        assert _equal(r0[key], r1[key]), key


def test_a_nan_on_rank_1_halts_both_ranks_with_one_report_naming_it(ranks: list[dict]) -> None:
    from _distributed_worker import NAN_RANK, NAN_STEP

    r0, r1 = (r["nan"] for r in ranks)
    assert r0["halted_at"] == r1["halted_at"] == NAN_STEP
    assert r0["report"] == r1["report"]
    first = r0["report"][0]
    assert (first["name"], first["step"], first["kind"], first["rank"]) == (
        "hidden", NAN_STEP, "nan", NAN_RANK,
    )  # fmt: skip


def test_sharded_clip_and_optimizer_statistics_match_one_process(ranks: list[dict]) -> None:
    s0, s1 = (r["sharded"] for r in ranks)
    for key in ("norms", "clip", "adam"):
        assert _equal(s0[key], s1[key]), key
    whole = s0["whole"]
    torch.testing.assert_close(s0["norms"], whole["norms"], rtol=1e-5, atol=0)
    torch.testing.assert_close(s0["clip"], whole["clip"], rtol=1e-5, atol=0)
    torch.testing.assert_close(s0["adam"], whole["adam"], rtol=1e-4, atol=1e-6, equal_nan=True)


def test_fsdp_with_rank_consistent_clip_and_adam_matches_one_process(ranks: list[dict]) -> None:
    f0, f1 = (r["fsdp"] for r in ranks)
    for key in ("clip", "adam", "weights"):
        assert _equal(f0[key], f1[key]), key
    whole = f0["whole"]
    torch.testing.assert_close(f0["weights"], whole["weights"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(f0["clip"], whole["clip"], rtol=1e-4, atol=0)
    torch.testing.assert_close(f0["adam"], whole["adam"], rtol=1e-3, atol=1e-6, equal_nan=True)


def test_a_missing_sync_is_refused_and_one_process_needs_a_group(tmp_path: Path) -> None:
    import torch.distributed as dist

    from trimtab.bounds import AdaptiveBounds
    from trimtab.distributed import RankConsistent

    with pytest.raises(RuntimeError, match="init_process_group"):
        RankConsistent()
    b = AdaptiveBounds(["a"])
    assert b.before_fold is None  # one process: no hook, nothing paid
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 's'}", rank=0, world_size=1)
    try:
        rc = RankConsistent().attach(b)
        b.measure("a", torch.randn(100))
        with pytest.raises(RuntimeError, match=r"before RankConsistent\.sync"):
            b.fold()
        rc.sync()
        b.fold()  # synced: folds (world 1: its own measurement)
        assert not math.isnan(float(b.values[0]))
        with pytest.raises(ValueError, match="already attached"):
            rc.attach(b)
        with pytest.raises(TypeError, match="AdaptiveBounds and Sentinel"):
            rc.attach(torch.zeros(1))
    finally:
        dist.destroy_process_group()
