from __future__ import annotations

import gc

import pytest
import torch

from trimtab.lifecycle import Lifecycle, active_lifecycle, register


class Counter:
    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


def test_fold_boundary_runs_every_action_in_order():
    life = Lifecycle()
    order: list[str] = []
    a, b = Counter(), Counter()
    life.register(a, lambda o: order.append("a"), name="a", what="first")
    life.register(b, lambda o: order.append("b"), name="b", what="second")
    life.register(a, "reset", name="a.reset", what="reset a")
    life.fold_boundary()
    assert order == ["a", "b"] and a.resets == 1 and b.resets == 0
    assert life.describe() == ["a: first", "b: second", "a.reset: reset a"]
    assert life.boundaries == 1


def test_same_owner_and_name_registers_once():
    life, c = Lifecycle(), Counter()
    life.register(c, "reset", name="c", what="x")
    life.register(c, "reset", name="c", what="x")
    life.fold_boundary()
    assert c.resets == 1 and len(life) == 1


def test_target_sync_copies_online_weights():
    life = Lifecycle()
    online, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    life.register_target_sync(online, target, name="target[q]")
    assert not torch.equal(online.weight, target.weight)
    life.fold_boundary()
    assert torch.equal(online.weight, target.weight)
    assert life.describe() == ["target[q]: hard sync from its online network"]


def test_owners_are_weak():
    life = Lifecycle()
    c = Counter()
    life.register(c, "reset", name="c", what="x")
    del c
    gc.collect()
    assert len(life) == 0 and life.describe() == []


def test_active_lifecycle_nests_and_restores():
    outer = active_lifecycle()
    with Lifecycle() as a:
        assert active_lifecycle() is a
        with Lifecycle() as b:
            c = Counter()
            register(c, "reset", name="c", what="x")
            assert active_lifecycle() is b
        assert active_lifecycle() is a
    assert active_lifecycle() is outer
    b.fold_boundary()
    assert c.resets == 1 and len(a) == 0


def test_register_rejects_missing_method():
    with pytest.raises(TypeError, match="has no method 'nope'"):
        Lifecycle().register(Counter(), "nope", name="c", what="x")
