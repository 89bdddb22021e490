"""On a CUDA device: every graph the trainer captures (a learn step, a collection) is captured on
a stream of its own, never on ``torch.cuda.graph``'s one default capture stream. cuBLAS's
workspace is chosen per stream and a graph keeps the workspace of the stream it was captured
on: graphs captured on one stream share it, and replayed at once on different streams (a
population's members) their matrix products would write it together."""

from __future__ import annotations

import pytest
import torch

from trimtab.rl.agent.graphed import CapturedStep, OwnStream

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _matmul_step(a: torch.Tensor, out: torch.Tensor):
    def step(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out.copy_(batch["x"] @ a)  # a long inner dimension: cuBLAS may split it (a workspace)
        return {"out": out}

    return step


def test_each_captured_step_is_captured_on_its_own_stream(monkeypatch):
    seen: list[torch.cuda.Stream | None] = []
    real = torch.cuda.graph

    def spy(graph, *args, **kwargs):
        seen.append(kwargs.get("stream"))
        return real(graph, *args, **kwargs)

    monkeypatch.setattr(torch.cuda, "graph", spy)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(8192, 64, device="cuda", generator=gen)
    steps = [
        CapturedStep(_matmul_step(a, torch.empty(64, 64, device="cuda")), [], lambda: (), 1)
        for _ in range(2)
    ]
    x = torch.randn(64, 8192, device="cuda", generator=gen)
    for s in steps:
        for _ in range(3):  # a warm-up, the capture and a replay
            s({"x": x})
    assert len(seen) == 2 and all(st is not None for st in seen)
    assert seen[0] is steps[0].side_stream() and seen[1] is steps[1].side_stream()
    assert seen[0] != seen[1]
    # (identity: a torch Stream compared with None is False both ways, == and !=)
    assert all(st is not real.default_capture_stream for st in seen)


def test_each_own_stream_is_a_stream_no_other_object_holds():
    # torch.cuda.Stream() hands out a pool of 32 streams per priority, round robin
    owns = [OwnStream() for _ in range(40)]
    handles = [o.stream.cuda_stream for o in owns]
    pool = {torch.cuda.Stream().cuda_stream for _ in range(64)}
    assert len(set(handles)) == 40 and not set(handles) & pool
    assert all(o.stream is o.stream for o in owns)  # made once


def _replay_all(steps, streams, x, want, rounds):
    """The steps' replays queued at once, each on its stream (a population's turns), ``rounds``
    times; the worst error against the eager products ``want``."""
    worst = 0.0
    for _ in range(rounds):
        for s, st, xi in zip(steps, streams, x):
            with torch.cuda.stream(st):
                s({"x": xi})
        torch.cuda.synchronize()
        worst = max(worst, *((s.out["out"] - w).abs().max().item() for s, w in zip(steps, want)))
    return worst


@pytest.mark.parametrize("n", [2, 40])  # 40: more graphs than torch's pool has streams
def test_graphs_replayed_at_once_on_their_streams_give_the_eager_products(n):
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = [torch.randn(8192, 64, device="cuda", generator=gen) for _ in range(n)]
    x = [torch.randn(64, 8192, device="cuda", generator=gen) for _ in range(n)]
    want = [xi @ ai for xi, ai in zip(x, a)]
    tol = 1e-3 * max(w.abs().max().item() for w in want)
    outs = [torch.empty(64, 64, device="cuda") for _ in range(n)]
    steps = [CapturedStep(_matmul_step(ai, o), [], lambda: (), 1) for ai, o in zip(a, outs)]
    streams = [torch.cuda.Stream() for _ in range(n)]  # the members' streams (a pool's)
    for s, st, xi in zip(steps, streams, x):
        with torch.cuda.stream(st):
            s({"x": xi})  # the warm-up
            s({"x": xi})  # the capture and its first replay
    torch.cuda.synchronize()
    assert _replay_all(steps, streams, x, want, 100) <= tol
    # destroying graphs (an evaluation's, a finished member's) leaves the others' workspaces:
    # their memory handed back and taken by other tensors, the kept graphs still multiply
    del steps[1::2], streams[1::2], x[1::2], want[1::2]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    filler = torch.full((1 << 26,), 7.0, device="cuda")
    assert _replay_all(steps, streams, x, want, 20) <= tol
    del filler
