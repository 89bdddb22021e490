"""The generated pages: every results file on a page with its command and provenance, the
trading page's verdict read from the JSON, the loader's reading of bare NaN and null, bsuite's
cells, and the config reference's links named by their pages' titles."""

from __future__ import annotations

import json
import math
import re

import pytest
from docs_helpers import ROOT, gen


def test_results_loader_reads_bare_nan_and_null(tmp_path):
    fmt = gen("markdown").fmt
    path = tmp_path / "r.json"
    path.write_text('{"date": "2026-01-01", "rows": [{"a": NaN, "b": null, "c": Infinity}]}')
    data = gen("records").load_json(path)
    row = data["rows"][0]
    assert math.isnan(row["a"]) and row["b"] is None and row["c"] == math.inf
    assert fmt(row["a"]) == fmt(row["b"]) == "n/a"
    assert "n/a" in gen("sections").file_section(path)


def test_every_results_file_is_on_a_page_with_its_command_and_provenance():
    pages = gen("results").result_pages()
    text = "\n".join(v for v in pages.values() if isinstance(v, str))
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        assert f"`{path.name}`" in text, path.name
    assert "results/other.md" not in pages, "a results file is on no page: place it in PAGES"
    assert "```bash\npython benchmarks/" in pages["results/stability.md"]
    assert "(no script recorded" not in text


def test_trading_page_states_the_verdict_from_the_json():
    signed = gen("markdown").signed
    data = gen("records").load_json(ROOT / "benchmarks" / "results" / "agent_vs_baselines.json")
    runs = gen("trading").default_runs(data)
    text = gen("results").result_pages()["results/trading.md"]
    verdict = text.split("## Verdict")[1].split("\n## ")[0]
    for key, rec, var in runs:
        agg = var["aggregate"]
        para = next(p for p in verdict.split("\n\n") if f"`{key}`" in p)
        assert signed(agg["agent"]["mean"]) in para and signed(agg["buy_and_hold"]["mean"]) in para
        beats = agg["targets"]["above"]["buy_and_hold"]
        assert ("does not beat buy & hold" in para) == (not beats), para
        assert f"{100 * agg['targets']['oracle_fraction']:.0f}%" in para
        assert str(rec["date"]) in text  # the provenance of the record it comes from
    assert any(set(r.get("seeds", [])) == {0, 1, 2, 3, 4} for _, r, _ in runs)


def test_reproduce_commands_come_from_the_scripts():
    scripts = gen("scripts")
    cmd = scripts.reproduce_command(scripts.script_for("agent_vs_baselines"))
    assert cmd.startswith("python benchmarks/") and "agent_vs_baselines.py --seeds" in cmd
    assert scripts.script_for("stress_fp16") == scripts.script_for("stress")


def test_bsuite_file_shows_each_cell_and_says_when_a_budget_was_capped(tmp_path):
    path = tmp_path / "bsuite.json"
    cell = {"score": 0.25, "per_seed": [0.2, 0.3], "per_seed_mean": 0.25, "per_seed_se": 0.05,
            "ids": 2, "complete_ids": 1, "episodes": {"cartpole/0": 1000, "cartpole/1": 40},
            "env_steps": 12345, "seconds": 60.0}  # fmt: skip
    rec = {"date": "2026-01-01", "full_budget": False, "cells": {"adaptive": {"cartpole": cell}}}
    path.write_text(json.dumps({"k": rec}))
    text = gen("sections").file_section(path)
    row = next(line for line in text.splitlines() if "| `adaptive` | cartpole |" in line)
    assert "0.25 ± 0.05" in row and "1 of 2" in row and "| 1040 |" in row and "12345" in row
    assert "not bsuite's score" in text
    rec["full_budget"] = True
    path.write_text(json.dumps({"k": rec}))
    assert "not bsuite's score" not in gen("sections").file_section(path)
    scripts = gen("scripts")
    assert "bsuite_suite.py" in scripts.reproduce_command(scripts.script_for("bsuite"))


def test_config_reference_names_the_pages_it_links_by_their_titles():
    page = gen("config_page")
    text = page.config_reference_page()
    links = re.findall(r"\[([^\]]*)\]\(\.\./([^)]*)\)", text)
    assert links and all(".md" not in label for label, _ in links)
    assert ("Stability modes and bounds: Where a clamp binds",
            "guides/stability.md#where-a-clamp-binds") in links  # fmt: skip
    with pytest.raises(ValueError, match="no heading whose anchor is #nowhere"):
        page.link_text("guides/stability.md#nowhere")
    with pytest.raises(ValueError, match="does not exist"):
        page.link_text("guides/missing.md")


#: a test file or a script named in prose, with an optional ``::test_name``
_CODE_PATH = re.compile(r"`((?:tests|benchmarks|examples)/[\w/.-]+\.(?:py|toml|sh))(?:::(\w+))?`")


def test_every_test_and_script_the_docs_name_exists():
    """A path the prose names in backticks (a test, a benchmark, an example), and a test it
    names after ``::``, exists: the strict build checks links, not these."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for path, test in _CODE_PATH.findall(page.read_text()):
            target = ROOT / path
            if not target.is_file():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
            elif test and not re.search(rf"^def {test}\(", target.read_text(), re.M):
                missing.append(f"{page.relative_to(ROOT)}: {path}::{test}")
    assert not missing, missing
