"""BranchingQNetwork: shapes for Discrete / MultiDiscrete / unequal branches, Q as expectation,
masking of padded actions, the dueling aggregation and the trunk hook."""

from __future__ import annotations

import math

import pytest
import torch

from trimtab.rl.agent.losses import atoms
from trimtab.rl.agent.networks import BranchingQNetwork, expected_q


def _net(branch_sizes, **kw):
    torch.manual_seed(0)
    return BranchingQNetwork(5, branch_sizes, hidden=16, depth=2, n_atoms=7, iqn_embed=8, **kw)


@pytest.mark.parametrize("dueling", [True, False])
@pytest.mark.parametrize("trunk", ["layernorm", "mlp", "gated"])
@pytest.mark.parametrize("branch_sizes", [[2], [3, 3, 3, 3], [2, 5]])
def test_output_shapes(branch_sizes, trunk, dueling):
    net = _net(branch_sizes, trunk=trunk, dueling=dueling)
    d, a = len(branch_sizes), max(branch_sizes)
    obs = torch.randn(4, 5)
    out = net(obs)
    assert out.trunk.shape == (4, 16)
    assert out.logits.shape == (4, d, a, 7)
    z = atoms(torch.full((d,), -1.0), torch.full((d,), 1.0), 7)
    assert net.q_values(out.logits, z).shape == (4, d, a)
    assert net.quantiles(out.trunk, torch.rand(4, 3)).shape == (4, 3, d, a)
    assert net.action_mask.shape == (d, a)


def test_q_is_expectation_over_per_branch_atoms():
    logits = torch.log(torch.tensor([0.2, 0.3, 0.5])).expand(1, 2, 1, 3)
    z = torch.tensor([[-1.0, 0.0, 1.0], [0.0, 10.0, 20.0]])  # a different support per branch
    q = expected_q(logits, z, torch.ones(2, 1, dtype=torch.bool))
    torch.testing.assert_close(q, torch.tensor([[[0.3], [13.0]]]))


def test_q_uses_the_support_it_is_given():
    net = _net([3, 3])
    logits = net(torch.randn(8, 5)).logits
    z = atoms(torch.tensor([-1.0, -1.0]), torch.tensor([1.0, 1.0]), 7)
    q1, q2 = net.q_values(logits, z), net.q_values(logits, 2 * z + 3)
    torch.testing.assert_close(q2, 2 * q1 + 3)
    assert not any("atom" in k or "support" in k for k in net.state_dict())


def test_padded_actions_are_never_greedy():
    net = _net([2, 5])
    z = atoms(torch.full((2,), -1.0), torch.full((2,), 1.0), 7)
    q = net.q_values(net(torch.randn(256, 5) * 5).logits, z)
    assert torch.isinf(q[:, 0, 2:]).all() and (q[:, 0, 2:] < 0).all()
    assert torch.isfinite(q[:, 1]).all()
    assert (q.argmax(-1)[:, 0] < 2).all()


def test_dueling_shares_value_across_branches():
    # mean over each branch's *valid* actions of V + A − mean A is V, the same in every branch
    net = _net([2, 5, 3])
    logits = net(torch.randn(6, 5)).logits  # [6, 3, 5, 7]
    mask = net.action_mask.float()[None, :, :, None]
    per_branch_mean = (logits * mask).sum(2) / mask.sum(2)  # [6, 3, 7]
    torch.testing.assert_close(per_branch_mean[:, 0], per_branch_mean[:, 1])
    torch.testing.assert_close(per_branch_mean[:, 0], per_branch_mean[:, 2])


def test_trunk_out_module_is_applied_after_the_trunk():
    seen = []

    class Zero(torch.nn.Module):
        def forward(self, h):
            seen.append(h.shape)
            return torch.zeros_like(h)

    net = BranchingQNetwork(5, [3, 3], hidden=16, depth=2, n_atoms=7, iqn_embed=8, trunk_out=Zero())
    out = net(torch.randn(4, 5))
    assert seen == [torch.Size([4, 16])]
    assert (out.trunk == 0).all()
    torch.testing.assert_close(out.logits[0], out.logits[1])  # input no longer matters


