"""Where a training run's wall time goes, by part of the runner's loop: collection (act, env
step, check, store), replay sampling, the learn step, the sentinel's host read, metrics rows,
checkpoints and the greedy evaluation; and how often the learn step and the collection were
captured in a CUDA graph.

    python benchmarks/experiments/profile_loop.py --device cuda [--config FILE] \\
        [--set KEY=VALUE ...]

Two runs of the same config: one plain (its wall time is the reference), one with each part
timed (a device synchronisation before and after every call of a timed part, so the parts add
up to what each costs alone, pipelining lost). Defaults: the default market run, 1 fold of 1500
gradient steps. Prints a table; ``--out`` adds a JSON record (machine, date, commit).
"""

from __future__ import annotations

import argparse
import cProfile
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import benchmark_parser, cprofile_top, provenance, save_record

PARTS = {
    "collect": ("trimtab.rl.run.collect", "Collector", "step"),
    "sample": ("trimtab.rl.agent.replay", "ReplayBuffer", "sample"),
    "learn": ("trimtab.rl.agent.learner", "Learner", "learn"),
    "poll": ("trimtab.rl.agent.learner", "Learner", "poll"),
    "halt_read": ("trimtab.rl.agent.learner", "Learner", "halt_message"),
    "log_row": ("trimtab.rl.run.runner", None, "_log_row"),
    "checkpoint": ("trimtab.rl.run.runner", None, "save_checkpoint"),
    "evaluate": ("trimtab.rl.envs.adapters", "MarketAdapter", "evaluate"),
    "evaluate_gym": ("trimtab.rl.envs.adapters", "TorchCartPoleAdapter", "evaluate"),
}


def _timed(fn: Callable, name: str, acc: Counter, calls: Counter, sync: Callable) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return fn(*args, **kwargs)  # recorded into a graph (sample inside the learn step)
        sync()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        sync()
        acc[name] += time.perf_counter() - t0
        calls[name] += 1
        return out

    return wrapper


def _config(args: argparse.Namespace, out: Path) -> Any:
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict, load_toml

    data = load_toml(args.config) if args.config else {}
    sets = [f'run.device="{args.device}"', "run.progress=false", f'run.out="{out}"',
            *(["walkforward.folds=1", "walkforward.steps_per_fold=1500"] if not args.config
              else []), *args.sets]  # fmt: skip
    return from_dict(TrainConfig, apply_overrides(data, sets))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import importlib

    from trimtab.rl.run.runner import train

    p = benchmark_parser(__doc__, None, device="auto", key=True, out_help="JSON to add a record to")
    p.add_argument("--config", type=Path, default=None, help="default: the default market run")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="run the plain run under cProfile and record its top N functions",
    )
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with tempfile.TemporaryDirectory(prefix="profile-loop-") as tmp:
        prof = cProfile.Profile() if args.cprofile else None
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        plain = train(_config(args, Path(tmp) / "plain"))
        if prof is not None:
            prof.disable()
        plain_wall = time.perf_counter() - t0
        print(f"plain: wall {plain_wall:.1f} s, train {plain['seconds']:.1f} s", flush=True)
        top = cprofile_top(prof, args.cprofile) if prof is not None else None
        for row in top["tottime"][:30] if top else []:  # host time by function (cProfile)
            print(f"  {row['tottime']:7.2f} s own {row['cumtime']:7.2f} s cum "
                  f"{row['calls']:8d}  {row['function']}", flush=True)  # fmt: skip
        acc: Counter = Counter()
        calls: Counter = Counter()
        captured: dict[str, int] = {}
        originals = []
        for name, (module, cls, attr) in PARTS.items():
            owner = importlib.import_module(module)
            owner = getattr(owner, cls) if cls else owner
            originals.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, _timed(getattr(owner, attr), name, acc, calls, sync))

        def setup(learner: Any) -> None:
            captured["learner"] = learner

        try:
            t0 = time.perf_counter()
            timed = train(_config(args, Path(tmp) / "timed"), setup=setup)
            timed_wall = time.perf_counter() - t0
        finally:
            for owner, attr, fn in originals:
                setattr(owner, attr, fn)
    graph = getattr(captured.get("learner"), "graph", None)
    rows = {name: {"s": acc[name], "calls": calls[name],
                   "us_per_call": 1e6 * acc[name] / calls[name]}
            for name in PARTS if calls[name]}  # fmt: skip
    command = ["benchmarks/experiments/profile_loop.py", *(sys.argv[1:] if argv is None else argv)]
    record = {**provenance(args.device), "command": " ".join(command), "plain_wall_s": plain_wall,
              "plain_train_s": plain["seconds"], "timed_wall_s": timed_wall,
              "timed_train_s": timed["seconds"], "updates": timed["updates"],
              "env_steps": timed["env_steps"], "parts": rows,
              "learn_captures": getattr(graph, "captures", None)}  # fmt: skip
    if top is not None:
        record["cprofile"] = top
    print(f"plain: wall {plain_wall:.1f} s, train {plain['seconds']:.1f} s; timed: wall "
          f"{timed_wall:.1f} s, {timed['updates']} updates, {timed['env_steps']} env steps; "
          f"learn step captures: {record['learn_captures']}")  # fmt: skip
    for name, r in rows.items():
        print(f"  {name:12} {r['s']:7.2f} s  {r['calls']:6d} calls  {r['us_per_call']:9.0f} us")
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
