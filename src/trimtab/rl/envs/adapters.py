"""The built-in environments the runner trains on, behind one interface
(:class:`~trimtab.rl.envs.protocol.EnvAdapter`, chosen by :mod:`trimtab.rl.envs.registry`):
walk-forward market folds (a :class:`BatchedTradingEnv` per fold, tested out of sample) and a
Gymnasium env (one "fold").

An adapter knows its folds, opens a fold's envs, steps them with device tensors in and out,
saves and restores a fold mid-way (for ``--resume``), and evaluates the greedy policy at a
fold's end. It never learns: the runner does that, the same way for every adapter.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trimtab.rl.config import GYM_TOTAL_STEPS, TrainConfig
from trimtab.rl.configio import ConfigError
from trimtab.rl.data.features import encoded_width
from trimtab.rl.envs.protocol import EnvStep, FoldPlan

__all__ = ["EnvStep", "FoldPlan", "GymAdapter", "MarketAdapter", "TorchCartPoleAdapter"]


class MarketAdapter:
    """Walk-forward folds: fold k trains a fresh :class:`BatchedTradingEnv` on its training days
    (windows 0 to k, or window k alone: ``walkforward.train_window``; features normalised with
    their statistics) and is evaluated greedily on window k+1."""

    #: the envs live on the run's device: a step can be captured (trimtab.rl.run.collect)
    on_device = True

    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        from trimtab.rl.run.walkforward import load_market, make_folds

        self.cfg, self.device = cfg, device
        # each asset's branch learns from its own asset's part of the return (env.reward)
        self.reward_parts = cfg.env.reward == "per_asset"
        self.market = load_market(cfg)  # a DataError here leaves no run directory behind
        self.folds = make_folds(self.market.n_days, cfg)
        self.n_folds, self.n_envs = len(self.folds), cfg.env.n_envs
        n_assets, n_features = self.market.features.shape[1:]
        width = encoded_width(n_features, cfg.env.feature_bins)  # each feature and its bins
        self.obs_dim = n_assets * width + n_assets  # features and the position held
        self.branch_sizes = [len(cfg.env.levels)] * n_assets
        self.env: Any = None
        self.feats: np.ndarray | None = None
        self.norm: Any = None

    def plan(self, k: int) -> FoldPlan:
        wf = self.cfg.walkforward
        return FoldPlan(k, wf.learning_starts, wf.steps_per_fold, max_updates=wf.steps_per_fold)

    def updates_due(self, before: int, after: int) -> int:
        """Gradient steps after a batched env step that took the fold from ``before`` to
        ``after`` env steps (once learning has started)."""
        return self.cfg.walkforward.updates_per_step

    def open_fold(self, k: int, seed: int) -> Tensor:
        from trimtab.rl.envs.trading import BatchedTradingEnv
        from trimtab.rl.run.walkforward import fold_arrays

        fold, env_cfg = self.folds[k], self.cfg.env
        self.feats, self.norm = fold_arrays(self.market, fold, self.cfg.env.feature_bins)
        a, b = fold.train_start, fold.fit_end  # the embargo's days are not trained on
        self.env = BatchedTradingEnv(
            self.feats[a:b], self.market.fills.slice(a, b), n_envs=env_cfg.n_envs,
            window_len=min(env_cfg.episode_days, b - a - 1), levels=env_cfg.levels,
            costs=self.market.costs, device=self.device, seed=seed,
            reward_parts=self.reward_parts,
        )  # fmt: skip
        return self.env.reset()

    def step(self, action: Tensor) -> EnvStep:
        r = self.env.step(action)
        reward = r.parts if self.reward_parts else r.reward
        return EnvStep(r.obs, reward, r.final_obs, r.terminated, r.truncated, r.episode_return)

    def generators(self) -> list[torch.Generator]:
        """What a step draws from (episode starts): registered with a captured collection."""
        return [self.env.generator]

    def state_dict(self) -> dict[str, Any]:
        return self.env.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state)

    def normalizer_state(self) -> dict[str, Any]:
        return self.norm.state_dict()

    def evaluate(self, agent: Any, k: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Greedy, out of sample on window k+1: the fold's row and its daily curves."""
        from trimtab.rl.run.walkforward import evaluate_fold

        def policy(obs: Tensor) -> Tensor:
            return agent.act(obs.to(agent.device, torch.float32), 0, greedy=True)

        fold = self.folds[k]
        return evaluate_fold(self.market, fold, self.feats, policy, self.cfg, self.device)

    def summary(self, rows: list[dict[str, Any]], run_dir: Any = None) -> dict[str, Any]:
        """The data's warnings and issues, the folds' aggregate and, given the run directory
        that holds the folds' curves, the pooled out-of-sample backtest (``oos``,
        ``baselines``, ``vs_baselines``; it writes ``oos.csv``)."""
        from dataclasses import asdict

        from trimtab.rl.backtest.pooled import pool
        from trimtab.rl.report.build import aggregate_folds

        pooled = pool(run_dir, rows, self.market, self.cfg) if run_dir and rows else {}
        return {"data_warnings": list(self.market.data.warnings),
                "data_issues": [asdict(i) for i in self.market.data.issues],
                "periods_per_year": self.market.periods_per_year,
                **pooled,
                "aggregate": aggregate_folds(rows, pooled.get("oos"))}  # fmt: skip

    def close(self) -> None:
        self.env = None


