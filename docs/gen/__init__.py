"""The docs site's generated pages, one module per job (``docs/gen_pages.py`` puts them together):

- ``markdown``: cells and tables; ``records``: a results file, its records and their provenance;
  ``scripts``: the benchmark script behind a results file and the command that reproduces it;
- ``sections``: a results file rendered as a section; ``trading``: the trading page;
  ``results``: which file is on which results page, and the results index;
- ``config_page``, ``api``, ``cli_page``: the config, API and command references.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# the site documents this checkout, whatever else is installed
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
