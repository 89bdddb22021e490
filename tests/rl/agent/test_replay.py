"""ReplayBuffer: n-step transitions against a hand-rolled loop, ring overwrite, uniform and
prioritized sampling, and an exact resume from state_dict."""

from __future__ import annotations

import io

import pytest
import torch

from trimtab.rl.agent.replay import ReplayBuffer

GAMMA = 0.9


def _script(n_envs: int, steps: int, seed: int = 0):
    """Per step: obs [E, 3] = (env, t, 0), next_obs = (env, t, 1), random rewards and actions,
    and episode ends at fixed places (including a step both terminated and truncated)."""
    g = torch.Generator().manual_seed(seed)
    terminated = torch.zeros(max(steps, 14), max(n_envs, 3), dtype=torch.bool)
    truncated = torch.zeros_like(terminated)
    terminated[4, 0] = terminated[5, 0] = terminated[9, 1] = True
    truncated[6, 1] = truncated[2, 2] = truncated[10, 2] = True
    terminated[10, 2] = True  # both: termination wins
    terminated, truncated = terminated[:steps, :n_envs], truncated[:steps, :n_envs]
    rows = []
    for t in range(steps):
        env = torch.arange(n_envs, dtype=torch.float32)
        time = torch.full((n_envs,), float(t))
        obs = torch.stack([env, time, torch.zeros(n_envs)], 1)
        next_obs = torch.stack([env, time, torch.ones(n_envs)], 1)
        action = torch.randint(0, 3, (n_envs, 2), generator=g)
        reward = torch.randn(n_envs, generator=g)
        rows.append((obs, action, reward, next_obs, terminated[t], truncated[t]))
    return rows


def _reference(rows, n_step: int):
    """Hand-rolled n-step transitions, one env and one start step at a time."""
    out = []
    steps, n_envs = len(rows), rows[0][0].shape[0]
    for e in range(n_envs):
        for t in range(steps):
            ret, k = 0.0, 0
            for k, j in enumerate(range(t, min(t + n_step, steps)), start=1):
                _, _, r, nxt, term, trunc = rows[j]
                ret += GAMMA ** (k - 1) * r[e].item()
                if term[e] or trunc[e]:
                    discount = 0.0 if term[e] else GAMMA**k
                    break
            else:
                if k < n_step:  # still pending at the end of the script
                    continue
                discount = GAMMA**k
            out.append((e, t, *rows[t][1][e].tolist(), ret, nxt[e, 1].item(), discount))
    return sorted(out)


def _stored(buf: ReplayBuffer):
    n = len(buf)
    out = []
    for i in range(n):
        env, t, _ = buf.obs[i].tolist()
        assert buf.next_obs[i, 2] == 1.0
        out.append((int(env), int(t), *buf.action[i].tolist(), buf.reward[i].item(),
                    buf.next_obs[i, 1].item(), buf.discount[i].item()))  # fmt: skip
    return sorted(out)


@pytest.mark.parametrize("n_step", [1, 3, 4])
def test_n_step_transitions_match_hand_rolled_loop(n_step):
    rows = _script(n_envs=3, steps=14)
    buf = ReplayBuffer(256, 3, 2, n_step=n_step, gamma=GAMMA)
    for row in rows:
        buf.add(*row)
    got, want = _stored(buf), _reference(rows, n_step)
    assert len(got) == len(want)
    for g_row, w_row in zip(got, want):
        assert g_row[:4] == w_row[:4]  # env, t, action
        assert g_row[4:] == pytest.approx(w_row[4:], abs=1e-5)  # return, successor, discount


def test_terminated_and_truncated_discounts():
    rows = _script(n_envs=3, steps=14)
    buf = ReplayBuffer(256, 3, 2, n_step=3, gamma=GAMMA)
    for row in rows:
        buf.add(*row)
    by_start = {(e, t): (nxt, d) for e, t, *_, nxt, d in _stored(buf)}
    assert by_start[(0, 4)] == (4.0, 0.0)  # terminal step itself
    assert by_start[(0, 3)] == (4.0, 0.0)  # stops at the termination, no bootstrap
    assert by_start[(1, 5)] == pytest.approx((6.0, GAMMA**2))  # truncation bootstraps, k = 2
    assert by_start[(2, 10)] == (10.0, 0.0)  # terminated and truncated: terminated wins
    assert by_start[(1, 7)] == pytest.approx((9.0, 0.0))
    assert by_start[(1, 10)] == pytest.approx((12.0, GAMMA**3))  # full n-step


def test_ring_overwrites_oldest():
    buf = ReplayBuffer(5, 3, 2, n_step=1)
    for obs, a, r, nxt, term, trunc in _script(n_envs=1, steps=8):
        buf.add(obs, a, r, nxt, term, trunc)
    assert len(buf) == 5
    assert sorted(buf.obs[:5, 1].tolist()) == [3.0, 4.0, 5.0, 6.0, 7.0]


