"""CleanRL's ``c51.py`` beside ``trimtab train`` on CartPole-v1, in the same run on this machine:
env steps per second, wall time and (when training returns reach 475) wall time to solve.

    python benchmarks/bench_cleanrl.py --cleanrl PATH/TO/cleanrl --cleanrl-python VENV/bin/python \\
        --steps 100000 [--modes off adaptive] [--impls gymnasium torch] [--repeats 1] [--quick]

The peer is an unmodified CleanRL checkout (``c51.py`` and ``cleanrl_utils/``) run by the
python of its own virtual environment (gymnasium 0.29.x, tyro, tensorboard, torch; trimtab does
not depend on it). Without it, only trimtab runs and the peer is reported as skipped.

Every run is its own process, one at a time, one CPU thread each (``OMP_NUM_THREADS=1``;
trimtab's ``run.threads = 1``), with the settings of ``examples/cartpole.toml``, which mirrors
``c51.py``'s; ``--steps`` sets both total step counts, ε decays over half of them on both sides
(c51.py's ``exploration_fraction = 0.5``), and ``--quick`` also starts learning after 1000
steps. With ``--repeats`` > 1 the order of the runs rotates, so that drift in the machine's
load falls on every side alike. Wall time is the whole process's, start-up included.

CPU time (user + system of the run's process tree, ``cpu_s``) is reported beside wall time: on a
machine that other work shares, wall time measures the load as much as the run, CPU time less so.

Time to solve: the wall time at which the training episodes (ε-greedy) that finished within
the last 5000 env steps first average >= 475, on both sides (c51.py evaluates no greedy
policy); trimtab's greedy return over ``--eval-episodes`` (10) at the end is reported beside
it. That evaluation is part of trimtab's wall time (at most 5000 greedy steps: a few seconds).
"""

from __future__ import annotations

import csv
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trimtab.benchmarking import benchmark_parser, provenance, save_record

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cartpole.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cleanrl_cpu.json"
SOLVED = 475.0  # CartPole-v1's reward threshold
WINDOW = 5000  # env steps over which training returns are averaged for the time to solve
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_EPISODE = re.compile(r"global_step=(\d+), episodic_return=\[?([-\d.e+]+)\]?")


def peer_problem(cleanrl: Path | None, python: str | None) -> str | None:
    """Why the CleanRL peer cannot run here, or None when it can."""
    if cleanrl is None or python is None:
        return "no --cleanrl checkout and --cleanrl-python given"
    if not (cleanrl / "c51.py").is_file():
        return f"{cleanrl}/c51.py does not exist"
    probe = "import gymnasium, tyro, torch, torch.utils.tensorboard; print(gymnasium.__version__)"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except OSError as e:
        return f"--cleanrl-python {python}: {e}"
    if out.returncode != 0:
        return f"--cleanrl-python {python} lacks c51.py's packages: {out.stderr.strip()[-300:]}"
    if not out.stdout.strip().startswith("0.29."):
        return (f"c51.py needs gymnasium 0.29.x (1.x stops at the first truncation), "
                f"{python} has {out.stdout.strip()}")  # fmt: skip
    return None


def time_to_solve(stamped: list[tuple[float, int, float]], min_count: int = 5) -> float | None:
    """The first wall time at which the ``min_count`` or more returns stamped within the last
    ``WINDOW`` env steps average >= ``SOLVED``; ``stamped`` holds (wall s, env step, return) in
    order: CleanRL's episodes, or trimtab's metrics rows (each already the mean return of the
    episodes of its ``WINDOW`` steps: examples/cartpole.toml logs every 500 x 10 env steps)."""
    for i, (t, step, _) in enumerate(stamped):
        recent = [r for _, s, r in stamped[: i + 1] if s > step - WINDOW]
        if len(recent) >= min_count and sum(recent) / len(recent) >= SOLVED:
            return t
    return None


