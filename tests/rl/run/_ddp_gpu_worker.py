"""One rank of tests/rl/run/test_ddp_gpu.py, launched by torchrun on a CUDA machine:
``python -m torch.distributed.run --nproc-per-node N _ddp_gpu_worker.py MODE OUT``.

Backend: NCCL when every rank of the node has a GPU of its own, else gloo (ranks sharing a GPU;
NCCL refuses two ranks on one device). ``nan``: the tiny market with a NaN written into rank 1's
Bellman targets at learn step ``NAN_STEP``; ``sync``: the tiny market with every learn step
after the first ``WARMUP`` under ``torch.cuda.set_sync_debug_mode("error")``, its host syncs
counted through torch's GPU trace, every other one issued behind a device sleep on an idle
device and timed on the host (a step that waits for the device takes at least the sleep).
Each rank writes what it saw to ``OUT/rank{RANK}.json``.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rl_helpers
from rl_helpers import tiny

from trimtab.rl.run.ddp import Ranks
from trimtab.rl.train import TrainingHalted, train

NAN_RANK, NAN_STEP, STEPS = 1, 9, 16
#: the sync run: learn steps, and the first one checked (DDP's runtime statistics wait on CUDA
#: events on its iterations 1-10 whatever their cadence; past 100 its default cadence recurs)
SYNC_STEPS, WARMUP = 120, 12
#: torch.cuda._sleep: about 120 ms on an H200 (1.98 GHz); an eager step's launches take the
#: host about 20 ms (more with the GPU trace's callbacks)
SLEEP_CYCLES = 240_000_000


def count_syncs(counts: dict[str, int]) -> None:
    """Count host synchronisations into ``counts`` through torch's GPU trace (the CUDA
    sanitizer's hooks), which sees ``CUDAEvent.synchronize`` (DDP's statistics wait so) as well
    as stream and device synchronisations; ``set_sync_debug_mode`` sees the last two only."""
    from torch.cuda import _gpu_trace

    torch._C._activate_gpu_trace()

    def bump(kind: str):
        return lambda *_: counts.__setitem__(kind, counts[kind] + 1)

    _gpu_trace.register_callback_for_event_synchronization(bump("event"))
    _gpu_trace.register_callback_for_stream_synchronization(bump("stream"))
    _gpu_trace.register_callback_for_device_synchronization(bump("device"))


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
        seen["checked"], seen["first_ms"], seen["sleep_ms"] = [], [], []
        syncs = dict.fromkeys(("event", "stream", "device"), 0)
        seen["syncs"] = syncs

        def strict(*args, **kwargs):
            n = learner.agent.num_updates
            if n < WARMUP:
                return learn_from(*args, **kwargs)
            if n == WARMUP:
                count_syncs(syncs)
            first = n % 2 == 0
            if first:  # behind a device sleep on an idle device: the host must run ahead
                torch.cuda.synchronize()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(SLEEP_CYCLES)
                end.record()
            before = dict(syncs)
            torch.cuda.set_sync_debug_mode("error")
            t0 = time.perf_counter()
            try:
                info = learn_from(*args, **kwargs)
            finally:
                host_ms = (time.perf_counter() - t0) * 1e3
                torch.cuda.set_sync_debug_mode("default")
            seen["checked"].append(n + 1)
            seen["in_steps"] = {k: seen.get("in_steps", {}).get(k, 0) + syncs[k] - before[k]
                                for k in syncs}  # fmt: skip
            if first:
                end.synchronize()
                seen["first_ms"].append(host_ms)
                seen["sleep_ms"].append(start.elapsed_time(end))
            if n + 1 == SYNC_STEPS:  # a control: the count sees one of each kind it counts
                before = dict(syncs)
                event = torch.cuda.Event()
                event.record()
                event.synchronize()
                torch.cuda.current_stream().synchronize()
                seen["control"] = {k: syncs[k] - before[k] for k in syncs}
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
