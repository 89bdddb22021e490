"""save_record: a benchmark's record goes into its results file by name, keeping the others, and
a results file that is not a JSON object of records is named in the error and left untouched."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pytest

from trimtab.benchmarking import provenance, record_key, save_record, write_json


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
