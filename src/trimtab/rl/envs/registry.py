"""The kinds of environment the trainer runs, by ``env.name`` (and ``env.impl``): the market,
Gymnasium envs, the batched torch CartPole, bsuite ids, and any kind a user registers. The config
checks an env name here, and the runner builds its adapter here, so a new kind of environment is
one new module with its adapter class (:class:`~trimtab.rl.envs.protocol.EnvAdapter`) and one
:func:`register_env_kind` call.

    from trimtab.rl.envs.registry import EnvKind, register_env_kind
    register_env_kind(EnvKind("mine", "mine:ID", lambda name, impl: name.startswith("mine:"),
                              "my_package.my_env:MyAdapter"))
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trimtab.rl.configio import ConfigError

if TYPE_CHECKING:  # annotations only: the config imports this module, the CLI the config
    import torch

    from trimtab.rl.envs.protocol import EnvAdapter

__all__ = ["EnvKind", "env_kind", "env_kinds", "make_adapter", "register_env_kind"]


@dataclass(frozen=True)
class EnvKind:
    """One kind of environment: ``name``; ``pattern``, how its ``env.name`` is written (for
    messages); ``matches(env_name, env_impl)``; ``factory``, ``"module:attribute"`` of its
    adapter class, called as ``factory(cfg, device)`` and imported only when a run uses it; and
    ``walk_forward``: whether it is walked forward in folds over dated data with a backtest
    (the [data], [walkforward] and [backtest] keys apply), or one long run ([gym])."""

    name: str
    pattern: str
    matches: Callable[[str, str], bool]
    factory: str
    walk_forward: bool = False

    def load(self) -> Callable[[Any, torch.device], EnvAdapter]:
        module, _, attribute = self.factory.partition(":")
        return getattr(importlib.import_module(module), attribute)


_KINDS: list[EnvKind] = []


def register_env_kind(kind: EnvKind) -> None:
    """Add ``kind``, or replace the registered kind of the same name. Kinds are tried in the
    order registered, so a narrower pattern goes before a broader one it overlaps."""
    for i, known in enumerate(_KINDS):
        if known.name == kind.name:
            _KINDS[i] = kind
            return
    _KINDS.append(kind)


def env_kinds() -> tuple[EnvKind, ...]:
    """The registered kinds, in the order they are tried."""
    return tuple(_KINDS)


def env_kind(name: str, impl: str = "gymnasium") -> EnvKind:
    """The kind of env ``name`` (run as ``impl``); a :class:`ConfigError` naming the patterns
    that are known where none matches."""
    for kind in _KINDS:
        if kind.matches(name, impl):
            return kind
    known = ", ".join(repr(k.pattern) for k in _KINDS)
    raise ConfigError(f"env.name = {name!r} is no known kind of environment: {known}")


def make_adapter(cfg: Any, device: torch.device) -> EnvAdapter:
    """The adapter of ``cfg.env.name`` / ``cfg.env.impl`` (``cfg`` a
    :class:`~trimtab.rl.config.TrainConfig`); bad data or an unknown Gymnasium id raise here,
    before a run directory exists."""
    return env_kind(cfg.env.name, cfg.env.impl).load()(cfg, device)


_ADAPTERS = "trimtab.rl.envs.adapters"
register_env_kind(EnvKind(
    "torch", "gym:CartPole-v1 with env.impl = 'torch'", lambda name, impl: impl == "torch",
    f"{_ADAPTERS}:TorchCartPoleAdapter",
))  # fmt: skip
register_env_kind(EnvKind(
    "bsuite", "bsuite:BSUITE_ID", lambda name, impl: name.startswith("bsuite:"),
    "trimtab.rl.envs.bsuite_env:BsuiteAdapter",
))  # fmt: skip
register_env_kind(EnvKind(
    "gym", "gym:ENV_ID", lambda name, impl: name.startswith("gym:"), f"{_ADAPTERS}:GymAdapter"
))  # fmt: skip
register_env_kind(EnvKind(
    "market", "market", lambda name, impl: name == "market", f"{_ADAPTERS}:MarketAdapter",
    walk_forward=True,
))  # fmt: skip
