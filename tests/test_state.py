from __future__ import annotations

import math

import pytest
import torch

from trimtab import LayoutMismatchError, Slot, StateVector


def make(**kw) -> StateVector:
    return StateVector(
        [
            Slot("target_bound", doc="p99 |Bellman target|"),
            Slot("weight_bound", size=3, doc="per parameter group"),
            Slot("lr_scale", reset="keep"),
        ],
        **kw,
    )


def test_starts_unset_and_views_share_storage():
    sv = make()
    assert sv.tensor.dtype == torch.float32
    assert sv.tensor.shape == (5,)
    assert torch.isnan(sv.tensor).all()
    v = sv["weight_bound"]
    assert isinstance(v, torch.Tensor) and v.shape == (3,)
    v.fill_(2.0)
    assert sv.tensor[1:4].eq(2.0).all()
    assert sv["target_bound"].dim() == 0
    assert sv.index("lr_scale") == (4, 1)


def test_read_applies_floor_only_where_unset_or_smaller():
    sv = make()
    assert sv.read("target_bound", floor=0.5).item() == 0.5  # unset reads as the floor
    sv.write_("target_bound", 3.0)
    assert sv.read("target_bound", floor=0.5).item() == 3.0
    sv.write_("weight_bound", torch.tensor([0.1, 1.0, float("nan")]))
    assert sv.read("weight_bound", floor=0.5).tolist() == [0.5, 1.0, 0.5]
    assert sv.is_set("weight_bound").tolist() == [True, True, False]


def test_fold_reset_applies_policies():
    sv = make()
    sv.tensor.fill_(7.0)
    sv.reset("fold")
    assert torch.isnan(sv["target_bound"])
    assert torch.isnan(sv["weight_bound"]).all()
    assert sv["lr_scale"].item() == 7.0
    assert any("lr_scale" in line and "kept" in line for line in sv.describe())
    with pytest.raises(ValueError, match="unknown reset event"):
        sv.reset("epoch")


def test_fingerprint_is_stable_and_layout_sensitive():
    a, b = make(), make()
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    # The docstring of a slot is not part of the layout.
    c = StateVector(
        [Slot("target_bound", doc="x"), Slot("weight_bound", 3), Slot("lr_scale", reset="keep")]
    )
    assert c.fingerprint == a.fingerprint
    for other in (
        [Slot("target_bound"), Slot("weight_bound", 4), Slot("lr_scale", reset="keep")],
        [Slot("target_bound"), Slot("weight_bound", 3), Slot("lr_scale")],
        [Slot("weight_bound", 3), Slot("target_bound"), Slot("lr_scale", reset="keep")],
    ):
        assert StateVector(other).fingerprint != a.fingerprint


def test_state_dict_round_trip(tmp_path):
    a = make()
    a.tensor.copy_(torch.arange(5.0))
    path = tmp_path / "sv.pt"
    torch.save(a.state_dict(), path)
    b = make()
    b.load_state_dict(torch.load(path))
    assert torch.equal(a.tensor, b.tensor)
    assert b.as_dict() == {
        "target_bound": [0.0],
        "weight_bound": [1.0, 2.0, 3.0],
        "lr_scale": [4.0],
    }


def test_loading_another_layout_names_both_fingerprints_and_the_slots():
    a = make()
    b = StateVector([Slot("target_bound"), Slot("weight_bound", 4), Slot("atom_span")])
    with pytest.raises(LayoutMismatchError) as err:
        b.load_state_dict(a.state_dict())
    msg = str(err.value)
    assert a.fingerprint in msg and b.fingerprint in msg
    assert "only in checkpoint: lr_scale" in msg
    assert "only in this run: atom_span" in msg
    assert "weight_bound: checkpoint weight_bound(size=3" in msg
    assert torch.isnan(b.tensor).all()  # nothing half-loaded


@pytest.mark.parametrize(
    ("build", "exc", "pattern"),
    [
        (lambda: Slot("a b"), ValueError, "identifier"),
        (lambda: Slot("a", size=0), ValueError, "size must be an int >= 1"),
        (lambda: Slot("a", size=2.0), ValueError, "size must be an int"),
        (lambda: Slot("a", reset="zero"), ValueError, "reset must be one of"),
        (lambda: StateVector([Slot("a"), Slot("a")]), ValueError, "repeated: \\['a'\\]"),
        (lambda: StateVector(["a"]), TypeError, "takes Slot objects"),
        (lambda: make()["nope"], KeyError, "no slot named 'nope'"),
        (
            lambda: make().load_state_dict({"values": torch.zeros(5)}),
            LayoutMismatchError,
            "missing",
        ),
    ],
)
def test_error_table(build, exc, pattern):
    with pytest.raises(exc, match=pattern):
        build()


def test_unset_is_nan_constant():
    from trimtab.state import UNSET

    assert math.isnan(UNSET)


@pytest.mark.gpu
def test_cuda_reads_and_resets_without_sync():
    sv = make(device="cuda")
    two = torch.tensor(2.0, device="cuda")
    floor = torch.tensor(0.25, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sv.write_("target_bound", two)
        r = sv.read("weight_bound", floor=floor)
        sv.reset("fold")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert r.device.type == "cuda" and r.eq(0.25).all().item()


def test_registers_its_fold_reset_with_the_active_lifecycle():
    from trimtab import Lifecycle

    with Lifecycle() as life:
        sv = make()
    sv.tensor.fill_(1.0)
    life.fold_boundary()
    assert torch.isnan(sv["target_bound"]) and sv["lr_scale"].item() == 1.0
    assert "unset slots ['target_bound', 'weight_bound']; keep ['lr_scale']" in life.describe()[0]
