"""DQNAgent: it learns a contextual bandit and a two-state MDP, Double-DQN selection uses the
online net, target sync, hooks, determinism and exact resume."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from rl_helpers import generic

from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.dqn import AgentConfig, DQNAgent
from trimtab.rl.agent.learner import Learner

SMALL = AgentConfig(
    hidden=32, depth=1, n_atoms=11, n_tau=8, n_tau_target=8, iqn_embed=16, batch_size=64,
    lr=3e-3, n_step=1, gamma=0.9, v_min=-1.0, v_max=3.0, target_update_period=25,
    eps_decay_steps=100, replay_capacity=4096,
)  # fmt: skip


def _batch(obs_dim=3, branches=2, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, obs_dim, generator=g),
        "action": torch.randint(0, 2, (n, branches), generator=g),
        "reward": torch.randn(n, generator=g),
        "next_obs": torch.randn(n, obs_dim, generator=g),
        "discount": torch.full((n,), 0.9),
        "weights": torch.ones(n),
        "indices": torch.arange(n),
    }


def _update(agent, batch, replay=None):
    """One learn step of ``agent`` (no stability: the ``off`` mode's parts)."""
    if not hasattr(agent, "_test_learner"):
        agent._test_learner = Learner.unguarded(agent)
    return agent._test_learner.learn(batch, replay)


def _params(net):
    return torch.cat([p.detach().flatten() for p in net.parameters()])


def test_learns_contextual_bandit_with_multidiscrete_actions():
    # context c ∈ {0, 1}; reward = [a_0 = c] + [a_1 = 2c]: each branch must find its own action
    agent = DQNAgent(2, [2, 3], SMALL)
    replay = agent.make_replay()
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        ctx = torch.randint(0, 2, (16,), generator=g)
        obs = torch.nn.functional.one_hot(ctx, 2).float()
        action = agent.act(obs, step=0)  # ε = 1: uniform exploration
        reward = (action[:, 0] == ctx).float() + (action[:, 1] == 2 * ctx).float()
        done = torch.ones(16, dtype=torch.bool)
        replay.add(obs, action, reward, obs, done, torch.zeros_like(done))
    for _ in range(300):
        _update(agent, replay.sample(SMALL.batch_size, g), replay)
    greedy = agent.act(torch.eye(2), step=10**6, greedy=True)
    assert greedy.tolist() == [[0, 0], [1, 2]]


def test_learns_two_state_mdp_by_bootstrapping():
    # s0 -a0-> end, r = 0.5;  s0 -a1-> s1, r = 0;  s1 -any-> end, r = 1.  Q*(s0) = (0.5, γ = 0.9)
    agent = DQNAgent(2, [2], SMALL)
    replay = agent.make_replay()
    g = torch.Generator().manual_seed(1)
    state = torch.zeros(16, dtype=torch.long)
    for _ in range(64):
        obs = torch.nn.functional.one_hot(state, 2).float()
        action = agent.act(obs, step=0)[:, 0]
        to_s1 = (state == 0) & (action == 1)
        reward = torch.where(state == 1, 1.0, torch.where(to_s1, 0.0, 0.5))
        next_state = to_s1.long()
        next_obs = torch.nn.functional.one_hot(next_state, 2).float()
        replay.add(obs, action[:, None], reward, next_obs, ~to_s1, torch.zeros_like(to_s1))
        state = next_state  # an episode end resets to s0
    for _ in range(400):
        _update(agent, replay.sample(SMALL.batch_size, g), replay)
    with torch.no_grad():
        z = torch.linspace(SMALL.v_min, SMALL.v_max, SMALL.n_atoms)[None]
        q = agent.online.q_values(agent.online(torch.eye(2)).logits, z)
    assert q[0, 0].argmax().item() == 1
    assert q[0, 0].tolist() == pytest.approx([0.5, 0.9], abs=0.1)
    assert q[1, 0].tolist() == pytest.approx([1.0, 1.0], abs=0.1)


def _hand_set(net, adv_bias):
    """Make the C51 logits ignore the input: zero the value stream and advantage weights."""
    with torch.no_grad():
        if net.c51_head.value is not None:
            net.c51_head.value[-1].weight.zero_()
            net.c51_head.value[-1].bias.zero_()
        net.c51_head.adv_out.weight.zero_()
        net.c51_head.adv_out.bias.copy_(adv_bias.reshape(1, -1))


def test_double_dqn_selects_with_online_and_evaluates_with_target():
    cfg = dataclasses.replace(SMALL, n_atoms=5, v_min=-2.0, v_max=2.0, iqn_weight=0.0)
    agent = DQNAgent(3, [3], cfg)
    high, mid, low = (torch.nn.functional.one_hot(torch.tensor(i), 5) * 8.0 for i in (4, 2, 0))
    _hand_set(agent.online, torch.stack([low, high, low]))  # online prefers action 1
    _hand_set(agent.target, torch.stack([high, mid, low]))  # target alone would pick action 0
    batch = _batch(obs_dim=3, branches=1)
    batch["reward"].zero_()
    batch["discount"].fill_(1.0)  # T z = z: the target is the target net's p(x', a*) itself
    _, info = agent.compute_loss(batch)
    assert (info["next_action"] == 1).all()
    z = torch.linspace(-2.0, 2.0, 5)
    with torch.no_grad():
        p = torch.softmax(agent.target(batch["next_obs"]).logits[:, 0], dim=-1)  # [B, A, N]
    torch.testing.assert_close(info["target_mean"], (p[:, 1] * z).sum(-1).mean())
    assert (p[:, 0] * z).sum(-1).mean() > info["target_mean"] + 1.0


@pytest.mark.parametrize("dueling", [True, False])
def test_without_double_dqn_the_target_net_selects(dueling):
    cfg = dataclasses.replace(
        SMALL, n_atoms=5, v_min=-2.0, v_max=2.0, iqn_weight=0.0, double_dqn=False, dueling=dueling
    )
    agent = DQNAgent(3, [3], cfg)
    high, mid, low = (torch.nn.functional.one_hot(torch.tensor(i), 5) * 8.0 for i in (4, 2, 0))
    _hand_set(agent.online, torch.stack([low, high, low]))  # online alone would pick action 1
    _hand_set(agent.target, torch.stack([high, mid, low]))  # the target net prefers action 0
    batch = _batch(obs_dim=3, branches=1)
    batch["reward"].zero_()
    batch["discount"].fill_(1.0)
    _, info = agent.compute_loss(batch)
    assert (info["next_action"] == 0).all()
    z = torch.linspace(-2.0, 2.0, 5)
    with torch.no_grad():
        p = torch.softmax(agent.target(batch["next_obs"]).logits[:, 0], dim=-1)
    torch.testing.assert_close(info["target_mean"], (p[:, 0] * z).sum(-1).mean())


@pytest.mark.parametrize("iqn_weight", [0.5, 0.0])
@pytest.mark.parametrize("split_reward", [False, True])
def test_gamma_zero_targets_are_the_reward_and_skip_the_next_state(iqn_weight, split_reward):
    """At γ = 0 the target is the reward's point mass: the same projected C51 target and IQN
    samples as the general path's with every γ^k = 0 (to within the rounding of its softmax's
    mass), with no forward of either network on x' and no next action."""
    cfg = dataclasses.replace(SMALL, gamma=0.0, iqn_weight=iqn_weight)
    fast = DQNAgent(3, [3, 3], cfg)
    general = DQNAgent(3, [3, 3], dataclasses.replace(cfg, gamma=0.5))  # the same weights
    batch = _batch(obs_dim=3, branches=2)
    batch["discount"].zero_()  # γ^k = 0: what the general path computes at γ = 0
    if split_reward:  # each branch its own part of the reward
        batch["reward"] = torch.randn(16, 2, generator=torch.Generator().manual_seed(3))
    batch["reward"][0] = 2.0  # a target on an atom, and one past the support's edge
    batch["reward"][1] = 9.0
    runs = []
    for net in (fast.online, fast.target):
        net.register_forward_hook(lambda m, i, out: runs.append(i[0].data_ptr()))
    z = fast.atoms(torch.tensor(-1.0), torch.tensor(3.0))
    v = (torch.full((2,), -1.0), torch.full((2,), 3.0))
    got, want = fast.bellman_targets(batch, z), general.bellman_targets(batch, z)
    assert batch["next_obs"].data_ptr() not in runs and got.next_action is None
    assert torch.equal(got.bounded, want.bounded)  # G + 0 · (a finite value) is G
    from trimtab.rl.agent.losses import c51_projection

    m = c51_projection(got.tz, got.next_probs, *v)
    torch.testing.assert_close(m, c51_projection(want.tz, want.next_probs, *v), rtol=0,
                               atol=1e-6)  # fmt: skip
    assert torch.equal(m.sum(-1), torch.ones(16, 2))  # all of the mass, exactly
    _, info = fast.compute_loss(batch)
    assert "next_action" not in info and torch.isfinite(info["loss"])
    # the bound clamps the IQN samples in place: they never alias the reward that tz views,
    # not even where one sample per branch makes the expansion a view of the same shape
    one = DQNAgent(3, [3, 3], dataclasses.replace(cfg, n_tau_target=1))
    reward, tz = batch["reward"].clone(), one.bellman_targets(batch, z)
    tz.bounded.fill_(-123.0)
    assert torch.equal(batch["reward"], reward) and not (tz.tz == -123.0).any()


def test_adam_eps_reaches_the_optimizer():
    seen = {}

    def factory(params, lr, eps):
        seen.update(lr=lr, eps=eps)
        return torch.optim.Adam(params, lr=lr, eps=eps)

    agent = DQNAgent(
        3, [2], dataclasses.replace(SMALL, adam_eps=0.01 / 128), optimizer_factory=factory
    )
    assert seen == {"lr": SMALL.lr, "eps": 0.01 / 128}
    assert agent.optimizer.param_groups[0]["eps"] == 0.01 / 128


def test_target_sync_periodic_and_manual():
    agent = DQNAgent(3, [2, 2], dataclasses.replace(SMALL, target_update_period=4))
    before = _params(agent.target)
    _update(agent, _batch())
    assert not torch.equal(_params(agent.online), _params(agent.target))
    assert torch.equal(_params(agent.target), before)
    agent.sync_target()
    assert torch.equal(_params(agent.online), _params(agent.target))
    _update(agent, _batch(seed=1))
    _update(agent, _batch(seed=2))
    assert not torch.equal(_params(agent.online), _params(agent.target))
    _update(agent, _batch(seed=3))  # the fourth update: periodic hard sync
    assert torch.equal(_params(agent.online), _params(agent.target))


def test_act_explores_per_branch_inside_branch_sizes():
    agent = DQNAgent(3, [2, 5], SMALL)
    obs = torch.zeros(2000, 3)
    random = agent.act(obs, step=0)  # ε = 1
    assert set(random[:, 0].tolist()) == {0, 1} and set(random[:, 1].tolist()) == set(range(5))
    greedy = agent.act(obs, step=10**6, greedy=True)
    assert (greedy == greedy[0]).all()
    late = agent.act(obs, step=10**6)  # ε = eps_end = 0.05 per branch
    differs = (late != greedy).float().mean(0)
    assert (differs < 0.1).all() and (differs > 0.0).all()
    assert agent.epsilon(0) == 1.0 and agent.epsilon(50) == pytest.approx(0.525)
    assert agent.epsilon(10**6) == SMALL.eps_end


def test_support_fn_sets_each_branchs_support():
    calls = []
    v_min, v_max = torch.tensor([0.0, 10.0]), torch.tensor([1.0, 11.0])

    def support():
        calls.append("support")
        return v_min, v_max

    agent = DQNAgent(3, [2, 2], SMALL, support_fn=support)
    batch = _batch()
    batch["reward"].zero_()
    batch["discount"].zero_()  # T z = 0
    info = _update(agent, batch)
    # T z = 0 is clipped to each branch's own V_min: 0 and 10, so the mean target is 5
    torch.testing.assert_close(info["target_mean"], torch.tensor(5.0))
    assert calls == ["support"]  # read once per step
    assert all(isinstance(v, torch.Tensor) for v in info.values())


def test_update_refreshes_replay_priorities():
    agent = DQNAgent(3, [2, 2], dataclasses.replace(SMALL, prioritized=True))
    replay = agent.make_replay()
    b = _batch()
    replay.add(b["obs"], b["action"], b["reward"], b["next_obs"], torch.ones(16, dtype=torch.bool),
               torch.zeros(16, dtype=torch.bool))  # fmt: skip
    batch = replay.sample(8, torch.Generator().manual_seed(0))
    info = _update(agent, batch, replay)
    expected = (info["priorities"] + 1e-6) ** SMALL.priority_alpha
    torch.testing.assert_close(replay.priority[batch["indices"]], expected)


def test_deterministic_given_seed():
    runs = []
    for _ in range(2):
        torch.manual_seed(torch.seed())  # the global RNG must not matter
        agent = DQNAgent(3, [2, 2], SMALL)
        infos = [_update(agent, _batch(seed=s)) for s in range(3)]
        runs.append((_params(agent.online), infos[-1]["loss"], agent.act(torch.randn(5, 3), 0)))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_state_dict_resume_is_exact():
    a = DQNAgent(3, [2, 2], SMALL)
    for s in range(3):
        _update(a, _batch(seed=s))
    blob = io.BytesIO()
    torch.save(a.state_dict(), blob)
    blob.seek(0)
    b = DQNAgent(3, [2, 2], AgentConfig.from_dict(dataclasses.asdict(SMALL)))
    b.load_state_dict(torch.load(blob))
    assert b.num_updates == 3
    ia, ib = _update(a, _batch(seed=9)), _update(b, _batch(seed=9))
    torch.testing.assert_close(ib["loss"], ia["loss"], rtol=0, atol=0)
    assert torch.equal(_params(a.online), _params(b.online))
    assert torch.equal(_params(a.target), _params(b.target))


def test_load_refuses_another_config():
    a = DQNAgent(3, [2, 2], SMALL)
    b = DQNAgent(3, [2, 2], dataclasses.replace(SMALL, gamma=0.5))
    with pytest.raises(ValueError, match="different config"):
        b.load_state_dict(a.state_dict())


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"gamma": 1.5}, "gamma"),
        ({"n_step": 0}, "n_step"),
        ({"n_atoms": 1}, "n_atoms"),
        ({"v_min": 1.0, "v_max": 1.0}, "v_min"),
        ({"eps_end": -0.1}, "eps_end"),
        ({"trunk": "conv"}, "trunk"),
        ({"kappa": -1.0}, "kappa"),
        ({"adam_eps": 0.0}, "adam_eps"),
        ({"trunk": "MLP"}, "'layernorm', 'mlp' or 'gated'"),
        ({"dueling": "no"}, "dueling"),
        ({"double_dqn": 1}, "double_dqn"),
    ],
)
def test_config_validation(change, pattern):
    with pytest.raises(ValueError, match=pattern):
        AgentConfig(**change)


