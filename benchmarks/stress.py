"""Stress proof: seeds x {adaptive, fixed, off} x {default market, stress market}.

    python benchmarks/stress.py [--seeds 5] [--steps 400] [--device cpu] [--quick] [--out PATH]
        [--autocast {none,bf16,fp16}] [--reward-scale X] [--runs DIR] [--serial | --address A]
    # a subset, then one table of it and earlier result files:
    python benchmarks/stress.py --seed-list 3 --modes off --markets stress --merge old.json

The cells run through the sweep runner (``trimtab.rl.sweep.trials``): as Ray tasks on every core (or
a cluster with ``--address``; ``--serial``: one after another in this process), each an
ordinary run directory under ``--runs`` (default: a temporary folder), so a rerun with the same
``--runs`` skips the cells it finished. Each cell is a full walk-forward run
(``on_nonfinite = "halt"``). The stress market is the
embedded market's stress preset: a crash segment late in the data (volatility x20 and a mean
daily return -100x the calm regime's) that lands in the last folds. Per cell: folds completed
with every watched tensor finite, the first-fire slot of a halted run, the out-of-sample
Sharpe per fold, and the time per gradient step. ``--autocast`` runs the agent's forwards in
bf16 or fp16 (``run.autocast``; fp16 without a GradScaler) and is recorded in every row; rows
of older files, written before the option, count as ``none``.
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, write_json
from trimtab.rl.configio import apply_overrides
from trimtab.rl.sweep.spec import SweepSpec
from trimtab.rl.sweep.trials import TrialResult, run_sweep

DEFAULT_OUT = Path(__file__).parent / "results" / "stress.json"
MODES = ("adaptive", "fixed", "off")
AUTOCAST = ("none", "bf16", "fp16")


def base_config(
    steps: int,
    device: str,
    quick: bool,
    scale: float = 1.0,
    autocast: str = "none",
    overrides: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Every cell's config data but its seed, stability mode and market."""
    base: dict[str, Any] = {
        "run": {"device": device, "checkpoint_every": 10**9, "log_every": 50,
                "autocast": autocast},
        # learning_starts in env steps summed over the 16 envs: 200 batched steps
        "walkforward": {"steps_per_fold": steps, "learning_starts": 16 * min(200, steps)},
        "env": {"reward_scale": scale},
    }  # fmt: skip
    if quick:
        base["data"] = {"synthetic_days": 400}
        base["walkforward"].update(folds=2, learning_starts=64)  # 4 batched steps
        base["agent"] = {"hidden": 16, "batch_size": 16, "n_tau": 2, "n_tau_target": 2}
    return apply_overrides(base, overrides)


def row_of(result: TrialResult, overrides: tuple[str, ...]) -> dict[str, Any]:
    """A finished cell's row: folds kept finite, the first-fire slot, Sharpe per fold."""
    cfg, summary = result.trial.cfg, result.summary or {}
    fired = json.loads((result.trial.run_dir / "sentinel.json").read_text())["fired"]
    folds = summary["folds"]
    steps_done = sum(f["steps"] for f in folds) or 1
    return {
        "seed": cfg.run.seed,
        "stability": cfg.run.stability,
        "market": "stress" if cfg.data.stress else "default",
        "reward_scale": cfg.env.reward_scale,
        "autocast": cfg.run.autocast,
        "overrides": list(overrides),
        "steps_per_fold": cfg.walkforward.steps_per_fold,
        "folds_total": cfg.walkforward.folds,
        "folds_finite": sum(1 for f in folds if f["nonfinite"] == 0),
        "halted": summary["halted"],
        "first_fire": fired[0]["name"] if fired else None,
        "sharpe": [round(f["sharpe"], 3) for f in folds],
        "buy_hold_sharpe": [round(f["buy_hold_sharpe"], 3) for f in folds],
        "ms_per_step": 1e3 * summary["seconds"] / steps_done,
        "run_dir": str(result.trial.run_dir),
    }


def _mean(values: list[float]) -> str:
    """A signed mean, or "-" when no fold finished (a run halted in its first fold)."""
    return f"{statistics.mean(values):+.2f}" if values else "-"


