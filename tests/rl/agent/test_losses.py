"""C51 projection, cross-entropy, quantile Huber loss and n-step helpers on hand-worked cases."""

from __future__ import annotations

import math

import pytest
import torch

from trimtab.rl.agent.losses import (
    atoms,
    c51_loss,
    c51_projection,
    n_step_discounts,
    n_step_returns,
    quantile_huber_loss,
)


def _project(p, reward, discount, v_min=-2.0, v_max=2.0):
    """Project one distribution over atoms(v_min, v_max, len(p)) after r + γ z."""
    p = torch.tensor(p, dtype=torch.float64)
    lo, hi = torch.tensor(v_min, dtype=torch.float64), torch.tensor(v_max, dtype=torch.float64)
    z = atoms(lo, hi, p.numel())
    return c51_projection(reward + discount * z, p, lo, hi)


def test_atoms_edges_exact_and_evenly_spaced():
    z = atoms(torch.tensor([-2.0, 0.1]), torch.tensor([2.0, 0.7]), 7)
    assert z.shape == (2, 7)
    assert z[0, 0] == -2.0 and z[0, -1] == 2.0
    assert z[1, 0] == torch.tensor(0.1) and z[1, -1] == torch.tensor(0.7)
    torch.testing.assert_close(z.diff(dim=-1), torch.tensor([[4 / 6] * 6, [0.1] * 6]))


def test_atoms_needs_two():
    with pytest.raises(ValueError, match="at least 2 atoms"):
        atoms(torch.tensor(0.0), torch.tensor(1.0), 1)


def test_projection_hand_example_splits_between_neighbours():
    # atoms -2..2, Δz = 1; Tz = z + 0.5 -> b = 0.5, 1.5, 2.5, 3.5 and 4.5 clipped to 4 (an atom)
    m = _project([0.1, 0.2, 0.3, 0.2, 0.2], reward=0.5, discount=1.0)
    torch.testing.assert_close(m, torch.tensor([0.05, 0.15, 0.25, 0.25, 0.30], dtype=m.dtype))


def test_projection_integer_b_puts_all_mass_on_that_atom():
    # z_1 = -1, Tz = 0 = z_2 exactly: l == u == 2, the case a naive implementation drops
    m = _project([0.0, 1.0, 0.0, 0.0, 0.0], reward=1.0, discount=1.0)
    torch.testing.assert_close(m, torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0], dtype=m.dtype))


def test_projection_identity_when_target_is_the_support():
    p = torch.softmax(torch.randn(11, dtype=torch.float64), 0)
    torch.testing.assert_close(_project(p.tolist(), reward=0.0, discount=1.0), p)


@pytest.mark.parametrize(("reward", "edge"), [(10.0, -1), (-10.0, 0)])
def test_projection_targets_beyond_support_go_to_the_edge_atom(reward, edge):
    m = _project([0.2] * 5, reward=reward, discount=0.9)
    expected = torch.zeros(5, dtype=m.dtype)
    expected[edge] = 1.0
    torch.testing.assert_close(m, expected)


def test_projection_terminal_collapses_to_reward():
    # discount 0: every Tz_j = 0.25 -> b = 2.25 -> 0.75 on atom 2 and 0.25 on atom 3
    m = _project([0.3, 0.1, 0.2, 0.2, 0.2], reward=0.25, discount=0.0)
    torch.testing.assert_close(m, torch.tensor([0.0, 0.0, 0.75, 0.25, 0.0], dtype=m.dtype))


def test_projection_per_branch_supports():
    v_min, v_max = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 4.0])  # both Δz = 1
    p = torch.full((1, 2, 5), 0.2)
    tz = torch.full((1, 2, 5), 0.5)  # a terminal reward of 0.5 in both branches
    m = c51_projection(tz, p, v_min, v_max)
    torch.testing.assert_close(m[0, 0], torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0]))  # b = 2.5
    torch.testing.assert_close(m[0, 1], torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0]))  # b = 0.5


def test_projection_per_sample_per_branch_supports_conserve_mass():
    g = torch.Generator().manual_seed(0)
    batch, branches, n = 64, 3, 21
    v_min = -torch.rand(batch, branches, generator=g, dtype=torch.float64) * 5
    v_max = v_min + 0.1 + torch.rand(batch, branches, generator=g, dtype=torch.float64) * 5
    z = atoms(v_min, v_max, n)
    p = torch.softmax(torch.randn(batch, branches, n, generator=g, dtype=torch.float64), -1)
    reward = torch.randn(batch, 1, 1, generator=g, dtype=torch.float64) * 4
    discount = torch.rand(batch, 1, 1, generator=g, dtype=torch.float64)
    m = c51_projection(reward + discount * z, p, v_min, v_max)
    torch.testing.assert_close(m.sum(-1), torch.ones(batch, branches, dtype=torch.float64))
    assert (m >= 0).all()
    # the mean of the projection is the mean of the clipped targets (linear interpolation)
    tz = torch.maximum(torch.minimum(reward + discount * z, v_max[..., None]), v_min[..., None])
    torch.testing.assert_close((m * z).sum(-1), (p * tz).sum(-1))