def test_config_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown AgentConfig fields"):
        AgentConfig.from_dict({"gama": 0.9})


def test_fold_boundary_hard_syncs_the_target():
    with Lifecycle() as life:
        agent = DQNAgent(3, [2, 2], SMALL)
    _update(agent, _batch())
    assert not torch.equal(_params(agent.online), _params(agent.target))
    life.fold_boundary()
    assert torch.equal(_params(agent.online), _params(agent.target))


def test_acting_storing_sampling_and_loss_read_nothing_back_to_the_host(monkeypatch):
    agent = DQNAgent(3, [2, 2], dataclasses.replace(SMALL, prioritized=True, n_step=3))
    replay = agent.make_replay()
    b = _batch()
    g = torch.Generator().manual_seed(0)

    def host_read(*_args, **_kwargs):
        raise AssertionError("a host read (item/bool/float/int/tolist) in the hot path")

    for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    for step in range(4):
        action = agent.act(b["obs"], step)
        done = torch.arange(16) % 5 == step
        replay.add(b["obs"], action, b["reward"], b["next_obs"], done, torch.zeros_like(done))
    batch = replay.sample(8, g)
    loss, info = agent.compute_loss(batch)
    replay.update_priorities(batch["indices"], info["priorities"])
    monkeypatch.undo()
    assert torch.isfinite(loss) and len(replay) > 0


