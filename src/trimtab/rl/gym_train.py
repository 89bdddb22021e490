"""``trimtab train --env gym:ID``: the same agent and stability wiring on a Gymnasium env.

Discrete(n) actions become one branch of n; MultiDiscrete one branch per dimension. The loop is
CleanRL's: collect from ``n_envs`` vector envs, store, every ``train_every`` steps sample and
update; at the end, ``eval_episodes`` greedy episodes on a fresh env give the reported return.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from trimtab.lifecycle import Lifecycle
from trimtab.rl import checkpoint as ckpt
from trimtab.rl.agent import DQNAgent
from trimtab.rl.config import AUTOCAST_DTYPES, TrainConfig
from trimtab.rl.configio import ConfigError, to_dict, to_toml
from trimtab.rl.stability import Stability
from trimtab.rl.train import (
    MetricsLog,
    TrainingHalted,
    default_out,
    prepare_run_dir,
    resolve_device,
)

__all__ = ["branch_sizes_of", "train_gym"]


def branch_sizes_of(space: gym.Space) -> list[int]:
    if isinstance(space, gym.spaces.Discrete):
        return [int(space.n)]
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return [int(n) for n in space.nvec]
    raise ConfigError(
        f"the agent needs Discrete or 1-D MultiDiscrete actions; this env has {space}"
    )


def _make_env(env_id: str) -> gym.Env:
    try:
        return gym.make(env_id)
    except gym.error.Error as e:
        raise ConfigError(f"--env gym:{env_id}: {e}") from None


def _to_env_action(action: torch.Tensor, space: gym.Space) -> np.ndarray:
    a = action.cpu().numpy()
    return a[:, 0] if isinstance(space, gym.spaces.Discrete) else a


def evaluate_greedy(agent: DQNAgent, env_id: str, episodes: int, seed: int) -> list[float]:
    """Undiscounted returns of ``episodes`` greedy episodes on a fresh env."""
    env = _make_env(env_id)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, done = 0.0, False
        while not done:
            x = torch.as_tensor(
                np.asarray(obs, dtype=np.float32).reshape(1, -1), device=agent.device
            )
            a = _to_env_action(agent.act(x, 0, greedy=True), env.action_space)[0]
            obs, r, term, trunc, _ = env.step(a)
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return returns


def train_gym(cfg: TrainConfig) -> dict[str, Any]:
    if not cfg.run.out:
        cfg = replace(cfg, run=replace(cfg.run, out=default_out(cfg)))
    env_id = cfg.env.name.removeprefix("gym:")
    device = resolve_device(cfg.run.device)
    torch.set_num_threads(cfg.run.threads)
    g = cfg.gym
    envs = gym.vector.SyncVectorEnv(
        [lambda: _make_env(env_id) for _ in range(g.n_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    sizes = branch_sizes_of(envs.single_action_space)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    run_dir = prepare_run_dir(cfg, resume=False)
    ckpt.atomic_write_text(run_dir / "config.toml", to_toml(cfg))
    with Lifecycle():
        stab = Stability(cfg, n_branches=len(sizes), device=device)
        agent = DQNAgent(
            obs_dim, sizes, replace(cfg.agent, seed=cfg.run.seed), device,
            optimizer_factory=stab.optimizer_factory, support_fn=stab.support_fn,
            autocast=AUTOCAST_DTYPES[cfg.run.autocast],
        )  # fmt: skip
        stab.attach(agent)
    replay = agent.make_replay()
    generator = torch.Generator(device=device).manual_seed(cfg.run.seed)
    log = MetricsLog(run_dir, purge_step=None)
    obs_np, _ = envs.reset(seed=cfg.run.seed)
    ep_ret = np.zeros(g.n_envs)
    finished: list[float] = []
    steps = updates = 0
    info: dict[str, torch.Tensor] = {}
    halted = None
    t0 = time.perf_counter()
    while steps < g.total_steps:
        # collect
        obs = torch.as_tensor(np.asarray(obs_np, np.float32).reshape(g.n_envs, -1), device=device)
        action = agent.act(obs, steps)
        next_np, reward, term, trunc, infos = envs.step(
            _to_env_action(action, envs.single_action_space)
        )
        done = term | trunc
        final = np.array(next_np, dtype=np.float32, copy=True).reshape(g.n_envs, -1)
        if done.any():  # SAME_STEP autoreset: the true last observation is in final_obs
            for i in np.flatnonzero(done):
                final[i] = np.asarray(infos["final_obs"][i], np.float32).reshape(-1)
        ep_ret += reward
        finished += [float(r) for r in ep_ret[done]]
        ep_ret[done] = 0.0
        replay.add(
            obs, action, torch.as_tensor(reward, dtype=torch.float32, device=device),
            torch.as_tensor(final, device=device), torch.as_tensor(term, device=device),
            torch.as_tensor(trunc & ~term, device=device),
        )  # fmt: skip
        obs_np = next_np
        before = steps
        steps += g.n_envs
        if steps < g.learning_starts:
            continue
        # learn: one update per train_every env steps
        for _ in range(steps // g.train_every - before // g.train_every):
            info = agent.update(replay.sample(cfg.agent.batch_size, generator), replay)
            updates += 1
            if updates % cfg.run.log_every == 0:
                recent = finished[-100:]
                mean_return = float(np.mean(recent)) if recent else float("nan")
                row = {"step": updates, "fold": 0, "env_steps": float(steps),
                       "episode_return": mean_return}  # fmt: skip
                values = {"loss/total": info["loss"], "loss/c51": info["c51_loss"],
                          "loss/iqn": info["iqn_loss"], **stab.log_values()}  # fmt: skip
                host = torch.stack([v.detach().double().reshape(()) for v in values.values()]).cpu()
                row.update({k: float(h) for k, h in zip(values, host.tolist())})
                log.write(row)
                halted = stab.halt_message()
                if halted:
                    break
        if halted:
            break
    log.close()
    envs.close()
    returns = evaluate_greedy(agent, env_id, g.eval_episodes, seed=10_000 + cfg.run.seed)
    recent = finished[-100:]
    summary = {
        "run_dir": str(run_dir),
        "env": env_id,
        "stability": cfg.run.stability,
        "halted": halted,
        "env_steps": steps,
        "updates": updates,
        "seconds": round(time.perf_counter() - t0, 1),
        "train_return_last100": float(np.mean(recent)) if recent else None,
        "eval": {
            "episodes": len(returns),
            "mean_return": float(np.mean(returns)),
            "std_return": float(np.std(returns)),
            "min_return": float(np.min(returns)),
        },
        "folds": [],
    }
    state = {"config": to_dict(cfg), "agent": agent.state_dict(), "stability": stab.state_dict(),
             "normalizer": None, "progress": {"env_steps": steps, "updates": updates}}  # fmt: skip
    ckpt.save(run_dir / "checkpoints" / "last.pt", state, fingerprint=stab.fingerprint)
    ckpt.atomic_write_json(run_dir / "sentinel.json", stab.sentinel_report())
    ckpt.atomic_write_json(run_dir / "summary.json", summary)
    if halted:
        raise TrainingHalted(halted)
    return summary
