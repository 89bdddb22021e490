"""What the sentinel costs inside the CartPole learn step on the CPU: process CPU time per
gradient step of ``examples/cartpole.toml``'s learner, with and without its parts.

    python benchmarks/bench_sentinel_share.py [--modes off adaptive] [--steps 300] [--quick]

Per mode, one learner (the example's network, batch 128, one thread) steps on a replay of
random CartPole-shaped transitions; four variants of the same learner are timed in
interleaved rounds (so that drift in the machine's load falls on all of them alike), the
median round per variant reported:

- ``full``: the learn step as the trainer runs it;
- ``no_checks``: every ``Sentinel.check`` replaced by nothing (the records, the per-phase
  abs-max);
- ``no_watch``: the watched buffers' threshold upkeep replaced by nothing (their max |x| and
  the estimator fold, ``Checks._measure`` and ``Checks._fold``; ``Checks._watch`` in a tree
  from before commit 77adf3d, run with ``PYTHONPATH`` pointing at it);
- ``no_sentinel``: both.

A variant that does less computes other numbers from then on (thresholds, records), never
other weights (diagnostics never change training), so the timings compare like with like.
Absolute times on a shared machine measure its load too: read the differences and ratios.
Writes a record (provenance) to ``benchmarks/results/sentinel_share.json``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import benchmark_parser, provenance, save_record

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cartpole.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "sentinel_share.json"
VARIANTS = ("full", "no_checks", "no_watch", "no_sentinel")


def _learner(mode: str, seed: int) -> tuple[Any, Any, torch.Generator]:
    from trimtab.lifecycle import Lifecycle
    from trimtab.rl.agent.learner import build_learner
    from trimtab.rl.agent.replay import ReplayBuffer
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict, load_toml

    data = apply_overrides(load_toml(EXAMPLE), [f'run.stability="{mode}"', 'run.device="cpu"'])
    cfg = from_dict(TrainConfig, data)
    with Lifecycle():
        learner = build_learner(cfg, 4, [2], torch.device("cpu"))
    replay = ReplayBuffer(cfg.agent.replay_capacity, 4, 1, "cpu")
    g = torch.Generator().manual_seed(seed)
    for _ in range(300):  # 1200 transitions of 4 envs: CartPole's 4 observations, 2 actions
        obs = torch.randn(4, 4, generator=g)
        nxt = obs + 0.02 * torch.randn(4, 4, generator=g)
        done = torch.rand(4, generator=g) < 0.05
        replay.add(obs, torch.randint(0, 2, (4, 1), generator=g), torch.ones(4), nxt, done,
                   torch.zeros(4, dtype=torch.bool))  # fmt: skip
    return learner, replay, g


def _patches(variant: str) -> list[tuple[Any, str, Any]]:
    from trimtab.rl.agent.checks import Checks
    from trimtab.sentinel import Sentinel

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    checks = [(Sentinel, "check", nothing)]
    # (_watch: what the learn step called before commit 77adf3d, for a before/after pair)
    names = ("_measure", "_fold", "_watch")
    watch = [(Checks, name, nothing) for name in names if hasattr(Checks, name)]
    return {"full": [], "no_checks": checks, "no_watch": watch,
            "no_sentinel": checks + watch}[variant]  # fmt: skip


def time_mode(mode: str, steps: int, rounds: int, seed: int) -> dict[str, Any]:
    """Median CPU ms per learn step of each variant over ``rounds`` interleaved rounds."""
    learner, replay, g = _learner(mode, seed)
    batch = learner.agent.config.batch_size
    for _ in range(20):  # warm-up: the optimizer's state, the sentinel's launch metadata
        learner.learn_from(replay, g, batch)
    per_round: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            saved = [(owner, name, getattr(owner, name)) for owner, name, _ in _patches(variant)]
            for owner, name, fn in _patches(variant):
                setattr(owner, name, fn)
            try:
                t0 = time.process_time()
                for _ in range(steps):
                    learner.learn_from(replay, g, batch)
                per_round[variant].append(1e3 * (time.process_time() - t0) / steps)
            finally:
                for owner, name, fn in saved:
                    setattr(owner, name, fn)
    ms = {v: statistics.median(r) for v, r in per_round.items()}
    return {
        "cpu_ms_per_step": ms,
        "checks_ms": ms["full"] - ms["no_checks"],
        "watch_ms": ms["full"] - ms["no_watch"],
        "sentinel_ms": ms["full"] - ms["no_sentinel"],
        "rounds_ms": per_round,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(
        __doc__,
        None,
        quick="2 steps x 2 rounds: a smoke test",
        key=True,
        quick_writes=False,
    )
    p.add_argument("--modes", nargs="+", default=["off", "adaptive"],
                   choices=["off", "fixed", "adaptive"])  # fmt: skip
    p.add_argument("--steps", type=int, default=30, help="learn steps per variant and round")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    steps, rounds = (2, 2) if args.quick else (args.steps, args.rounds)
    torch.set_num_threads(1)
    modes = {m: time_mode(m, steps, rounds, args.seed) for m in args.modes}
    print(f"{'mode':9} " + " ".join(f"{v:>12}" for v in VARIANTS) + "   (CPU ms per learn step)")
    for m, r in modes.items():
        print(f"{m:9} " + " ".join(f"{r['cpu_ms_per_step'][v]:12.3f}" for v in VARIANTS))
    command = " ".join(["benchmarks/bench_sentinel_share.py",
                        *(sys.argv[1:] if argv is None else argv)])  # fmt: skip
    record = {**provenance("cpu"), "threads": 1, "command": command, "steps": steps,
              "rounds": rounds, "quick": args.quick, "modes": modes}  # fmt: skip
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
