"""Probe: can the guarded learn step be captured whole in a CUDA graph, per stability mode?
Captures one ``Learner.learn`` on static batch buffers after a warm-up on a side stream, replays
it, and compares the replayed losses with eager steps from the same state; prints and writes
what happened (success, or the first error) for each mode.

    python benchmarks/experiments/probe_capture.py [--out PATH]
"""

from __future__ import annotations

import traceback
from dataclasses import replace
from pathlib import Path

import torch

from trimtab.benchmarking import benchmark_parser, provenance, write_json
from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.learner import build_learner
from trimtab.rl.config import TrainConfig

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "capture_probe_h200.json"


def probe(mode: str, steps: int = 5) -> dict:
    cfg = TrainConfig()
    # cuda_graph off: this probe captures the eager step itself (the trainer's own capture is
    # trimtab.rl.agent.graphed, tested in tests/rl/test_learner_gpu.py)
    cfg = replace(cfg, run=replace(cfg.run, stability=mode, device="cuda", cuda_graph="off"))
    dev = torch.device("cuda")
    with Lifecycle():
        learner = build_learner(cfg, 32, [3, 3, 3, 3], dev)
    g = torch.Generator(device=dev).manual_seed(0)
    n = cfg.agent.batch_size

    def batch() -> dict[str, torch.Tensor]:
        return {"obs": torch.randn(n, 32, device=dev, generator=g),
                "action": torch.randint(0, 3, (n, 4), device=dev, generator=g),
                "reward": 0.01 * torch.randn(n, device=dev, generator=g),
                "next_obs": torch.randn(n, 32, device=dev, generator=g),
                "discount": torch.full((n,), 0.95, device=dev)}  # fmt: skip

    static = batch()
    out: dict = {"mode": mode}
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                learner.learn(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(learner.agent.generator)
        with torch.cuda.graph(graph):
            info = learner.learn(static)
        replayed = []
        for _ in range(steps):
            new = batch()
            for k, v in new.items():
                static[k].copy_(v)
            graph.replay()
            replayed.append(float(info["loss"]))
        out.update(captured=True, replayed_losses=replayed,
                   finite=all(torch.isfinite(torch.tensor(replayed)).tolist()))  # fmt: skip
    except Exception as e:  # a probe: report whatever stops the capture
        out.update(captured=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                   where=[f"{f.filename.split('src/')[-1]}:{f.lineno}"
                          for f in traceback.extract_tb(e.__traceback__)
                          if "trimtab" in f.filename][-3:])  # fmt: skip
    return out


def main() -> None:
    args = benchmark_parser(__doc__, DEFAULT_OUT).parse_args()
    rows = [probe(m) for m in ("off", "fixed", "adaptive")]
    for r in rows:
        print(r)
    write_json(args.out, {**provenance("cuda"), "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
