"""A machine's first CUDA run, compiled at once: the Triton kernel variants a run needs, compiled
in worker processes into Triton's on-disk cache before the run launches them.

A first ``trimtab train --device cuda`` compiles about twenty kernel variants, each in the
thread that first launches it, one after another. Compiling in threads does not overlap them
(Triton's compiler holds the GIL: two compiles in two threads took 2.2x as long as one); separate
processes do, which is how PyTorch's Inductor compiles its own Triton kernels (a pool of
compile workers). What a worker needs is what Triton itself serialises for a variant (its
``jit_post_compile_hook`` hands it over; ``JITFunction.preload`` compiles from it): the kernel's
signature, its constexprs, its argument attributes (16-byte divisibility) and its options. From
those the worker builds the very source and options the run's own JIT builds, so its compile
lands under the cache key the run looks up, and the run loads the binary instead of compiling.

A *manifest* lists the variants of one run, recorded by ``benchmarks/record_variants.py``
on a machine; it is valid for one Triton version and one GPU architecture (Triton's serialised
form and its options change with both), and is named after them:
``variants/triton-<version>-<backend>-<arch>.json``. Where no manifest matches, nothing is
precompiled and the run compiles as it goes (the reason is in its ``run.log``). A variant the
manifest names but the run does not use costs a worker's time, not the run's; a variant the run
uses but the manifest lacks is compiled by the run, as without a manifest.

A leaf (design invariant 8): imports only the standard library, torch and Triton; the kernels a
manifest names are imported by name in the workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFESTS",
    "Precompile",
    "manifest_for",
    "read_manifest",
    "record",
    "resolve_kernel",
    "settle_keys",
    "write_manifest",
]

#: where the package's manifests live
MANIFESTS = Path(__file__).with_name("variants")
#: the modules whose kernels a manifest holds (Triton's own or a user's are left to their JIT)
_OURS = "trimtab."


def manifest_name(version: str, backend: str, arch: object) -> str:
    return f"triton-{version}-{backend}-{arch}.json"


def _target() -> tuple[str, str, Any]:
    """``(triton version, backend, arch)`` of the current device."""
    import triton
    from triton.runtime import driver

    target = driver.active.get_current_target()
    return triton.__version__, str(target.backend), target.arch


def manifest_for(directory: Path = MANIFESTS) -> tuple[Path | None, str]:
    """The manifest of this Triton version and the current device's architecture, and a
    sentence saying which it is or why there is none."""
    version, backend, arch = _target()
    path = directory / manifest_name(version, backend, arch)
    if path.is_file():
        return path, f"{path.name}"
    have = sorted(p.name for p in directory.glob("triton-*.json")) if directory.is_dir() else []
    return None, (
        f"no manifest of kernel variants for Triton {version} on {backend} {arch} (have: "
        f"{', '.join(have) or 'none'}); the run compiles its kernels as it launches them"
    )


# --- recording ---------------------------------------------------------------------------------
@contextlib.contextmanager
def record() -> Iterator[list[dict[str, Any]]]:
    """Collect every trimtab kernel variant compiled (or loaded from the disk cache) in this
    process while the block runs: ``{"kernel": "module:qualname", "specialization": <Triton's
    JSON>, "seconds": <compile seconds, 0.0 on a cache hit>}``, one per variant, in order."""
    from triton import knobs

    out: list[dict[str, Any]] = []
    seconds: list[float] = []
    old_hook, old_listener = knobs.runtime.jit_post_compile_hook, knobs.compilation.listener

    def listener(*, times: Any, cache_hit: bool, **kw: Any) -> None:
        total = times.ir_initialization + sum(us for _, us in times.lowering_stages)
        seconds.append(0.0 if cache_hit else (total + times.store_results) / 1e6)
        if old_listener is not None:
            old_listener(times=times, cache_hit=cache_hit, **kw)

    def hook(*, fn: Any, compile: dict[str, Any], **kw: Any) -> Any:
        if fn.module.startswith(_OURS):
            entry = {"kernel": f"{fn.module}:{fn.name}",
                     "specialization": compile["specialization_data"],
                     "seconds": round(seconds[-1], 3) if seconds else 0.0}  # fmt: skip
            if entry["specialization"] not in {e["specialization"] for e in out}:
                out.append(entry)
        return None if old_hook is None else old_hook(fn=fn, compile=compile, **kw)

    knobs.runtime.jit_post_compile_hook, knobs.compilation.listener = hook, listener
    try:
        yield out
    finally:
        knobs.runtime.jit_post_compile_hook = old_hook
        knobs.compilation.listener = old_listener


def write_manifest(entries: list[dict[str, Any]], source: str, directory: Path = MANIFESTS) -> Path:
    """Write ``entries`` (from :func:`record`) as the manifest of this Triton version and
    device architecture; ``source``: what run they came from. Returns its path."""
    version, backend, arch = _target()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / manifest_name(version, backend, arch)
    body = {"triton": version, "backend": backend, "arch": arch, "source": source,
            "variants": entries}  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """A manifest's variants; ``ValueError`` naming the file and what is wrong in it."""
    try:
        body = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path}: not a readable manifest of kernel variants ({e}); "
            "record it again with benchmarks/record_variants.py"
        ) from None
    variants = body.get("variants") if isinstance(body, dict) else None
    if not isinstance(variants, list):
        raise ValueError(f"{path}: no 'variants' list; record it again with "
                         "benchmarks/record_variants.py")  # fmt: skip
    for i, v in enumerate(variants):
        ok = (isinstance(v, dict) and isinstance(v.get("kernel"), str) and ":" in v["kernel"]
              and isinstance(v.get("specialization"), str))  # fmt: skip
        if not ok:
            raise ValueError(f"{path}: variant {i} needs 'kernel' (module:qualname) and "
                             "'specialization' (Triton's JSON); record it again with "
                             "benchmarks/record_variants.py")  # fmt: skip
    return variants