def test_projection_collapsed_support_stays_finite():
    m = c51_projection(
        torch.zeros(3), torch.full((3,), 1 / 3), torch.tensor(1.0), torch.tensor(1.0)
    )
    assert torch.isfinite(m).all() and math.isclose(m.sum().item(), 1.0, rel_tol=1e-6)


def test_c51_loss_is_cross_entropy():
    logits = torch.zeros(2, 4)
    target = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    torch.testing.assert_close(c51_loss(logits, target), torch.full((2,), math.log(4)))
    logits = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)]])
    loss = c51_loss(logits, torch.tensor([[1.0, 0.0, 0.0]]))
    torch.testing.assert_close(loss, torch.tensor([math.log(2)]))


def test_quantile_huber_hand_example():
    # one predicted quantile θ = 0 at τ = 0.25, targets 1 and -2, κ = 1:
    # δ = 1: |0.25 − 0| · ½ = 0.125; δ = −2: |0.25 − 1| · (2 − ½) = 1.125; mean = 0.625
    pred, target, taus = torch.zeros(1, 1), torch.tensor([[1.0, -2.0]]), torch.tensor([[0.25]])
    torch.testing.assert_close(
        quantile_huber_loss(pred, target, taus, kappa=1.0), torch.tensor([0.625])
    )
    # κ = 0 is quantile regression: (0.25 · 1 + 0.75 · 2) / 2 = 0.875
    torch.testing.assert_close(
        quantile_huber_loss(pred, target, taus, kappa=0.0), torch.tensor([0.875])
    )
    # κ = 2 keeps both in the quadratic zone, divided by κ: (0.25·0.5 + 0.75·2)/2/2 = 0.40625
    torch.testing.assert_close(
        quantile_huber_loss(pred, target, taus, kappa=2.0), torch.tensor([0.40625])
    )


def test_quantile_huber_sums_over_predictions_and_keeps_trailing_dims():
    pred = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])  # [B=1, N=2, R=2]
    target = torch.tensor([[[1.0, 1.0]]])  # [B=1, N'=1, R=2]
    taus = torch.tensor([[0.25, 0.75]])
    # R=0: δ = 1 for both predictions: 0.25·0.5 + 0.75·0.5 = 0.5; R=1: δ = 0 -> 0
    torch.testing.assert_close(
        quantile_huber_loss(pred, target, taus, 1.0), torch.tensor([[0.5, 0.0]])
    )


def test_quantile_huber_minimiser_is_the_tau_quantile():
    target = torch.arange(100, dtype=torch.float64).view(1, 100)
    grid = torch.linspace(0, 99, 397, dtype=torch.float64)
    taus = torch.full((1, 1), 0.25, dtype=torch.float64)
    losses = torch.stack(
        [quantile_huber_loss(g.view(1, 1), target, taus, kappa=0.01)[0] for g in grid]
    )
    assert 24.0 <= grid[losses.argmin()].item() <= 25.0


def test_quantile_huber_rejects_negative_kappa():
    with pytest.raises(ValueError, match="kappa"):
        quantile_huber_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), -1.0)


def test_n_step_returns_hand_example():
    g = n_step_returns(torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 4.0]]), gamma=0.5)
    torch.testing.assert_close(g, torch.tensor([[2.75, 3.5, 3.0], [1.0, 2.0, 4.0]]))


def test_n_step_discounts_zero_after_termination():
    d = n_step_discounts(torch.tensor([3, 2, 1]), torch.tensor([[False], [True]]), gamma=0.5)
    torch.testing.assert_close(d, torch.tensor([[0.125, 0.25, 0.5], [0.0, 0.0, 0.0]]))


def test_projection_of_a_nan_target_is_nan_not_an_index_error():
    """Issue 11: a NaN reward made Tz NaN and its cast to an index crashed the step. The NaN
    stays visible (in the loss, for the sentinel and found_inf); no index leaves [0, N)."""
    n = 5
    z = atoms(torch.tensor(-1.0), torch.tensor(1.0), n)
    tz = torch.stack([z, z + math.nan, z.clone().fill_(math.inf)])  # finite, NaN, +Inf rows
    probs = torch.full((3, n), 1.0 / n)
    m = c51_projection(tz, probs, torch.tensor(-1.0), torch.tensor(1.0))
    torch.testing.assert_close(m[0], probs[0])
    assert torch.isnan(m[1]).any()
    torch.testing.assert_close(m[2], torch.tensor([0.0, 0, 0, 0, 1]))  # +Inf clips to V_max
