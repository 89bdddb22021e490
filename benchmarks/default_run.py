"""The default ``trimtab train`` (the embedded market, 4 walk-forward folds) on a device: wall time
per run, and each fold's Sharpe against buy & hold, per variant (a set of config overrides) and
seed; several runs at once as separate processes.

    python benchmarks/default_run.py --device cuda --seeds 0 1 2 [--jobs 6] \\
        [--variant NAME KEY=VALUE ...] [--out benchmarks/results/default_run_h200.json]

Without ``--variant`` one variant runs: ``default`` (no override; the market takes the same
device profile on CUDA as on the CPU, ``trimtab.rl.config.device_profile``). ``--variant
cuda_profile env.n_envs=64 agent.batch_size=256`` adds the CUDA profile's sizes on the same
device (the records before that change ran them as the default). Wall time is the whole
process's (start-up, CUDA initialisation and the report included) and ``train_s`` the training
loop's (summary.json); ``timings`` splits the wall time (summary.json's ``timings``: set-up,
loop, report; ``start_s`` the rest: interpreter start-up and imports);
runs that share the device at once (``--jobs`` > 1) slow each other, so the target
(<= 30 s on the H200) is read from a run alone (``--jobs 1``). ``--cold`` gives each run an
empty Triton cache of its own (``TRITON_CACHE_DIR``), as on a machine's first run, and records
the kernels compiled into it (by the run, or before it by ``run.precompile``'s workers, whose
report is the row's ``precompile``): how many of each, and when (seconds after the process
started). Per variant: the mean fold Sharpe over seeds (mean ± standard error of each seed's
mean over folds) and the folds that beat buy & hold. The JSON gains one record (keyed by
``--key``) with machine, date and commit.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trimtab.benchmarking import benchmark_parser, child_env, provenance, save_record

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "default_run_h200.json"
QUICK = ["walkforward.folds=2", "walkforward.steps_per_fold=30", "walkforward.learning_starts=64",
         "data.synthetic_days=400"]  # fmt: skip


def compiled_kernels(cache: Path, t0: float) -> dict[str, Any]:
    """What a run compiled into its own Triton cache: each kernel's name and variants, and the
    seconds after ``t0`` (the process's start, wall clock) at which its binaries were written."""
    rows = []
    for meta in cache.rglob("*.json"):
        if meta.name.startswith("__grp__"):
            continue
        try:
            name = json.loads(meta.read_text()).get("name")
        except (OSError, ValueError):
            continue
        if name:
            rows.append((meta.stat().st_mtime - t0, name))
    rows.sort()
    counts = Counter(name for _, name in rows)
    return {"variants": len(rows), "by_name": dict(counts.most_common()),
            "written_s": [[round(t, 2), name] for t, name in rows]}  # fmt: skip


def run_one(
    device: str,
    variant: str,
    sets: list[str],
    seed: int,
    runs: Path,
    quick: bool,
    cold: bool = False,
) -> dict[str, Any]:
    out = runs / f"{variant}-s{seed}"
    cmd = [sys.executable, "-m", "trimtab", "train", "--device", device, "--seed", str(seed),
           "--out", str(out), "--no-progress"]  # fmt: skip
    for s in [*sets, *(QUICK if quick else [])]:
        cmd += ["--set", s]
    # warm: Python's bytecode shared by the runs (the first compiles it); cold: a machine's
    # first run, with empty Triton and bytecode caches of its own
    env = child_env(runs / (f"{variant}-s{seed}-pycache" if cold else "pycache"))
    cache = runs / f"{variant}-s{seed}-triton-cache"
    if cold:  # an empty cache of its own: the run compiles every kernel it launches
        cache.mkdir(parents=True)
        env["TRITON_CACHE_DIR"] = str(cache)
    wall0 = time.time()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    row: dict[str, Any] = {"variant": variant, "seed": seed, "sets": sets, "rc": proc.returncode,
                           "wall_s": time.perf_counter() - t0}  # fmt: skip
    if cold:
        row["triton_cache"] = compiled_kernels(cache, wall0)
    summary = out / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        row["error"] = (proc.stderr or proc.stdout)[-2000:]
        return row
    s = json.loads(summary.read_text())
    keys = ("fold", "sharpe", "buy_hold_sharpe", "total_return", "buy_hold_return", "nonfinite")
    folds = [{k: f.get(k) for k in keys} for f in s["folds"]]
    row.update(train_s=s["seconds"], updates=s["updates"], env_steps=s["env_steps"],
               halted=s["halted"], folds=folds)  # fmt: skip
    if "precompile" in s:  # what worker processes compiled before the run (run.precompile)
        row["precompile"] = s["precompile"]
    parts = s.get("timings", {})  # the process's wall time by part; the rest: start-up, imports
    if parts:
        row["timings"] = {**parts, "start_s": row["wall_s"] - sum(parts.values())}
    cfg = (out / "config.toml").read_text()
    row["n_envs_batch"] = [ln for ln in cfg.splitlines() if ln.startswith(("n_envs", "batch_size"))]
    sharpes = [f["sharpe"] for f in folds if f["sharpe"] is not None]
    row["mean_fold_sharpe"] = sum(sharpes) / len(sharpes) if sharpes else None
    row["beats_buy_hold"] = [f["fold"] for f in folds if (f["sharpe"] or -math.inf)
                             > (f["buy_hold_sharpe"] if f["buy_hold_sharpe"] is not None
                                else math.inf)]  # fmt: skip
    return row


def mean_se(values: list[float]) -> tuple[float | None, float | None]:
    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else None
    return mean, se


def aggregate(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        ok = [r for r in rows if r["variant"] == variant and r.get("mean_fold_sharpe") is not None]
        sharpe, sharpe_se = mean_se([r["mean_fold_sharpe"] for r in ok])
        wall, wall_se = mean_se([r["wall_s"] for r in ok])
        out[variant] = {"runs": len(ok), "mean_fold_sharpe": sharpe, "stderr": sharpe_se,
                        "wall_s": wall, "wall_se": wall_se,
                        "folds_beating_buy_hold": sum(len(r["beats_buy_hold"]) for r in ok),
                        "folds": sum(len(r["folds"]) for r in ok)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(
        __doc__,
        None,
        quick="2 short folds: a smoke test",
        device="cuda",
        key=True,
        quick_writes=False,
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=1, help="runs at once (processes)")
    p.add_argument("--variant", nargs="+", action="append", default=None,
                   metavar="NAME KEY=VALUE", help="a name and its config overrides")  # fmt: skip
    p.add_argument("--runs", type=Path, default=None, help="run directories (default: temp)")
    p.add_argument(
        "--cold",
        action="store_true",
        help="each run with an empty Triton cache of its own (a machine's first run)",
    )
    args = p.parse_args(argv)
    variants = {v[0]: v[1:] for v in (args.variant or [["default"]])}
    jobs = [(name, sets, seed) for seed in args.seeds for name, sets in variants.items()]
    with tempfile.TemporaryDirectory(prefix="default-run-") as tmp:
        runs = args.runs or Path(tmp)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            rows = list(pool.map(lambda j: run_one(args.device, j[0], j[1], j[2], runs, args.quick,
                                                     args.cold),
                                 jobs))  # fmt: skip
    for r in rows:
        failed = f"  FAILED: {r['error'][-300:]}" if "error" in r else ""
        sharpe = r.get("mean_fold_sharpe")
        print(f"{r['variant']:14} seed {r['seed']}: wall {r['wall_s']:6.1f} s, train "
              f"{r.get('train_s', float('nan')):6.1f} s, mean fold Sharpe "
              f"{'-' if sharpe is None else format(sharpe, '+.2f')}, folds beating B&H "
              f"{r.get('beats_buy_hold')}{failed}", flush=True)  # fmt: skip
        if r.get("timings"):
            print("    " + ", ".join(f"{k} {v:.1f}" for k, v in r["timings"].items()))
        if r.get("triton_cache"):
            c = r["triton_cache"]
            last = c["written_s"][-1][0] if c["written_s"] else None
            print(
                f"    compiled {c['variants']} kernel variants (last written at {last} s): "
                f"{c['by_name']}"
            )
    agg = aggregate(rows)
    for name, a in agg.items():
        print(f"{name}: {a}")
    command = " ".join(["benchmarks/default_run.py", *(sys.argv[1:] if argv is None else argv)])
    record = {**provenance(args.device), "command": command, "device": args.device,
              "jobs": args.jobs, "quick": args.quick, "cold": args.cold, "runs": rows,
              "aggregate": agg}  # fmt: skip
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
