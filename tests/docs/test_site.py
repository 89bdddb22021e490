"""The docs site: built strictly with every section, and its pages opened in a browser."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_helpers import ROOT, Served, broken_local_links, keep, save_shot


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_site_builds_with_every_section(site):
    for page in (
        "getting-started/install",
        "guides/library",
        "concepts/invariants",
        "reference/config",
        "reference/api/library",
        "results/trading",
    ):
        assert (site / page / "index.html").exists(), page
    api = (site / "reference/api/library/index.html").read_text()
    assert "guard.step" in api or "step" in api
    assert "Guard" in api


#: pages of the site opened in the browser (one per section; the rest share their templates)
SITE_PAGES = [
    "",
    "getting-started/first-run/",
    "getting-started/report/",
    "guides/library/",
    "concepts/invariants/",
    "reference/config/",
    "reference/api/library/",
    "results/trading/",
    "results/stability/",
]


@pytest.mark.slow
def test_site_pages_in_a_browser(site, browser, tmp_path):
    served = Served(site)
    problems = []
    try:
        for rel in SITE_PAGES:
            name = "site-" + (rel.strip("/").replace("/", "-") or "home")
            shot = save_shot(tmp_path, name)
            page = browser.open(f"{served.origin}/{rel}", shot)
            keep(shot)
            for kind in ("errors", "failed", "broken"):
                if page[kind]:
                    problems.append(f"{rel or '/'}: {kind}: {page[kind]}")
            bad = broken_local_links(page, site, served.origin)
            if bad:
                problems.append(f"{rel or '/'}: broken links: {bad}")
            assert shot.stat().st_size > 10_000, f"{rel}: an empty screenshot"
    finally:
        served.close()
    assert not problems, "\n".join(problems)