def make_gym_env(env_id: str) -> Any:
    import gymnasium as gym

    try:
        return gym.make(env_id)
    except gym.error.Error as e:
        raise ConfigError(f"--env gym:{env_id}: {e}") from None


def branch_sizes_of(space: Any) -> list[int]:
    """Discrete(n) actions are one branch of n; 1-D MultiDiscrete one branch per dimension."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return [int(space.n)]
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return [int(n) for n in space.nvec]
    raise ConfigError(
        f"the agent needs Discrete or 1-D MultiDiscrete actions; this env has {space}"
    )


class GymAdapter:
    """A Gymnasium env as one fold of ``gym.total_steps`` env steps (``"auto"``:
    :data:`~trimtab.rl.config.GYM_TOTAL_STEPS`): ``env.n_envs`` copies
    stepped in turn with same-step autoreset (the true last observation of an episode is the
    stored successor), then ``gym.eval_episodes`` greedy episodes on a fresh env.

    The envs are stepped here, not by ``gym.vector.SyncVectorEnv``, so that their state
    (including each env's RNG) can be saved into a checkpoint as plain data
    (:mod:`trimtab.rl.envs.gym_state`) and a resumed run continues exactly where the interrupted
    one was.
    """

    #: the envs step on the host: collection runs eagerly (trimtab.rl.run.collect)
    on_device = False
    reward_parts = False  # one reward per step

    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        import gymnasium as gym

        self.cfg, self.device = cfg, device
        self.env_id = cfg.env.name.removeprefix("gym:")
        probe = make_gym_env(self.env_id)
        self.discrete = isinstance(probe.action_space, gym.spaces.Discrete)
        self.branch_sizes = branch_sizes_of(probe.action_space)
        self.obs_dim = int(np.prod(probe.observation_space.shape))
        probe.close()
        self.n_folds, self.n_envs = 1, cfg.env.n_envs
        self.envs: list[Any] = []
        self.ep_return = np.zeros(self.n_envs)
        self.finished: deque[float] = deque(maxlen=100)  # training returns, for the summary

    def plan(self, k: int) -> FoldPlan:
        g, n = self.cfg.gym, self.n_envs
        total = GYM_TOTAL_STEPS if g.total_steps == "auto" else g.total_steps
        # env steps advance by n: learning starts at the first multiple of n >= learning_starts
        last = -(-total // n) * n
        first = max(-(-g.learning_starts // n) * n, n)
        expected = max(last // g.train_every - (first - n) // g.train_every, 0)
        return FoldPlan(k, g.learning_starts, expected, max_env_steps=total)

    def updates_due(self, before: int, after: int) -> int:
        """One gradient step per ``gym.train_every`` env steps (summed over envs)."""
        every = self.cfg.gym.train_every
        return after // every - before // every

    def open_fold(self, k: int, seed: int) -> Tensor:
        self.close()
        self.envs = [make_gym_env(self.env_id) for _ in range(self.n_envs)]
        self.ep_return = np.zeros(self.n_envs)
        return self._obs([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])

    def _obs(self, rows: list[Any]) -> Tensor:
        x = np.stack([np.asarray(o, dtype=np.float32).reshape(-1) for o in rows])
        return torch.as_tensor(x, device=self.device)

    def _env_actions(self, action: Tensor) -> np.ndarray:
        a = action.cpu().numpy()
        return a[:, 0] if self.discrete else a

    def step(self, action: Tensor) -> EnvStep:
        # Each env's row is written into numpy arrays made for this step (the conversions of
        # _obs and torch.tensor, element by element), then each becomes a tensor without a
        # copy: a handful of host operations per env step, which a CPU run pays 30k times.
        n = self.n_envs
        obs = np.empty((n, self.obs_dim), dtype=np.float32)
        final = np.empty_like(obs)
        rewards = np.empty(n)  # float64, as the episode returns add them
        term, trunc = np.empty(n, dtype=bool), np.empty(n, dtype=bool)
        for i, (env, a) in enumerate(zip(self.envs, self._env_actions(action), strict=True)):
            o, r, te, tr, _ = env.step(a)
            final[i] = np.asarray(o, dtype=np.float32).reshape(-1)
            if te or tr:  # same-step autoreset: the successor stored is the true last state
                o, _ = env.reset()
            obs[i] = np.asarray(o, dtype=np.float32).reshape(-1)
            rewards[i] = float(r)
            term[i] = bool(te)
            trunc[i] = bool(tr) and not te
        self.ep_return += rewards
        done = term | trunc
        ended = self.ep_return.copy()
        self.finished.extend(float(x) for x in ended[done])
        self.ep_return[done] = 0.0
        dev = self.device
        return EnvStep(
            torch.from_numpy(obs).to(dev), torch.from_numpy(rewards.astype(np.float32)).to(dev),
            torch.from_numpy(final).to(dev), torch.from_numpy(term).to(dev),
            torch.from_numpy(trunc).to(dev), torch.from_numpy(ended).to(dev),
        )  # fmt: skip

    def generators(self) -> list[torch.Generator]:
        """No device generator: the envs draw from their own numpy generators on the host."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """Plain data only (trimtab.rl.envs.gym_state): a checkpoint never holds a pickled env."""
        from trimtab.rl.envs.gym_state import env_state

        return {"envs": [env_state(env) for env in self.envs],
                "ep_return": torch.from_numpy(self.ep_return.copy()),
                "finished": list(self.finished)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from trimtab.rl.envs.gym_state import restore_env

        self.close()
        self.envs = [restore_env(make_gym_env(self.env_id), s) for s in state["envs"]]
        self.ep_return = np.asarray(state["ep_return"], dtype=np.float64).copy()
        self.finished = deque(state["finished"], maxlen=100)

    def normalizer_state(self) -> None:
        return None

    def evaluate(self, agent: Any, k: int) -> tuple[dict[str, Any], None]:
        """Undiscounted returns of ``gym.eval_episodes`` greedy episodes, episode ``i`` on a
        fresh env reset with seed ``10_000 + run.seed + i``. The episodes run side by side: one
        batched greedy action per step for the envs whose episode has not ended (each env plays
        exactly its one episode), so the agent acts once per step of the longest episode, not
        once per env step of all of them."""
        n = self.cfg.gym.eval_episodes
        envs = [make_gym_env(self.env_id) for _ in range(n)]
        try:
            obs = [env.reset(seed=10_000 + self.cfg.run.seed + i)[0] for i, env in enumerate(envs)]
            totals, running = [0.0] * n, list(range(n))
            while running:
                actions = self._env_actions(
                    agent.act(self._obs([obs[i] for i in running]), 0, greedy=True)
                )
                still = []
                for i, a in zip(running, actions, strict=True):
                    obs[i], r, term, trunc, _ = envs[i].step(a)
                    totals[i] += float(r)
                    if not (term or trunc):
                        still.append(i)
                running = still
        finally:
            for env in envs:
                env.close()
        returns = np.asarray(totals)
        recent = list(self.finished)
        row = {"fold": k, "episodes": len(returns), "mean_return": float(np.mean(returns)),
               "std_return": float(np.std(returns)), "min_return": float(np.min(returns)),
               "max_return": float(np.max(returns)),
               "train_return_last100": float(np.mean(recent)) if recent else None}  # fmt: skip
        return row, None

    def summary(self, rows: list[dict[str, Any]], run_dir: Any = None) -> dict[str, Any]:
        keys = ("episodes", "mean_return", "std_return", "min_return", "max_return")
        return {
            "train_return_last100": rows[-1]["train_return_last100"] if rows else None,
            "eval": {k: rows[-1][k] for k in keys} if rows else None,
        }

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


class TorchCartPoleAdapter(GymAdapter):
    """``gym:CartPole-v1`` with ``env.impl = "torch"``: the same fold, plan and summary as
    :class:`GymAdapter`, but the ``env.n_envs`` envs are one :class:`BatchedCartPole` on the
    run's device, so a step moves no data to the host, and the greedy evaluation runs
    ``gym.eval_episodes`` torch envs at once."""

    on_device = True
    reward_parts = False  # one reward per step

    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.env_id = cfg.env.name.removeprefix("gym:")
        self.discrete, self.branch_sizes, self.obs_dim = True, [2], 4
        self.n_folds, self.n_envs = 1, cfg.env.n_envs
        self.env: Any = None
        # the training returns of the last 100 episodes, on the device: a ring of 100 slots
        # and one more that absorbs the rows of envs whose episode did not end (no host sync)
        self.recent = torch.zeros(101, dtype=torch.float64, device=device)
        self.recent_count = torch.zeros((), dtype=torch.long, device=device)

    def open_fold(self, k: int, seed: int) -> Tensor:
        from trimtab.rl.envs.cartpole import BatchedCartPole

        self.env = BatchedCartPole(self.n_envs, device=self.device, seed=seed)
        self.recent.zero_()
        self.recent_count.zero_()
        return self.env.reset()

    def step(self, action: Tensor) -> EnvStep:
        r = self.env.step(action[:, 0])
        done = r.terminated | r.truncated
        self._remember(r.episode_return.double(), done)
        trunc = r.truncated & ~r.terminated  # a time limit reached as the pole falls: terminal
        return EnvStep(r.obs, r.reward, r.final_obs, r.terminated, trunc, r.episode_return)

    def generators(self) -> list[torch.Generator]:
        """What a step draws from (reset states): registered with a captured collection."""
        return [self.env.generator]

    def _remember(self, returns: Tensor, done: Tensor) -> None:
        """Append the returns of the episodes that ended (in env order) to the ring; where more
        than 100 end at once, the last 100 of them."""
        rank = done.long().cumsum(0) - 1
        n_done = rank[-1] + 1
        # with at most 100 envs every ended episode is among the last 100 (rank < n_done <= 100)
        kept = done & (rank >= n_done - 100) if self.n_envs > 100 else done
        slot = torch.where(kept, (self.recent_count + rank) % 100, 100)
        self.recent[slot] = returns  # slot 100 takes the rest, in any order: never read
        self.recent_count += n_done

    def _finished(self) -> list[float]:
        n = min(int(self.recent_count), 100)  # a host read, at a fold's end only
        return self.recent[:n].tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"env": self.env.state_dict(), "recent": self.recent.clone(),
                "recent_count": self.recent_count.clone()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state["env"])
        self.recent.copy_(state["recent"])
        self.recent_count.copy_(state["recent_count"])

    def evaluate(self, agent: Any, k: int) -> tuple[dict[str, Any], None]:
        """Undiscounted returns of ``gym.eval_episodes`` greedy episodes: as many fresh torch
        envs, each stepped until its first episode ends (at most 500 steps). Where the run
        captures CUDA graphs (``run.cuda_graph``), one greedy step is captured after one eager
        step and replayed for the rest: the same kernels on the same buffers, one launch a step
        instead of the act's and the env's dozens (what a GPU evaluation's host time is)."""
        from trimtab.rl.agent.graphed import CapturedStep
        from trimtab.rl.config import uses_cuda_graph
        from trimtab.rl.envs.cartpole import BatchedCartPole

        n = self.cfg.gym.eval_episodes
        env = BatchedCartPole(n, device=self.device, seed=10_000 + self.cfg.run.seed)
        obs = env.reset().clone()  # the step's static input, overwritten by each step
        returns = torch.zeros(n, dtype=torch.float64, device=self.device)
        running = torch.ones(n, dtype=torch.bool, device=self.device)

        def greedy_step(_: dict[str, Tensor]) -> dict[str, Tensor]:
            r = env.step(agent.act(obs, 0, greedy=True)[:, 0])
            returns.add_(r.reward.double() * running)
            running.logical_and_(~(r.terminated | r.truncated))
            obs.copy_(r.obs)
            return {}

        step = greedy_step
        if uses_cuda_graph(self.cfg.run, self.device):  # reset draws: the env's generator
            step = CapturedStep(greedy_step, [env.generator], addresses=lambda: (), warmup=1)
        host = self.device.type == "cpu"
        for _ in range(env.max_episode_steps):  # every first episode has ended by then
            step({})
            # on the CPU (where a read waits for nothing) stop once every first episode ended:
            # the later steps add nothing to the returns and draw from this env's own generator
            if host and not running.any():
                break
        ret = returns.cpu().numpy()
        recent = self._finished()
        row = {"fold": k, "episodes": n, "mean_return": float(np.mean(ret)),
               "std_return": float(np.std(ret)), "min_return": float(np.min(ret)),
               "max_return": float(np.max(ret)),
               "train_return_last100": float(np.mean(recent)) if recent else None}  # fmt: skip
        return row, None

    def summary(self, rows: list[dict[str, Any]], run_dir: Any = None) -> dict[str, Any]:
        return {**super().summary(rows), "env_impl": "torch"}

    def close(self) -> None:
        self.env = None
