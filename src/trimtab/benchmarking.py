"""What every benchmark shares: which commit, machine, versions and date a figure came from
(provenance), the results file it writes (write_json) or adds a named record to (save_record),
its command line's common options (benchmark_parser), the markdown table it prints
(markdown_table), and an empty Triton cache for a first-run measurement (own_triton_cache).

The device machine receives a copy of the working tree without ``.git``; the caller passes
the commit there as ``TRIMTAB_COMMIT`` (``benchmarks/tools/gpu_tier.sh`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trimtab._source import source_commit

__all__ = [
    "benchmark_parser",
    "commit",
    "cprofile_top",
    "invocation",
    "kernel_census",
    "labelled_ops",
    "markdown_table",
    "provenance",
    "record_key",
    "save_record",
    "write_json",
]


def commit() -> str:
    """:func:`trimtab._source.source_commit` (``TRIMTAB_COMMIT``, or the checkout's ``HEAD`` with
    ``-dirty``), or ``"unknown"``."""
    return source_commit() or "unknown"


def provenance(device: torch.device | str | None = None) -> dict[str, Any]:
    """Date, commit, machine, Python/torch/Triton versions and the device's name."""
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    dev = torch.device(device) if device is not None else None
    name = (
        torch.cuda.get_device_name(dev)
        if dev is not None and dev.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton_version,
        "device_name": name,
    }


def own_triton_cache(script: str, cache: Path | None = None) -> Path:
    """Point Triton's kernel cache (``TRITON_CACHE_DIR``) at ``cache``, or at a new empty
    folder, as on a machine's first run; returns it. Triton reads the variable when it is
    imported, so a script calls this first (importing this module imports no Triton): without
    ``cache``, a Triton already imported is a ``SystemExit`` naming ``script``."""
    if "triton" in sys.modules and cache is None:
        raise SystemExit(f"{script}: Triton is already imported; its cache cannot be moved")
    path = cache if cache is not None else Path(tempfile.mkdtemp(prefix="triton-cache-"))
    os.environ["TRITON_CACHE_DIR"] = str(path)
    return path


def child_env(pycache: Path, **extra: str) -> dict[str, str]:
    """The environment of a benchmark's child process: this one's, one OpenMP thread, Python's
    bytecode cached in ``pycache`` (``PYTHONPYCACHEPREFIX``) even where the environment turns
    bytecode writing off (``PYTHONDONTWRITEBYTECODE``), and ``extra``. A package installed by
    pip has its bytecode written at install; a process that compiles every source it imports
    (some images turn the cache off) pays seconds a machine's second run does not. Children
    that share ``pycache`` compile once; an empty one of its own is a machine's first run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPYCACHEPREFIX": str(pycache), **extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def cprofile_top(prof: Any, n: int) -> dict[str, list[dict[str, Any]]]:
    """The ``n`` functions of a ``cProfile.Profile`` with the most own time (``tottime``) and
    the ``n`` with the most cumulative time, each ``{"function": "file.py:line:name", "calls",
    "tottime", "cumtime"}``: a record's host profile."""
    import pstats

    st = pstats.Stats(prof)
    rows = [
        {
            "function": f"{Path(f).name}:{line}:{name}",
            "calls": int(nc),
            "tottime": tt,
            "cumtime": ct,
        }
        for (f, line, name), (_, nc, tt, ct, _) in st.stats.items()  # type: ignore[attr-defined]
    ]
    return {key: sorted(rows, key=lambda r: -r[key])[:n] for key in ("tottime", "cumtime")}


#: how :func:`labelled_ops` names the profiler ranges it opens around an operator
SOURCE, PHASE = "@source ", "@phase "


@contextlib.contextmanager
def labelled_ops(phases: Sequence[str] = ()) -> Iterator[None]:
    """Every torch operator run in the block (eagerly; a CUDA graph's replay runs none) inside
    two ``torch.profiler`` ranges that say where it was called from: ``"@source <frame>"``, the
    innermost frame of ``trimtab``'s sources (``"rl/agent/losses.py:88:project"``: file, line of
    the call, function), and ``"@phase <frame>"``, the innermost frame whose function is one of
    ``phases`` (``"rl/agent/learner.py:175:guarded_step"``: the line of the step it came from).
    A frame that is not found is ``"(elsewhere)"``; an operator of autograd's backward (run by
    its engine, with no Python caller) ``"(backward) <operator>"``. Read by
    :func:`kernel_census`. It works from the interpreter's frames, not the profiler's Python
    tracer (which records no frames on some torch and Python versions)."""
    import threading

    from torch.autograd.profiler import record_function
    from torch.utils._python_dispatch import TorchDispatchMode

    main = threading.main_thread()
    wanted = frozenset(phases)

    def origin() -> tuple[str, str]:
        source = phase = None
        f = sys._getframe(3)
        while f is not None and (source is None or (wanted and phase is None)):
            path = Path(f.f_code.co_filename)
            if "trimtab" in path.parts and f.f_code.co_filename != __file__:
                at = max(i for i, p in enumerate(path.parts) if p == "trimtab")
                frame = f"{'/'.join(path.parts[at + 1 :])}:{f.f_lineno}:{f.f_code.co_name}"
                if source is None:
                    source = frame
                if phase is None and f.f_code.co_name in wanted:
                    phase = frame
            f = f.f_back
        return source or "(elsewhere)", phase or "(elsewhere)"

    class Labels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if threading.current_thread() is not main:
                source = phase = f"(backward) {func}"
            else:
                source, phase = origin()
            with record_function(SOURCE + source), record_function(PHASE + phase):
                return func(*args, **(kwargs or {}))

    with Labels():
        yield


