"""The branching dueling Q-network: a shared trunk, C51 distributional heads per action branch
and an IQN quantile head. Holds no training logic and no support: atoms come in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["AssetwiseQNetwork", "BranchOutput", "BranchingQNetwork", "expected_q"]

TrunkKind = Literal["layernorm", "mlp", "gated"]


class BranchOutput(NamedTuple):
    """What one forward pass returns."""

    trunk: Tensor  # [B, hidden], after ``trunk_out`` (the trunk clamp, where there is one)
    logits: Tensor  # [B, branches, max_actions, n_atoms]; padded actions are masked in Q


def expected_q(logits: Tensor, atoms: Tensor, action_mask: Tensor) -> Tensor:
    """``Q(x, a) = Σ_i z_i p_i(x, a)``: the mean of each action's C51 distribution.

    ``logits [B, D, A, N]``, ``atoms [D, N]`` (or ``[B, D, N]``), ``action_mask [D, A]``; returns
    ``[B, D, A]`` with ``-inf`` on padded actions, so an argmax never picks one.
    """
    q = (torch.softmax(logits, dim=-1) * atoms.unsqueeze(-2)).sum(dim=-1)
    return q.masked_fill(~action_mask, float("-inf"))


class _BranchLinear(nn.Module):
    """``D`` independent linear layers in one batched matrix product with the bias added in it
    (``baddbmm``): ``[..., D, in] -> [..., D, out]``. The same numbers as
    ``einsum("...di,dio->...do") + bias`` on the CPU, bitwise (tested), in about half the time
    at CartPole's sizes."""

    def __init__(self, n_branches: int, in_features: int, out_features: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)  # nn.Linear's default initialisation range
        self.weight = nn.Parameter(
            torch.empty(n_branches, in_features, out_features).uniform_(-bound, bound)
        )
        self.bias = nn.Parameter(torch.empty(n_branches, out_features).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        d, width = x.shape[-2:]
        per_branch = x.reshape(-1, d, width).transpose(0, 1)  # [D, N, in]
        y = torch.baddbmm(self.bias.unsqueeze(1), per_branch, self.weight)  # [D, N, out]
        return y.transpose(0, 1).reshape(*x.shape[:-1], y.shape[-1])


class _GatedResidualBlock(nn.Module):
    """Gated residual network (Lim et al. 2021, TFT): ``LN(x + GLU(W1 ELU(W2 x + b2) + b1))``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc1 = nn.Linear(hidden, hidden)
        self.glu = nn.Linear(hidden, 2 * hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: Tensor) -> Tensor:
        eta = self.fc1(nn.functional.elu(self.fc2(x)))
        return self.norm(x + nn.functional.glu(self.glu(eta), dim=-1))


def _make_trunk(obs_dim: int, hidden: int, depth: int, kind: TrunkKind) -> nn.Sequential:
    if kind in ("layernorm", "mlp"):
        layers: list[nn.Module] = []
        width = obs_dim
        for _ in range(depth):
            norm = [nn.LayerNorm(hidden)] if kind == "layernorm" else []
            layers += [nn.Linear(width, hidden), *norm, nn.ReLU()]
            width = hidden
        return nn.Sequential(*layers)
    if kind == "gated":
        blocks = [_GatedResidualBlock(hidden) for _ in range(depth)]
        return nn.Sequential(nn.Linear(obs_dim, hidden), *blocks)
    raise ValueError(f"unknown trunk {kind!r}; expected 'layernorm', 'mlp' or 'gated'")


class _DuelingBranchHead(nn.Module):
    """Shared value stream plus one advantage stream per branch (Tavakoli et al. 2018).

    ``out_d(x, a) = V(x) + A_d(x, a) − mean_{a' valid} A_d(x, a')``, per output unit (an atom's
    logit for C51, a quantile value for IQN). Input ``[..., hidden]``; output
    ``[..., D, A_max, out]``. With ``dueling=False`` there is no value stream and no mean:
    ``out_d(x, a) = A_d(x, a)``, one plain MLP per branch (CleanRL's C51 head for one branch).
    """

    value: nn.Module | None

    def __init__(
        self,
        hidden: int,
        head_hidden: int,
        branch_sizes: Sequence[int],
        out: int,
        dueling: bool = True,
    ) -> None:
        super().__init__()
        n_branches, max_actions = len(branch_sizes), max(branch_sizes)
        self.shape = (n_branches, max_actions, out)
        self.value = None
        if dueling:
            self.value = nn.Sequential(
                nn.Linear(hidden, head_hidden), nn.ReLU(), nn.Linear(head_hidden, out)
            )
        self.adv_hidden = _BranchLinear(n_branches, hidden, head_hidden)
        self.adv_out = _BranchLinear(n_branches, head_hidden, max_actions * out)
        mask = torch.arange(max_actions) < torch.tensor(list(branch_sizes)).unsqueeze(1)
        self.register_buffer("action_weight", mask.float().unsqueeze(-1), persistent=False)
        n_valid = torch.tensor(list(branch_sizes), dtype=torch.float32)
        self.register_buffer("n_valid", n_valid, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        n_branches, max_actions, out = self.shape
        per_branch = x.unsqueeze(-2).expand(*x.shape[:-1], n_branches, x.shape[-1])
        adv = self.adv_out(torch.relu(self.adv_hidden(per_branch)))
        adv = adv.reshape(*x.shape[:-1], n_branches, max_actions, out)
        if self.value is None:
            return adv
        value = self.value(x)  # [..., out]
        adv_mean = (adv * self.action_weight).sum(dim=-2, keepdim=True) / self.n_valid.view(
            n_branches, 1, 1
        )
        return value.unsqueeze(-2).unsqueeze(-2) + adv - adv_mean


class BranchingQNetwork(nn.Module):
    """Branching dueling distributional Q-network with an implicit-quantile auxiliary head.

    - Trunk ``h = f(x)``: an MLP of ``depth`` Linear–LayerNorm–ReLU layers, the same without
      LayerNorm (``trunk="mlp"``), or a Linear layer followed by ``depth`` gated residual blocks
      (``trunk="gated"``), then ``trunk_out``: a module given by the builder (the trainer's
      adaptive trunk clamp, :class:`trimtab.BoundClamp`) or ``nn.Identity``.
    - C51 head (Bellemare et al. 2017) per branch, dueling across branches (Tavakoli, Pardo &
      Kormushev 2018, *Action Branching Architectures for Deep RL*): logits
      ``ℓ_d(x, a) = V(h) + A_d(h, a) − mean_a' A_d(h, a')`` over ``n_atoms`` atoms; the Q-value is
      ``Σ_i z_i softmax(ℓ_d(x, a))_i`` for atoms ``z`` given by the caller (:func:`expected_q`).
      ``dueling=False`` drops the value stream: ``ℓ_d(x, a) = A_d(h, a)``.
    - IQN head (Dabney et al. 2018): ``φ_j(τ) = ReLU(Σ_{i=0}^{n−1} cos(π i τ) w_ij + b_j)``,
      ``Z_τ(x, a) = g_d(h ⊙ φ(τ))`` with the same dueling-branch structure; ``iqn=False``
      builds none (an agent whose loss has no IQN term: no weights that never train, for the
      optimizer, the sentinel and the checkpoints to carry).

    Unequal branch sizes are padded to ``max(branch_sizes)``; :attr:`action_mask` ``[D, A_max]``
    marks the real actions. ``Discrete(n)`` is ``branch_sizes=[n]``; ``MultiDiscrete(v)`` is
    ``branch_sizes=list(v)``.
    """

    def __init__(
        self,
        obs_dim: int,
        branch_sizes: Sequence[int],
        hidden: int = 256,
        depth: int = 2,
        n_atoms: int = 51,
        iqn_embed: int = 64,
        head_hidden: int | None = None,
        trunk: TrunkKind = "layernorm",
        dueling: bool = True,
        trunk_out: nn.Module | None = None,
        iqn: bool = True,
    ) -> None:
        super().__init__()
        branch_sizes = [int(n) for n in branch_sizes]
        if not branch_sizes or min(branch_sizes) < 1:
            raise ValueError(f"branch_sizes must be a non-empty list of sizes >= 1: {branch_sizes}")
        if obs_dim < 1 or hidden < 1 or depth < 1 or n_atoms < 2 or iqn_embed < 1:
            raise ValueError(
                "need obs_dim, hidden, depth, iqn_embed >= 1 and n_atoms >= 2, got "
                f"{obs_dim=}, {hidden=}, {depth=}, {n_atoms=}, {iqn_embed=}"
            )
        head_hidden = hidden if head_hidden is None else head_hidden
        self.obs_dim, self.branch_sizes, self.n_atoms = obs_dim, branch_sizes, n_atoms
        self.trunk = _make_trunk(obs_dim, hidden, depth, trunk)
        self.trunk_out = trunk_out if trunk_out is not None else nn.Identity()
        self.c51_head = _DuelingBranchHead(hidden, head_hidden, branch_sizes, n_atoms, dueling)
        self.iqn = bool(iqn)
        if self.iqn:
            self.tau_embed = nn.Linear(iqn_embed, hidden)
            self.iqn_head = _DuelingBranchHead(hidden, head_hidden, branch_sizes, 1, dueling)
            self.register_buffer(
                "cos_freq", math.pi * torch.arange(iqn_embed, dtype=torch.float32),
                persistent=False,
            )  # fmt: skip
        mask = torch.arange(max(branch_sizes)) < torch.tensor(branch_sizes).unsqueeze(1)
        self.register_buffer("action_mask", mask, persistent=False)

    @property
    def n_branches(self) -> int:
        return len(self.branch_sizes)

    def features(self, obs: Tensor) -> Tensor:
        """Trunk features ``h = f(x)``, after ``trunk_out``: ``[B, obs_dim] -> [B, hidden]``."""
        return self.trunk_out(self.trunk(obs))

    def forward(self, obs: Tensor) -> BranchOutput:
        h = self.features(obs)
        return BranchOutput(trunk=h, logits=self.c51_head(h))

    def quantiles(self, trunk: Tensor, taus: Tensor) -> Tensor:
        """IQN quantile values ``Z_τ(x, a)``: ``trunk [B, H]``, ``taus [B, T] -> [B, T, D, A]``."""
        if not self.iqn:
            raise RuntimeError(
                "this network has no IQN head (built with iqn=False, as an agent with "
                "iqn_weight = 0 builds it); build it with iqn=True to take quantiles"
            )
        phi = torch.relu(self.tau_embed(torch.cos(taus.unsqueeze(-1) * self.cos_freq)))
        return self.iqn_head(trunk.unsqueeze(1) * phi).squeeze(-1)

    def q_values(self, logits: Tensor, atoms: Tensor) -> Tensor:
        """:func:`expected_q` with this network's action mask: ``[B, D, A]``."""
        return expected_q(logits, atoms, self.action_mask)


class AssetwiseQNetwork(BranchingQNetwork):
    """One network shared by every branch, each branch seeing only its own block of the input:
    the *identical independent evaluators* of Jiang, Xu & Liang (2017, *A Deep Reinforcement
    Learning Framework for the Financial Portfolio Management Problem*), with the heads of
    :class:`BranchingQNetwork`.

    The observation is the market's layout ``[x_1 .. x_D, p_1 .. p_D]``: ``D`` blocks of ``F``
    features (one per asset) then the ``D`` positions held. Branch ``d`` gets
    ``h_d = f([x_d, p_d])`` from the trunk and its outputs from one single-branch head applied to
    ``h_d``, the same weights for every ``d``: ``ℓ_d(x, a) = V(h_d) + A(h_d, a) − mean_a' A(h_d,
    a')``. Every asset is then a sample of one function, so a fold's data trains it ``D`` times
    over, and no branch can fit another asset's noise. ``trunk`` is ``[B, D, hidden]``; the
    branches must have one size (one set of levels).
    """

    def __init__(self, obs_dim: int, branch_sizes: Sequence[int], **kwargs: object) -> None:
        sizes = [int(n) for n in branch_sizes]
        d = len(sizes)
        if not sizes or len(set(sizes)) != 1 or obs_dim % d or obs_dim // d < 2:
            raise ValueError(
                f"an assetwise network needs branches of one size and an observation of "
                f"{d} blocks of features plus {d} positions (obs_dim a multiple of {d}, at least "
                f"{2 * d}); got branch_sizes={sizes}, obs_dim={obs_dim}"
            )
        self.block = obs_dim // d  # F features and the position of one asset
        super().__init__(self.block, sizes[:1], **kwargs)  # type: ignore[arg-type]
        self.branch_sizes = sizes
        self.obs_dim = obs_dim
        mask = torch.arange(max(sizes)) < torch.tensor(sizes).unsqueeze(1)
        self.register_buffer("action_mask", mask, persistent=False)

    def own_inputs(self, obs: Tensor) -> Tensor:
        """``[B, D*F + D] -> [B, D, F + 1]``: each asset's features and its position."""
        d, f = self.n_branches, self.block - 1
        feats = obs[..., : d * f].reshape(*obs.shape[:-1], d, f)
        return torch.cat([feats, obs[..., d * f :].unsqueeze(-1)], dim=-1)

    def features(self, obs: Tensor) -> Tensor:
        """Trunk features per branch ``h_d``, after ``trunk_out``: ``[B, D, hidden]``."""
        return self.trunk_out(self.trunk(self.own_inputs(obs)))

    def forward(self, obs: Tensor) -> BranchOutput:
        h = self.features(obs)
        return BranchOutput(trunk=h, logits=self.c51_head(h).squeeze(-3))  # [B, D, A, N]

    def quantiles(self, trunk: Tensor, taus: Tensor) -> Tensor:
        """``trunk [B, D, H]``, ``taus [B, T] -> [B, T, D, A]``."""
        if not self.iqn:
            return super().quantiles(trunk, taus)  # raises: no IQN head
        phi = torch.relu(self.tau_embed(torch.cos(taus.unsqueeze(-1) * self.cos_freq)))
        z = self.iqn_head(trunk.unsqueeze(1) * phi.unsqueeze(2))  # [B, T, D, 1, A, 1]
        return z.squeeze(-1).squeeze(-2)
