"""The config reference page, from ``trimtab.rl.config_reference.reference(device)``: one table
per section, each key's type, default (per device where it differs), meaning and values."""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

from markdown.extensions.toc import slugify

from gen import ROOT
from gen.markdown import table


def config_reference_page() -> str:
    """The config reference, from ``trimtab.rl.config_reference.reference(device)``."""
    try:
        mod = importlib.import_module("trimtab.rl.config_reference")
        reference = mod.reference
    except (ImportError, AttributeError) as e:
        raise RuntimeError(
            "docs: the config reference page is generated from "
            "trimtab.rl.config_reference.reference(device) -> list[dict] "
            f"(one dict per key: key, type, default, device_default, meaning, allowed), which is "
            f"missing here ({e}). Install the package from this checkout (pip install -e .[docs])."
        ) from e
    cpu = reference("cpu")
    cuda = {r["key"]: r for r in reference("cuda")}
    sections: dict[str, list[dict]] = {}
    for r in cpu:
        sections.setdefault(r["key"].split(".", 1)[0], []).append(r)
    out = [
        "# Config reference\n",
        "Generated from the trainer's config dataclasses (`trimtab.rl.config_reference`); the "
        "same table prints with `trimtab config` (`--format markdown|json`, `--device cuda`). "
        "Set a key in a TOML file (`--config FILE`, one `[section]` per prefix) or on the "
        "command line (`--set section.key=value`). A key whose default depends on the device "
        "shows both values. Every run writes its resolved config to `RUN_DIR/config.toml`.\n",
    ]
    for section, rows in sections.items():
        out.append(f"## `[{section}]`\n")
        body = []
        for r in rows:
            d = r.get("default")
            dev = cuda.get(r["key"], {}).get("device_default", d)
            cpu_dev = r.get("device_default", d)
            default = f"`{_toml(cpu_dev)}`"
            if dev != cpu_dev:
                default = f"CPU `{_toml(cpu_dev)}`, CUDA `{_toml(dev)}`"
            if d != cpu_dev and d != dev:
                default = f"`{_toml(d)}` → " + default
            body.append(
                [
                    f"`{r['key']}`",
                    _type(r),
                    default,
                    _cell(r.get("meaning") or ""),
                    _allowed(r.get("allowed")),
                ]
            )
        out.append(table(["key", "type", "default", "meaning", "allowed"], body))
    return "\n".join(out)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if v is None:
        return "none"
    return str(v)


def _type(r: dict) -> str:
    """The type, or "one of" where the allowed values already list a choice of literals."""
    t, allowed = str(r.get("type", "")), r.get("allowed")
    if (
        isinstance(allowed, (list, tuple))
        and allowed
        and all(_toml(a) in t for a in allowed)
        and "|" in t
        and "int" not in t
        and "float" not in t
    ):
        return "one of"
    return f"`{t}`".replace("|", "\\|")


def _allowed(v: Any) -> str:
    if v is None or v == "" or v == []:
        return ""
    if isinstance(v, (list, tuple)):
        return ", ".join(f"`{_toml(x)}`" for x in v)
    return _cell(v)


#: how the code's comments cite a docs page: ``docs: guides/stability.md#where-a-clamp-binds``
_DOCS_REF = re.compile(r"docs: ([a-z-]+/[a-z0-9-]+\.md(?:#[a-z0-9-]+)?)")


def link_text(ref: str) -> str:
    """What a cited page (``guides/stability.md#where-a-clamp-binds``) is called on the site:
    its title, and the section's heading where the reference names one. A page or section that
    does not exist is an error: a comment cites it, and the strict build would keep a dead
    link."""
    page, _, anchor = ref.partition("#")
    path = ROOT / "docs" / page
    if not path.is_file():
        raise ValueError(f"a config comment cites docs: {ref}, but docs/{page} does not exist")
    headings, fenced = [], False
    for ln in path.read_text().splitlines():
        fenced ^= ln.lstrip().startswith("```")  # a "# comment" in a code block is no heading
        if not fenced and re.match(r"#{1,6} ", ln):
            headings.append(ln.lstrip("#").strip())
    title = headings[0] if headings else page
    if not anchor:
        return title
    # the anchor the site's table of contents gives a heading (mkdocs.yml's toc: its default
    # slugify)
    section = next((h for h in headings if slugify(h, "-") == anchor), None)
    if section is None:
        raise ValueError(f"a config comment cites docs: {ref}, but docs/{page} has no "
                         f"heading whose anchor is #{anchor}")  # fmt: skip
    return f"{title}: {section}"


def _cell(s: Any) -> str:
    """A table cell of prose: no raw HTML (``<time>`` is text), pipes escaped, and the
    docs pages the comments cite made links, named as the site names them."""
    import html

    text = html.escape(str(s), quote=False).replace("|", "\\|").replace("\n", " ")
    return _DOCS_REF.sub(lambda m: f"[{link_text(m.group(1))}](../{m.group(1)})", text)
