"""Where the CPU's gradient step goes, by part of the guarded learn step, per stability mode:
the step that decides how ``trimtab train`` compares with CleanRL's ``c51.py`` over a whole run
(``benchmarks/bench_cleanrl.py``), where acting is cheaper (several envs per forward) and the
learn step dearer.

    python benchmarks/experiments/profile_cpu_step.py [--config examples/cartpole.toml]
        [--modes off adaptive] [--steps 80] [--rounds 7] [--quick] [--out FILE --key NAME]

One thread. Each mode's learner is built from the config as a run builds it, its replay filled
with the config's env stepped under random actions, then warmed up. The modes' steps are timed
interleaved (``--rounds`` rounds of ``--steps`` steps of each mode in turn; the median round, in
this thread's CPU time, which other jobs on a shared machine inflate least). Then each part of
:meth:`trimtab.rl.agent.learner.Learner.guarded_step` is timed alone over the same number of
steps (``time.perf_counter`` around each call: on the CPU nothing runs asynchronously, so the
parts add up to the step), with the aten operations the step dispatches counted as
``probe_cartpole_ops.py`` counts them (views left out). Prints a table; ``--out`` adds a JSON
record (machine, date, commit).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the experiments
from probe_cartpole_ops import OpCount  # one definition of what counts as an op

from trimtab.benchmarking import benchmark_parser, provenance, save_record

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "cartpole.toml"
FILL = 2000  # transitions in the replay before timing (random actions)
#: the step's parts: (label, owner attribute path on the learner, method)
PARTS = [
    ("sentinel: batch", "stability.checks", "batch"),
    ("forward (predict)", "agent", "predict"),
    ("Bellman targets", "agent", "bellman_targets"),
    ("bound targets", "stability", "bound_targets"),
    ("loss", "agent", "loss"),
    ("sentinel: forward", "guard", "check_loss"),
    ("backward", "guard", "backward"),
    ("sentinel: gradients", "guard", "check_gradients"),
    ("found_inf", "guard", "decide"),
    ("gradient clip", "guard", "clip_gradients"),
    ("optimizer step", "guard", "optimizer_step"),
    ("bounds' fold", "guard", "fold"),
    ("sentinel: optimizer", "guard", "check_weights"),
    ("replay sample", "replay", "sample"),
]


def _config(path: Path, mode: str, sets: list[str]) -> Any:
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict, load_toml

    data = apply_overrides(load_toml(path), [*sets, f'run.stability="{mode}"', 'run.device="cpu"',
                                             'run.cuda_graph="off"', "run.threads=1"])  # fmt: skip
    return from_dict(TrainConfig, data)


def build(cfg: Any, fill: int) -> dict[str, Any]:
    """A learner of ``cfg`` on the CPU, its replay filled with ``fill`` env transitions."""
    from trimtab.lifecycle import Lifecycle
    from trimtab.rl.agent.learner import build_learner
    from trimtab.rl.envs.registry import make_adapter

    device = torch.device("cpu")
    adapter = make_adapter(cfg, device)
    with Lifecycle():
        learner = build_learner(cfg, adapter.obs_dim, adapter.branch_sizes, device)
    replay = learner.agent.make_replay(adapter.reward_parts)
    gen = torch.Generator().manual_seed(0)
    obs = adapter.open_fold(0, cfg.run.seed)
    sizes = torch.tensor(adapter.branch_sizes)
    for _ in range(-(-fill // adapter.n_envs)):
        action = (torch.rand(adapter.n_envs, len(sizes), generator=gen) * sizes).long()
        step = adapter.step(action)
        replay.add(obs, action, step.reward, step.final_obs, step.terminated, step.truncated)
        obs = step.obs
    adapter.close()
    return {"cfg": cfg, "learner": learner, "replay": replay, "gen": gen, "cpu_ms": []}


def _steps(m: dict[str, Any], n: int) -> None:
    learner, replay, gen = m["learner"], m["replay"], m["gen"]
    for _ in range(n):
        learner.learn_from(replay, gen, m["cfg"].agent.batch_size)


def _wrap(fn: Callable[..., Any], label: str, acc: Counter) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        acc[label] += time.perf_counter() - t0
        return out

    return timed


def parts(m: dict[str, Any], n: int) -> dict[str, float]:
    """Milliseconds per step of each part, over ``n`` steps (then the methods are restored)."""
    acc: Counter = Counter()
    learner = m["learner"]
    owners = {"replay": m["replay"]}
    undo = []
    for label, path, attr in PARTS:
        owner = owners.get(path)
        if owner is None:
            owner = learner
            for name in path.split("."):
                owner = getattr(owner, name)
        # an attribute of the instance (a slot, a field) is put back; a method, deleted again
        own = attr in getattr(owner, "__dict__", {}) or not hasattr(owner, "__dict__")
        undo.append((owner, attr, getattr(owner, attr) if own else None))
        object.__setattr__(owner, attr, _wrap(getattr(owner, attr), label, acc))
    try:
        t0 = time.perf_counter()
        _steps(m, n)
        total = time.perf_counter() - t0
    finally:
        for owner, attr, before in undo:
            if before is None:
                object.__delattr__(owner, attr)
            else:
                object.__setattr__(owner, attr, before)
    rows = {label: 1e3 * acc[label] / n for label, _, _ in PARTS}
    rows["the rest"] = 1e3 * total / n - sum(rows.values())
    rows["step"] = 1e3 * total / n
    return rows


def ops_per_step(m: dict[str, Any], n: int) -> float:
    with OpCount() as ops:
        _steps(m, n)
    return sum(ops.counts.values()) / n


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, None, quick="a few steps (the test)", key=True,
                         out_help="a JSON file of records")  # fmt: skip
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--modes", nargs="+", default=["off", "adaptive"],
                   choices=["off", "fixed", "adaptive"])  # fmt: skip
    p.add_argument("--steps", type=int, default=80, help="steps per mode and round")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (the median)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    steps, rounds, fill, warm = (args.steps, args.rounds, FILL, 50)
    if args.quick:
        steps, rounds, fill, warm = 4, 1, 300, 2
    torch.set_num_threads(1)
    sets = [*args.sets, *(["agent.batch_size=16"] if args.quick else [])]
    modes = {mode: build(_config(args.config, mode, sets), fill) for mode in args.modes}
    for m in modes.values():
        _steps(m, warm)
    for _ in range(rounds):
        for m in modes.values():
            c0 = time.thread_time()
            _steps(m, steps)
            m["cpu_ms"].append(1e3 * (time.thread_time() - c0) / steps)
    config = args.config.resolve()
    shown = config.relative_to(ROOT) if config.is_relative_to(ROOT) else config
    record: dict[str, Any] = {**provenance("cpu"), "config": shown.as_posix(), "sets": sets,
                              "steps": steps, "rounds": rounds, "modes": {}}  # fmt: skip
    for mode, m in modes.items():
        row = {"step_cpu_ms": statistics.median(m["cpu_ms"]),
               "round_cpu_ms": [round(x, 3) for x in m["cpu_ms"]],
               "parts_ms": parts(m, steps * rounds),
               "aten_ops_per_step": ops_per_step(m, steps)}  # fmt: skip
        record["modes"][mode] = row
        print(f"{mode}: {row['step_cpu_ms']:.3f} ms a step (CPU time, median of {rounds}), "
              f"{row['aten_ops_per_step']:.0f} aten ops", flush=True)  # fmt: skip
        for label, ms in sorted(row["parts_ms"].items(), key=lambda kv: -kv[1]):
            print(f"  {ms:7.3f} ms  {label}", flush=True)
    # one table a reader scans: a row per part, a column per mode (ms a step)
    rows = record["modes"]
    last = rows[args.modes[-1]]["parts_ms"]
    record["parts"] = [
        {"part": "step, CPU time (median round)",
         **{f"{m}_ms": round(r["step_cpu_ms"], 3) for m, r in rows.items()}},
        {"part": "aten ops a step", **{f"{m}_ms": r["aten_ops_per_step"] for m, r in rows.items()}},
        *({"part": label, **{f"{m}_ms": round(r["parts_ms"][label], 3) for m, r in rows.items()}}
          for label in sorted(last, key=lambda k: -last[k])),
    ]  # fmt: skip
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
