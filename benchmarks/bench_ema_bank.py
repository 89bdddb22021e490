"""AdaptiveEMA on a bank of 35 signal families in three groups: tuned on, seen, and fresh.

Usage: ``python benchmarks/bench_ema_bank.py [--quick] [--out PATH] [--device DEVICE]
[--halves tune,held_out,fresh]``

The families, their split into ``tune``, ``held_out`` (seen) and ``fresh``, and why, are in
``ema_signals.py``; the estimator is tuned with ``--halves tune,held_out`` only.

Two banks are scored, as ``bench_ema.py`` scores its five signals (the mean over all steps of
the squared error against the true level, averaged over seeds, against fixed-rate EMAs whose
first observation replaces, rates ``FIXED_ALPHAS``):

- ``update``: every family with a finite mean, :meth:`AdaptiveEMA.update` against fixed EMAs of
  ``y``; the error is on the linear scale, against the true mean.
- ``update_log``: the positive families (multiplicative noise, the shape of a p99 stream),
  :meth:`AdaptiveEMA.update_log` against fixed EMAs of ``log y``; the error is on the log scale,
  against the log of the true median level (a relative error: scale-free, as a magnitude is).

The target is adaptive MSE ≤ 1.25 × the best fixed rate in hindsight on every family of the
held-out half. All families × seeds of one bank run as the slots of ONE AdaptiveEMA.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ema_signals import FAMILIES, FRESH_COMMIT, HALVES, make
from trimtab import AdaptiveEMA
from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, write_json

FIXED_ALPHAS = (0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.001)
TARGET_RATIO = 1.25
DEFAULT_OUT = Path(__file__).parent / "results" / "ema_bank.json"


def _score(obs: Tensor, truth: Tensor, log: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    """MSE per slot of the adaptive EMA ``[slots]`` and of each fixed rate ``[rates, slots]``."""
    obs, truth = obs.to(device), truth.to(device)
    slots = obs.shape[1]
    ema = AdaptiveEMA(slots, device=device)
    y = obs.log() if log else obs
    alphas = torch.tensor(FIXED_ALPHAS, dtype=torch.float64, device=device)[:, None]
    fixed = y[0].expand(len(FIXED_ALPHAS), slots).clone()  # first observation replaces
    err_a = torch.zeros(slots, dtype=torch.float64, device=device)
    err_f = torch.zeros_like(fixed)
    for i in range(obs.shape[0]):
        if i:
            fixed += alphas * (y[i] - fixed)
        if log:
            ema.update_log(obs[i].float())
        else:
            ema.update(obs[i].float())
        err_a += (ema.estimate.double() - truth[i]).square()
        err_f += (fixed - truth[i]).square()
    steps = obs.shape[0]
    return err_a / steps, err_f / steps


def run(
    steps: int, seeds: int, device: torch.device, halves: tuple[str, ...] = HALVES
) -> dict[str, dict[str, dict]]:
    """``{bank: {family: row}}``, bank ``update`` or ``update_log``, families of ``halves``."""
    runs = {
        name: [make(name, steps, s) for s in range(seeds)]
        for name, (half, _) in FAMILIES.items()
        if half in halves
    }
    out: dict[str, dict[str, dict]] = {}
    for bank, log in (("update", False), ("update_log", True)):
        names = [n for n in runs if runs[n][0][2 if log else 1] is not None]
        obs = torch.stack([r[0] for n in names for r in runs[n]], 1)
        truth = torch.stack([r[2 if log else 1] for n in names for r in runs[n]], 1)
        mse_a, mse_f = _score(obs, truth, log, device)
        mse_a = mse_a.view(len(names), seeds).mean(1).cpu()
        mse_f = mse_f.view(len(FIXED_ALPHAS), len(names), seeds).mean(2).cpu()
        rows: dict[str, dict] = {}
        for j, name in enumerate(names):
            row: dict = {"half": FAMILIES[name][0], "adaptive": float(mse_a[j])}
            row.update({f"alpha={a:g}": float(mse_f[k, j]) for k, a in enumerate(FIXED_ALPHAS)})
            best = min(FIXED_ALPHAS, key=lambda a: row[f"alpha={a:g}"])
            row["best_fixed_alpha"] = best
            row["ratio"] = row["adaptive"] / row[f"alpha={best:g}"]
            rows[name] = row
        out[bank] = rows
    return out


def update_cost(slots: int, calls: int, repeats: int = 5) -> dict[str, float]:
    """Host time of one :meth:`AdaptiveEMA.update` / ``update_log`` (torch path, CPU, float32)
    on ``slots`` slots: the least over ``repeats`` of the mean of ``calls`` calls, in
    microseconds (the least disturbed: this machine's 2 cores are shared), on one intra-op thread
    (on tensors this small a second thread only adds hand-offs, which under load cost ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    obs = torch.rand(calls, slots, generator=gen) + 0.5
    out: dict[str, float] = {"slots": slots, "calls": calls, "threads": 1}
    for fold in ("update", "update_log"):
        times = []
        for _ in range(repeats):
            ema = AdaptiveEMA(slots)
            t0 = time.perf_counter()
            for row in obs:
                getattr(ema, fold)(row, impl="torch")
            times.append((time.perf_counter() - t0) / calls * 1e6)
        out[f"{fold}_us"] = min(times)
    torch.set_num_threads(threads)
    return out


def markdown(rows: dict[str, dict], half: str) -> str:
    """One half of one bank as a markdown table (the best fixed rate and the ratio)."""
    head = ["family", "adaptive MSE", "best fixed α", "its MSE", "adaptive / best"]
    body = []
    for name, row in rows.items():
        if row["half"] != half:
            continue
        a = row["best_fixed_alpha"]
        ok = "✓" if row["ratio"] <= TARGET_RATIO else "✗"
        body.append([name, f"{row['adaptive']:.4g}", f"{a:g}", f"{row[f'alpha={a:g}']:.4g}",
                     f"{row['ratio']:.2f} {ok}"])  # fmt: skip
    return markdown_table(head, body)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = benchmark_parser(
        __doc__, DEFAULT_OUT, quick="300 steps, 2 seeds (for tests)", device="auto"
    )
    parser.add_argument(
        "--halves",
        default=",".join(HALVES),
        help=f"comma-separated subset of {HALVES} to run (tuning: leave out fresh)",
    )
    args = parser.parse_args(argv)
    halves = tuple(h for h in args.halves.split(",") if h)
    if not halves or set(halves) - set(HALVES):
        parser.error(f"--halves must name some of {HALVES}, got {args.halves!r}")
    steps, seeds = (300, 2) if args.quick else (3000, 5)
    results = run(steps, seeds, torch.device(args.device), halves)
    cost = [update_cost(n, 50 if args.quick else 1000) for n in (8, 64)]
    for row in cost:
        print(f"update cost, {row['slots']} slots (torch, CPU): update {row['update_us']:.0f} us, "
              f"update_log {row['update_log_us']:.0f} us per call")  # fmt: skip
    print(f"AdaptiveEMA on the signal bank: tracking MSE, {steps} steps, {seeds} seeds")
    for bank, rows in results.items():
        for half in halves:
            print(f"\n{bank}, {half} half\n")
            print(markdown(rows, half))
    worst = {
        bank: {
            half: max(
                ((n, r["ratio"]) for n, r in rows.items() if r["half"] == half),
                key=lambda x: x[1],
            )
            for half in halves
            if any(r["half"] == half for r in rows.values())
        }
        for bank, rows in results.items()
    }
    report: dict[str, object] = {
        "benchmark": "ema_bank",
        **provenance(args.device),
        "device": args.device,
        "steps": steps,
        "seeds": seeds,
        "fixed_alphas": FIXED_ALPHAS,
        "target_ratio": TARGET_RATIO,
        "halves_run": halves,
        "fresh_commit": FRESH_COMMIT,
        "split": {h: [n for n, (hh, _) in FAMILIES.items() if hh == h] for h in HALVES},
        "worst": worst,
        "update_cost_cpu": cost,
        "results": results,
    }
    write_json(args.out, report, indent=2)
    return report


if __name__ == "__main__":
    main()
