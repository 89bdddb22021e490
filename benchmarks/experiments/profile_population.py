"""Where a population's host time goes: ``trimtab train --seeds ... --population`` run in this
process, its members' turns counted, a window of its training loop profiled with cProfile and
an equal window after it timed without the profiler.

    python benchmarks/experiments/profile_population.py --device cuda \\
        [--config examples/cartpole_fast.toml] [--seeds 1 2 ... 32] [--skip 400] [--steps 200] \\
        [--top 40] [--set KEY=VALUE ...] [--out FILE --key NAME]

A turn is one member's batched env step and its gradient steps
(:func:`trimtab.rl.run.population.interleave` steps the members in turn). After ``--skip``
rounds of turns (every member past its warm-ups and captures, and past
``gym.learning_starts``), ``--steps`` rounds run under cProfile (host time by function: its own
overhead inflates Python's share), then ``--steps`` rounds are timed alone; a device
synchronize opens and closes each window. The record gives the host microseconds a turn in
both windows and the top functions by own and by cumulative time. Runs on the CPU too (``--quick``:
two members of a few steps).
"""

from __future__ import annotations

import cProfile
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import (
    benchmark_parser,
    cprofile_top,
    invocation,
    provenance,
    save_record,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "cartpole_fast.toml"
QUICK = ["gym.total_steps=512", "gym.learning_starts=64", "gym.eval_episodes=2",
         "env.n_envs=4", "gym.train_every=4", "agent.batch_size=16"]  # fmt: skip


class Windows:
    """Counts turns and opens the profiled window, then the timed one, at their turns."""

    def __init__(self, members: int, skip: int, steps: int, device: str) -> None:
        self.bounds = [skip * members, (skip + steps) * members, (skip + 2 * steps) * members]
        self.turns, self.marks = 0, [0.0, 0.0, 0.0]
        self.prof = cProfile.Profile()
        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def wrap(self, turn: Any) -> Any:
        def counted(*args: Any) -> Any:  # (population._turn's arguments)
            self._mark()
            try:
                return turn(*args)
            finally:
                self.turns += 1
                if self.turns == self.bounds[-1]:
                    self._mark()

        return counted

    def _mark(self) -> None:
        if self.turns not in self.bounds:
            return
        k = self.bounds.index(self.turns)
        if k == 1:
            self.prof.disable()
        self.sync()
        self.marks[k] = time.perf_counter()
        if k == 0:
            self.prof.enable()

    def done(self) -> bool:
        return self.turns >= self.bounds[-1]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from trimtab import cli
    from trimtab.rl.run import population

    p = benchmark_parser(__doc__, None, device="auto", key=True, quick="two members, few steps")
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--seeds", nargs="+", type=int, default=list(range(1, 33)))
    p.add_argument("--skip", type=int, default=400, help="rounds of turns before the windows")
    p.add_argument("--steps", type=int, default=200, help="rounds of turns in each window")
    p.add_argument("--top", type=int, default=40, help="functions recorded per ordering")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    seeds, skip, steps = ([1, 2], 20, 20) if args.quick else (args.seeds, args.skip, args.steps)
    sets = [*args.sets, *(QUICK if args.quick else [])]
    windows = Windows(len(seeds), skip, steps, args.device)
    turn = population._turn
    population._turn = windows.wrap(turn)  # interleave looks it up at each turn
    try:
        with tempfile.TemporaryDirectory(prefix="profile-population-") as tmp:
            cmd = ["train", "--config", str(args.config), "--device", args.device,
                   "--no-progress", "--population", "--out", f"{tmp}/runs",
                   "--seeds", *map(str, seeds)]  # fmt: skip
            for s in sets:
                cmd += ["--set", s]
            rc = cli.main(cmd)
    finally:
        population._turn = turn
    if rc != 0 or not windows.done():
        raise SystemExit(
            f"the population ended (exit {rc}) after {windows.turns} turns, before the windows "
            f"closed at {windows.bounds[-1]}: lower --skip/--steps or lengthen the run"
        )
    t0, t1, t2 = windows.marks
    turns = steps * len(seeds)
    result = {
        "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT)
                      else args.config),
        "sets": sets, "members": len(seeds), "skip": skip, "steps": steps,
        "profiled_us_per_turn": 1e6 * (t1 - t0) / turns,
        "us_per_turn": 1e6 * (t2 - t1) / turns,
        "cprofile": cprofile_top(windows.prof, args.top),
    }  # fmt: skip
    us, profiled = result["us_per_turn"], result["profiled_us_per_turn"]
    print(f"{len(seeds)} members: {us:.0f} µs a turn ({profiled:.0f} under cProfile); own time:")
    for row in result["cprofile"]["tottime"][:25]:
        print(f"  {row['tottime']:7.3f} s own {row['cumtime']:7.3f} s cum "
              f"{row['calls']:8d}  {row['function']}")  # fmt: skip
    if args.out:
        record = {**provenance(args.device), "command": invocation(__file__, argv), **result}
        save_record(args.out, args.key, record)
    return result


if __name__ == "__main__":
    main()
