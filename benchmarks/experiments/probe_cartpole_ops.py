"""Where the CPU CartPole loop's device ops come from, per stability mode: aten ops per act, per
learn step that does not measure and per one that does (``run.measure_every``), by trimtab file.

    python benchmarks/experiments/probe_cartpole_ops.py [--out PATH] [--key NAME]

The workload is ``examples/cartpole.toml`` on the CPU, one thread, on a replay of random
transitions (the op count does not depend on the data). On a CPU step of this size an op costs
microseconds of dispatch whatever it computes, so the count is what the mode costs, and unlike a
time it does not move with other jobs on the machine: ``bench_cleanrl.py`` times the same loop
against CleanRL, this says where adaptive's share of it goes. TorchScript's ops (the estimator's
folds) are counted one by one, under ``_script.py``.
"""

from __future__ import annotations

import collections
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, save_record
from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.learner import build_learner
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import apply_overrides, from_dict, load_toml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cartpole.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "probe_cartpole_ops.json"
_VIEWS = {"detach", "view", "unsqueeze", "squeeze", "select", "reshape", "t", "expand", "slice",
          "_unsafe_view", "as_strided", "alias", "permute", "transpose", "split", "unbind",
          "_reshape_alias", "lift_fresh", "_record_function_enter_new",
          "_record_function_exit"}  # fmt: skip


class OpCount(TorchDispatchMode):
    """Counts non-view aten ops by the innermost trimtab file that issued them."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] not in _VIEWS:
            frames = [f for f in traceback.extract_stack() if "/trimtab/" in f.filename]
            self.counts[frames[-1].filename.split("trimtab/")[-1] if frames else "other"] += 1
        return func(*args, **(kwargs or {}))


def _learner(mode: str) -> tuple[Any, Any]:
    data = apply_overrides(load_toml(EXAMPLE), ["run.threads=1", 'run.device="cpu"',
                                                f'run.stability="{mode}"'])  # fmt: skip
    cfg = from_dict(TrainConfig, data)
    with Lifecycle():
        learner = build_learner(cfg, 4, [2], torch.device("cpu"))
    replay = learner.agent.make_replay()
    g = torch.Generator().manual_seed(0)
    for _ in range(cfg.agent.batch_size):
        obs = torch.randn(4, 4, generator=g)
        replay.add(obs, torch.randint(0, 2, (4, 1), generator=g), torch.ones(4), obs + 0.01,
                   torch.rand(4, generator=g) < 0.05, torch.zeros(4, dtype=torch.bool))  # fmt: skip
    return learner, replay


def count_mode(mode: str) -> dict[str, Any]:
    """Ops of one act, of the learn steps of one cadence period (the first measures), and of
    ``off``'s steps (no cadence: every step alike), by file."""
    learner, replay = _learner(mode)
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(4, 4)
    batch = learner.agent.config.batch_size

    def learn() -> None:
        learner.learn_from(replay, gen, batch)

    bounds = learner.guard.bounds
    every = bounds.cadence.every if bounds is not None else 1
    for _ in range(2 * every):  # warm, and end on a period's boundary
        learn()
    learner.agent.act(obs, 100)
    steps = []
    for _ in range(every):
        with OpCount() as c:
            learn()
        steps.append(c.counts)
    with OpCount() as acts:
        for i in range(4):
            learner.agent.act(obs, 100 + i)
    total = sum(steps, collections.Counter())
    first = sum(steps[0].values())
    return {
        "measure_every": every,
        "ops_per_act": sum(acts.counts.values()) / 4,
        "ops_measuring_step": first,
        "ops_other_step": (sum(total.values()) - first) / (every - 1) if every > 1 else first,
        "ops_per_step": sum(total.values()) / every,
        "per_step_by_file": {k: v / every for k, v in total.most_common()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, key=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    modes = {m: count_mode(m) for m in ("off", "adaptive")}
    rows = [(m, r["ops_per_act"], r["ops_other_step"], r["ops_measuring_step"], r["ops_per_step"])
            for m, r in modes.items()]  # fmt: skip
    heads = ["stability", "ops/act", "ops/step (not measuring)", "ops/step (measuring)",
             "ops/step (mean)"]  # fmt: skip
    print(markdown_table(heads, rows, "lrrrr"))
    print("\nadaptive, mean ops per learn step by file:")
    for k, v in list(modes["adaptive"]["per_step_by_file"].items())[:15]:
        print(f"{v:8.1f}  {k}")
    command = " ".join(["benchmarks/experiments/probe_cartpole_ops.py",
                        *(sys.argv[1:] if argv is None else argv)])  # fmt: skip
    record = {**provenance("cpu"), "command": command, "modes": modes}
    save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
