"""False-alarm rate of the trainer's watched sentinel thresholds on simulated healthy streams.

Usage: ``python benchmarks/bench_ema_alarm.py [--quick] [--out PATH] [--device DEVICE]``

A watched buffer (observations, logits, loss, the trunk-output gradient) fires when its max|x|
exceeds its slot, the largest this fold of :func:`trimtab.rl.agent.checks.watch_threshold` (a
log-scale :class:`~trimtab.AdaptiveEMA` of max|x|, times ``exp(EXCURSION_Z · sd)``). Here each
stream is the max|x| of a healthy buffer, one per step, drawn exactly (inverse CDF of the max of
``n`` i.i.d. values): ``n`` values of a distribution (half-normal, lognormal σ = 1, Pareto tails
of index 3 and 1.5) times a scale that is constant, shrinks by 10⁴ over the run (gradients as
training converges), grows by 10² along an S-curve, or walks on a log scale; plus the loss, a
scalar with lognormal noise. Reported per stream kind: fires of the rule as the trainer applies
it (the fold max), and the fraction of checks beyond ``k`` spreads of the instantaneous
threshold for several ``k``, against the Gumbel tail that sets ``EXCURSION_Z``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from trimtab import AdaptiveEMA
from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, write_json
from trimtab.rl.agent.checks import EXCURSION_Z, FALSE_ALARM_PROB, watch_threshold

DEFAULT_OUT = Path(__file__).parent / "results" / "ema_alarm.json"
DISTS = ("halfnormal", "lognormal", "pareto3", "pareto1.5")
PATHS = ("constant", "shrink", "grow", "walk")
SIZES = (128, 16384)
KS = (2.0, 4.0, 6.0, 8.0, 10.0, EXCURSION_Z)
EULER = 0.5772156649015329


def gumbel_tail(k: float) -> float:
    """P(G > μ + kσ) for a Gumbel G: the tail that sets ``EXCURSION_Z``."""
    return -math.expm1(-math.exp(-EULER - k * math.pi / math.sqrt(6.0)))


def _scale(path: str, steps: int, gen: torch.Generator) -> torch.Tensor:
    t = torch.arange(steps, dtype=torch.float64) / steps
    if path == "constant":
        return torch.zeros(steps, dtype=torch.float64)
    if path == "shrink":
        return -4.0 * math.log(10.0) * t
    if path == "grow":
        return 2.0 * math.log(10.0) * torch.sigmoid(8.0 * (t - 0.5))
    return torch.cumsum(0.02 * torch.randn(steps, generator=gen, dtype=torch.float64), 0)


def _log_max(dist: str, n: int, steps: int, gen: torch.Generator) -> torch.Tensor:
    """log max|x| of ``n`` i.i.d. values, per step, exactly (inverse CDF at U^(1/n))."""
    u = torch.rand(steps, generator=gen, dtype=torch.float64).clamp(min=1e-300)
    tail = -torch.expm1(u.log() / n)  # 1 - U^(1/n): P(|x| > max)
    if dist == "halfnormal":
        return (-torch.special.ndtri(0.5 * tail)).log()
    if dist == "lognormal":
        return -torch.special.ndtri(tail)
    if dist == "pareto3":
        return -tail.log() / 3.0
    if dist == "pareto1.5":
        return -tail.log() / 1.5
    raise ValueError(f"unknown distribution {dist!r}")


def streams(steps: int, seeds: int) -> tuple[list[str], torch.Tensor]:
    """Stream kinds and their log max|x| ``[steps, kinds * seeds]``."""
    kinds, cols = [], []
    for dist in DISTS:
        for n in SIZES:
            for path in PATHS:
                kinds.append(f"{dist} n={n} {path}")
    for path in PATHS:
        kinds.append(f"loss lognormal(0.5) {path}")
    for i, kind in enumerate(kinds):
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(1000 * seed + i)
            parts = kind.split()
            path = parts[-1]
            if parts[0] == "loss":
                noise = 0.5 * torch.randn(steps, generator=gen, dtype=torch.float64)
            else:
                noise = _log_max(parts[0], int(parts[1][2:]), steps, gen)
            cols.append(noise + _scale(path, steps, gen))
    return kinds, torch.stack(cols, 1)


def run(steps: int, seeds: int, device: torch.device) -> dict[str, dict]:
    """Per stream kind: checks, fires of the fold-max rule, exceedances beyond each ``k``."""
    kinds, logmax = streams(steps, seeds)
    logmax = logmax.to(device)
    slots = logmax.shape[1]
    ema = AdaptiveEMA(slots, device=device)
    slot = torch.full((slots,), math.nan, device=device)
    fires = torch.zeros(slots, dtype=torch.int64, device=device)
    beyond = torch.zeros(len(KS), slots, dtype=torch.int64, device=device)
    checks = torch.zeros(slots, dtype=torch.int64, device=device)
    x = logmax.float().exp()
    for i in range(steps):
        thresholds = torch.stack([watch_threshold(ema, k) for k in KS])
        known = ~thresholds[0].isnan() & ~ema.noise_var.isnan()
        checks += known.to(torch.int64)
        beyond += (known & (x[i] > thresholds)).to(torch.int64)
        fires += (x[i] > slot).to(torch.int64)  # NaN (unset) never fires
        ema.update_log(x[i])
        slot = torch.fmax(slot, watch_threshold(ema))
    out: dict[str, dict] = {}
    for j, kind in enumerate(kinds):
        cols = slice(j * seeds, (j + 1) * seeds)
        n = int(checks[cols].sum())
        out[kind] = {
            "checks": n,
            "fires": int(fires[cols].sum()),
            "beyond": {f"{k:.3g}": int(beyond[m, cols].sum()) for m, k in enumerate(KS)},
        }
    return out


def summary(results: dict[str, dict]) -> dict[str, object]:
    """Totals over every stream, and the measured vs the Gumbel exceedance at each ``k``."""
    checks = sum(r["checks"] for r in results.values())
    fires = sum(r["fires"] for r in results.values())
    rows = {}
    for k in KS:
        key = f"{k:.3g}"
        got = sum(r["beyond"][key] for r in results.values())
        rows[key] = {"measured": got / max(checks, 1), "gumbel": gumbel_tail(k), "count": got}
    # 95% upper bound on the per-check rate when no fire was seen (the rule of three).
    bound = (fires if fires else 3.0) / max(checks, 1)
    return {"checks": checks, "fires": fires, "rate_bound_95": bound, "by_k": rows}


def markdown(total: dict[str, object]) -> str:
    body = [(key, f"{row['measured']:.3g} ({row['count']})", f"{row['gumbel']:.3g}")
            for key, row in total["by_k"].items()]  # type: ignore[union-attr]  # fmt: skip
    return markdown_table(["k (spreads)", "measured P(beyond)", "Gumbel P(beyond)"], body)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = benchmark_parser(
        __doc__, DEFAULT_OUT, quick="300 steps, 1 seed (for tests)", device="auto"
    )
    args = parser.parse_args(argv)
    steps, seeds = (300, 1) if args.quick else (20000, 2)
    results = run(steps, seeds, torch.device(args.device))
    total = summary(results)
    print(f"Watched sentinel thresholds on healthy streams: {len(results)} kinds x {seeds} seeds,")
    print(f"{steps} steps; EXCURSION_Z = {EXCURSION_Z:.2f} (FALSE_ALARM_PROB {FALSE_ALARM_PROB:g})")
    print(f"fires of the rule: {total['fires']} in {total['checks']} checks\n")
    print(markdown(total))
    report: dict[str, object] = {
        "benchmark": "ema_alarm",
        **provenance(args.device),
        "device": args.device,
        "steps": steps,
        "seeds": seeds,
        "excursion_z": EXCURSION_Z,
        "false_alarm_prob": FALSE_ALARM_PROB,
        "summary": total,
        "results": results,
    }
    write_json(args.out, report, indent=2)
    return report


if __name__ == "__main__":
    main()
