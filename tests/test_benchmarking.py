"""save_record: a benchmark's record goes into its results file by name, keeping the others, and
a results file that is not a JSON object of records is named in the error and left untouched;
the benchmarks' one command-line helper and table, their children's environment, and the layout
of benchmarks/."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trimtab.benchmarking import (
    benchmark_parser,
    child_env,
    markdown_table,
    provenance,
    record_key,
    save_record,
    write_json,
)


def test_new_key_is_added_beside_the_records_there(tmp_path: Path) -> None:
    out = tmp_path / "results" / "bench.json"  # the folder is created
    assert save_record(out, "a", {"x": 1}) == "a"
    assert save_record(out, "b", {"x": 2}) == "b"
    assert json.loads(out.read_text()) == {"a": {"x": 1}, "b": {"x": 2}}
    # the bytes the benchmarks wrote before save_record: indent 1 and a final newline
    assert out.read_text() == json.dumps({"a": {"x": 1}, "b": {"x": 2}}, indent=1) + "\n"
    assert [p.name for p in out.parent.iterdir()] == ["bench.json"]  # no temporary left


def test_same_key_is_replaced_in_place(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    for key, x in (("a", 1), ("b", 2), ("c", 3), ("a", 4)):
        save_record(out, key, {"x": x}, indent=2)
    data = json.loads(out.read_text())
    assert list(data) == ["a", "b", "c"] and data["a"] == {"x": 4}  # its place, the new record
    assert out.read_text() == json.dumps(data, indent=2) + "\n"


def test_default_key_is_date_and_commit() -> None:
    record = {"date": "2026-12-01T20:00:00+00:00", "commit": "f4d43d8abcdef"}
    assert record_key(record) == "run_2026-12-01_f4d43d8"


def test_default_key_from_provenance(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    record = {**provenance(), "rows": [1, 2]}
    key = save_record(out, None, record)
    assert key == record_key(record) and json.loads(out.read_text()) == {key: record}
    assert save_record(out, "", record) == key  # --key "" is no name, as before


def test_file_mode_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    out.write_text("{}\n")
    os.chmod(out, 0o640)
    save_record(out, "a", {"x": 1})
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ('{"a": {"x": 1}', "is not valid JSON"),  # cut short
        ("\xff\xfe not text", "is not valid JSON"),
        ('[{"x": 1}]', "holds a JSON list, not an object"),
    ],
)
def test_bad_file_is_named_and_left_as_it_was(tmp_path: Path, text: str, pattern: str) -> None:
    out = tmp_path / "bench.json"
    out.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=pattern) as err:
        save_record(out, "a", {"x": 1})
    assert str(out) in str(err.value) and "left as it is" in str(err.value)
    assert out.read_bytes() == text.encode("latin-1")
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]


def test_nan_and_inf_are_written_as_null_and_the_file_is_standard_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text('{"old": {"se": NaN}}\n')  # a file written before: Python's NaN literal
    rec = {"se": math.nan, "rows": [1.0, math.inf, (-math.inf, 2)], "n": 3, "ok": "NaN"}
    save_record(out, "new", rec)
    text = out.read_text()
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text

    def strict(c: str) -> None:
        raise ValueError(f"non-standard JSON literal {c}")

    data = json.loads(text, parse_constant=strict)
    assert data["new"] == {"se": None, "rows": [1.0, None, [None, 2]], "n": 3, "ok": "NaN"}
    assert data["old"] == {"se": None}


def test_source_commit_names_the_checkout_its_package_is_in_or_nothing(tmp_path: Path) -> None:
    """A record's commit is the commit of the source that ran: HEAD of the checkout holding the
    package, ``-dirty`` for edits to the package (not elsewhere), None for an exported tree the
    checkout around it does not track, and TRIMTAB_COMMIT above all."""
    import shutil
    import subprocess
    import sys

    from trimtab import _source

    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    pkg = repo / "src" / "trimtab"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(_source.__file__, pkg / "_source.py")
    (repo / "notes.txt").write_text("a\n")
    (repo / ".gitignore").write_text("export/\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = git("rev-parse", "HEAD")
    env = {k: v for k, v in os.environ.items() if k != "TRIMTAB_COMMIT"}

    def probe(root: Path, **extra: str) -> str:
        code = "from trimtab._source import source_commit; print(source_commit())"
        run_env = {**env, "PYTHONPATH": str(root), **extra}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=run_env)  # fmt: skip
        return out.stdout.strip()

    assert probe(repo / "src") == head
    (repo / "notes.txt").write_text("b\n")  # a tracked change outside the package
    assert probe(repo / "src") == head
    (pkg / "__init__.py").write_text("# edited\n")
    assert probe(repo / "src") == head + "-dirty"
    shutil.copytree(pkg, repo / "export" / "trimtab")  # an ignored export of some other tree
    assert probe(repo / "export") == "None"
    assert probe(repo / "export", TRIMTAB_COMMIT="abc1234") == "abc1234"


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_write_json_writes_standard_json_whole(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    write_json(out, {"a": [1.0, math.nan, -math.inf], "b": {"c": math.inf}})
    assert _strict(out.read_text()) == {"a": [1.0, None, None], "b": {"c": None}}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_every_result_file_is_standard_json() -> None:
    """What the docs' results pages are generated from: readable by any JSON reader."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    files = sorted(results.rglob("*.json"))
    assert files
    for f in files:
        _strict(f.read_text())


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_benchmark_parser_spells_the_common_options_once(tmp_path: Path) -> None:
    doc = "What it measures,\non two lines.\n\n    python benchmarks/x.py [--quick]\n"
    p = benchmark_parser(doc, tmp_path / "x.json", quick="a smoke test", device="cpu", key=True)
    assert p.description == "What it measures, on two lines."
    args = p.parse_args([])
    assert (args.out, args.quick, args.device, args.key) == (
        tmp_path / "x.json",
        False,
        "cpu",
        None,
    )
    args = p.parse_args(["--quick", "--out", "y.json", "--device", "cuda", "--key", "k"])
    assert (args.out, args.quick, args.device, args.key) == (Path("y.json"), True, "cuda", "k")
    bare = benchmark_parser(None).parse_args([])
    assert vars(bare) == {"out": None}  # only what the benchmark asked for