def kernel_census(prof: Any, steps: int = 1, *, copies: bool = False) -> dict[str, Any]:
    """The GPU kernels of a ``torch.profiler`` profile (CUDA activity) per step of ``steps``:
    ``{"kernels", "kernel_us", "by_name": {name: launches}, "us_by_name": {name: µs},
    "by_source": {frame: launches}, "by_phase": {frame: launches}}``, each most first (names cut
    to 80 characters). Memory copies and sets are left out
    unless ``copies``: what is counted is the kernels a step launches. ``by_source`` and
    ``by_phase`` are filled where the profiled steps ran inside :func:`labelled_ops` (eagerly):
    each kernel counted at its operator's labels, a kernel launched outside an operator (a
    Triton kernel) at ``"(not an operator) <name>"``."""
    cuda = torch.autograd.DeviceType.CUDA

    def counted(name: str) -> bool:  # (a profiler range is on the GPU's timeline too)
        if name.startswith((SOURCE, PHASE)):
            return False
        return copies or not name.startswith(("Memcpy", "Memset"))

    def add(d: dict[str, float], key: str, n: float = 1) -> None:
        d[key] = d.get(key, 0) + n

    n, us = 0, 0.0
    by_name: dict[str, float] = {}
    us_by_name: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == cuda and counted(e.name):
            t = e.device_time if hasattr(e, "device_time") else e.cuda_time
            n, us = n + 1, us + t
            add(by_name, e.name[:80])
            add(us_by_name, e.name[:80], t)
    by_source: dict[str, float] = {}
    by_phase: dict[str, float] = {}
    left = dict(by_name)
    for e in prof.events():
        mine = [] if e.device_type == cuda else [k for k in e.kernels if counted(k.name)]
        labels = _labels(e) if mine else {}
        if not labels:
            continue
        for k in mine:
            add(by_source, labels.get(SOURCE, "(elsewhere)"))
            add(by_phase, labels.get(PHASE, "(elsewhere)"))
            if k.name[:80] in left:
                left[k.name[:80]] -= 1
    if by_source:  # the kernels no labelled operator launched
        for name, count in left.items():
            if count > 0:
                add(by_source, f"(not an operator) {name}", count)
                add(by_phase, "(not an operator)", count)

    def per_step(d: dict[str, float]) -> dict[str, float]:
        return {k: v / steps for k, v in sorted(d.items(), key=lambda kv: -kv[1])}

    return {"kernels": n / steps, "kernel_us": us / steps, "by_name": per_step(by_name),
            "us_by_name": per_step(us_by_name), "by_source": per_step(by_source),
            "by_phase": per_step(by_phase)}  # fmt: skip


def _labels(event: Any) -> dict[str, str]:
    """The :func:`labelled_ops` ranges around a profiled event (itself included), by kind."""
    found: dict[str, str] = {}
    e = event
    while e is not None and len(found) < 2:
        for kind in (SOURCE, PHASE):
            if e.name.startswith(kind) and kind not in found:
                found[kind] = e.name[len(kind) :]
        e = e.cpu_parent
    return found


def invocation(script: str | Path, argv: Sequence[str] | None = None) -> str:
    """A record's ``"command"``: the script's path from its ``benchmarks`` folder on
    (``benchmarks/experiments/probe.py``) and its arguments, ``argv`` or this process's when
    None, as the results pages show how to rerun it."""
    parts = Path(script).resolve().parts
    at = max((i for i, p in enumerate(parts) if p == "benchmarks"), default=len(parts) - 1)
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join(["/".join(parts[at:]), *args])


def record_key(record: Mapping[str, Any]) -> str:
    """The default name of a record in a results file: ``run_<date>_<commit[:7]>``."""
    return f"run_{record['date'][:10]}_{record['commit'][:7]}"