def run_cleanrl(cleanrl: Path, python: str, steps: int, seed: int, quick: bool) -> dict[str, Any]:
    cmd = [python, "-u", str(cleanrl / "c51.py"), "--no-cuda", "--seed", str(seed),
           "--total-timesteps", str(steps)]  # fmt: skip
    if quick:
        cmd += ["--learning-starts", "1000"]
    stamped: list[tuple[float, int, float]] = []
    sps = None
    with tempfile.TemporaryDirectory(prefix="cleanrl-") as cwd:  # c51.py writes runs/ here
        cpu0 = _children_cpu()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, **ONE_THREAD})  # fmt: skip
        tail: list[str] = []
        for line in proc.stdout or ():
            m = _EPISODE.search(line)
            if m:
                stamped.append((time.perf_counter() - t0, int(m[1]), float(m[2])))
            elif line.startswith("SPS:"):
                sps = int(line.split()[1])
            tail = [*tail[-20:], line]
        rc = proc.wait()
        wall = time.perf_counter() - t0
        cpu = _children_cpu() - cpu0
    row = {"side": "cleanrl", "impl": "gymnasium", "mode": "c51.py", "steps": steps,
           "wall_s": wall, "cpu_s": cpu, "env_steps_per_s": steps / wall, "own_sps": sps, "rc": rc,
           "episodes": len(stamped), "solve_s": time_to_solve(stamped),
           "train_return_last100": _mean([r for *_, r in stamped[-100:]])}  # fmt: skip
    if rc != 0:
        row["error"] = "".join(tail)[-2000:]
    return row


def run_trimtab(
    impl: str,
    mode: str,
    steps: int,
    seed: int,
    quick: bool,
    eval_episodes: int,
    runs: Path,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    out = runs / f"trimtab-{impl}-{mode}-s{seed}"
    sets = [f"gym.total_steps={steps}", f"agent.eps_decay_steps={max(steps // 2, 1)}",
            f"gym.eval_episodes={eval_episodes}", f'env.impl="{impl}"',
            "run.threads=1"]  # fmt: skip
    if quick:
        sets.append("gym.learning_starts=1000")
    sets += extra or []
    cmd = [sys.executable, "-m", "trimtab", "train", "--config", str(EXAMPLE), "--stability", mode,
           "--seed", str(seed), "--out", str(out), "--no-progress"]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    stamped: list[tuple[float, int, float]] = []
    done = threading.Event()
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    # metrics.csv gains a row every run.log_every updates: its mean training return, stamped
    # with the time it appeared (a poll every 0.2 s)
    watcher = threading.Thread(target=_watch, args=(out / "metrics.csv", t0, stamped, done))
    watcher.start()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, **ONE_THREAD})  # fmt: skip
    finally:
        wall = time.perf_counter() - t0
        cpu = _children_cpu() - cpu0
        done.set()
        watcher.join()
    row: dict[str, Any] = {"side": "trimtab", "impl": impl, "mode": mode, "steps": steps,
                           "wall_s": wall, "cpu_s": cpu, "env_steps_per_s": steps / wall,
                           "rc": proc.returncode,
                           "run_dir": str(out), "solve_s": time_to_solve(stamped, 1)}  # fmt: skip
    summary = out / "summary.json"
    if proc.returncode == 0 and summary.is_file():
        s = json.loads(summary.read_text())
        row.update(train_s=s["seconds"], updates=s["updates"], greedy=s["eval"]["mean_return"],
                   train_return_last100=s["train_return_last100"], halted=s["halted"])  # fmt: skip
    else:
        row["error"] = (proc.stderr or proc.stdout)[-2000:]
    return row


