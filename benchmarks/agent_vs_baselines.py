"""The agent against the simple baselines and the regime oracle, out of sample, over seeds:
the default ``trimtab train`` (next-open fills, ~5 bp costs) per variant and seed, each seed a
separate process, and per seed the pooled out-of-sample Sharpe of the agent and of every
baseline on the same days, and the paired difference against the best simple baseline.

    python benchmarks/agent_vs_baselines.py --seeds 0 1 2 3 4 [--jobs 16] [--device cpu] \\
        [--variant NAME KEY=VALUE ...] [--key NAME] [--out FILE.json]

The targets it checks (per variant, over its seeds): the agent's mean pooled Sharpe above each
simple baseline's mean (buy & hold, momentum, reversal, MA crossover, random); its paired daily
difference against the best simple baseline of its seed positive in at least 4 of 5 seeds (the
point estimate; its 95% interval is recorded beside it); and a mean Sharpe at least half the
oracle's. Settings are chosen on seeds 0-4; seeds 5-9 are the held-out report. The JSON gains
one record (keyed by ``--key``) with machine, date and commit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trimtab.benchmarking import provenance, save_record

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "agent_vs_baselines.json"
SIMPLE = ("buy_and_hold", "momentum", "reversal", "ma_crossover", "random")
QUICK = [
    "walkforward.folds=2",
    "walkforward.steps_per_fold=30",
    "walkforward.learning_starts=64",
    "data.synthetic_days=400",
    "backtest.random_draws=8",
    "backtest.bootstrap_draws=50",
]


def run_one(
    device: str, variant: str, sets: list[str], seed: int, runs: Path, quick: bool
) -> dict[str, Any]:
    out = runs / f"{variant}-s{seed}"
    cmd = [
        sys.executable,
        "-m",
        "trimtab",
        "train",
        "--device",
        device,
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--no-progress",
    ]
    for s in [*sets, *(QUICK if quick else [])]:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"variant": variant, "seed": seed, "error": proc.stderr.strip()[-2000:]}
    summary = json.loads((out / "summary.json").read_text())
    return {"variant": variant, "seed": seed, "wall_s": round(wall, 1), **seed_row(summary)}


def seed_row(summary: dict[str, Any]) -> dict[str, Any]:
    """One seed's pooled figures from its summary.json."""
    base = summary["baselines"]
    best = max(
        (n for n in SIMPLE if base[n]["sharpe"] is not None), key=lambda n: base[n]["sharpe"]
    )
    vs = summary["vs_baselines"][best]
    row = {
        "agent": summary["oos"]["sharpe"],
        "agent_ci95": summary["oos"]["sharpe_ci95"],
        "days": summary["oos"]["days"],
        "turnover": summary["oos"]["turnover"],
        "breakeven_bps": summary["oos"]["breakeven_bps"],
        **{n: base[n]["sharpe"] for n in (*SIMPLE, "oracle") if n in base},
        "random_percentile": base["random"].get("agent_percentile"),
        "best_baseline": best,
        "vs_best_ir": vs["information_ratio"],
        "vs_best_ir_ci95": vs["information_ratio_ci95"],
        "vs_best_annual_return": vs["annual_return"],
    }
    return row


def _mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else math.nan
    return mean, se


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± s.e. over seeds of each Sharpe, and the three targets."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return {"seeds": 0}
    out: dict[str, Any] = {"seeds": len(ok)}
    for k in ("agent", *SIMPLE, "oracle", "vs_best_ir"):
        vals = [r[k] for r in ok if r.get(k) is not None]
        if vals:
            out[k] = dict(zip(("mean", "se"), _mean_se(vals)))
    beats = {n: out["agent"]["mean"] > out[n]["mean"] for n in SIMPLE if n in out}
    positive = sum(1 for r in ok if r["vs_best_ir"] > 0)
    oracle = out.get("oracle", {}).get("mean")
    out["targets"] = {
        "mean_above_every_simple_baseline": all(beats.values()),
        "above": beats,
        "vs_best_positive_seeds": f"{positive} of {len(ok)}",
        "vs_best_positive_in_4_of_5": positive >= math.ceil(0.8 * len(ok)),
        "oracle_fraction": None if not oracle else out["agent"]["mean"] / oracle,
        "half_of_oracle": None if not oracle else out["agent"]["mean"] >= 0.5 * oracle,
    }
    return out


def format_table(rows: list[dict[str, Any]], agg: dict[str, Any]) -> str:
    cols = ("agent", *SIMPLE, "oracle", "vs_best_ir")
    head = "| seed | " + " | ".join(cols) + " | best baseline |\n" + "|---" * (len(cols) + 2) + "|"
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['seed']} | error: {r['error'][:80]} |")
            continue
        cells = [("" if r.get(c) is None else f"{r[c]:+.2f}") for c in cols]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + f" | {r['best_baseline']} |")
    cells = [f"{agg[c]['mean']:+.2f} ± {agg[c]['se']:.2f}" if c in agg else "" for c in cols]
    lines.append("| mean ± s.e. | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument(
        "--variant",
        nargs="+",
        action="append",
        metavar="NAME KEY=VALUE",
        help="a named set of config overrides (repeatable); default: the default",
    )
    p.add_argument("--key", help="the record's name in the results file")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--runs", type=Path, help="keep the run directories here")
    p.add_argument("--quick", action="store_true", help="a few seconds: tiny folds, for tests")
    args = p.parse_args(argv)
    variants = {v[0]: v[1:] for v in args.variant} if args.variant else {"default": []}
    runs = args.runs or Path(tempfile.mkdtemp(prefix="trimtab-avb-"))
    jobs = [(name, sets, s) for name, sets in variants.items() for s in args.seeds]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(
            pool.map(lambda j: run_one(args.device, j[0], j[1], j[2], runs, args.quick), jobs)
        )
    record: dict[str, Any] = {
        **provenance(args.device),
        "device": args.device,
        "seeds": args.seeds,
        "quick": args.quick,
        "wall_s": round(time.perf_counter() - t0, 1),
        "variants": {},
    }
    for name, sets in variants.items():
        rows = [r for r in results if r["variant"] == name]
        agg = aggregate(rows)
        record["variants"][name] = {"overrides": sets, "rows": rows, "aggregate": agg}
        print(f"\n## {name} {' '.join(sets)}\n")
        print(format_table(rows, agg))
        if "targets" in agg:
            print(json.dumps(agg["targets"], indent=1))
    key = save_record(args.out, args.key, record)
    print(f"\nrecord {key} in {args.out}")
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"{r['variant']} seed {r['seed']} failed: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
