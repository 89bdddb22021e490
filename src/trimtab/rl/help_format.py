"""How the trainer's commands print ``--help``."""

from __future__ import annotations

import argparse

__all__ = ["DefaultsFormatter"]


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, where it has one of its own (a flag whose value
    otherwise comes from the config says the config key and its default in its help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)