def test_quick_writes_only_where_out_is_given(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    p = benchmark_parser("", out, quick="a smoke test", quick_writes=False)
    assert p.parse_args([]).out == out
    assert p.parse_args(["--quick"]).out is None
    assert p.parse_args(["--quick", "--out", "y.json"]).out == Path("y.json")
    assert "--quick writes only where --out is given" in " ".join(p.format_help().split())


def test_device_auto_is_cuda_where_there_is_one() -> None:
    import torch

    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert benchmark_parser("", device="auto").parse_args([]).device == want


def test_markdown_table() -> None:
    text = markdown_table(["a", "b"], [("x", 1.5), ["y", None]], "lr")
    assert text == "| a | b |\n|---|---:|\n| x | 1.5 |\n| y | None |"
    with pytest.raises(ValueError, match="align='l' has 1 columns, the header 2"):
        markdown_table(["a", "b"], [], "l")


#: benchmarks whose command line is their own (edited elsewhere; held to the helper when touched)
OWN_PARSER = {"agent_vs_baselines.py", "bsuite_suite.py"}


def test_benchmarks_use_the_shared_helper_and_sit_in_their_folders() -> None:
    """The split of benchmarks/: records at the top, experiments/ and tools/; no script builds
    its own ArgumentParser or writes a markdown table by hand."""
    scripts = sorted(BENCHMARKS.rglob("*.py"))
    assert {p.parent.name for p in scripts} == {"benchmarks", "experiments"}
    assert not [p for p in BENCHMARKS.glob("*.sh")], "shell scripts belong in benchmarks/tools/"
    assert not [p.name for p in scripts if p.parent.name == "benchmarks"
                and p.name.startswith(("probe_", "profile_"))]  # fmt: skip
    for p in scripts:
        if p.name in OWN_PARSER:
            continue
        text = p.read_text()
        assert "argparse.ArgumentParser(" not in text, f"{p.name}: use benchmark_parser"
        assert '"|---' not in text and "'|---" not in text, f"{p.name}: use markdown_table"


def test_own_triton_cache_moves_the_cache_or_refuses_once_triton_is_imported(
    tmp_path, monkeypatch
) -> None:
    from trimtab.benchmarking import own_triton_cache

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))  # restored afterwards
    assert own_triton_cache("probe", tmp_path / "given") == tmp_path / "given"
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "given")
    monkeypatch.setitem(sys.modules, "triton", sys.modules.get("triton", object()))
    with pytest.raises(SystemExit, match="probe: Triton is already imported"):
        own_triton_cache("probe")
    monkeypatch.delitem(sys.modules, "triton")
    fresh = own_triton_cache("probe")
    assert fresh.is_dir() and not any(fresh.iterdir())
    assert os.environ["TRITON_CACHE_DIR"] == str(fresh)


