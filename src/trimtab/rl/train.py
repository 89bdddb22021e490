"""``trimtab train`` on market data: the walk-forward loop, read top to bottom like the algorithm.

Per fold: fit the feature normaliser on the training window, collect with ε-greedy batched
envs, store n-step transitions, sample, compute the distributional target, step the
optimizer, sync the target network; then evaluate greedily out of sample on the next window.
Stability hooks (adaptive support, target clamp, clip, sentinel) are marked ``# stability``.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trimtab.lifecycle import Lifecycle
from trimtab.rl import checkpoint as ckpt
from trimtab.rl.agent import DQNAgent
from trimtab.rl.config import AUTOCAST_DTYPES, TrainConfig
from trimtab.rl.configio import to_dict, to_toml
from trimtab.rl.env import BatchedTradingEnv
from trimtab.rl.report import build_report
from trimtab.rl.stability import Stability
from trimtab.rl.walkforward import (
    Fold,
    MarketSet,
    evaluate_fold,
    fold_arrays,
    load_market,
    make_folds,
)

__all__ = ["RunDirError", "TrainingHalted", "TrainingInterrupted", "train"]


class RunDirError(ValueError):
    """The output directory holds another run, or a run to resume is not there."""


class TrainingHalted(RuntimeError):
    """The sentinel fired under ``on_nonfinite = "halt"``; ``sentinel.json`` names the slot."""


class TrainingInterrupted(RuntimeError):
    """Raised by the ``stop_after`` test hook, as a crash would stop a run."""


@dataclass
class Progress:
    """Where the run is: restored from a checkpoint on ``--resume``."""

    fold: int = 0
    fold_step: int = 0  # gradient steps done in this fold
    env_steps: int = 0  # batched env steps done in this fold
    global_step: int = 0  # gradient steps over all folds
    global_env_steps: int = 0  # batched env steps over all folds (drives ε)
    fold_rows: list[dict[str, Any]] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RunDirError(
            f"--device {name} was asked for but this machine has no CUDA device; use --device cpu"
        )
    return torch.device(name)


def default_out(cfg: TrainConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"runs/{stamp}-{cfg.run.stability}-s{cfg.run.seed}"


def prepare_run_dir(cfg: TrainConfig, resume: bool) -> Path:
    out = Path(cfg.run.out)
    if resume:
        if not (out / "checkpoints" / "last.pt").is_file():
            raise RunDirError(f"{out} has no checkpoints/last.pt to resume from")
        return out
    if out.exists() and any(out.iterdir()):
        raise RunDirError(
            f"{out} already holds files; choose another --out, remove it, or continue that run "
            f"with `trimtab train --resume {out}`"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out


class MetricsLog:
    """``metrics.csv`` (one row per ``log_every`` steps) plus TensorBoard scalars."""

    def __init__(self, run_dir: Path, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / "metrics.csv"
        self.columns: list[str] | None = None
        if purge_step is not None and self.path.is_file():
            with self.path.open() as fh:
                rows = list(csv.reader(fh))
            if rows:
                self.columns = rows[0]
                keep = [r for r in rows[1:] if int(r[0]) <= purge_step]
                with self.path.open("w", newline="") as fh:
                    csv.writer(fh).writerows([rows[0], *keep])
        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)

    def write(self, row: dict[str, float]) -> None:
        if self.columns is None:
            self.columns = list(row)
            with self.path.open("w", newline="") as fh:
                csv.writer(fh).writerow(self.columns)
        with self.path.open("a", newline="") as fh:
            csv.writer(fh).writerow([row.get(c, "") for c in self.columns])
        step = int(row["step"])
        for k, v in row.items():
            if k not in ("step", "fold") and isinstance(v, float) and np.isfinite(v):
                self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        self.tb.close()


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    setup: Callable[[Stability, DQNAgent], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) a walk-forward training run; returns the summary written to disk.

    ``stop_after`` (raise :class:`TrainingInterrupted` after that many gradient steps) and
    ``setup`` (called with the wired stability and agent) are test hooks.
    """
    if not cfg.run.out:
        cfg = replace(cfg, run=replace(cfg.run, out=default_out(cfg)))
    device = resolve_device(cfg.run.device)
    torch.set_num_threads(cfg.run.threads)
    market = load_market(cfg)  # a DataError here leaves no run directory behind
    folds = make_folds(market.n_days, cfg)
    run_dir = prepare_run_dir(cfg, resume)
    if not resume:
        ckpt.atomic_write_text(run_dir / "config.toml", to_toml(cfg))

    n_assets = market.features.shape[1]
    obs_dim = n_assets * market.features.shape[2] + n_assets
    branch_sizes = [len(cfg.env.levels)] * n_assets
    torch.manual_seed(cfg.run.seed)
    with Lifecycle() as life:
        stab = Stability(cfg, n_branches=n_assets, device=device)  # stability
        agent = DQNAgent(
            obs_dim,
            branch_sizes,
            replace(cfg.agent, seed=cfg.run.seed),  # run.seed seeds the agent too
            device,
            optimizer_factory=stab.optimizer_factory,  # stability: trimtab.optim.Adam
            support_fn=stab.support_fn,  # stability: adaptive C51 support
            autocast=AUTOCAST_DTYPES[cfg.run.autocast],  # forwards in bf16/fp16 (or float32)
        )
        stab.attach(agent)
    if setup is not None:
        setup(stab, agent)
    fingerprint = stab.fingerprint

    prog = Progress()
    blob: dict[str, Any] | None = None
    if resume:
        blob = ckpt.load(run_dir / "checkpoints" / "last.pt", fingerprint=fingerprint)
        prog = Progress(**blob["progress"])
        agent.load_state_dict(blob["agent"])
        stab.load_state_dict(blob["stability"])
        torch.set_rng_state(blob["torch_rng"])
    log = MetricsLog(run_dir, purge_step=prog.global_step if resume else None)
    (run_dir / "run.log").open("a").write(
        "fold boundary does:\n" + "\n".join(f"  {line}" for line in life.describe()) + "\n"
    )
    halted: str | None = None
    t0 = time.perf_counter()
    try:
        while prog.fold < len(folds):
            fold = folds[prog.fold]
            if prog.fold_step == 0 and prog.env_steps == 0 and prog.fold > 0:
                life.fold_boundary()  # moments, target nets, slots, sentinel: all together
            halted = _train_fold(
                cfg, market, fold, agent, stab, prog, log, run_dir, fingerprint, device,
                blob, stop_after,
            )  # fmt: skip
            blob = None
            if halted:
                break
            feats, norm = fold_arrays(market, fold)
            row, curves = evaluate_fold(market, fold, feats, _greedy(agent), cfg, device)
            row.update(steps=prog.fold_step, nonfinite=stab.nonfinite_count())
            prog.fold_rows.append(row)
            _write_fold_curve(run_dir, fold, curves)
            _print_fold(row, cfg.run.progress)
            prog.fold += 1
            prog.fold_step = prog.env_steps = 0
            _save(cfg, run_dir, agent, stab, prog, fingerprint, fold_end=fold.index, norm=norm)
    finally:
        log.close()
    summary = {
        "run_dir": str(run_dir),
        "folds": prog.fold_rows,
        "halted": halted,
        "stability": cfg.run.stability,
        "device": str(device),
        "seconds": round(time.perf_counter() - t0, 1),
        "fold_boundary": life.describe(),
    }
    ckpt.atomic_write_json(run_dir / "sentinel.json", stab.sentinel_report())
    ckpt.atomic_write_json(run_dir / "summary.json", summary)
    build_report(run_dir)
    if halted:
        raise TrainingHalted(halted)
    return summary


