"""A Gymnasium env's state as plain data (tensors, numbers, strings, lists, dicts), so that a
checkpoint never holds a pickled object: it loads with ``torch.load(weights_only=True)`` and
nothing in it can run code.

:func:`env_state` walks the wrapper chain (outermost first) and keeps, per layer, every
attribute that is data: numbers, strings, None, numpy arrays and scalars, numpy random
generators (as their bit generator's state) and legacy ``RandomState`` s (as their state tuple),
named tuples (as their fields, rebuilt as the env's own type), and lists, tuples and str-keyed
dicts of those. :func:`to_data` and :func:`from_data` are the encoding, for
other kinds of env (bsuite's) that walk their own layers.
What is not data (spaces, the ``env`` link itself, renderers, specs) is rebuilt by making the
env afresh; :func:`restore_env` then writes the saved data back, layer by layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["EnvStateError", "env_state", "from_data", "restore_env", "to_data"]


class EnvStateError(ValueError):
    """A saved env state that does not fit the env it is restored into."""


class _NotData(TypeError):
    """A value that is not data (a function, a space, a renderer): not saved."""


# Attributes rebuilt with the env, never saved: the chain link, the spaces (their own
# generators draw nothing the trainer uses) and the spec.
_SKIP = frozenset({
    "env", "_env", "action_space", "observation_space", "_action_space", "_observation_space",
    "spec", "_cached_spec", "metadata", "render_mode",
})  # fmt: skip


def to_data(v: Any) -> Any:
    """``v`` as plain data (see the module docstring); a ``TypeError`` where it is not data."""
    return _to_data(v)


def from_data(d: Any, current: Any = None) -> Any:
    """The value :func:`to_data` encoded; ``current`` (the fresh env's attribute) is written
    into in place where it is a generator, or gives the type of a named tuple."""
    return _from_data(d, current)


def _to_data(v: Any) -> Any:
    if isinstance(v, np.generic):  # first: np.float64 is a float, and pickles as numpy's
        return {"__npscalar__": str(v.dtype), "value": v.item()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.random.Generator):
        return {"__generator__": _to_data(v.bit_generator.state)}
    if isinstance(v, np.random.RandomState):
        return {"__randomstate__": _to_data(v.get_state(legacy=True))}
    if isinstance(v, tuple) and hasattr(type(v), "_fields"):  # a named tuple
        return {
            "__namedtuple__": type(v).__qualname__,
            "fields": {k: _to_data(x) for k, x in zip(type(v)._fields, v, strict=True)},
        }
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            raise _NotData
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(v).copy()),
                "dtype": str(v.dtype)}  # fmt: skip
    if isinstance(v, tuple):
        return {"__tuple__": [_to_data(x) for x in v]}
    if isinstance(v, list):
        return [_to_data(x) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"__dict__": {k: _to_data(x) for k, x in v.items()}}
    raise _NotData


def _from_data(d: Any, current: Any = None) -> Any:
    if isinstance(d, list):
        return [_from_data(x) for x in d]
    if not isinstance(d, dict):
        return d
    if "__generator__" in d:
        state = _from_data(d["__generator__"])
        gen = current
        if not isinstance(gen, np.random.Generator):
            gen = np.random.Generator(getattr(np.random, state["bit_generator"])())
        gen.bit_generator.state = state
        return gen
    if "__randomstate__" in d:
        rs = current if isinstance(current, np.random.RandomState) else np.random.RandomState()
        rs.set_state(_from_data(d["__randomstate__"]))
        return rs
    if "__namedtuple__" in d:
        kind = type(current)
        if not hasattr(kind, "_fields") or kind.__qualname__ != d["__namedtuple__"]:
            raise EnvStateError(
                f"a saved {d['__namedtuple__']} has no counterpart in the env it is restored into"
            )
        return kind(**{k: _from_data(x) for k, x in d["fields"].items()})
    if "__ndarray__" in d:
        return d["__ndarray__"].numpy().astype(d["dtype"], copy=True)
    if "__npscalar__" in d:
        return np.dtype(d["__npscalar__"]).type(d["value"])
    if "__tuple__" in d:
        return tuple(_from_data(x) for x in d["__tuple__"])
    if "__dict__" in d:
        return {k: _from_data(x) for k, x in d["__dict__"].items()}
    raise EnvStateError(f"unknown entry in a saved env state: keys {sorted(d)}")


def _layers(env: Any) -> list[Any]:
    out = [env]
    while hasattr(out[-1], "env") and out[-1].env is not out[-1]:
        out.append(out[-1].env)
    return out


def env_state(env: Any) -> list[dict[str, Any]]:
    """``[{"class": name, "attrs": {name: data}}]``, one per layer of the wrapper chain."""
    state = []
    for layer in _layers(env):
        attrs = {}
        for name, value in vars(layer).items():
            if name in _SKIP:
                continue
            try:
                attrs[name] = _to_data(value)
            except _NotData:
                continue
        state.append({"class": type(layer).__qualname__, "attrs": attrs})
    return state


def restore_env(env: Any, state: list[dict[str, Any]]) -> Any:
    """Write ``state`` (from :func:`env_state`) into ``env``, a freshly made env of the same
    id and wrappers; returns ``env``."""
    layers = _layers(env)
    names = [type(layer).__qualname__ for layer in layers]
    saved = [s["class"] for s in state]
    if names != saved:
        raise EnvStateError(
            f"the saved env has the wrappers {saved}, this one {names}: it was made by another "
            "Gymnasium version or env id"
        )
    for layer, s in zip(layers, state, strict=True):
        for name, data in s["attrs"].items():
            setattr(layer, name, _from_data(data, getattr(layer, name, None)))
    return env