def resolve_kernel(name: str) -> Any:
    """The ``triton.JITFunction`` a manifest names (``module:qualname``)."""
    from triton.runtime.jit import JITFunction

    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):  # an autotuner's or heuristic's
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{name} is a {type(obj).__name__}, not a Triton kernel")
    return obj


def settle_keys(kernels: list[Any]) -> None:
    """Compute the cache keys of ``kernels`` and of every jit function their modules reach,
    the same whatever was keyed before in this process.

    A kernel's key in Triton's cache hashes the global constants of the jit functions it calls.
    Triton 3.6 takes a callee's constants into the caller's key only when the callee's own key
    already exists, so a kernel keyed before its helpers (their first use came through it) gets
    another key than one keyed after them: a worker that compiles the helpers' kernels in
    another order than the run writes entries the run never looks up. Here every key is
    recomputed until none changes: each function then holds the constants of every callee,
    as later Triton versions compute them at once (where the keys never change, two passes).
    """
    from triton.runtime.jit import JITFunction

    fns: dict[int, Any] = {}
    seen: set[int] = set()
    todo = [k.fn.__globals__ for k in kernels]
    while todo:
        scope = todo.pop()
        if id(scope) in seen:
            continue
        seen.add(id(scope))
        for value in list(scope.values()):
            if isinstance(value, JITFunction) and id(value) not in fns:
                fns[id(value)] = value
                todo.append(value.fn.__globals__)
    ordered = sorted(fns.values(), key=lambda f: (f.fn.__module__, f.fn.__qualname__))
    if not all(hasattr(f, "hash") for f in ordered):  # a Triton that keys otherwise
        return
    previous: list[str] | None = None
    for _ in range(len(ordered) + 2):  # each pass completes one more level of calls
        for f in ordered:
            f.hash = None
        keys = [f.cache_key for f in ordered]
        if keys == previous:
            return
        previous = keys


