"""A replay buffer that lives on the device: n-step transitions from a batch of envs, stored and
sampled (uniformly or by priority) with no Python loop over envs and no host synchronisation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trimtab.rl.agent.losses import n_step_discounts, n_step_weights

__all__ = ["ReplayBuffer"]

#: Added to every priority so that a transition with zero loss can still be sampled
#: (Schaul et al. 2016, ε in p_i = |δ_i| + ε). A numerical floor, not a tuned constant.
PRIORITY_EPS = 1e-6

_STORED = ("obs", "action", "reward", "next_obs", "discount")


class ReplayBuffer:
    """Ring buffer of n-step transitions ``(x_t, a_t, G_t, x_{t+k}, γ^k·[not terminated])``.

    **n-step returns on insertion.** Each env keeps a window of its last ``n_step`` transitions
    (tensors ``[n_envs, n_step, ...]``). After each :meth:`add`, a transition leaves its window
    once it has ``n`` rewards after it, with ``G_t = Σ_{k<n} γ^k r_{t+k}``, successor
    ``x_{t+n}`` and ``discount = γ^n``. At an episode end every pending transition leaves at
    once with the rewards it has:

    - *terminated*: ``G_t`` sums up to the terminal reward and ``discount = 0`` (no bootstrap);
    - *truncated* (time limit, not terminated): ``G_t`` sums the ``k`` real rewards and
      ``discount = γ^k``, bootstrapping from ``next_obs`` of that step, which must be the
      truncated episode's last state (gymnasium's final observation), not the reset observation.

    **Storage.** Preallocated device tensors with one spare *scratch* row: every step writes a
    fixed number of candidate rows, those that do not leave their window go to the scratch row,
    and the write position and fill level are device tensors, so adding and sampling never read
    a value back to the host.

    **Prioritized** (Schaul et al. 2016, proportional): ``P(i) = p_i^α / Σ_k p_k^α``, sampled by
    inverse CDF; importance weights ``w_i = (N P(i))^{-β} / max_k w_k = (P(i)/min_k P(k))^{-β}``.
    New transitions get the largest priority seen so far. Priorities must be finite.
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        n_branches: int,
        device: torch.device | str = "cpu",
        n_step: int = 1,
        gamma: float = 0.99,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        obs_dtype: torch.dtype = torch.float32,
        reward_parts: bool = False,
    ) -> None:
        if capacity < 1 or obs_dim < 1 or n_branches < 1 or n_step < 1:
            raise ValueError(
                f"need capacity, obs_dim, n_branches, n_step >= 1, got {capacity=}, {obs_dim=}, "
                f"{n_branches=}, {n_step=}"
            )
        if not 0.0 <= gamma <= 1.0 or alpha < 0.0 or beta < 0.0:
            raise ValueError(
                f"need 0 <= gamma <= 1, alpha >= 0, beta >= 0: {gamma=} {alpha=} {beta=}"
            )
        self.capacity, self.obs_dim, self.n_branches = capacity, obs_dim, n_branches
        self.device = torch.device(device)
        self.n_step, self.gamma = n_step, gamma
        self.prioritized, self.alpha, self.beta = prioritized, alpha, beta
        self.reward_parts = bool(reward_parts)
        # one reward per transition, or one per branch (``reward_parts``: ``[rows, D]``)
        self._reward_shape = (n_branches,) if self.reward_parts else ()
        rows, dev = capacity + 1, self.device  # row `capacity` is the scratch row
        self.obs = torch.zeros(rows, obs_dim, dtype=obs_dtype, device=dev)
        self.next_obs = torch.zeros(rows, obs_dim, dtype=obs_dtype, device=dev)
        self.action = torch.zeros(rows, n_branches, dtype=torch.int64, device=dev)
        self.reward = torch.zeros(rows, *self._reward_shape, dtype=torch.float32, device=dev)
        self.discount = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.priority = torch.zeros(rows if prioritized else 0, dtype=torch.float32, device=dev)
        self._ptr = torch.zeros((), dtype=torch.int64, device=dev)
        self._size = torch.zeros((), dtype=torch.int64, device=dev)
        self._max_priority = torch.ones((), dtype=torch.float32, device=dev)
        # Per-env pending windows, oldest first; allocated on the first add (n_envs known then).
        self._win: dict[str, Tensor] | None = None
        self._win_len: Tensor | None = None  # [n_envs]: how many trailing window slots are real
        self._env_index = torch.zeros(0, dtype=torch.int64, device=dev)  # arange(n_envs)
        pos = torch.arange(n_step, device=dev)
        self._consts = {  # what every n-step add reads and none changes
            "rev": n_step - 1 - pos,  # a window slot is real where length > n - 1 - pos
            "first": pos == 0,
            "weights": n_step_weights(n_step, gamma, torch.float32, dev),
            "powers": n_step_discounts(
                n_step - pos, torch.zeros_like(pos, dtype=torch.bool), gamma
            ),
        }
        # γ^1 as n_step_discounts computes it (a float32 power), for the n_step = 1 path
        self._gamma32 = torch.pow(torch.tensor(gamma), torch.tensor(1.0)).to(dev)

    # --- size -----------------------------------------------------------------------------
    @property
    def size(self) -> Tensor:
        """Number of stored transitions, as a device tensor (reading it needs no sync)."""
        return self._size

    def __len__(self) -> int:
        return int(self._size.item())  # a host sync: for set-up and logging, not the hot loop

    # --- insertion ------------------------------------------------------------------------
    def add(
        self,
        obs: Tensor,
        action: Tensor,
        reward: Tensor,
        next_obs: Tensor,
        terminated: Tensor,
        truncated: Tensor,
    ) -> None:
        """Add one step of ``n_envs`` envs: ``obs/next_obs [E, obs_dim]``, ``action [E, D]``,
        ``reward [E]`` (``[E, D]``, one per branch, with ``reward_parts``),
        ``terminated/truncated [E]``. Completed n-step transitions are stored."""
        terminated = terminated.to(self.device, torch.bool)
        if self.n_step == 1:  # every step leaves its window at once: store it directly
            self._add_one_step(obs, action, reward, next_obs, terminated)
        else:
            self._add_windows(obs, action, reward, next_obs, terminated, truncated)

    def _windows(self, n_envs: int) -> tuple[dict[str, Tensor], Tensor]:
        """Both paths of :meth:`add` start here: the per-env windows and their lengths,
        allocated on the first add, and a check that every add brings as many envs."""
        if self._win is None or self._win_len is None:
            if n_envs * self.n_step > self.capacity:
                raise ValueError(
                    f"capacity {self.capacity} < n_envs*n_step = {n_envs * self.n_step}: one "
                    "step could overwrite rows it writes itself; use a larger capacity"
                )
            self._allocate_windows(n_envs)
        assert self._win is not None and self._win_len is not None
        if n_envs != self._win_len.shape[0]:
            raise ValueError(
                f"add() got {n_envs} envs, the buffer was filled with {self._win_len.shape[0]}"
            )
        return self._win, self._win_len

    def _add_windows(
        self,
        obs: Tensor,
        action: Tensor,
        reward: Tensor,
        next_obs: Tensor,
        terminated: Tensor,
        truncated: Tensor,
    ) -> None:
        """The n-step path of :meth:`add` (valid for every ``n``; ``n = 1`` takes a shortcut).
        What does not change from step to step (the positions, the returns' weights, the
        discounts' powers) was computed when the buffer was built: each add is fewer
        operations, the same values (a GPU runs each as a kernel)."""
        windows, length = self._windows(obs.shape[0])
        n_envs, n, k = obs.shape[0], self.n_step, self._consts
        done = terminated | truncated.to(self.device, torch.bool)

        # 1. Push this step into each env's window, dropping the slot released last step.
        new = {"obs": obs, "action": action, "reward": reward}
        for key, value in new.items():
            win = windows[key]
            win.copy_(torch.cat([win[:, 1:], value.to(win.dtype).unsqueeze(1)], dim=1))
        length.add_(1).clamp_max_(n)

        # 2. Return and discount of every pending transition if it left now.
        valid = length.unsqueeze(1) > k["rev"]  # [E, n]: pos >= n - length
        if self.reward_parts:  # [E, n, D]: each branch's n-step return over the n axis
            rewards = torch.where(valid.unsqueeze(-1), windows["reward"], 0.0)
            returns = (rewards.transpose(1, 2) @ k["weights"]).transpose(1, 2)
        else:
            rewards = torch.where(valid, windows["reward"], 0.0)
            returns = rewards @ k["weights"]  # [E, n]: n_step_returns
        # n_step_discounts(n - pos, terminated): γ^(n - pos), 0 after a termination
        discount = torch.where(terminated.unsqueeze(1), 0.0, k["powers"])  # [E, n]

        # 3. Who leaves: everyone at an episode end, else the oldest once it has n rewards.
        emit = valid & (done.unsqueeze(1) | k["first"])
        self._write(
            emit.reshape(-1),
            obs=windows["obs"].reshape(n_envs * n, -1),
            action=windows["action"].reshape(n_envs * n, -1),
            reward=returns.reshape(n_envs * n, *self._reward_shape),
            discount=discount.reshape(-1),
            next_obs=next_obs.unsqueeze(1),  # one row per env, to each of its n destinations
        )

        # 4. An episode end empties the window; a full window has released its oldest slot.
        length.clamp_max_(n - 1).masked_fill_(done, 0)  # length <= n: a full one drops to n - 1

    def _add_one_step(
        self, obs: Tensor, action: Tensor, reward: Tensor, next_obs: Tensor, terminated: Tensor
    ) -> None:
        """``n_step = 1``: what :meth:`add`'s windows compute, in five row writes (the same rows
        at the same positions: every env emits its step, in env order, with ``G = r`` and
        ``discount = γ·[not terminated]``; the windows stay empty). Fewer operations matter on a
        CPU, where each costs microseconds of host time per env step."""
        n_envs = obs.shape[0]
        self._windows(n_envs)
        dest = (self._ptr + self._env_index[:n_envs]).remainder_(self.capacity)
        self.obs.index_copy_(0, dest, obs.to(self.obs.dtype))
        self.action.index_copy_(0, dest, action.to(torch.int64))
        self.reward.index_copy_(0, dest, reward.to(torch.float32))
        self.next_obs.index_copy_(0, dest, next_obs.to(self.obs.dtype))
        self.discount.index_copy_(0, dest, torch.where(terminated, 0.0, self._gamma32))
        if self.prioritized:
            self.priority[dest] = self._max_priority**self.alpha
        self._ptr.add_(n_envs).remainder_(self.capacity)
        self._size.add_(n_envs).clamp_max_(self.capacity)

    def _allocate_windows(self, n_envs: int) -> None:
        n, dev = self.n_step, self.device
        self._win = {
            "obs": torch.zeros(n_envs, n, self.obs_dim, dtype=self.obs.dtype, device=dev),
            "action": torch.zeros(n_envs, n, self.n_branches, dtype=torch.int64, device=dev),
            "reward": torch.zeros(n_envs, n, *self._reward_shape, dtype=torch.float32, device=dev),
        }
        self._win_len = torch.zeros(n_envs, dtype=torch.int64, device=dev)
        self._env_index = torch.arange(n_envs, device=dev)

    def _write(self, emit: Tensor, **rows: Tensor) -> None:
        """``emit [E·n]``: which window slots leave; each of ``rows`` ``[E·n, ...]``, but
        ``next_obs`` ``[E, 1, obs_dim]``: one row per env, broadcast over its ``n`` slots."""
        # Emitted rows go to consecutive ring positions; the rest land on the scratch row.
        emitted = emit.cumsum(0, dtype=torch.int64)  # the last: how many leave
        dest = torch.where(emit, (self._ptr + emitted - 1) % self.capacity, self.capacity)
        for key, value in rows.items():
            store = getattr(self, key)
            if key == "next_obs":
                store[dest.view(value.shape[0], -1)] = value.to(store.dtype)
            else:
                store[dest] = value.to(store.dtype)
        if self.prioritized:
            self.priority[dest] = self._max_priority**self.alpha
            self.priority[self.capacity] = 0.0
        count = emitted[-1]
        self._ptr.add_(count).remainder_(self.capacity)
        self._size.add_(count).clamp_max_(self.capacity)

    # --- sampling -------------------------------------------------------------------------
    def sample(
        self, batch_size: int, generator: torch.Generator, beta: float | None = None
    ) -> dict[str, Tensor]:
        """A batch of ``batch_size`` transitions drawn with ``generator`` (on this device).

        Keys: ``obs, action, reward`` (the n-step return), ``next_obs, discount`` (γ^k, or 0
        after a termination), ``indices`` (rows, for :meth:`update_priorities`) and ``weights``
        (importance weights; ones when uniform). ``beta`` overrides :attr:`beta` for this call.
        The buffer must not be empty.
        """
        last = self._size - 1
        u = torch.rand(batch_size, generator=generator, device=self.device)
        if self.prioritized:
            p = self.priority[: self.capacity]
            cdf = p.double().cumsum(0)
            idx = torch.searchsorted(cdf, u.double() * cdf[-1], right=True)
            idx = torch.minimum(idx, last)  # rounding at the top end must stay on a stored row
            p_min = torch.where(p > 0, p, float("inf")).min()
            b = self.beta if beta is None else beta
            weights = (p[idx] / p_min) ** (-b)
        else:
            idx = torch.minimum((u * self._size).long(), last)
            weights = torch.ones(batch_size, dtype=torch.float32, device=self.device)
        batch = {key: getattr(self, key)[idx] for key in _STORED}
        batch["indices"] = idx
        batch["weights"] = weights
        return batch

    def update_priorities(self, indices: Tensor, priorities: Tensor) -> None:
        """Set ``p_i = priorities + ε`` for the sampled rows (e.g. each sample's loss). A
        non-finite priority (a step the sentinel has flagged) leaves its row's priority as it
        was: one NaN in the priorities would make every later sample a NaN index."""
        if not self.prioritized:
            return
        p = priorities.detach().to(self.device, torch.float32).abs() + PRIORITY_EPS
        finite = torch.isfinite(p)
        self.priority[indices] = torch.where(finite, p**self.alpha, self.priority[indices])
        top = torch.where(finite, p, 0.0).max()
        torch.maximum(self._max_priority, top, out=self._max_priority)

    # --- checkpointing --------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "obs_dim": self.obs_dim,
            "n_branches": self.n_branches,
            "n_step": self.n_step,
            "gamma": self.gamma,
            "prioritized": self.prioritized,
            "alpha": self.alpha,
            "reward_parts": self.reward_parts,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: storage, ring position, pending windows."""
        state: dict[str, Any] = {"config": self._config(), "beta": self.beta}
        for key in (*_STORED, "priority", "_ptr", "_size", "_max_priority"):
            state[key] = getattr(self, key).clone()
        state["windows"] = None
        if self._win is not None and self._win_len is not None:
            state["windows"] = {k: v.clone() for k, v in self._win.items()}
            state["windows"]["length"] = self._win_len.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = {"reward_parts": False, **state["config"]}  # saved before per-branch rewards
        if saved != self._config():
            raise ValueError(
                f"replay state was saved with {saved}, this buffer is {self._config()}; "
                "construct the buffer with the saved settings to resume"
            )
        self.beta = state["beta"]
        for key in (*_STORED, "priority", "_ptr", "_size", "_max_priority"):
            getattr(self, key).copy_(state[key])
        windows = state["windows"]
        if windows is None:
            self._win, self._win_len = None, None
        else:
            self._win = {k: windows[k].to(self.device).clone() for k in ("obs", "action", "reward")}
            self._win_len = windows["length"].to(self.device).clone()
            self._env_index = torch.arange(self._win_len.shape[0], device=self.device)