def _children_cpu() -> float:
    """User + system seconds of the finished child processes so far (runs are one at a time)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _watch(path: Path, t0: float, stamped: list, done: threading.Event) -> None:
    seen = 0
    while True:
        finished = done.is_set()
        if path.is_file():
            with path.open() as fh:
                rows = list(csv.DictReader(fh))
            for r in rows[seen:]:
                ret = float(r["episode_return"])
                if ret > 0:  # 0: no episode ended since the previous row
                    stamped.append((time.perf_counter() - t0, int(float(r["env_steps"])), ret))
            seen = len(rows)
        if finished:
            return
        done.wait(0.2)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _fmt(v: Any, spec: str) -> str:
    return "-".rjust(int(spec.split(".")[0])) if v is None else format(v, spec)


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'side':8} {'impl':9} {'mode':8} {'steps':>7} {'wall s':>7} {'steps/s':>8} "
            f"{'x peer':>7} {'cpu s':>7} {'x peer':>7} {'greedy':>7} {'train100':>8} "
            f"{'solve s':>7}")  # fmt: skip
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['side']:8} {r['impl']:9} {r['mode']:8} {r['steps']:>7} {r['wall_s']:7.1f} "
            f"{r['env_steps_per_s']:8.0f} {_fmt(r.get('wall_vs_cleanrl'), '7.2f')} "
            f"{_fmt(r.get('cpu_s'), '7.1f')} {_fmt(r.get('cpu_vs_cleanrl'), '7.2f')} "
            f"{_fmt(r.get('greedy'), '7.1f')} {_fmt(r.get('train_return_last100'), '8.1f')} "
            f"{_fmt(r.get('solve_s'), '7.1f')}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    quick = "3000 steps, learning from 1000, 5 greedy episodes: a smoke test"
    p = benchmark_parser(
        __doc__,
        None,
        quick=quick,
        key=True,
        quick_writes=False,
    )
    p.add_argument("--cleanrl", type=Path, help="a CleanRL checkout (holding c51.py)")
    p.add_argument("--cleanrl-python", help="the python of CleanRL's virtual environment")
    p.add_argument("--steps", type=int, default=100_000, help="env steps per run (both sides)")
    p.add_argument("--modes", nargs="+", default=["off", "adaptive"],
                   choices=["off", "fixed", "adaptive"])  # fmt: skip
    p.add_argument("--impls", nargs="+", default=["gymnasium", "torch"],
                   choices=["gymnasium", "torch"], help="trimtab's env.impl")  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1, help="rounds, each running every side")
    p.add_argument("--eval-episodes", type=int, default=10, help="trimtab's greedy episodes")
    p.add_argument("--runs", type=Path, default=None, help="trimtab's run dirs (default: temp)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of examples/cartpole.toml on trimtab's side (repeatable; "
                        "after the script's own, so it may replace them)")  # fmt: skip
    args = p.parse_args(argv)
    steps, episodes = (3000, 5) if args.quick else (args.steps, args.eval_episodes)
    problem = peer_problem(args.cleanrl, args.cleanrl_python)
    if problem:
        print(f"CleanRL peer skipped: {problem}", flush=True)
    sides: list[tuple[str, ...]] = [] if problem else [("cleanrl",)]
    sides += [("trimtab", impl, mode) for impl in args.impls for mode in args.modes]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-cleanrl-") as tmp:
        runs = args.runs or Path(tmp)
        for rep in range(args.repeats):
            order = sides[rep % len(sides) :] + sides[: rep % len(sides)]
            for side in order:
                if side[0] == "cleanrl":
                    row = run_cleanrl(args.cleanrl, args.cleanrl_python, steps, args.seed,
                                      args.quick)  # fmt: skip
                else:
                    row = run_trimtab(side[1], side[2], steps, args.seed, args.quick, episodes,
                                      runs / f"r{rep}", args.sets)  # fmt: skip
                row["repeat"] = rep
                rows.append(row)
                failed = f" FAILED rc {row['rc']}: {row['error'][-400:]}" if "error" in row else ""
                print(f"  {row['side']} {row['impl']} {row['mode']}: {row['wall_s']:.1f} s{failed}",
                      flush=True)  # fmt: skip
    # each trimtab run against the peer's run of the same round: wall time, trimtab / CleanRL
    peer = {r["repeat"]: r for r in rows if r["side"] == "cleanrl" and r["rc"] == 0}
    for r in rows:
        if r["side"] == "trimtab" and r["repeat"] in peer:
            r["wall_vs_cleanrl"] = r["wall_s"] / peer[r["repeat"]]["wall_s"]
            r["cpu_vs_cleanrl"] = r["cpu_s"] / peer[r["repeat"]]["cpu_s"]
    print(table(rows))
    command = " ".join(["benchmarks/bench_cleanrl.py", *(sys.argv[1:] if argv is None else argv)])
    record = {**provenance(), "threads": 1, "command": command, "steps": steps,
              "seed": args.seed, "quick": args.quick, "sets": args.sets,
              "cleanrl_skipped": problem, "runs": rows}  # fmt: skip
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