def test_uniform_sampling_stays_in_filled_rows():
    buf = ReplayBuffer(100, 3, 2, n_step=1)
    for row in _script(n_envs=3, steps=3):
        buf.add(*row)
    batch = buf.sample(500, torch.Generator().manual_seed(1))
    assert set(batch["indices"].tolist()) == set(range(9))
    assert (batch["weights"] == 1).all()
    assert {k: v.shape[0] for k, v in batch.items()} == dict.fromkeys(batch, 500)


def _filled_prioritized(alpha=1.0):
    buf = ReplayBuffer(20, 3, 2, n_step=1, prioritized=True, alpha=alpha, beta=0.5)
    buf.add(*_script(n_envs=10, steps=1)[0])
    return buf


def test_prioritized_sampling_favours_high_priority():
    buf = _filled_prioritized()
    priorities = torch.ones(10)
    priorities[3] = 100.0
    buf.update_priorities(torch.arange(10), priorities)
    batch = buf.sample(4000, torch.Generator().manual_seed(0))
    idx = batch["indices"]
    assert idx.max() < 10  # empty rows are never drawn
    assert (idx == 3).float().mean() > 0.85  # expected 100/109
    w = batch["weights"]
    assert w.max() <= 1.0 + 1e-6
    torch.testing.assert_close(w[idx == 3][0], torch.tensor(0.01**0.5))  # (P_3 / P_min)^-β


def test_new_transitions_get_max_priority():
    buf = _filled_prioritized()
    buf.update_priorities(torch.arange(10), torch.full((10,), 0.5))
    buf.update_priorities(torch.tensor([0]), torch.tensor([7.0]))
    buf.add(*_script(n_envs=10, steps=1)[0])
    torch.testing.assert_close(buf.priority[10:20], torch.full((10,), 7.0 + 1e-6))


def test_state_dict_round_trip_resumes_exactly():
    rows = _script(n_envs=3, steps=14)
    a = ReplayBuffer(64, 3, 2, n_step=3, gamma=GAMMA, prioritized=True)
    for row in rows[:8]:
        a.add(*row)
    a.update_priorities(torch.arange(6), torch.rand(6) * 3)
    blob = io.BytesIO()
    torch.save(a.state_dict(), blob)
    blob.seek(0)
    b = ReplayBuffer(64, 3, 2, n_step=3, gamma=GAMMA, prioritized=True)
    b.load_state_dict(torch.load(blob))
    ga, gb = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    torch.testing.assert_close(b.sample(32, gb), a.sample(32, ga))
    for row in rows[8:]:  # pending n-step windows came along too
        a.add(*row)
        b.add(*row)
    assert _stored(a) == _stored(b)
    torch.testing.assert_close(b.sample(32, gb), a.sample(32, ga))


def test_load_refuses_other_settings():
    a = ReplayBuffer(64, 3, 2, n_step=3)
    with pytest.raises(ValueError, match="n_step"):
        ReplayBuffer(64, 3, 2, n_step=2).load_state_dict(a.state_dict())


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [({"capacity": 0}, "capacity"), ({"n_step": 0}, "n_step"), ({"gamma": 1.5}, "gamma")],
)
def test_bad_arguments(kwargs, pattern):
    args = {"capacity": 8, "obs_dim": 3, "n_branches": 2, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        ReplayBuffer(**args)


def test_capacity_must_hold_one_step():
    buf = ReplayBuffer(4, 3, 2, n_step=2)
    with pytest.raises(ValueError, match="capacity"):
        buf.add(*_script(n_envs=3, steps=1)[0])


@pytest.mark.parametrize("n_step", [1, 3])
def test_reward_parts_are_summed_per_branch(n_step):
    """With ``reward_parts`` each branch's stored return is the n-step return of its own
    reward column: branch b of a buffer fed ``[r, 2r]`` holds what a shared buffer fed ``r``
    holds, times b + 1; everything else is stored as the shared buffer stores it."""
    rows = _script(n_envs=3, steps=14)
    shared = ReplayBuffer(256, 3, 2, n_step=n_step, gamma=GAMMA)
    split = ReplayBuffer(256, 3, 2, n_step=n_step, gamma=GAMMA, reward_parts=True)
    for obs, action, reward, nxt, term, trunc in rows:
        shared.add(obs, action, reward, nxt, term, trunc)
        split.add(obs, action, torch.stack([reward, 2 * reward], 1), nxt, term, trunc)
    n = len(shared)
    assert len(split) == n and split.reward.shape[1:] == (2,)
    for key in ("obs", "action", "next_obs", "discount"):
        assert torch.equal(getattr(split, key)[:n], getattr(shared, key)[:n])
    torch.testing.assert_close(split.reward[:n, 0], shared.reward[:n])
    torch.testing.assert_close(split.reward[:n, 1], 2 * shared.reward[:n])
    batch = split.sample(8, torch.Generator().manual_seed(0))
    assert batch["reward"].shape == (8, 2)
    other = ReplayBuffer(256, 3, 2, n_step=n_step, gamma=GAMMA)
    with pytest.raises(ValueError, match="reward_parts"):
        other.load_state_dict(split.state_dict())
