"""One rank of tests/rl/run/test_ddp.py, launched by torchrun with 2 processes on gloo:
``python -m torch.distributed.run --nproc-per-node 2 _ddp_worker.py OUT``.

B. a 2-rank run of the tiny market with a NaN written into rank 1's Bellman targets at learn
step ``NAN_STEP`` (both ranks must halt with one report naming rank 1); its mid-fold checkpoint
and sentinel report are kept aside; C. run B resumed by both ranks, to its end. Each rank
writes what it saw to ``OUT/rank{RANK}.json``."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rl_helpers
from rl_helpers import tiny

from trimtab.rl.run.ddp import Ranks
from trimtab.rl.train import TrainingHalted, train

NAN_RANK, NAN_STEP, STEPS = 1, 9, 16


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    ranks = Ranks.init("cpu")
    seen: dict = {"rank": ranks.rank}

    built = []

    def inject(learner):  # rank 1's targets get a NaN at its learn step NAN_STEP
        built.append(learner)
        if ranks.rank == NAN_RANK:
            learner.stability.checks.fault = ("targets", NAN_STEP, math.nan)

    cfg_b = tiny(out / "b", steps_per_fold=STEPS, checkpoint_every=4)
    try:
        train(ranks.config(cfg_b), ranks=ranks, setup=inject)
        seen["b"] = None
    except TrainingHalted as e:
        seen["b"] = str(e)
    seen["b_report"] = [f.to_dict() for f in built[0].stability.sentinel.report()]
    ranks.barrier()
    if ranks.is_main:
        shutil.copy(out / "b" / "checkpoints" / "last.pt", out / "midfold.pt")
        shutil.copy(out / "b" / "sentinel.json", out / "b_sentinel.json")
    ranks.barrier()
    summary = train(ranks.config(cfg_b), ranks=ranks, resume=True)
    seen["c"] = {"updates": summary["updates"], "halted": summary["halted"],
                 "world_size": summary.get("world_size")}  # fmt: skip
    (out / f"rank{ranks.rank}.json").write_text(json.dumps(seen))
    ranks.close()


if __name__ == "__main__":
    main()