def json_safe(value: Any) -> Any:
    """``value`` with every float NaN or ±Inf (a standard error of one seed, a metric that was
    never logged) replaced by None, recursively through dicts, lists and tuples: standard JSON
    has no NaN, and Python's ``json`` would write the non-standard literal that other readers
    (``jq``, browsers, most JSON libraries) refuse."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(out: Path, value: Any, *, indent: int = 1) -> None:
    """Write ``value`` to ``out`` as standard JSON (NaN and ±Inf as ``null``,
    :func:`json_safe`), beside the old file and renamed over it: an interrupted write leaves
    the old file whole. For a benchmark's whole-file result; :func:`save_record` keeps a file
    of named records."""
    text = json.dumps(json_safe(value), indent=indent, allow_nan=False) + "\n"
    _replace(Path(out).resolve(), text)


def save_record(out: Path, key: str | None, record: Mapping[str, Any], *, indent: int = 1) -> str:
    """Store ``record`` as ``out[key]`` in a JSON file of named records; returns the key.

    An empty ``key`` (None, or ``--key ""``) names it :func:`record_key` (the record carries
    :func:`provenance`'s date and commit). The file's other records are kept, and a record of
    the same name is replaced in place. The new file is written beside the old one and renamed
    over it, so an interrupted write leaves the old file whole; a file that is not a JSON object
    is an error and is left as it was. NaN and ±Inf are written as ``null`` (:func:`json_safe`):
    the file is standard JSON.
    """
    target = Path(out).resolve()  # through a symlink, as writing to it would
    data: dict[str, Any] = {}
    if target.is_file():
        try:
            data = json.loads(target.read_text())
        except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError
            raise ValueError(
                f"{out} is not valid JSON ({e}); it was left as it is: repair or move it, "
                "or write the record to another file"
            ) from e
        if not isinstance(data, dict):
            raise ValueError(
                f"{out} holds a JSON {type(data).__name__}, not an object of named records; it "
                "was left as it is: move it, or write the record to another file"
            )
    name = key or record_key(record)
    data[name] = record
    _replace(target, json.dumps(json_safe(data), indent=indent, allow_nan=False) + "\n")
    return name


def _replace(target: Path, text: str) -> None:
    """``text`` into ``target`` by a temporary file beside it and a rename (its mode kept)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x") as f:  # mode 0o666 & ~umask, as a new file written directly
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if target.exists():
            shutil.copymode(target, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


class _BenchmarkParser(argparse.ArgumentParser):
    """An ArgumentParser whose ``--out`` is None under ``--quick`` unless given (``quick_out``)."""

    quick_out: Path | None = None

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        ns, rest = super().parse_known_args(args, namespace)
        if self.quick_out is not None and ns.out is None and not ns.quick:
            ns.out = self.quick_out
        return ns, rest


def benchmark_parser(
    doc: str | None,
    out: Path | None = None,
    *,
    quick: str | None = None,
    quick_writes: bool = True,
    device: str | None = None,
    key: bool = False,
    out_help: str | None = None,
) -> argparse.ArgumentParser:
    """A benchmark's command line with the options every benchmark spells alike; the benchmark
    adds its own arguments to it.

    ``doc``: the script's docstring, whose first paragraph is the description. ``--out``: the
    results file, default ``out`` (``out_help`` says more where None means something else).
    ``--quick`` (when ``quick`` gives its help): the few-second mode that a test runs; with
    ``quick_writes=False`` it writes nothing unless ``--out`` is given (``args.out`` is None).
    ``--device`` (when ``device`` is given): its default, ``"auto"`` for CUDA where there is one,
    else the CPU. ``--key`` (with ``key``): the record's name in a file of named records
    (:func:`save_record`; default ``run_<date>_<commit>``).
    """
    description = (doc or "").strip().split("\n\n")[0].replace("\n", " ") or None
    p = _BenchmarkParser(description=description)
    if out_help is None:
        out_help = "the results file" + (f" (default {_shown(out)})" if out is not None else "")
        if quick is not None and not quick_writes:
            out_help += "; --quick writes only where --out is given"
    if quick is not None and not quick_writes:
        p.quick_out, out = out, None
    p.add_argument("--out", type=Path, default=out, help=out_help)
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick)
    if device is not None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        p.add_argument("--device", default=device, help=f"the torch device (default {device})")
    if key:
        p.add_argument(
            "--key",
            default=None,
            help="the record's name in the results file (default: date-commit)",
        )
    return p


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None
) -> str:
    """``rows`` under ``header`` as a markdown table (no final newline). A cell is written as
    ``str(cell)`` (format numbers before); ``align`` gives a column's alignment per character,
    ``l`` or ``r`` (default: every column left)."""
    align = align or "l" * len(header)
    if len(align) != len(header):
        raise ValueError(f"align={align!r} has {len(align)} columns, the header {len(header)}")
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align)
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
