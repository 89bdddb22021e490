"""Shapes of the adaptive step's single-program kernels: the captured step's GPU time per setting.

    python benchmarks/experiments/probe_warps.py [--replays 200] [--rounds 5] \\
        [--settings NAME ...] [--out PATH]

The clip's step (``kernels.clip.CLIP_WARPS``: one program sorting the window of clipped norms),
the small tensors' quantile (``kernels.quantile.SMALL_WARPS``: one program per tensor, for
tensors up to ``SMALL_MAX`` elements) and the optimizer's finalize
(``kernels.optim_finalize.FINALIZE_WARPS``) each run as few programs, so their time is
latency, and the warps per program set how much of it overlaps; ``TOP_MAX`` 0 makes the clip
sort its window, ``SMALL_MAX`` 0 sends every quantile through the multi-program passes. For
each setting the adaptive learner of the default config is built and captured as
``bench_trainer.py`` does, its graph replayed back to back (``bench_trainer.replay_ms``),
and ``off`` once for the ratio.
Settings are measured in rounds (every setting once per round, the median per setting), so a
drift of the machine's clocks falls on all of them. Needs CUDA.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks
import bench_trainer
from trimtab.benchmarking import (
    benchmark_parser,
    invocation,
    markdown_table,
    provenance,
    save_record,
)
from trimtab.kernels import clip, optim_finalize, quantile
from trimtab.rl.config import TrainConfig

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "probe_warps_h200.json"
KNOBS = {"clip": (clip, "CLIP_WARPS"), "small": (quantile, "SMALL_WARPS"),
         "finalize": (optim_finalize, "FINALIZE_WARPS"), "small_max": (quantile, "SMALL_MAX"),
         "top": (clip, "TOP_MAX")}  # fmt: skip
#: The settings probed: the knobs each changes (the rest at their defaults)
SETTINGS: dict[str, dict[str, int]] = {
    "default": {},
    "clip sorts": {"top": 0},  # the clip's window quantile by a sort (before 8f0b8f6)
    "clip 8": {"clip": 8},
    "finalize 16": {"finalize": 16},
    "no small path": {"small_max": 0},  # every quantile by the multi-program radix passes
}


def build(mode: str, setting: dict[str, int]) -> dict[str, Any]:
    defaults = {k: getattr(mod, attr) for k, (mod, attr) in KNOBS.items()}
    for k, v in setting.items():
        mod, attr = KNOBS[k]
        setattr(mod, attr, v)
    try:
        device = torch.device("cuda")
        cfg = bench_trainer.mode_config(TrainConfig(), mode, device, "on")
        return bench_trainer.prepare(cfg, device)
    finally:
        for k, (mod, attr) in KNOBS.items():
            setattr(mod, attr, defaults[k])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, key=True)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                   help="the settings to probe (default: all), each against off")  # fmt: skip
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("probe_warps.py times CUDA graphs: it needs a CUDA device")
    torch.set_num_threads(1)
    learners = {"off": build("off", {})}
    learners.update({name: build("adaptive", SETTINGS[name]) for name in args.settings})
    times: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(args.rounds):
        for name, m in learners.items():
            times[name].append(bench_trainer.replay_ms(m["learner"].sampled_graph.graph,
                                                       args.replays))  # fmt: skip
    rows = {name: {"replay_ms": statistics.median(t), "rounds_ms": [round(x, 4) for x in t]}
            for name, t in times.items()}  # fmt: skip
    off = rows["off"]["replay_ms"]
    for r in rows.values():
        r["over_off"] = r["replay_ms"] / off
    body = [(n, f"{r['replay_ms']:.4f}", f"{r['over_off']:.3f}") for n, r in rows.items()]
    print(markdown_table(["setting", "captured step, ms", "/ off"], body, "lrr"))
    record = {**provenance("cuda"), "replays": args.replays, "rounds": args.rounds,
              "settings": {n: SETTINGS[n] for n in args.settings}, "rows": rows,
              "command": invocation(__file__, argv)}  # fmt: skip
    save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
