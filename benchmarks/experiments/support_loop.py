"""The adaptive C51 support's closed loop on CartPole's rewards, without an agent: how the
measured target bound moves over a run's worth of updates (no network, no env: seconds a 1k).

    python benchmarks/experiments/support_loop.py [--updates 49000] [--reward 1] [--gamma 0.99] \\
        [--quick]

With C51 alone the trainer's target bound measures each transition's reach ``|G| + γ b`` on the
support ``b`` in force (``DQNAgent.bellman_targets``), and the support is that bound. For
CartPole every non-terminal transition has ``G = 1`` (times ``env.reward_scale``), so each
update feeds :class:`trimtab.AdaptiveBounds` a batch of 128 equal reaches ``G + γ b`` (terminal
ones, |G|, lie below the p99 and do not move it), whatever the policy. The fixed point is
``G / (1 - γ)`` (100 on CartPole). The JSON records the support per 1,000 updates (min, max,
last) and the updates spent below half and above twice the fixed point, with machine, date,
commit: ``benchmarks/results/support_loop.json``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import benchmark_parser, invocation, provenance, write_json
from trimtab.bounds import AdaptiveBounds
from trimtab.estimate import AdaptiveEMA

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "support_loop.json"


def run_estimator(updates: int, reward: float, gamma: float) -> tuple[list[float], dict]:
    """The same loop through the bound's estimator alone (no quantile, no engagement test):
    ``s_t = exp(EMA(log(|G| + γ s_(t-1))))``; also the estimator's final state (its candidates'
    log levels and log weights, the noise variance R), to see which candidates carry it."""
    ema = AdaptiveEMA(1)
    s, out = 1e-3, []
    for _ in range(updates):
        out.append(s)
        s = float(ema.update_log(torch.tensor([abs(reward) + gamma * s]))[0])
    state = ema.state_dict()
    keep = ("mean", "r", "level", "slope", "score")
    return out, {k: state[k].reshape(-1).tolist() for k in keep if k in state}


def run(updates: int, reward: float, gamma: float, batch: int = 128) -> list[float]:
    """The support read at each update (before that update's fold)."""
    bounds = AdaptiveBounds(["targets"], q=0.99, floor=1e-3)  # the trainer's settings
    reach = torch.empty(batch)
    out = []
    for _ in range(updates):
        support = bounds.read("targets")
        out.append(float(support))
        reach.copy_(abs(reward) + gamma * support)  # |G| + γ b, as bellman_targets measures
        bounds.measure("targets", reach)
        bounds.clamp_("targets", reach)
        bounds.fold()
    return out


def summarize(traj: list[float], fixed_point: float, every: int = 1000) -> dict[str, Any]:
    blocks = [traj[i : i + every] for i in range(0, len(traj), every)]
    late = traj[every:]
    return {
        "fixed_point": fixed_point,
        "per_block": [
            {"from": i * every, "min": min(b), "max": max(b), "last": b[-1]}
            for i, b in enumerate(blocks)
        ],
        "updates_after_first_block": len(late),
        "below_half_fixed_point": sum(v < fixed_point / 2 for v in late),
        "above_twice_fixed_point": sum(v > 2 * fixed_point for v in late),
        "min_after_first_block": min(late) if late else None,
        "max": max(traj),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, quick="600 updates, nothing written")
    p.add_argument("--updates", type=int, default=49_000, help="a 500k CartPole run: 49k")
    p.add_argument("--reward", type=float, default=1.0, help="G of a non-terminal transition")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument(
        "--estimator-only",
        action="store_true",
        help="the loop through the AdaptiveEMA alone; its final state in the JSON",
    )
    args = p.parse_args(argv)
    updates = 600 if args.quick else args.updates
    t0 = time.perf_counter()
    state = None
    if args.estimator_only:
        traj, state = run_estimator(updates, args.reward, args.gamma)
    else:
        traj = run(updates, args.reward, args.gamma)
    fixed_point = abs(args.reward) / (1 - args.gamma)
    doc = {**provenance(), "command": invocation(__file__, argv), "updates": updates,
           "reward": args.reward, "gamma": args.gamma, "seconds": time.perf_counter() - t0,
           "estimator_only": args.estimator_only, "final_estimator_state": state,
           **summarize(traj, fixed_point, every=min(1000, updates // 3))}  # fmt: skip
    for b in doc["per_block"]:
        span = f"{b['min']:.4g} .. {b['max']:.4g}"
        print(f"updates {b['from']:>6}+: support {span}, last {b['last']:.4g}")
    print(f"after the first block: {doc['below_half_fixed_point']} updates below "
          f"{doc['fixed_point'] / 2:g}, {doc['above_twice_fixed_point']} above "
          f"{2 * doc['fixed_point']:g} (of {doc['updates_after_first_block']})")  # fmt: skip
    if not args.quick:
        write_json(args.out, doc, indent=1)
    return doc


if __name__ == "__main__":
    main()