def test_atoms_follow_the_support():
    """The atoms an agent reuses for an unchanged support are those of its current values: an
    in-place change of the support, or a new support, gives freshly computed atoms."""
    from trimtab.rl.agent.losses import atoms

    with Lifecycle():
        agent = DQNAgent(2, [2, 3], SMALL)
    lo, hi = torch.tensor([-10.0, -5.0]), torch.tensor([10.0, 5.0])
    z = agent.atoms(lo, hi)
    assert agent.atoms(lo, hi) is z  # unchanged: computed once
    torch.testing.assert_close(z, atoms(lo, hi, SMALL.n_atoms), rtol=0, atol=0)
    hi.mul_(2.0)  # written in place: its version moves
    torch.testing.assert_close(agent.atoms(lo, hi), atoms(lo, hi, SMALL.n_atoms), rtol=0, atol=0)
    lo2 = lo.clone()
    lo2[0] = -1.0  # a new tensor
    torch.testing.assert_close(agent.atoms(lo2, hi), atoms(lo2, hi, SMALL.n_atoms), rtol=0, atol=0)
    assert not torch.equal(agent.atoms(lo2, hi), agent.atoms(lo, hi))


def test_without_iqn_loss_the_agent_builds_no_iqn_head_and_every_weight_steps():
    """iqn_weight = 0: no IQN head (weights that never got a gradient used to ride along: the
    optimizer then took its per-tensor step-count path, the sentinel checked them, checkpoints
    carried them). An agent state that has the head is refused with the reason."""
    from trimtab.rl.agent.learner import build_learner
    from trimtab.rl.config import RunConfig, TrainConfig

    c51_only = dataclasses.replace(SMALL, iqn_weight=0.0)
    cfg = TrainConfig(run=RunConfig(stability="adaptive"), agent=c51_only)
    with Lifecycle():
        learner = build_learner(generic(cfg), 3, [2, 2], torch.device("cpu"))
    agent = learner.agent
    assert not hasattr(agent.online, "tau_embed") and not hasattr(agent.target, "iqn_head")
    for s in range(3):
        learner.learn(_batch(seed=s))
    assert agent.optimizer._equal_steps == [True, True]  # every parameter stepped every step
    with_head = DQNAgent(3, [2, 2], SMALL).state_dict()
    with_head["config"] = dataclasses.asdict(agent.config)
    with pytest.raises(ValueError, match=r"IQN head.*iqn_weight = 0"):
        agent.load_state_dict(with_head)