def _settled(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The kernels ``entries`` name (sorted by name; None for one that does not resolve), their
    keys settled (:func:`settle_keys`) together: a kernel that is gone leaves the others'
    keys settled. Never raises: a key left unsettled only costs a cache miss."""
    kernels: dict[str, Any] = {}
    for name in sorted({e["kernel"] for e in entries}):
        try:
            kernels[name] = resolve_kernel(name)
        except Exception:  # reported where it is used (the stamp, the worker's line)
            kernels[name] = None
    with contextlib.suppress(Exception):
        settle_keys([k for k in kernels.values() if k is not None])
    return kernels


def _cache_dir() -> Path:
    """Triton's on-disk kernel cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``)."""
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None and getattr(knobs.cache, "dir", None):
        return Path(knobs.cache.dir)
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def _stamp(manifest: Path, entries: list[dict[str, Any]]) -> Path:
    """The file in Triton's cache that says this manifest was compiled into it: named by a hash
    of the manifest and of the source of every kernel it names (a changed kernel compiles
    again)."""
    h = hashlib.sha256(manifest.read_bytes())
    for name, kernel in _settled(entries).items():
        key = None
        if kernel is not None:
            with contextlib.suppress(Exception):
                key = kernel.cache_key
        h.update((key or f"missing {name}").encode())  # a kernel gone: no stamp can hold
    return _cache_dir() / "trimtab-precompiled" / h.hexdigest()[:32]


def _try_lock(path: Path, block: bool = False) -> Any:
    """``path`` opened and locked exclusively (``flock``; the open file holds the lock until it
    is closed, or the process ends); False when another process holds it and ``block`` is
    False; None where no lock can be taken (a read-only cache, no ``fcntl``): go on unlocked."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fh = path.open("a")
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX if block else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return False
    except OSError:
        fh.close()
        return None
    return fh


# --- compiling ---------------------------------------------------------------------------------
def share(entries: list[dict[str, Any]], workers: int) -> list[list[dict[str, Any]]]:
    """``entries`` dealt to ``workers`` lists, longest recorded compile first, each to the list
    with the least recorded time so far (greedy; empty lists dropped)."""
    bins: list[list[dict[str, Any]]] = [[] for _ in range(max(1, workers))]
    load = [0.0] * len(bins)
    for e in sorted(entries, key=lambda e: -float(e.get("seconds", 0.0))):
        k = min(range(len(bins)), key=lambda i: (load[i], len(bins[i])))
        bins[k].append(e)
        load[k] += float(e.get("seconds", 0.0)) or 1.0
    return [b for b in bins if b]


class Precompile:
    """The manifest's variants compiling in worker processes (``python -m
    trimtab.kernels.precompile SHARE.json``), started by :meth:`start` and
    awaited by :meth:`wait`. Never fails the run: a worker's error is reported, and the run
    compiles what did not land in the cache."""

    def __init__(
        self,
        reason: str,
        entries: list[dict[str, Any]] | None = None,
        workers: int = 1,
        *,
        stamp: Path | None = None,
        lock: Any = None,
        waits: str | None = None,
    ) -> None:
        self.reason, self.entries = reason, entries or []
        #: the cache's file that says the manifest is compiled: written once these workers
        #: compiled it cleanly, or (``waits``: the manifest's name) the one the process holding
        #: the lock writes
        self.stamp, self._lock, self._waits = stamp, lock, waits
        self.started = time.perf_counter()
        # the workers' shares and outputs (none where nothing is to compile)
        self._tmp = tempfile.TemporaryDirectory(prefix="trimtab-precompile-") if entries else None
        self.procs: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
        folder = Path(self._tmp.name) if self._tmp is not None else None
        for i, part in enumerate(share(self.entries, workers) if folder is not None else []):
            work = folder / f"{i}.json"
            work.write_text(json.dumps(part))
            out, err = work.with_suffix(".out"), work.with_suffix(".err")
            with out.open("wb") as fo, err.open("wb") as fe:
                proc = subprocess.Popen([sys.executable, "-m", "trimtab.kernels.precompile",
                                         str(work)], stdin=subprocess.DEVNULL, stdout=fo,
                                        stderr=fe)  # fmt: skip
            self.procs.append((proc, out, err))
        self.workers = len(self.procs)

    @classmethod
    def start(cls, workers: int | None = None, directory: Path = MANIFESTS) -> Precompile:
        """Start compiling the current device's manifest (if there is one, and this machine's
        Triton cache does not hold it yet) in ``workers`` processes (default: one per CPU, at
        most one per variant)."""
        path, reason = manifest_for(directory)
        if path is None:
            return cls(reason)
        entries = read_manifest(path)
        stamp = _stamp(path, entries)
        if stamp.is_file():
            return cls(f"{reason}: already compiled into this machine's Triton cache")
        # Several runs starting at once on one machine (``--seeds``, a sweep) share Triton's
        # cache: the first compiles, the others wait for it in :meth:`wait`.
        lock = _try_lock(stamp.parent / "lock")
        if lock is False:
            return cls(f"{reason}: compiled by another process of this machine", stamp=stamp,
                       waits=reason)  # fmt: skip
        n = workers if workers is not None else (os.cpu_count() or 1)
        return cls(reason, entries, min(max(1, n), len(entries)), stamp=stamp, lock=lock)

    def cancel(self) -> None:
        """Stop the workers (the run did not get to use them)."""
        for proc, _, _ in self.procs:
            proc.kill()
            proc.wait()
        self.procs = []
        self._cleanup()

    def _cleanup(self) -> None:
        """Remove the shares' folder and release the lock (after the workers, or instead)."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases its flock
            self._lock = None

    def wait(self) -> dict[str, Any]:
        """Wait for every worker; returns ``{"manifest", "variants", "compiled", "failed",
        "workers", "seconds"}`` (``failed``: ``"kernel: error"`` lines), or ``{"skipped":
        reason}`` where no manifest matched, the cache held it, or another process of this
        machine compiled it (waited for here: until it releases the lock)."""
        if self._waits and self.stamp is not None:  # wait for the process holding the lock
            held = _try_lock(self.stamp.parent / "lock", block=True)
            if held:
                held.close()
            if not self.stamp.is_file():
                self.reason = (f"{self._waits}: another process of this machine compiled them "
                               "with errors; this run compiles what is missing")  # fmt: skip
            return {"skipped": self.reason}
        if not self.procs:
            self._cleanup()
            return {"skipped": self.reason}
        compiled, failed = 0, []
        for proc, out, err in self.procs:
            code = proc.wait()
            try:
                results = json.loads(out.read_text().strip().splitlines()[-1])
            except (OSError, ValueError, IndexError):
                results = None
            if code != 0 or not isinstance(results, list):
                tail = (err.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
                failed.append(f"a worker exited with {code}: {tail}")
                continue
            for r in results:
                if r.get("error"):
                    failed.append(f"{r['kernel']}: {r['error']}")
                else:
                    compiled += 1
        self.procs = []
        if not failed and self.stamp is not None:  # the next run skips the workers
            with contextlib.suppress(OSError):
                self.stamp.parent.mkdir(parents=True, exist_ok=True)
                self.stamp.write_text(self.reason + "\n")
        self._cleanup()  # the stamp first: a waiting process reads it once the lock is free
        return {"manifest": self.reason, "variants": len(self.entries), "compiled": compiled,
                "failed": failed, "workers": self.workers,
                "seconds": round(time.perf_counter() - self.started, 2)}  # fmt: skip


def _compile_share(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A worker's part: each variant compiled through its kernel's ``preload`` (into the disk
    cache); an error is returned with its variant, never raised. The keys are settled first
    (:func:`settle_keys`), as the run settles them before its first launch."""
    out = []
    _settled(entries)
    for e in entries:
        t0 = time.perf_counter()
        try:
            resolve_kernel(e["kernel"]).preload(e["specialization"])
            error = None
        except Exception as exc:  # reported to the run, which compiles it itself
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        out.append({"kernel": e["kernel"], "seconds": round(time.perf_counter() - t0, 3),
                    "error": error})  # fmt: skip
    return out


if __name__ == "__main__":  # a worker: its share in the file named, its results as one JSON line
    print(json.dumps(_compile_share(json.loads(Path(sys.argv[1]).read_text()))), flush=True)
