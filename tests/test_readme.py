"""The README: its Python examples run as written, it stays short, its links resolve, and it
carries no work history (commit hashes, issue numbers)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    spaces = []
    for code in blocks:
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)
        spaces.append(namespace)
    guard = spaces[0]["guard"]
    assert guard.steps == 20 and bool(spaces[0]["applied"])
    bounds = namespace["bounds"]
    assert bounds.values.isfinite().all()  # the layer measured the activation, fold set the slot
    assert float(namespace["policy"].found_inf) == 0.0


def test_readme_is_short_and_has_no_history():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text), "a commit hash in the README"
    assert not re.search(r"(?i)\bissue\s*#?\d+|#\d{1,4}\b", text), "an issue number in the README"
    assert "python -m pytest -q" in text and "mkdocs serve" in text


def test_readme_links_resolve():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    missing = [ln for ln in links if "://" not in ln and not (ROOT / ln).exists()]
    assert not missing, missing


def test_readme_test_time_is_the_recorded_one():
    """The suite's time in the README is the record it names, in minutes as written."""
    import json

    text = " ".join(README.read_text().split())
    m = re.search(r"took \*\*([\d.]+) minutes\*\* of wall time \(([\d.]+) minutes of CPU time\)"
                  r".*?record `(\w+)` of `(benchmarks/results/[\w.]+)`", text)  # fmt: skip
    assert m, "the README's test time and the record it comes from"
    rec = json.loads((ROOT / m[4]).read_text())[m[3]]
    assert rec["command"] == "python -m pytest -q" and not rec["quick"]
    assert f"{rec['wall_s'] / 60:.1f}" == m[1] and f"{rec['cpu_s'] / 60:.1f}" == m[2]