def _greedy(agent: DQNAgent) -> Any:
    return lambda obs: agent.act(obs.to(agent.device, torch.float32), 0, greedy=True)


def _train_fold(
    cfg: TrainConfig,
    market: MarketSet,
    fold: Fold,
    agent: DQNAgent,
    stab: Stability,
    prog: Progress,
    log: MetricsLog,
    run_dir: Path,
    fingerprint: str,
    device: torch.device,
    blob: dict[str, Any] | None,
    stop_after: int | None,
) -> str | None:
    wf = cfg.walkforward
    feats, _ = fold_arrays(market, fold)
    env = BatchedTradingEnv(
        feats[fold.train_start : fold.train_end],
        market.log_returns[fold.train_start : fold.train_end],
        n_envs=cfg.env.n_envs,
        window_len=min(cfg.env.episode_days, fold.train_end - fold.train_start - 1),
        levels=cfg.env.levels,
        cost_bps=cfg.env.cost_bps,
        device=device,
        seed=cfg.run.seed * 1009 + fold.index,
    )
    replay = agent.make_replay()  # a fresh buffer per fold: features are renormalised
    generator = torch.Generator(device=device).manual_seed(cfg.run.seed * 7919 + fold.index)
    obs = env.reset()
    if blob is not None and blob["progress"]["fold"] == fold.index and blob.get("env"):
        env.load_state_dict(blob["env"])
        replay.load_state_dict(blob["replay"])
        generator.set_state(blob["generator"])
        obs = blob["obs"].to(device)
    ep_sum = torch.zeros((), dtype=torch.float64, device=device)
    ep_count = torch.zeros((), dtype=torch.float64, device=device)
    bar = _bar(cfg, fold, prog.fold_step)
    info: dict[str, torch.Tensor] = {}
    while prog.fold_step < wf.steps_per_fold:
        # collect: one ε-greedy action per env and branch, n-step transitions into replay
        action = agent.act(obs, prog.global_env_steps)
        res = env.step(action)
        reward = res.reward * cfg.env.reward_scale  # training rewards only; metrics are unscaled
        replay.add(obs, action, reward, res.final_obs, res.terminated, res.truncated)
        obs = res.obs
        done = res.terminated | res.truncated
        ep_sum += (res.episode_return * done).sum()
        ep_count += done.sum()
        prog.env_steps += 1
        prog.global_env_steps += 1
        if prog.env_steps < wf.learning_starts:
            continue
        for _ in range(wf.updates_per_step):
            # learn: sample, distributional target, loss, guarded optimizer step
            batch = replay.sample(cfg.agent.batch_size, generator)
            info = agent.update(batch, replay)  # guarded by stab (agent.guard)
            prog.fold_step += 1
            prog.global_step += 1
            if prog.global_step % cfg.run.log_every == 0:
                row = _log_row(prog, fold, info, stab, ep_sum, ep_count, agent)
                ep_sum.zero_()
                ep_count.zero_()
                log.write(row)
                if bar is not None:
                    bar.set_postfix(
                        loss=f"{row['loss/total']:.3g}",
                        ret=f"{row['episode_return']:.3f}",
                        bound=f"{row['bound/support']:.3g}",
                    )
                halted = stab.halt_message()  # syncs here only, with the logging
                if halted:
                    return halted
            if prog.global_step % cfg.run.checkpoint_every == 0:
                _save(cfg, run_dir, agent, stab, prog, fingerprint, env, replay, generator, obs)
            if stop_after is not None and prog.global_step >= stop_after:
                raise TrainingInterrupted(f"stopped after {stop_after} steps (test hook)")
            if bar is not None:
                bar.update(1)
            if prog.fold_step >= wf.steps_per_fold:
                break
    if bar is not None:
        bar.close()
    return stab.halt_message()


