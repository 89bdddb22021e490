"""Trading environments: many episodes stepped at once in torch, and a gymnasium wrapper.

One action branch per asset picks a target position among ``levels``; the reward is the
equal-weight portfolio's log return over the next bar, filled and charged as
:mod:`trimtab.rl.backtest.execution` says (next open by default; commission, spread, borrow,
cash).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from trimtab._impl import resolve_impl
from trimtab.rl.backtest.execution import (
    BPS,
    RUIN_EQUITY,
    Costs,
    Fills,
    ruined,
    step_log_return,
    step_reward_parts,
)

__all__ = ["BPS", "RUIN_EQUITY", "BatchedTradingEnv", "Evaluation", "StepResult",
           "TradingGymEnv", "as_costs", "as_fills", "evaluate", "portfolio_log_return",
           "ruined"]  # fmt: skip


def as_fills(returns: Fills | Tensor | np.ndarray) -> Fills:
    """``returns`` as :class:`Fills`: close-to-close log returns ``[T, A]`` fill at the close
    just seen (``same_close``)."""
    if isinstance(returns, Fills):
        return returns
    r = returns.detach().cpu().numpy() if isinstance(returns, Tensor) else np.asarray(returns)
    return Fills.same_close(r)


def as_costs(costs: Costs | float) -> Costs:
    """``costs`` as :class:`Costs`; a number is bp per unit of turnover, all in, nothing else."""
    if isinstance(costs, Costs):
        return costs
    if not float(costs) >= 0:
        raise ValueError(f"a cost of {costs} bp per unit of turnover must be >= 0")
    return Costs(commission_bps=float(costs))


class StepResult(NamedTuple):
    """What one batched ``step`` returns; every field has leading dimension ``n_envs``.

    ``final_obs`` is the observation the step reached (the transition's next state, also
    for envs whose episode just ended); ``obs`` equals it except where the episode ended,
    where it is the first observation of the next episode (same-step autoreset).
    """

    obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    final_obs: Tensor
    episode_return: Tensor
    #: ``[n_envs, A]``: each asset's part of the step's return
    #: (:func:`~trimtab.rl.backtest.execution.step_reward_parts`), with ``reward_parts=True``
    parts: Tensor | None = None


class BatchedTradingEnv:
    """``n_envs`` trading episodes over one fold's data, all stepped by one call.

    Episode: decision days ``t = s, ..., s + window_len - 1`` with a start ``s`` drawn uniformly
    from ``[0, T - 1 - window_len]`` by a seeded ``torch.Generator``; positions start flat.
    At day ``t`` the agent sees ``features[t]`` (flattened) and its current position levels,
    chooses target levels ``l_a = levels[action_a]`` (weights ``w_a = l_a / A``) and receives
    the net log return of bar ``t + 1`` under the fills and costs given
    (:func:`trimtab.rl.backtest.execution.step_log_return`: the old weights earn the part of
    the bar before the fill, the new ones the part after it; turnover pays commission and
    half-spread, cash earns the cash rate and shorts pay the borrow fee).

    With ``|l| <= 1``, ``sum_a |w_a| <= 1`` and ``R > -1``, but a short position loses more
    than everything on a day with ``R > A`` (a bad tick, an unadjusted reverse split): when
    a growth factor of the bar falls to ``RUIN_EQUITY`` or below the day is *ruin*, its reward
    finite (about -15.9 per part), and the episode *terminates* (equity is gone:
    an absorbing state, no bootstrap). Costs are charged on entry and on every change; the
    position is not liquidated at the end of the window. After the last step the episode is
    *truncated* (a time limit, so bootstrap through it), and an ended episode resets in the
    same call. Step makes no host synchronisation and has no Python loop over
    envs, so it runs on a GPU and can be captured in a CUDA graph.

    On CUDA (``impl=None`` with Triton installed) a step is one ``torch.randint`` (the
    autoreset's starts, drawn as the eager step draws them) and one Triton launch
    (:mod:`trimtab.kernels.market`) in place of the eager step's dozens of ops, computing
    theirs op for op (``log1p`` is the CUDA math library's, as torch's; sums over assets run in
    order, where a GPU reduction may not): rewards within float rounding of the eager step's,
    positions, days, flags and observations the same. The eager step is the reference and the
    CPU path; ``impl="torch"`` or ``"triton"`` forces one, by
    :func:`trimtab._impl.resolve_impl`'s rules.
    """

    def __init__(
        self,
        features: Tensor | np.ndarray,
        returns: Fills | Tensor | np.ndarray,
        n_envs: int,
        window_len: int,
        levels: Sequence[float] = (-1.0, 0.0, 1.0),
        costs: Costs | float = 1.0,
        device: torch.device | str | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        reward_parts: bool = False,
        impl: str | None = None,
    ) -> None:
        feats = torch.as_tensor(features)
        fills, self.costs = as_fills(returns), as_costs(costs)
        rets = torch.as_tensor(fills.log_returns)
        if feats.ndim != 3 or rets.shape != feats.shape[:2]:
            raise ValueError(
                f"need features [T, A, F] and log_returns [T, A], got "
                f"{tuple(feats.shape)} and {tuple(rets.shape)}"
            )
        t_len, n_assets, _ = feats.shape
        if not 1 <= window_len <= t_len - 1:
            raise ValueError(f"window_len must be in [1, T - 1 = {t_len - 1}], got {window_len}")
        if n_envs < 1:
            raise ValueError(f"need n_envs >= 1, got {n_envs}")
        if not levels or max(abs(float(x)) for x in levels) > 1:
            raise ValueError(f"levels must be non-empty with |level| <= 1, got {levels}")
        if not (torch.isfinite(feats).all() and np.isfinite(fills.pre).all()
                and np.isfinite(fills.post).all()):  # fmt: skip
            raise ValueError("features and log_returns must be finite (slice off the warm-up)")
        self.device = torch.device(device) if device is not None else feats.device
        self.dtype = dtype
        self.features = feats.to(self.device, dtype)
        self.fills = fills
        self.pre = torch.expm1(torch.as_tensor(fills.pre, device=self.device)).to(dtype)
        self.post = torch.expm1(torch.as_tensor(fills.post, device=self.device)).to(dtype)
        self.levels = torch.tensor([float(x) for x in levels], device=self.device, dtype=dtype)
        self.n_envs, self.window_len, self.n_assets = n_envs, window_len, n_assets
        self.reward_parts = bool(reward_parts)
        self.n_days = t_len
        self.obs_dim = n_assets * feats.shape[2] + n_assets
        self.max_start = t_len - 1 - window_len
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.start = torch.zeros(n_envs, dtype=torch.long, device=self.device)
        self.t = torch.zeros(n_envs, dtype=torch.long, device=self.device)
        self.position = torch.zeros(n_envs, n_assets, dtype=dtype, device=self.device)
        self.episode_return = torch.zeros(n_envs, dtype=dtype, device=self.device)
        self.impl = impl
        self._launch: Any = None
        if resolve_impl(impl, (self.position,), fits=dtype in (torch.float32, torch.float64),
                        why=f"the market step's kernel computes in float32 or float64, not "
                            f"{dtype}") == "triton":  # fmt: skip
            self._launch, self._tables = self._kernel()
        self.reset()

    def _kernel(self) -> tuple[Callable[..., tuple[Tensor, ...]], Any]:
        """The step's kernel launcher and the tables it reads (:mod:`trimtab.kernels.market`),
        with every Python number the reference's ops meet."""
        from trimtab.kernels import market as market_kernel

        c = self.costs
        constants = market_kernel.pack_constants(
            {"floor": RUIN_EQUITY - 1.0, "cash_per_bar": c.cash_per_bar,
             "borrow_per_bar": c.borrow_per_bar, "per_turnover": c.per_turnover,
             "n_assets": float(self.n_assets), "one_over_n_assets": 1.0 / self.n_assets},
            self.dtype, self.device,
        )  # fmt: skip
        tables = market_kernel.Tables(
            self.features.flatten(1).contiguous(), self.pre.contiguous(), self.post.contiguous(),
            self.levels, constants, self.window_len, self.fills.overnight_old,
            c.has_carry,  # as step_log_return's test
        )  # fmt: skip
        return market_kernel.launch_step, tables

    def _random_starts(self) -> Tensor:
        return torch.randint(
            0, self.max_start + 1, (self.n_envs,), generator=self.generator, device=self.device
        )

    def observe(self, day: Tensor, position: Tensor) -> Tensor:
        """Observation ``[n, A*F + A]``: features of ``day`` (flattened) then position levels."""
        return torch.cat([self.features[day].flatten(1), position], dim=1)

    def reset(
        self, seed: int | None = None, starts: Tensor | Sequence[int] | None = None
    ) -> Tensor:
        """Start every env anew (flat); ``starts`` fixes the start days, else they are drawn."""
        if seed is not None:
            self.generator.manual_seed(seed)
        if starts is None:
            s = self._random_starts()
        else:
            s = torch.as_tensor(starts, dtype=torch.long, device=self.device).reshape(self.n_envs)
            if int(s.min()) < 0 or int(s.max()) > self.max_start:
                raise ValueError(f"starts must lie in [0, {self.max_start}]")
        self.start.copy_(s)
        self.t.copy_(s)
        self.position.zero_()
        self.episode_return.zero_()
        return self.observe(self.t, self.position)

    def state_dict(self) -> dict[str, Tensor]:
        """Everything that evolves: episode starts, days, positions, returns, the generator."""
        return {
            "start": self.start.clone(),
            "t": self.t.clone(),
            "position": self.position.clone(),
            "episode_return": self.episode_return.clone(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state["position"].shape != self.position.shape:
            raise ValueError(
                f"env state has {tuple(state['position'].shape)} positions, this env "
                f"{tuple(self.position.shape)}: n_envs or assets differ"
            )
        for name in ("start", "t", "position", "episode_return"):
            getattr(self, name).copy_(state[name])
        self.generator.set_state(state["generator"])

    def _check_action(self, action: Tensor) -> None:
        """Shape, dtype and device, from the tensor's metadata (no host sync): the kernel would
        read a transposed or flat action of as many elements as a scrambled one, and the
        reference reads a uint8 or bool tensor as a mask."""
        want = (self.n_envs, self.n_assets)
        if not isinstance(action, Tensor) or action.dtype not in (torch.int64, torch.int32):
            raise TypeError(
                f"BatchedTradingEnv.step: actions index the levels: need an int64 or int32 "
                f"tensor of shape {want}, got {getattr(action, 'dtype', type(action).__name__)}"
                f" (pass action.long())"
            )
        if tuple(action.shape) != want or action.device != self.position.device:
            raise ValueError(
                f"BatchedTradingEnv.step: need an action of shape {want} (n_envs, assets) on "
                f"{self.position.device}, got {tuple(action.shape)} on {action.device}"
            )

    def step(self, action: Tensor) -> StepResult:
        """Apply ``action[n_envs, A]`` (int64 or int32 indices into ``levels``, on the env's
        device); see the class docstring."""
        self._check_action(action)
        if self._launch is not None:  # the kernel resets from the same draw as below
            return StepResult(*self._launch(
                self._tables, action, self.position, self.t, self.start, self.episode_return,
                self._random_starts(), self.reward_parts,
            ))  # fmt: skip
        new_pos = self.levels[action]
        pre, post = self.pre[self.t + 1], self.post[self.t + 1]
        reward = step_log_return(
            new_pos, self.position, pre, post, self.costs, self.fills.overnight_old
        )
        terminated = ruined(new_pos, self.position, pre, post)
        parts = None
        if self.reward_parts:
            parts = step_reward_parts(
                new_pos, self.position, pre, post, self.costs, self.fills.overnight_old
            )
        self.t += 1
        self.position.copy_(new_pos)
        self.episode_return += reward
        final_obs = self.observe(self.t, self.position)
        truncated = (self.t - self.start >= self.window_len) & ~terminated
        done = terminated | truncated
        ep_return = self.episode_return.clone()
        # Drawn every step, used where an episode ended: computing, not branching, keeps the
        # step free of host syncs and the random stream independent of which envs finished.
        fresh = self._random_starts()
        self.start.copy_(torch.where(done, fresh, self.start))
        self.t.copy_(torch.where(done, fresh, self.t))
        self.position.mul_((~done).to(self.dtype).unsqueeze(1))
        self.episode_return.mul_((~done).to(self.dtype))
        obs = self.observe(self.t, self.position)
        return StepResult(obs, reward, terminated, truncated, final_obs, ep_return, parts)


def portfolio_log_return(
    new_pos: Tensor, old_pos: Tensor, simple_next: Tensor, cost: float
) -> Tensor:
    """The net log return of a fill at the close just seen (``same_close``) with ``cost`` per
    unit of turnover (a fraction) and no financing: :func:`step_log_return`'s special case."""
    zero = torch.zeros_like(simple_next)
    return step_log_return(new_pos, old_pos, zero, simple_next, Costs(cost / BPS), False)


@dataclass(frozen=True, eq=False)
class Evaluation:
    """One sequential run over a window: per decision day, arrays of length ``L``."""

    log_returns: np.ndarray  # [L] net daily log returns (the rewards)
    weights: np.ndarray  # [L, A] weights chosen on each decision day
    turnover: np.ndarray  # [L] sum_a |w_t - w_{t-1}|, from flat before the first day
    asset_log_returns: np.ndarray  # [L, A] the assets' log returns over the same days
    start: int
    end: int
    ruin: int | None = None  # the decision day (0-based in the window) that lost everything


Policy = Callable[[Tensor], Tensor]


def evaluate(
    features: Tensor | np.ndarray,
    returns: Fills | Tensor | np.ndarray,
    policy: Policy | Tensor | np.ndarray,
    *,
    levels: Sequence[float] = (-1.0, 0.0, 1.0),
    costs: Costs | float = 1.0,
    start: int = 0,
    end: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    capture: bool = False,
) -> Evaluation:
    """Run one env deterministically over decision days ``start .. end - 1`` (out of sample).

    ``policy`` maps an observation ``[1, D]`` to actions ``[1, A]`` (called once per day, in
    order, since the position is part of the observation), or is a fixed ``[L, A]`` array of
    actions. ``end`` defaults to ``T - 1``, the last day with a next-day return. After ruin
    (see :class:`BatchedTradingEnv`) nothing is left to trade: the remaining days hold no
    position and earn nothing, and :attr:`Evaluation.ruin` says on which day it happened.

    ``capture`` (a CUDA device): one day (act, env step, record) is captured in a CUDA graph
    after a few eager days and replayed for the rest
    (:class:`trimtab.rl.agent.graphed.CapturedStep`;
    one launch a day instead of a few hundred). The days are the same kernels on the same
    buffers, so the result is the eager one; ``policy`` must then make no host sync (the
    agent's greedy act does not).
    """
    fills = as_fills(returns)
    rets = torch.as_tensor(fills.log_returns)
    end = rets.shape[0] - 1 if end is None else end
    env = BatchedTradingEnv(features, fills, 1, end - start, levels, costs, device, 0, dtype)
    obs = env.reset(starts=[start])
    fixed = None if callable(policy) else torch.as_tensor(policy).to(env.device).long()
    if fixed is not None and fixed.shape != (env.window_len, env.n_assets):
        raise ValueError(
            f"actions must be [{env.window_len}, {env.n_assets}], got {tuple(fixed.shape)}"
        )
    dev, n_days = env.device, env.window_len
    rewards = torch.zeros(n_days, dtype=env.dtype, device=dev)
    positions = torch.zeros(n_days, env.n_assets, dtype=env.dtype, device=dev)
    # Ruin, found on the device (no host read per day): from the day after it, equity is gone:
    # flat, no return, no cost (the env steps on behind the mask; nothing of it is kept).
    alive = torch.ones(1, dtype=torch.bool, device=dev)
    ruin_day = torch.full((1,), n_days, dtype=torch.long, device=dev)
    day = torch.zeros(1, dtype=torch.long, device=dev)  # the decision day, on the device

    def one_day(_: dict[str, Tensor]) -> dict[str, Tensor]:
        action = fixed.index_select(0, day) if fixed is not None else policy(obs)  # type: ignore[operator]
        res = env.step(action.reshape(1, env.n_assets))
        rewards.index_copy_(0, day, torch.where(alive, res.reward, 0.0))
        held = torch.where(alive.unsqueeze(1), env.levels[action.reshape(1, -1)], 0.0)
        positions.index_copy_(0, day, held)
        ruin_day.copy_(torch.where(alive & res.terminated, day, ruin_day))
        alive.logical_and_(~res.terminated)
        obs.copy_(res.obs)
        day.add_(1)
        return {}

    if capture and dev.type == "cuda":
        from trimtab.rl.agent.graphed import CapturedStep

        step = CapturedStep(one_day, [env.generator], addresses=tuple)
        for _ in range(n_days):
            step({})
    else:
        for _ in range(n_days):
            one_day({})
    first = int(ruin_day[0])  # one host read, after the window
    ruin = first if first < n_days else None
    weights = (positions / env.n_assets).double().cpu().numpy()
    prev = np.vstack([np.zeros((1, env.n_assets)), weights[:-1]])
    return Evaluation(
        log_returns=rewards.double().cpu().numpy(),
        weights=weights,
        turnover=np.abs(weights - prev).sum(1),
        asset_log_returns=rets[start + 1 : end + 1].double().cpu().numpy(),
        start=start,
        end=end,
        ruin=ruin,
    )


class TradingGymEnv(gym.Env):
    """A single trading episode behind gymnasium's API (numpy in and out, float32 obs).

    ``reset(seed=...)`` seeds ``self.np_random``, which draws the start day;
    ``options={"start": s}`` fixes it. ``step`` returns the reached observation; after
    ``truncated`` call ``reset`` (gymnasium's vector wrappers do this themselves).
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(
        self,
        features: Tensor | np.ndarray,
        returns: Fills | Tensor | np.ndarray,
        window_len: int,
        levels: Sequence[float] = (-1.0, 0.0, 1.0),
        costs: Costs | float = 1.0,
    ) -> None:
        self._env = BatchedTradingEnv(features, returns, 1, window_len, levels, costs, "cpu")
        n_assets = self._env.n_assets
        self.action_space = gym.spaces.MultiDiscrete([len(levels)] * n_assets)
        # Every observation comes from the given features, so their range bounds the space.
        feats = self._env.features.flatten(1)
        low = torch.cat([feats.min(0).values, self._env.levels.min().expand(n_assets)])
        high = torch.cat([feats.max(0).values, self._env.levels.max().expand(n_assets)])
        self.observation_space = gym.spaces.Box(
            low.numpy().astype(np.float32), high.numpy().astype(np.float32), dtype=np.float32
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        start = (options or {}).get("start")
        if start is None:
            start = int(self.np_random.integers(0, self._env.max_start + 1))
        obs = self._env.reset(starts=[int(start)])
        return obs[0].numpy().astype(np.float32), {"start": int(start)}

    def step(self, action: np.ndarray):
        a = torch.as_tensor(np.asarray(action, dtype=np.int64)).reshape(1, self._env.n_assets)
        info = {"day": int(self._env.t[0])}  # the decision day of this step
        res = self._env.step(a)
        obs = res.final_obs[0].numpy().astype(np.float32)
        return obs, float(res.reward[0]), bool(res.terminated[0]), bool(res.truncated[0]), info
