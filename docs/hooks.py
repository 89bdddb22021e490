"""MkDocs hook: adds the generated pages (docs/gen_pages.py) to the site at build time, so the
results, config and API reference pages are never stale copies in the repository."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).parent))

import gen_pages

#: set to 1 to build without the config reference (a draft build: the page says it is missing)
SKIP_CONFIG = os.environ.get("TRIMTAB_DOCS_SKIP_CONFIG") == "1"


def on_files(files: Files, config) -> Files:
    pages = gen_pages.pages(config_reference=not SKIP_CONFIG)
    if SKIP_CONFIG:
        pages["reference/config.md"] = (
            "# Config reference\n\n!!! warning\n    Not generated in this draft build "
            "(`TRIMTAB_DOCS_SKIP_CONFIG=1`).\n"
        )
    for rel, content in pages.items():
        files.append(File.generated(config, rel, content=content))
    return files


#: Sphinx roles in docstrings (``:class:`~trimtab.Sentinel```) as mkdocstrings renders them:
#: the role's name before a code span; the reader gets the code span alone, with ``~`` honoured.
_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def _role(m: re.Match) -> str:
    name = m.group(2)
    if m.group(1):
        name = name.rsplit(".", 1)[-1]
    return f"<code>{name}</code>"


def on_page_content(html: str, page, config, files) -> str:
    html = _ROLE.sub(_role, html)
    return html.replace("::</p>", ":</p>")  # reST's literal-block marker