def _bar(cfg: TrainConfig, fold: Fold, initial: int) -> Any:
    if not cfg.run.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=cfg.walkforward.steps_per_fold, initial=initial, desc=f"fold {fold.index}",
        unit="step", dynamic_ncols=True, leave=True,
    )  # fmt: skip


def _log_row(
    prog: Progress,
    fold: Fold,
    info: dict[str, torch.Tensor],
    stab: Stability,
    ep_sum: torch.Tensor,
    ep_count: torch.Tensor,
    agent: DQNAgent,
) -> dict[str, float]:
    values = {
        "loss/total": info["loss"],
        "loss/c51": info["c51_loss"],
        "loss/iqn": info["iqn_loss"],
        "q_mean": info["q_mean"],
        "episode_return": ep_sum / ep_count.clamp_min(1),
        **stab.log_values(),
    }
    names = list(values)
    host = torch.stack([v.detach().double().reshape(()) for v in values.values()]).cpu()
    row: dict[str, float] = {"step": prog.global_step, "fold": fold.index}
    row.update({n: float(h) for n, h in zip(names, host.tolist())})
    row["epsilon"] = agent.epsilon(prog.global_env_steps)
    return row


def _save(
    cfg: TrainConfig,
    run_dir: Path,
    agent: DQNAgent,
    stab: Stability,
    prog: Progress,
    fingerprint: str,
    env: BatchedTradingEnv | None = None,
    replay: Any = None,
    generator: torch.Generator | None = None,
    obs: torch.Tensor | None = None,
    fold_end: int | None = None,
    norm: Any = None,
) -> None:
    state = {
        "normalizer": norm.state_dict() if norm is not None else None,
        "config": to_dict(cfg),
        "progress": prog.__dict__.copy(),
        "agent": agent.state_dict(),
        "stability": stab.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "env": env.state_dict() if env is not None else None,
        "replay": replay.state_dict() if replay is not None else None,
        "generator": generator.get_state() if generator is not None else None,
        "obs": obs.cpu() if obs is not None else None,
    }
    ckpt.save(run_dir / "checkpoints" / "last.pt", state, fingerprint=fingerprint)
    if fold_end is not None:
        ckpt.save(run_dir / "checkpoints" / f"fold_{fold_end}.pt", state, fingerprint=fingerprint)


