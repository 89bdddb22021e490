"""Tracking error of trimtab.AdaptiveEMA against every fixed-rate EMA, on five synthetic signals.

Usage: ``python benchmarks/bench_ema.py [--quick] [--out PATH] [--device DEVICE]``

Every signal is unit-variance Gaussian noise around a true level μ_t; the score is the mean over
all steps (the first included) of (estimate_t - μ_t)², averaged over seeds. The signals:

- ``stationary``: μ_t constant (drawn uniformly from [-5, 5] per seed).
- ``step``: μ_t = 0, then ±5σ (random sign) from a step time drawn uniformly in the middle
  half of the run.
- ``random_walk``: μ_t = μ_{t-1} + η_t with η_t ~ N(0, 0.1²), so Q/R = 0.01: the local-level
  model itself, whose optimal (Kalman) steady-state gain is ≈ 0.095.
- ``drift``: μ_t = 3σ·sin(2πt/T + φ), one slow cycle over the T steps of the run, random phase.
- ``spikes``: μ_t constant; with probability 0.005 per step the observation is replaced by
  μ_t ± 20σ (random sign). The true level excludes the spikes.

All signals × seeds run as the slots of ONE AdaptiveEMA (one batched update per step); the fixed
EMAs (rates in ``FIXED_ALPHAS``, first observation replaces) run as one batched tensor too. The
target is AdaptiveEMA MSE ≤ 1.25 × the hindsight-best fixed rate on each signal.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from trimtab import AdaptiveEMA
from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, write_json

FIXED_ALPHAS = (0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.001)
SIGNALS = ("stationary", "step", "random_walk", "drift", "spikes")
TARGET_RATIO = 1.25
DEFAULT_OUT = Path(__file__).parent / "results" / "ema.json"


def make_signal(name: str, steps: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One run of signal ``name``: (observations, true level), each float64 of length ``steps``."""
    t = torch.arange(steps, dtype=torch.float64)
    noise = torch.randn(steps, generator=gen, dtype=torch.float64)
    u = torch.rand(3, generator=gen, dtype=torch.float64)
    sign = 1.0 if u[1] < 0.5 else -1.0
    if name in ("stationary", "spikes"):
        level = torch.full((steps,), float(10.0 * u[0] - 5.0), dtype=torch.float64)
    elif name == "step":
        at = int(steps * (0.25 + 0.5 * float(u[0])))
        level = torch.where(t >= at, 5.0 * sign, 0.0).to(torch.float64)
    elif name == "random_walk":
        level = torch.cumsum(0.1 * torch.randn(steps, generator=gen, dtype=torch.float64), 0)
    elif name == "drift":
        level = 3.0 * torch.sin(2.0 * math.pi * t / steps + 2.0 * math.pi * float(u[0]))
    else:
        raise ValueError(f"unknown signal {name!r}; expected one of {SIGNALS}")
    obs = level + noise
    if name == "spikes":
        hit = torch.rand(steps, generator=gen, dtype=torch.float64) < 0.005
        signs = torch.where(torch.rand(steps, generator=gen) < 0.5, -1.0, 1.0).double()
        obs = torch.where(hit, level + 20.0 * signs, obs)
    return obs, level


def run(steps: int, seeds: int, device: torch.device) -> dict[str, dict[str, float]]:
    """Mean-square tracking error per signal and method, every signal × seed as one slot."""
    runs = [
        make_signal(s, steps, torch.Generator().manual_seed(1000 * k + i))
        for i, s in enumerate(SIGNALS)
        for k in range(seeds)
    ]
    obs = torch.stack([o for o, _ in runs], 1).to(device)  # [steps, slots]
    level = torch.stack([lv for _, lv in runs], 1).to(device)
    slots = obs.shape[1]

    ema = AdaptiveEMA(slots, device=device)
    alphas = torch.tensor(FIXED_ALPHAS, dtype=torch.float64, device=device)[:, None]
    fixed = obs[0].expand(len(FIXED_ALPHAS), slots).clone()  # first observation replaces
    err_a = torch.zeros(slots, dtype=torch.float64, device=device)
    err_f = torch.zeros_like(fixed)
    for i in range(steps):
        if i:
            fixed += alphas * (obs[i] - fixed)
        est = ema.update(obs[i].float()).double()
        err_a += (est - level[i]).square()
        err_f += (fixed - level[i]).square()
    mse_a = (err_a / steps).view(len(SIGNALS), seeds).mean(1).cpu()
    mse_f = (err_f / steps).view(len(FIXED_ALPHAS), len(SIGNALS), seeds).mean(2).cpu()
    out: dict[str, dict[str, float]] = {}
    for j, name in enumerate(SIGNALS):
        row = {"adaptive": float(mse_a[j])}
        row.update({f"alpha={a:g}": float(mse_f[k, j]) for k, a in enumerate(FIXED_ALPHAS)})
        best = min(FIXED_ALPHAS, key=lambda a: row[f"alpha={a:g}"])
        row["best_fixed_alpha"] = best
        row["ratio"] = row["adaptive"] / row[f"alpha={best:g}"]
        out[name] = row
    return out


def markdown(results: dict[str, dict[str, float]]) -> str:
    """The results as a markdown table (MSE against the true level; best fixed rate in bold)."""
    head = ["signal", "adaptive", *(f"α={a:g}" for a in FIXED_ALPHAS), "adaptive / best"]
    body = []
    for name, row in results.items():
        cells = [name, f"{row['adaptive']:.4f}"]
        for a in FIXED_ALPHAS:
            v = f"{row[f'alpha={a:g}']:.4f}"
            cells.append(f"**{v}**" if a == row["best_fixed_alpha"] else v)
        ok = "✓" if row["ratio"] <= TARGET_RATIO else "✗"
        body.append([*cells, f"{row['ratio']:.2f} {ok}"])
    return markdown_table(head, body)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = benchmark_parser(
        __doc__, DEFAULT_OUT, quick="300 steps, 2 seeds (for tests)", device="auto"
    )
    args = parser.parse_args(argv)
    steps, seeds = (300, 2) if args.quick else (3000, 5)
    results = run(steps, seeds, torch.device(args.device))
    print(f"AdaptiveEMA vs fixed-rate EMA: tracking MSE, {steps} steps, {seeds} seeds\n")
    print(markdown(results))
    report: dict[str, object] = {
        "benchmark": "ema",
        **provenance(args.device),
        "device": args.device,
        "steps": steps,
        "seeds": seeds,
        "target_ratio": TARGET_RATIO,
        "results": results,
    }
    write_json(args.out, report, indent=2)
    return report


if __name__ == "__main__":
    main()