def test_iqn_quantiles_depend_on_tau_and_train_the_embedding():
    net = _net([2, 3])
    trunk = net(torch.randn(3, 5)).trunk
    taus = torch.tensor([[0.1, 0.9]]).expand(3, 2)
    z = net.quantiles(trunk, taus)
    assert not torch.allclose(z[:, 0], z[:, 1])
    z.sum().backward()
    assert net.tau_embed.weight.grad is not None and net.tau_embed.weight.grad.abs().sum() > 0
    assert net.c51_head.value[0].weight.grad is None  # the C51 head is not on this path


def test_cosine_embedding_frequencies():
    net = _net([2])
    torch.testing.assert_close(net.cos_freq, math.pi * torch.arange(8, dtype=torch.float32))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"branch_sizes": []}, "branch_sizes"),
        ({"branch_sizes": [2, 0]}, "branch_sizes"),
        ({"n_atoms": 1}, "n_atoms"),
        ({"trunk": "conv"}, "unknown trunk"),
    ],
)
def test_bad_arguments(kwargs, pattern):
    args = {"obs_dim": 5, "branch_sizes": [2], "hidden": 8, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        BranchingQNetwork(**args)


def test_mlp_trunk_is_linear_relu_without_normalisation():
    net = _net([2], trunk="mlp")
    kinds = [type(m) for m in net.trunk]
    assert kinds == [torch.nn.Linear, torch.nn.ReLU, torch.nn.Linear, torch.nn.ReLU]
    obs = torch.randn(4, 5)
    h = obs
    for m in net.trunk:
        h = m(h)
    torch.testing.assert_close(net.features(obs), h)
    # no LayerNorm: scaling the first layer and every bias scales the features (ReLU is
    # positively homogeneous), which a normalised trunk would undo
    with torch.no_grad():
        for p in (net.trunk[0].weight, net.trunk[0].bias, net.trunk[2].bias):
            p.mul_(3.0)
    torch.testing.assert_close(net.features(obs), 3.0 * h)


def test_without_dueling_each_branch_is_one_plain_mlp():
    # CleanRL's C51 network for one branch: trunk -> Linear-ReLU-Linear to actions x atoms
    net = _net([3, 2], trunk="mlp", dueling=False, head_hidden=6)
    head = net.c51_head
    assert head.value is None and not any("value" in k for k in net.state_dict())
    x = torch.randn(4, 5)
    h = net.features(x)
    out = net(x).logits  # [4, 2, 3, 7]
    for d in range(2):
        hidden = torch.relu(h @ head.adv_hidden.weight[d] + head.adv_hidden.bias[d])
        expected = (hidden @ head.adv_out.weight[d] + head.adv_out.bias[d]).reshape(4, 3, 7)
        torch.testing.assert_close(out[:, d], expected)
    # no shared value stream: the per-branch means over valid actions differ
    mask = net.action_mask.float()[None, :, :, None]
    means = (out * mask).sum(2) / mask.sum(2)
    assert not torch.allclose(means[:, 0], means[:, 1])


@pytest.mark.parametrize(
    ("lead", "branches", "width", "out"),
    [((128,), 1, 120, 84), ((128,), 1, 84, 202), ((64,), 4, 33, 17), ((5, 8), 3, 7, 1),
     ((0,), 2, 3, 4), ((1,), 1, 1, 1)],
)  # fmt: skip
def test_branch_linear_is_one_linear_layer_per_branch(lead, branches, width, out):
    """Each branch's output is its own ``x_d W_d + b_d``; the batched product gives exactly the
    numbers of the einsum it replaced (forward, and every gradient), so training is unchanged."""
    from trimtab.rl.agent.networks import _BranchLinear

    torch.manual_seed(0)
    layer = _BranchLinear(branches, width, out)
    x = torch.randn(*lead, branches, width, requires_grad=True)
    y = layer(x)
    assert y.shape == (*lead, branches, out)
    for d in range(branches):
        expected = x[..., d, :] @ layer.weight[d] + layer.bias[d]
        torch.testing.assert_close(y[..., d, :], expected)
    einsum = torch.einsum("...di,dio->...do", x, layer.weight) + layer.bias
    assert torch.equal(y, einsum)
    grad = torch.randn_like(y)
    ours = torch.autograd.grad(y, [x, layer.weight, layer.bias], grad)
    theirs = torch.autograd.grad(einsum, [x, layer.weight, layer.bias], grad)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_without_iqn_no_head_is_built_and_quantiles_say_why():
    net = _net([2, 3], iqn=False)
    names = [n for n, _ in net.named_parameters()]
    assert not [n for n in names if n.startswith(("tau_embed", "iqn_head"))]
    full = _net([2, 3])
    assert sum(p.numel() for p in net.parameters()) < sum(p.numel() for p in full.parameters())
    out = net(torch.randn(4, 5))
    assert out.logits.shape == (4, 2, 3, 7)
    with pytest.raises(RuntimeError, match=r"no IQN head.*iqn=True"):
        net.quantiles(out.trunk, torch.rand(4, 3))


def test_assetwise_network_is_one_function_of_each_assets_own_block():
    """AssetwiseQNetwork: branch d's outputs depend on asset d's features and position only,
    through weights shared by every branch, so permuting the assets permutes the outputs
    (C51 logits and IQN quantiles alike) and changing asset 0's block moves branch 0 alone."""
    from trimtab.rl.agent.networks import AssetwiseQNetwork

    torch.manual_seed(0)
    d, f = 4, 3
    net = AssetwiseQNetwork(d * f + d, [3] * d, hidden=16, depth=2, n_atoms=11, iqn_embed=8)
    feats, pos = torch.randn(5, d, f), torch.randint(-1, 2, (5, d)).float()
    obs = torch.cat([feats.flatten(1), pos], 1)
    out = net(obs)
    assert out.logits.shape == (5, d, 3, 11) and out.trunk.shape == (5, d, 16)
    perm = torch.tensor([2, 0, 3, 1])
    moved = net(torch.cat([feats[:, perm].flatten(1), pos[:, perm]], 1))
    torch.testing.assert_close(moved.logits, out.logits[:, perm])
    taus = torch.rand(5, 6)
    z = net.quantiles(out.trunk, taus)
    assert z.shape == (5, 6, d, 3)
    torch.testing.assert_close(net.quantiles(moved.trunk, taus), z[:, :, perm])
    bumped = feats.clone()
    bumped[:, 0] += 1.0
    other = net(torch.cat([bumped.flatten(1), pos], 1)).logits
    assert not torch.allclose(other[:, 0], out.logits[:, 0])
    torch.testing.assert_close(other[:, 1:], out.logits[:, 1:])
    # one set of weights for every asset: as many as a one-asset network's
    one = BranchingQNetwork(f + 1, [3], hidden=16, depth=2, n_atoms=11, iqn_embed=8)
    assert sum(p.numel() for p in net.parameters()) == sum(p.numel() for p in one.parameters())
    q = net.q_values(out.logits, atoms(-torch.ones(d), torch.ones(d), 11))
    assert q.shape == (5, d, 3)


@pytest.mark.parametrize(
    ("obs_dim", "sizes"), [(10, [3, 3, 3, 3]), (8, [3, 2, 3, 3]), (4, [3, 3, 3, 3])]
)
def test_assetwise_network_refuses_another_layout(obs_dim, sizes):
    from trimtab.rl.agent.networks import AssetwiseQNetwork

    with pytest.raises(ValueError, match="assetwise network needs branches of one size"):
        AssetwiseQNetwork(obs_dim, sizes, hidden=8)
