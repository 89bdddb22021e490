"""The kernel variants a first CUDA run compiles in worker processes (trimtab.kernels.precompile):
the manifest's reading and sharing, its agreement with the kernels it names, the workers'
reports, and on the GPU that a precompiled variant is what the run's JIT then loads."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trimtab.kernels import precompile
from trimtab.rl.config import RunConfig, TrainConfig
from trimtab.rl.configio import ConfigError
from trimtab.rl.run.runner import start_precompile


def test_share_deals_the_longest_compiles_first_to_the_least_loaded_worker() -> None:
    entries = [{"kernel": f"m:k{i}", "specialization": "{}", "seconds": s}
               for i, s in enumerate([1.0, 8.0, 2.0, 7.0, 1.0])]  # fmt: skip
    shares = precompile.share(entries, 2)
    loads = sorted(sum(e["seconds"] for e in part) for part in shares)
    assert loads == [9.0, 10.0]  # 8+1 / 7+2+1 (greedy, longest first)
    assert sorted(e["kernel"] for part in shares for e in part) == sorted(
        e["kernel"] for e in entries
    )
    # more workers than variants: one variant each, no empty share
    assert [len(p) for p in precompile.share(entries[:2], 8)] == [1, 1]


@pytest.mark.parametrize(
    "body, says",
    [
        ("{not json", "not a readable manifest"),
        ('{"triton": "3.6.0"}', "no 'variants' list"),
        ('{"variants": [{"kernel": "no_colon", "specialization": "{}"}]}', "variant 0 needs"),
        ('{"variants": [{"kernel": "m:k"}]}', "variant 0 needs"),
    ],
)
def test_a_broken_manifest_is_refused_naming_the_file(tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "triton-3.6.0-cuda-90.json"
    path.write_text(body)
    with pytest.raises(ValueError, match=says) as e:
        precompile.read_manifest(path)
    assert str(path) in str(e.value) and "record_variants.py" in str(e.value)


def _python_function(name: str):
    """The plain Python function behind a manifest's ``module:qualname`` (a JITFunction on a
    GPU, an interpreted function under TRITON_INTERPRET=1)."""
    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not inspect.isfunction(obj):
        obj = obj.fn
    return obj


MANIFESTS = sorted(precompile.MANIFESTS.glob("triton-*.json"))


def test_the_package_ships_a_manifest() -> None:
    assert MANIFESTS, f"no manifest in {precompile.MANIFESTS}"


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_each_manifest_names_kernels_that_exist_with_their_parameters(path: Path) -> None:
    """A manifest goes stale when a kernel is renamed or its parameters change: its variants
    would then compile something no run launches (benchmarks/record_variants.py again)."""
    body = json.loads(path.read_text())
    assert path.name == precompile.manifest_name(body["triton"], body["backend"], body["arch"])
    variants = precompile.read_manifest(path)
    assert variants
    for v in variants:
        assert v["kernel"].startswith("trimtab.kernels.")
        spec = json.loads(v["specialization"])
        params = list(inspect.signature(_python_function(v["kernel"])).parameters)
        assert list(spec["signature"]) == params, v["kernel"]
        assert spec["name"].endswith(v["kernel"].partition(":")[2]), v["kernel"]


def test_a_worker_reports_a_kernel_it_cannot_find_and_goes_on() -> None:
    out = precompile._compile_share(
        [{"kernel": "trimtab.kernels.clamp:_no_such_kernel", "specialization": "{}"}]
    )
    assert out[0]["kernel"] == "trimtab.kernels.clamp:_no_such_kernel"
    assert "AttributeError" in out[0]["error"]


def test_without_a_manifest_for_this_triton_and_gpu_nothing_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precompile, "_target", lambda: ("9.9.9", "cuda", 75))
    (tmp_path / "triton-3.6.0-cuda-90.json").write_text('{"variants": []}')
    job = precompile.Precompile.start(directory=tmp_path)
    done = job.wait()
    assert job.procs == []
    assert "Triton 9.9.9 on cuda 75" in done["skipped"]
    assert "triton-3.6.0-cuda-90.json" in done["skipped"]


def test_the_workers_failures_come_back_as_lines_and_leave_no_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precompile, "_target", lambda: ("9.9.9", "cuda", 75))
    monkeypatch.setattr(precompile, "_cache_dir", lambda: tmp_path / "cache")
    variants = [{"kernel": f"trimtab.kernels.clamp:_missing{i}", "specialization": "{}",
                 "seconds": 1.0} for i in range(3)]  # fmt: skip
    (tmp_path / "triton-9.9.9-cuda-75.json").write_text(json.dumps({"variants": variants}))
    job = precompile.Precompile.start(workers=2, directory=tmp_path)
    assert job.workers == 2  # real processes: python -m trimtab.kernels.precompile
    done = job.wait()
    assert done["variants"] == 3 and done["compiled"] == 0 and done["workers"] == 2
    assert sorted(f.split(":")[1] for f in done["failed"]) == [
        "_missing0",
        "_missing1",
        "_missing2",
    ]
    stamp = precompile._stamp(tmp_path / "triton-9.9.9-cuda-75.json", variants)
    assert not stamp.exists()  # no stamp: the next run tries again


def test_precompile_applies_to_cuda_runs_only() -> None:
    cfg = TrainConfig()
    assert start_precompile(cfg, torch.device("cpu")) is None
    with pytest.raises(ConfigError, match="precompile"):
        RunConfig(precompile="sometimes")  # type: ignore[arg-type]


@pytest.mark.gpu
def test_a_precompiled_variant_is_what_the_run_then_loads(tmp_path: Path) -> None:
    """Record a kernel's variants in one process, precompile them into an empty cache from
    worker processes, then launch the kernel in a third process that starts as a run does
    (``Precompile.start``: the stamp is there, no worker starts; the keys are settled): every
    variant it needs is a cache hit (Triton's compile listener says so), none compiled."""
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        import torch, triton
        from trimtab.kernels import precompile
        from trimtab.clamp import clamp_finite_
        from trimtab.quantile import abs_quantile

        mode, where = sys.argv[1], Path(sys.argv[2])

        def launch():
            x = torch.randn(100_000, device="cuda")
            x[3] = float("nan")
            bound = abs_quantile(x, 0.99, exact=True)
            clamp_finite_(x, bound.reshape(1))
            torch.cuda.synchronize()

        if mode == "record":
            with precompile.record() as entries:
                launch()
            precompile.write_manifest(entries, "test", where)
            print(len(entries))
        elif mode == "precompile":
            print(json.dumps(precompile.Precompile.start(directory=where).wait()))
        else:
            skipped = precompile.Precompile.start(directory=where).wait()
            assert "already compiled" in skipped["skipped"], skipped
            hits = []
            def listener(*, cache_hit, **kw):
                hits.append(cache_hit)
            triton.knobs.compilation.listener = listener
            launch()
            print(json.dumps(hits))
        """
    )
    (tmp_path / "probe.py").write_text(script)

    def run(mode: str, cache: str) -> str:
        env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / cache)}
        env.pop("TRITON_INTERPRET", None)
        proc = subprocess.run([sys.executable, str(tmp_path / "probe.py"), mode, str(tmp_path)],
                              capture_output=True, text=True, env=env, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    assert int(run("record", "cache_a")) >= 1
    done = json.loads(run("precompile", "cache_b"))
    assert done["failed"] == [] and done["compiled"] == done["variants"] >= 1
    hits = json.loads(run("launch", "cache_b"))
    assert hits and all(hits), hits


def test_a_second_process_waits_for_the_first_instead_of_compiling_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs started together on one machine (--seeds, a sweep) share Triton's cache: while one
    holds the lock its workers compile, another starts none and waits for it; once the first
    is done (a stamp written) a later run skips, and after a failed compile the waiter says so."""
    monkeypatch.setattr(precompile, "_target", lambda: ("9.9.9", "cuda", 75))
    monkeypatch.setattr(precompile, "_cache_dir", lambda: tmp_path / "cache")
    variants = [{"kernel": "trimtab.kernels.clamp:_missing", "specialization": "{}",
                 "seconds": 1.0}]  # fmt: skip
    (tmp_path / "triton-9.9.9-cuda-75.json").write_text(json.dumps({"variants": variants}))
    first = precompile.Precompile.start(workers=1, directory=tmp_path)
    second = precompile.Precompile.start(workers=1, directory=tmp_path)
    assert first.workers == 1 and second.workers == 0  # the second started no worker
    assert first.wait()["failed"]  # the first's worker failed: no stamp
    done = second.wait()  # the lock is free again
    assert "compiled them with errors" in done["skipped"]
    # the first compiled cleanly: a stamp, and the next run skips at once
    stamp = precompile._stamp(tmp_path / "triton-9.9.9-cuda-75.json", variants)
    stamp.write_text("compiled\n")
    again = precompile.Precompile.start(workers=1, directory=tmp_path)
    assert again.workers == 0 and "already compiled" in again.wait()["skipped"]


def test_cancel_stops_the_workers_and_frees_the_lock(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(precompile, "_target", lambda: ("9.9.9", "cuda", 75))
    monkeypatch.setattr(precompile, "_cache_dir", lambda: tmp_path / "cache")
    variants = [{"kernel": "trimtab.kernels.clamp:_missing", "specialization": "{}"}]
    (tmp_path / "triton-9.9.9-cuda-75.json").write_text(json.dumps({"variants": variants}))
    job = precompile.Precompile.start(workers=1, directory=tmp_path)
    procs = [p for p, _, _ in job.procs]
    job.cancel()
    assert all(p.poll() is not None for p in procs) and job.procs == []
    after = precompile.Precompile.start(workers=1, directory=tmp_path)
    assert after.workers == 1  # the lock was freed
    after.wait()


def test_a_precompile_that_cannot_start_warns_and_the_run_goes_on(monkeypatch, capsys) -> None:
    """A speed-up only: a broken manifest (or Triton's driver) gives a warning, never an error."""
    import trimtab.rl.run.runner as runner

    def broken(*args, **kwargs):
        raise ValueError("manifest.json: not a readable manifest")

    monkeypatch.setattr(precompile.Precompile, "start", classmethod(broken))
    monkeypatch.setattr(runner, "triton_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    cfg = TrainConfig()
    assert runner.start_precompile(cfg, torch.device("cuda")) is None
    err = capsys.readouterr().err
    assert "precompile did not start (ValueError: manifest.json" in err
    assert "compiles its kernels as it launches them" in err


@pytest.mark.parametrize("fails", ["adapter", "memory"])
def test_a_run_that_fails_before_it_starts_cancels_the_precompile(tmp_path, monkeypatch, fails):
    """An error while the run sets up (its data, its memory check) stops the workers, closes
    what was opened, and leaves no run directory."""
    import trimtab.rl.run.runner as runner

    events: list[str] = []

    class Job:
        def cancel(self) -> None:
            events.append("cancel")

    class Adapter:
        def summary(self, rows):
            return {}

        def close(self) -> None:
            events.append("close")

    def adapter(cfg, device):
        if fails == "adapter":
            raise ValueError("data.csv: not a price file")
        return Adapter()

    def memory(cfg, adapter, device):
        raise ValueError("does not fit")

    monkeypatch.setattr(runner, "start_precompile", lambda cfg, device: Job())
    monkeypatch.setattr(runner, "make_adapter", adapter)
    monkeypatch.setattr(runner, "check_memory", memory)
    cfg = TrainConfig(run=RunConfig(out=str(tmp_path / "run")))
    with pytest.raises(ValueError, match="not a price file" if fails == "adapter" else "fit"):
        runner.train(cfg)
    assert events == (["cancel"] if fails == "adapter" else ["close", "cancel"])
    assert not (tmp_path / "run").exists()


def _merge_before_keying(self, func) -> None:  # type: ignore[no-untyped-def]
    """Triton 3.6's DependenciesFinder._update_hash: a callee's globals are merged before its
    key is computed, so a callee keyed for the first time through its caller adds none."""
    self.used_global_vals.update(func.used_global_vals)
    self.hasher.update((func.cache_key + str(getattr(func, "noinline", False))).encode("utf-8"))


@pytest.mark.parametrize("order", [("kernel_a", "kernel_b"), ("inner", "middle", "kernel_a")])
def test_settled_keys_do_not_depend_on_what_was_keyed_first(monkeypatch, order) -> None:
    """Under Triton 3.6's way of merging a callee's globals, a kernel keyed before its helpers
    gets another key than one keyed after them (which is how workers compiling in another order
    than the run wrote cache entries the run never read); settle_keys gives one key either way."""
    from triton.runtime import jit

    jc = pytest.importorskip("tests._jit_chain")
    monkeypatch.setattr(jit.DependenciesFinder, "_update_hash", _merge_before_keying)

    def fresh() -> None:
        for f in jc.FUNCTIONS:
            f.hash, f.used_global_vals = None, {}

    fresh()
    first = {name: getattr(jc, name).cache_key for name in order}
    fresh()
    helpers_first = {name: getattr(jc, name).cache_key for name in ("inner", "middle", *order)}
    if order[0] == "kernel_a":  # the order dependence this guards against, reproduced
        assert first["kernel_a"] != helpers_first["kernel_a"]
    settled = []
    for keyed in (order, tuple(reversed(order))):
        fresh()
        for name in keyed:
            assert getattr(jc, name).cache_key  # keyed in this order
        precompile.settle_keys([jc.kernel_a, jc.kernel_b])
        settled.append([f.cache_key for f in jc.FUNCTIONS])
        assert {n for n, _ in jc.kernel_a.used_global_vals} == {"SCALE", "SHIFT"}
    assert settled[0] == settled[1]
    assert settled[0][2] == helpers_first["kernel_a"]  # the key with every callee's globals
    fresh()


def test_a_kernel_that_is_gone_leaves_the_others_keys_settled(monkeypatch) -> None:
    """The stamp and the workers settle the kernels that resolve even where the manifest also
    names one that does not (it is reported where it is used, as missing)."""
    from triton.runtime import jit

    jc = pytest.importorskip("tests._jit_chain")
    monkeypatch.setattr(jit.DependenciesFinder, "_update_hash", _merge_before_keying)
    for f in jc.FUNCTIONS:
        f.hash, f.used_global_vals = None, {}
    entries = [{"kernel": "tests._jit_chain:kernel_a"}, {"kernel": "trimtab.kernels.gone:k"}]
    kernels = precompile._settled(entries)
    assert kernels == {"tests._jit_chain:kernel_a": jc.kernel_a, "trimtab.kernels.gone:k": None}
    assert {n for n, _ in jc.kernel_a.used_global_vals} == {"SCALE", "SHIFT"}
    for f in jc.FUNCTIONS:
        f.hash, f.used_global_vals = None, {}