def test_a_child_caches_its_bytecode_where_the_environment_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = child_env(tmp_path / "pycache", TRITON_CACHE_DIR="x")
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["OMP_NUM_THREADS"] == "1"
    assert env["TRITON_CACHE_DIR"] == "x" and os.environ["PYTHONDONTWRITEBYTECODE"] == "1"
    mod = tmp_path / "src" / "probe_mod.py"
    mod.parent.mkdir()
    mod.write_text("X = 1\n")
    code = f"import sys; sys.path.insert(0, {str(mod.parent)!r}); import probe_mod"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert list((tmp_path / "pycache").rglob("probe_mod*.pyc"))  # written under the prefix


def test_invocation_names_the_script_from_its_benchmarks_folder(tmp_path) -> None:
    from trimtab.benchmarking import invocation

    script = tmp_path / "repo" / "benchmarks" / "experiments" / "probe.py"
    assert invocation(script, ["--out", "x.json"]) == "benchmarks/experiments/probe.py --out x.json"
    assert invocation(tmp_path / "elsewhere.py", []) == "elsewhere.py"


def test_labelled_ops_name_the_trimtab_line_and_the_phase_of_each_operator() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trimtab.benchmarking import _labels, kernel_census, labelled_ops
    from trimtab.quantile import abs_quantile

    x = torch.randn(1000)
    with profile(activities=[ProfilerActivity.CPU]) as prof, labelled_ops(["abs_quantile"]):
        abs_quantile(x, 0.99)
        x.sin()  # called from here: no trimtab frame
    labels = [_labels(e) for e in prof.events() if e.name.startswith("aten::")]
    sources = {d["@source "] for d in labels if d}
    phases = {d["@phase "] for d in labels if d}
    assert "(elsewhere)" in sources and "(elsewhere)" in phases
    ours = sorted(s for s in sources if s != "(elsewhere)")
    assert ours and all(s.startswith(("quantile.py:", "_count.py:")) for s in ours), ours
    assert all(int(s.split(":")[1]) > 0 for s in ours)  # the line of the call
    ours = phases - {"(elsewhere)"}  # the lines of abs_quantile that ran operators
    assert ours and all(p.startswith("quantile.py:") and p.endswith(":abs_quantile") for p in ours)
    # a CPU profile has no kernels: nothing counted, nothing attributed
    census = kernel_census(prof, 2)
    assert census["kernels"] == 0 and census["by_source"] == {} and census["by_phase"] == {}


def test_kernel_census_counts_kernels_by_name_source_and_phase() -> None:
    """On a stand-in for a GPU profile: kernels counted per step by name, and by the labels of
    the operator that launched them; copies, the labels' own ranges on the GPU timeline and a
    kernel no operator launched (a Triton kernel) are told apart."""
    from types import SimpleNamespace as NS

    import torch

    from trimtab.benchmarking import kernel_census

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def ev(name, device=cpu, parent=None, kernels=(), us=0.0):
        return NS(name=name, device_type=device, cpu_parent=parent, kernels=list(kernels),
                  device_time=us)  # fmt: skip

    k = lambda name: NS(name=name)  # noqa: E731
    phase = ev("@phase rl/agent/learner.py:164:guarded_step")
    source = ev("@source rl/agent/losses.py:35:atoms", parent=phase)
    add = ev("aten::add", parent=source, kernels=[k("add_kernel"), k("Memcpy DtoD")])
    events = [
        phase, source, add,
        ev("aten::mul", kernels=[k("mul_kernel")]),  # outside labelled_ops: as if no operator
        ev("add_kernel", cuda, us=2.0),
        ev("Memcpy DtoD", cuda, us=1.0),
        ev("mul_kernel", cuda, us=3.0),
        ev("_check_kernel", cuda, us=4.0),  # launched outside any operator
        ev("@phase rl/agent/learner.py:164:guarded_step", cuda, us=9.0),  # a range, not a kernel
    ]  # fmt: skip
    census = kernel_census(NS(events=lambda: events), 2)
    assert census["kernels"] == 3 / 2 and census["kernel_us"] == 9.0 / 2
    assert census["by_name"] == {"add_kernel": 0.5, "mul_kernel": 0.5, "_check_kernel": 0.5}
    assert census["us_by_name"]["_check_kernel"] == 2.0
    assert census["by_source"] == {"rl/agent/losses.py:35:atoms": 0.5,
                                   "(not an operator) mul_kernel": 0.5,
                                   "(not an operator) _check_kernel": 0.5}  # fmt: skip
    assert census["by_phase"] == {"rl/agent/learner.py:164:guarded_step": 0.5,
                                  "(not an operator)": 1.0}  # fmt: skip
    with_copies = kernel_census(NS(events=lambda: events), 1, copies=True)
    assert (
        with_copies["kernels"] == 4 and with_copies["by_source"]["rl/agent/losses.py:35:atoms"] == 2
    )
