"""The docs site's generated pages: the results (from ``benchmarks/results/*.json``), the config
reference (from ``trimtab.rl.config_reference``) and the API reference (from the public names).

    python docs/gen_pages.py --out /tmp/pages      # write them to a folder, to read or diff
    mkdocs build --strict                          # the same pages, through docs/hooks.py

One source of truth: nothing here holds a figure. Every number on a results page is read from the
JSON file the benchmark wrote, beside that record's machine, date and commit, and the command that
reproduces it is read from the benchmark script's own docstring.

Each page family is made by a module of the package ``docs/gen/``; this file puts them together.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gen.api import api_pages
from gen.cli_page import cli_page
from gen.config_page import config_reference_page
from gen.results import result_pages


def pages(config_reference: bool = True) -> dict[str, str | bytes]:
    """Every generated page, by its path under docs/."""
    out: dict[str, str | bytes] = {}
    out.update(result_pages())
    out.update(api_pages())
    out["reference/cli.md"] = cli_page()
    if config_reference:
        out["reference/config.md"] = config_reference_page()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder to write the pages into")
    args = ap.parse_args(argv)
    for rel, content in pages().items():
        path = args.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
