"""Shared set-up of the docs tests: the docs as a person sees them (the generated pages, the
strict site build, a run's report.html and the built site opened in a headless browser, and the
guides' code and commands run as written). Without ``chromium`` on the PATH the browser tests
skip (CI installs it: ``.ci/run``); without mkdocs (the ``[docs]`` extra) the site tests skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_helpers import Browser, chromium, prices_with_defects, train_run


@pytest.fixture(scope="session")
def browser():
    exe = chromium()
    if exe is None:
        pytest.skip("chromium is not installed (CI installs it: apt-get install chromium)")
    b = Browser(exe)
    yield b
    b.close()


@pytest.fixture(scope="session")
def report_warned(tmp_path_factory) -> Path:
    """Your own data, with the defects the data guide says are reported, never absorbed."""
    tmp = tmp_path_factory.mktemp("warned")
    prices_with_defects(tmp / "prices")
    return train_run(tmp / "run", "--data", str(tmp / "prices"))