def table(rows: list[dict]) -> str:
    header = ["market", "autocast", "stability", "runs with every fold finite",
              "first-fire slots", "mean OOS Sharpe", "mean B&H Sharpe", "ms/step"]  # fmt: skip
    body = []
    variants = sorted({" ".join(r.get("overrides", [])) for r in rows})
    groups = itertools.product(("default", "stress"), variants, AUTOCAST, MODES)
    for market, variant, precision, mode in groups:
        cells = [r for r in rows if r["market"] == market and r["stability"] == mode
                 and r.get("autocast", "none") == precision
                 and " ".join(r.get("overrides", [])) == variant]  # fmt: skip
        if variant:
            market = f"{market} ({variant})"
        if cells:
            ok = sum(r["folds_finite"] == r["folds_total"] and not r["halted"] for r in cells)
            fires = sorted({r["first_fire"] for r in cells if r["first_fire"]}) or ["-"]
            sharpe = _mean([s for r in cells for s in r["sharpe"]])
            bh = _mean([s for r in cells for s in r["buy_hold_sharpe"]])
            ms = statistics.median(r["ms_per_step"] for r in cells)
            body.append((market, precision, mode, f"{ok}/{len(cells)}", ", ".join(fires), sharpe,
                         bh, f"{ms:.1f}"))  # fmt: skip
    return markdown_table(header, body, "lllrlrrr")


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser(
        __doc__, DEFAULT_OUT, quick="1 seed, a tiny market and net", device="auto"
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400, help="gradient steps per fold")
    parser.add_argument(
        "--markets",
        nargs="+",
        default=["default", "stress"],
        choices=["default", "stress"],
        help="run these markets only",
    )
    parser.add_argument(
        "--merge",
        nargs="*",
        type=Path,
        default=[],
        help="also tabulate the rows of these earlier result files",
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--reward-scale", type=float, default=1.0, help="training rewards x this (env.reward_scale)"
    )
    parser.add_argument(
        "--autocast",
        default="none",
        choices=AUTOCAST,
        help="the agent's forwards in this precision (run.autocast)",
    )
    parser.add_argument(
        "--seed-list", nargs="*", type=int, default=None, help="run these seeds (one shard)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="override one config value in every cell, e.g. --set agent.trunk=mlp (repeatable)",
    )
    parser.add_argument(
        "--runs", type=Path, help="keep the run directories here; a rerun skips finished cells"
    )
    parser.add_argument("--serial", action="store_true", help="no Ray: one cell after another")
    parser.add_argument("--address", help="a Ray cluster (default: a local Ray instance)")
    args = parser.parse_args(argv)
    seeds = 1 if args.quick else args.seeds
    steps = 10 if args.quick else args.steps
    seed_list = list(range(seeds)) if args.seed_list is None else args.seed_list
    overrides = tuple(args.overrides)
    base = base_config(steps, args.device, args.quick, args.reward_scale, args.autocast, overrides)
    grid = [("data.stress", [m == "stress" for m in args.markets]), ("run.stability", args.modes)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.runs or Path(tmp) / "stress"
        trials = SweepSpec.build(base, grid, seeds=seed_list).trials(runs) if seed_list else []
        result = run_sweep(trials, runs, engine="serial" if args.serial else "ray",
                           address=args.address)  # fmt: skip
        for r in result.results:
            if r.status != "failed":
                rows.append(row_of(r, overrides))
                if args.runs is None:  # a temporary folder: gone when this returns
                    del rows[-1]["run_dir"]
    failed = [{"cell": r.trial.label, "seed": r.trial.seed, "error": r.error}
              for r in result.failed]  # fmt: skip
    for path in args.merge:
        rows += json.loads(path.read_text())["rows"]
    print()
    print(table(rows))
    seeds = len({r["seed"] for r in rows})
    out = {"benchmark": "stress", **provenance(args.device), "seeds": seeds,
           "steps_per_fold": steps, "quick": args.quick, "rows": rows,
           "failed": failed}  # fmt: skip
    write_json(args.out, out, indent=2)
    if failed:
        print(f"{len(failed)} cells failed: {failed}")
    return out


if __name__ == "__main__":
    main()
