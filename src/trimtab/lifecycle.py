"""The fold-boundary registry: everything that holds state says once what a fold boundary does to
it, so one call resets optimizer moments, target networks, slots, estimators and flags together.

Design invariant 5: one mechanism applied to every instance through a registry. Trimtab's own
stateful objects (optimizers, estimators, clips, sentinels, state vectors) register themselves on
construction with the *active* lifecycle, so none can be forgotten.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Lifecycle", "active_lifecycle", "register"]


@dataclass
class _Entry:
    name: str
    what: str
    ref: Callable[[], Any]  # a weakref (or a strong-reference closure) to the owner
    action: Callable[[Any], None]


class Lifecycle:
    """An ordered registry of fold-boundary actions.

    Entries run in registration order. Owners are held by weak reference: an optimizer or
    network that is garbage-collected drops out of the registry instead of being kept alive.

    Use it as a context manager to make it the *active* lifecycle, with which trimtab objects
    constructed inside the block register themselves::

        with trimtab.Lifecycle() as life:
            opt = trimtab.optim.Adam(net.parameters())      # registers "reset moments"
            life.register_target_sync(net, target_net)      # hard sync at each boundary
        ...
        life.fold_boundary()
        print("\\n".join(life.describe()))

    Outside any ``with`` block, objects register with a process-wide default lifecycle,
    :func:`active_lifecycle`.
    """

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self.boundaries = 0

    # --- registration ---------------------------------------------------------------------
    def register(
        self,
        owner: Any,
        action: Callable[[Any], None] | str,
        *,
        name: str,
        what: str,
    ) -> None:
        """Run ``action(owner)`` (or ``owner.<action>()``) at every fold boundary.

        ``name`` identifies the owner in :meth:`describe` (``"optimizer[online]"``), ``what``
        says what happens (``"zero Adam moments and step counts"``). Registering the same owner
        under the same name twice is a no-op.
        """
        if isinstance(action, str):
            method = action
            if not callable(getattr(owner, method, None)):
                raise TypeError(f"{type(owner).__name__} has no method {method!r} to register")

            def action(o: Any, _m: str = method) -> None:
                getattr(o, _m)()

        if any(e.ref() is owner and e.name == name for e in self._entries):
            return
        try:
            ref: Callable[[], Any] = weakref.ref(owner)
        except TypeError:  # e.g. a plain tensor subclass without weakref support
            ref = lambda _o=owner: _o  # noqa: E731
        self._entries.append(_Entry(name=name, what=what, ref=ref, action=action))

    def register_target_sync(
        self, online: torch.nn.Module, target: torch.nn.Module, *, name: str = "target_network"
    ) -> None:
        """Hard-sync ``target`` from ``online`` (``load_state_dict``) at every fold boundary."""
        online_ref = weakref.ref(online)

        def sync(t: torch.nn.Module) -> None:
            o = online_ref()
            if o is not None:
                t.load_state_dict(o.state_dict())

        self.register(target, sync, name=name, what="hard sync from its online network")

    def unregister(self, owner: Any) -> None:
        """Remove every entry of ``owner``."""
        self._entries = [e for e in self._entries if e.ref() is not owner]

    # --- use ------------------------------------------------------------------------------
    def _live(self) -> list[tuple[_Entry, Any]]:
        live = [(e, e.ref()) for e in self._entries]
        self._entries = [e for e, o in live if o is not None]
        return [(e, o) for e, o in live if o is not None]

    def fold_boundary(self) -> None:
        """Apply every registered action, in registration order."""
        for entry, owner in self._live():
            entry.action(owner)
        self.boundaries += 1

    def describe(self) -> list[str]:
        """One line per registered action: what the next fold boundary will do."""
        return [f"{e.name}: {e.what}" for e, _ in self._live()]

    def __len__(self) -> int:
        return len(self._live())

    # --- activation -----------------------------------------------------------------------
    def __enter__(self) -> Lifecycle:
        _stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack.remove(self)


_default = Lifecycle()
_stack: list[Lifecycle] = []


def active_lifecycle() -> Lifecycle:
    """The innermost lifecycle entered with ``with``, or the process-wide default one."""
    return _stack[-1] if _stack else _default


def register(owner: Any, action: Callable[[Any], None] | str, *, name: str, what: str) -> None:
    """Register ``owner`` with the active lifecycle (what trimtab's own classes call)."""
    active_lifecycle().register(owner, action, name=name, what=what)


@contextlib.contextmanager
def detached() -> Iterator[None]:
    """Construct objects that register with no lifecycle (for throwaway copies in tests)."""
    scratch = Lifecycle()
    with scratch:
        yield
