"""The env-adapter registry: the config checks an env name against it, the runner builds its
adapter through it, every built-in adapter satisfies the Protocol, and a kind registered from
outside is accepted and built without editing the trainer."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from trimtab.rl.config import EnvConfig, TrainConfig
from trimtab.rl.configio import ConfigError, from_dict
from trimtab.rl.envs import registry
from trimtab.rl.envs.adapters import GymAdapter, MarketAdapter, TorchCartPoleAdapter
from trimtab.rl.envs.bsuite_env import BsuiteAdapter
from trimtab.rl.envs.protocol import EnvAdapter
from trimtab.rl.envs.registry import EnvKind, env_kind, make_adapter, register_env_kind

SMALL = {"data": {"synthetic_days": 420}, "walkforward": {"folds": 2}}


def test_built_in_kinds():
    assert env_kind("market").name == "market" and env_kind("market").walk_forward
    assert env_kind("gym:CartPole-v1").name == "gym" and not env_kind("gym:Acrobot-v1").walk_forward
    assert env_kind("gym:CartPole-v1", "torch").name == "torch"
    assert env_kind("bsuite:cartpole_scale/3").name == "bsuite"
    assert not env_kind("bsuite:cartpole_scale/3").walk_forward
    with pytest.raises(ConfigError, match=r"'dm:x' is no known kind.*'bsuite:BSUITE_ID', 'gym"):
        env_kind("dm:x")
    with pytest.raises(ValueError, match=r"invalid \[env\] config: env.name = 'nope'"):
        EnvConfig(name="nope")


@pytest.mark.parametrize(
    ("data", "cls"),
    [
        (SMALL, MarketAdapter),
        ({"env": {"name": "gym:CartPole-v1"}}, GymAdapter),
        ({"env": {"name": "gym:CartPole-v1", "impl": "torch"}}, TorchCartPoleAdapter),
        ({"env": {"name": "bsuite:mountain_car_scale/1"}}, BsuiteAdapter),
    ],
)
def test_every_built_in_adapter_is_an_env_adapter(data, cls):
    adapter = make_adapter(from_dict(TrainConfig, data), torch.device("cpu"))
    try:
        assert type(adapter) is cls and isinstance(adapter, EnvAdapter)
    finally:
        adapter.close()


def test_a_registered_kind_is_accepted_and_built(monkeypatch):
    built = []

    class Mine(GymAdapter):  # a Gymnasium env under a name of its own
        def __init__(self, cfg, device):
            built.append(cfg.env.name)
            super().__init__(cfg, device)

    module = types.ModuleType("trimtab_test_mine")
    module.Mine = Mine
    monkeypatch.setitem(sys.modules, "trimtab_test_mine", module)
    monkeypatch.setattr(registry, "_KINDS", list(registry._KINDS))
    with pytest.raises(ValueError, match="no known kind"):
        EnvConfig(name="mine:CartPole-v1")
    register_env_kind(EnvKind("mine", "mine:ID", lambda name, impl: name.startswith("mine:"),
                              "trimtab_test_mine:Mine"))  # fmt: skip
    cfg = from_dict(TrainConfig, {"env": {"name": "mine:CartPole-v1"}})
    # not walked forward: the market's keys are refused for it as for any Gymnasium env
    with pytest.raises(
        ConfigError, match=r"walkforward.folds = 2: does nothing in a Gymnasium run"
    ):
        from_dict(TrainConfig, {"env": {"name": "mine:CartPole-v1"}, "walkforward": {"folds": 2}})
    monkeypatch.setattr(GymAdapter, "__init__", lambda self, cfg, device: None)
    adapter = make_adapter(cfg, torch.device("cpu"))
    assert type(adapter) is Mine and built == ["mine:CartPole-v1"]
