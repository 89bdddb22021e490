"""How the trainer's commands print ``--help``."""

from __future__ import annotations

import argparse
import functools
from typing import Any

__all__ = ["DefaultsFormatter", "config_flag"]


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, where it has one of its own; a flag added with
    :func:`config_flag` names its config key and that key's default instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        key = getattr(action, "config_key", None)
        if key is not None:
            return f"{action.help} (config {key}; default {_config_default(key)})"
        if action.default in (None, False, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def config_flag(parser: argparse.ArgumentParser, *names: str, key: str, **kwargs: Any) -> Any:
    """``parser.add_argument(*names, **kwargs)`` for a flag that sets config key ``key``
    ("run.device"): its ``--help`` names the key and its default, read from the config only
    when help is printed (building the parser imports no config, so no torch)."""
    action = parser.add_argument(*names, **kwargs)
    action.config_key = key
    return action


@functools.cache
def _config_default(key: str) -> Any:
    from trimtab.rl.config import TrainConfig

    section, name = key.split(".")
    return getattr(getattr(TrainConfig(), section), name)