def _write_fold_curve(run_dir: Path, fold: Fold, curves: dict[str, np.ndarray]) -> None:
    lines = [",".join(curves)]
    cols = list(curves.values())
    lines += [",".join(f"{c[i]:.10g}" for c in cols) for i in range(len(cols[0]))]
    ckpt.atomic_write_text(run_dir / "folds" / f"fold_{fold.index}.csv", "\n".join(lines) + "\n")


def _print_fold(row: dict[str, Any], show: bool) -> None:
    if show:
        print(
            f"fold {row['fold']} test {row['test_start']}..{row['test_end']}: "
            f"Sharpe {row['sharpe']:+.2f} (buy & hold {row['buy_hold_sharpe']:+.2f}), "
            f"return {row['total_return']:+.1%} (B&H {row['buy_hold_return']:+.1%}), "
            f"max DD {row['max_drawdown']:.1%}, turnover {row['turnover']:.3f}",
            flush=True,
        )


def format_fold_table(summary: dict[str, Any]) -> str:
    """The per-fold results as a markdown table (printed at the end of a run, used in README)."""
    head = (
        "| fold | test window | Sharpe | B&H Sharpe | return | B&H return | max DD | turnover "
        "| hit rate | steps | non-finite |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [
        f"| {r['fold']} | {r['test_start']} … {r['test_end']} | {r['sharpe']:+.2f} | "
        f"{r['buy_hold_sharpe']:+.2f} | {r['total_return']:+.1%} | {r['buy_hold_return']:+.1%} | "
        f"{r['max_drawdown']:.1%} | {r['turnover']:.3f} | {r['hit_rate']:.1%} | {r['steps']} | "
        f"{r['nonfinite']} |"
        for r in summary["folds"]
    ]
    return "\n".join([head, *rows])
