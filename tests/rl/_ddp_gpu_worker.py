"""One rank of tests/rl/test_ddp_gpu.py, launched by torchrun on a CUDA machine:
``python -m torch.distributed.run --nproc-per-node N _ddp_gpu_worker.py MODE OUT``.

Backend: NCCL when every rank of the node has a GPU of its own, else gloo (ranks sharing a GPU;
NCCL refuses two ranks on one device). ``nan``: the tiny market with a NaN written into rank 1's
Bellman targets at learn step ``NAN_STEP``; ``sync``: the tiny market with every learn step
after the first ``WARMUP`` under ``torch.cuda.set_sync_debug_mode("error")``, in pairs issued
behind a device sleep, timing the host (a step that waits on the device, as on a CUDA event
that ``set_sync_debug_mode`` does not see, takes at least the sleep). Each rank writes
what it saw to ``OUT/rank{RANK}.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from rl_helpers import tiny

from trimtab.rl.ddp import Ranks
from trimtab.rl.train import TrainingHalted, train

NAN_RANK, NAN_STEP, STEPS = 1, 9, 16
#: the sync run: learn steps, and the first one checked (DDP's runtime statistics wait on CUDA
#: events on its iterations 1-10 whatever their cadence; past 100 its default cadence recurs)
SYNC_STEPS, WARMUP = 120, 12
SLEEP_CYCLES = 120_000_000  # torch.cuda._sleep: about 60 ms on an H200 (1.98 GHz)


def backend() -> str:
    here = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    return "nccl" if torch.cuda.device_count() >= here else "gloo"


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    ranks = Ranks.init("cuda", backend())
    seen: dict = {"rank": ranks.rank, "backend": ranks.backend, "device": str(ranks.device)}
    built = []

    def inject(learner):  # rank 1's targets get a NaN at its learn step NAN_STEP
        built.append(learner)
        if ranks.rank == NAN_RANK:
            learner.stability.checks.fault = ("targets", NAN_STEP, math.nan)

    def guard(learner):  # each learn step after the warm-up: no host sync, no host wait
        built.append(learner)
        learn_from = learner.learn_from
        seen["checked"], seen["pairs"], pending = [], [], []

        def strict(*args, **kwargs):
            n = learner.agent.num_updates
            if n < WARMUP:
                return learn_from(*args, **kwargs)
            if n % 2 == 0:  # a pair of steps behind a device sleep: the host must run ahead
                torch.cuda.synchronize()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(SLEEP_CYCLES)
                end.record()
                pending[:] = [start, end]
            torch.cuda.set_sync_debug_mode("error")
            t0 = time.perf_counter()
            try:
                info = learn_from(*args, **kwargs)
            finally:
                pending.append((time.perf_counter() - t0) * 1e3)
                torch.cuda.set_sync_debug_mode("default")
            seen["checked"].append(n + 1)
            if n % 2 == 1:  # (sleep ms, host ms of the first step, of the second)
                start, end, first, second = pending
                end.synchronize()
                seen["pairs"].append((start.elapsed_time(end), first, second))
            return info

        learner.learn_from = strict

    mode_steps = STEPS if mode == "nan" else SYNC_STEPS
    cfg = ranks.config(tiny(out / mode, steps_per_fold=mode_steps, device="cuda"))
    try:
        summary = train(cfg, ranks=ranks, setup=inject if mode == "nan" else guard)
        seen["halted"], seen["updates"] = None, summary["updates"]
    except TrainingHalted as e:
        seen["halted"] = str(e)
    seen["report"] = [f.to_dict() for f in built[0].stability.sentinel.report()]
    (out / f"rank{ranks.rank}.json").write_text(json.dumps(seen))
    ranks.close()


if __name__ == "__main__":
    main()
