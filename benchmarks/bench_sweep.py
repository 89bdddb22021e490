"""``trimtab sweep`` on a local Ray instance against the same trials one after another in one
process (``--serial``): wall time of each, the speed-up, and a check that both give the same
numbers trial for trial (the trials are seeded; where they run must not matter).

    python benchmarks/bench_sweep.py [--trials 16] [--cpus 16] [--steps 150] [--quick] \\
        [--out benchmarks/results/sweep_h200.json]

Trials: the default market on the CPU, 1 fold of ``--steps`` gradient steps, a grid of
stability modes x seeds adding up to ``--trials``, one torch thread each. The serial run goes
first (nothing else on the machine), then the Ray run (Ray's start-up included in its wall
time: what a user waits for).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from trimtab.benchmarking import benchmark_parser, provenance, write_json
from trimtab.rl.sweep.spec import SweepSpec, base_data
from trimtab.rl.sweep.trials import run_sweep

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "sweep_h200.json"
MODES = ("adaptive", "fixed", "off", "adaptive")  # cycled to fill the grid
QUICK = ["data.synthetic_days=300", "env.episode_days=16", "env.n_envs=4",
         "walkforward.learning_starts=12", "agent.batch_size=16", "agent.hidden=16",
         "agent.n_atoms=11", "agent.replay_capacity=1000"]  # fmt: skip


def trials_of(n: int, steps: int, out: Path, quick: bool) -> list[Any]:
    sets = ["run.device=cpu", "run.threads=1", "run.progress=false", "walkforward.folds=1",
            f"walkforward.steps_per_fold={steps}", f"run.checkpoint_every={10 * steps}",
            *(QUICK if quick else [])]  # fmt: skip
    modes = sorted(set(MODES[: min(n, 3)]))
    seeds = list(range(math.ceil(n / len(modes))))
    spec = SweepSpec.build(base_data(None, sets), [("run.stability", modes)], [], seeds)
    return spec.trials(out)[:n]


def metrics(result: Any) -> dict[str, Any]:
    return {f"{r.trial.label}/s{r.trial.seed}": (r.status, r.record()["metrics"])
            for r in result.results}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, quick="tiny trials (a smoke test)")
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--cpus", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--engines", nargs="+", default=["serial", "ray"])
    p.add_argument("--runs", type=Path, help="where the sweeps go (default: a temp dir)")
    args = p.parse_args(argv)
    source = provenance("cpu")  # the tree the runs start from (HEAD may move meanwhile)
    runs = args.runs or Path(tempfile.mkdtemp(prefix="bench_sweep-"))
    rows: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    for engine in args.engines:
        out = runs / engine
        trials = trials_of(args.trials, args.steps, out, args.quick)
        t0 = time.perf_counter()
        result = run_sweep(trials, out, engine=engine, cpus=args.cpus, echo=lambda s: None)
        wall = time.perf_counter() - t0
        failed = [f"{r.trial.label} s{r.trial.seed}: {r.error}" for r in result.failed]
        if failed:
            raise SystemExit(f"{engine}: {len(failed)} trials failed: {failed[:3]}")
        trial_s = [r.seconds for r in result.results]
        rows[engine] = {"wall_s": wall, "trials": len(trials), "trial_s": trial_s,
                        "trial_s_sum": sum(trial_s)}  # fmt: skip
        seen[engine] = metrics(result)
        print(f"{engine}: {len(trials)} trials in {wall:.1f} s (trials' own time "
              f"{sum(trial_s):.1f} s)", flush=True)  # fmt: skip
    result = {
        "benchmark": "sweep",
        **source,
        "quick": args.quick,
        "cpus": args.cpus,
        "steps_per_trial": args.steps,
        "engines": rows,
    }
    if "serial" in rows and "ray" in rows:
        result["speedup_ray_vs_serial"] = rows["serial"]["wall_s"] / rows["ray"]["wall_s"]
        result["same_metrics"] = seen["serial"] == seen["ray"]
        print(f"speed-up x{result['speedup_ray_vs_serial']:.2f}; same numbers trial for trial: "
              f"{result['same_metrics']}")  # fmt: skip
    write_json(args.out, result, indent=1)
    return result


if __name__ == "__main__":
    main()
