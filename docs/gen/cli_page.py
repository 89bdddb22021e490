"""The commands page: every ``trimtab`` command's ``--help``, from the parser itself."""

from __future__ import annotations


def cli_page() -> str:
    """Every ``trimtab`` command's ``--help``, from the parser itself."""
    import os

    from trimtab.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width
    parser = build_parser()
    out = [
        "# Commands\n",
        "Generated from the command line's own parser: each command's `--help`.\n",
        "```text\n" + parser.format_help().rstrip() + "\n```\n",
    ]
    for action in parser._subparsers._group_actions:  # argparse has no public walk
        for name, sub in action.choices.items():
            out.append(f"## `trimtab {name}`\n")
            out.append("```text\n" + sub.format_help().rstrip() + "\n```\n")
    out.append(
        "Several processes: `torchrun --nproc-per-node N -m trimtab train ...` "
        "([Several GPUs with torchrun](../guides/multi-gpu.md)).\n"
    )
    return "\n".join(out)
