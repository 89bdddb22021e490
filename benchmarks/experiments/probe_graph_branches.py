"""Whether a GPU gets through more small kernels a second when many independent training steps
are one CUDA graph's parallel branches than when each is a graph of its own, replayed on its own
stream (what a population does, ``trimtab.rl.run.population``).

    python benchmarks/experiments/probe_graph_branches.py [--members 1 3 8 32] [--rounds 300]
        [--threads 2 4 8] [--out FILE --key NAME]

Each member is a small training step of its own: CleanRL's C51 network for CartPole (4-120-84-
2x101, batch 256), a cross-entropy loss on its softmax, backward and ``torch.optim.Adam``
(``capturable=True``), on its own weights, batch and optimizer state: a chain of dependent small
kernels, as a trimtab member's step is (there: 411 kernels a batched env step). Ways, each a row
per member count:

* ``streams``: one graph per member, captured on a stream of its own, the graphs replayed in turn
  on the members' own streams (the population's arrangement);
* ``branches``: one graph holding every member's step as a parallel branch (forked from the
  capture stream onto the members' streams and joined back), replayed once a round;
* ``threadsT``: the per-member graphs of ``streams`` launched by ``T`` host threads at once
  (``--threads``), each its share of the members (whether launches from several threads
  overlap: ``CUDAGraph.replay`` releasing the GIL).

Kernels a step are counted with ``torch.profiler`` over one member's graph; the rate is members x
rounds x kernels over the wall time of the rounds (after a synchronize). First, what one launch
costs the host (``launch_host_us``): a graph of four member steps in a row, launched with the
device idle on the stream it was captured on, on another stream and on the default stream
(median of 200). Needs CUDA.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from trimtab.benchmarking import (
    benchmark_parser,
    invocation,
    kernel_census,
    markdown_table,
    provenance,
    save_record,
)

BATCH, ATOMS = 256, 101


class Member:
    """One member's weights, optimizer, batch and target: a step is forward, loss, backward,
    Adam, all on the current stream."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                 nn.Linear(84, 2 * ATOMS)).cuda()  # fmt: skip
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-4, capturable=True)
        self.x = torch.randn(BATCH, 4, device="cuda", generator=g)
        self.target = torch.softmax(torch.randn(BATCH, ATOMS, device="cuda", generator=g), -1)
        self.action = torch.randint(0, 2, (BATCH,), device="cuda", generator=g)

    def step(self) -> None:
        logits = self.net(self.x).view(BATCH, 2, ATOMS)
        chosen = logits[torch.arange(BATCH, device="cuda"), self.action]
        loss = -(self.target * torch.log_softmax(chosen, -1)).sum(-1).mean()
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        self.opt.step()


def _streams(n: int) -> list[torch.cuda.Stream]:
    from trimtab.rl.agent.graphed import dedicated_stream

    return [dedicated_stream() for _ in range(n)]


def _warm(members: list[Member], streams: list[torch.cuda.Stream]) -> None:
    for m, s in zip(members, streams):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m.step()
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def per_member_graphs(members: list[Member], streams: list[torch.cuda.Stream]) -> Any:
    graphs = []
    for m, s in zip(members, streams):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            m.step()
        graphs.append(g)
    torch.cuda.synchronize()

    def round_() -> None:
        for g, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                g.replay()

    return round_, graphs


def branched_graph(members: list[Member], streams: list[torch.cuda.Stream]) -> Any:
    capture = _streams(1)[0]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        for m, s in zip(members, streams):
            s.wait_stream(capture)
            with torch.cuda.stream(s):
                m.step()
        for s in streams:
            capture.wait_stream(s)
    torch.cuda.synchronize()
    return g.replay, g


def threaded_launches(
    graphs: list[torch.cuda.CUDAGraph], streams: list[torch.cuda.Stream], threads: int
) -> Any:
    """The per-member graphs of :func:`per_member_graphs` replayed by ``threads`` host threads
    at once, each launching its share of the members on their own streams; a round ends when
    every thread has launched its share. Launches overlap only where ``CUDAGraph.replay``
    lets go of Python's GIL while the driver launches."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(threads, thread_name_prefix="launch")
    shares = [list(range(i, len(graphs), threads)) for i in range(threads)]

    def launch(share: list[int]) -> None:
        for j in share:
            with torch.cuda.stream(streams[j]):
                graphs[j].replay()

    def round_() -> None:
        for _ in pool.map(launch, shares):
            pass

    return round_, pool


def kernels_per_replay(replay: Any) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    return int(kernel_census(prof)["kernels"])


def timed(round_: Any, rounds: int) -> float:
    for _ in range(10):
        round_()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(rounds):
        round_()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def launch_costs(chain: int = 4, launches: int = 200) -> dict[str, float]:
    """Host µs of one ``CUDAGraph.replay`` with the device idle (a synchronize before each), for
    a graph of ``chain`` member steps in a row captured on stream A, launched on A itself, on
    another stream B, and on the default stream."""
    member, (a, b) = Member(0), _streams(2)
    _warm([member], [a])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=a):
        for _ in range(chain):
            member.step()
    torch.cuda.synchronize()
    out = {"nodes": float(kernels_per_replay(g.replay))}
    for name, stream in (("capture_stream", a), ("other_stream", b),
                         ("default_stream", torch.cuda.default_stream())):  # fmt: skip
        seconds = []
        with torch.cuda.stream(stream):
            for _ in range(launches):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                g.replay()
                seconds.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        seconds.sort()
        out[f"{name}_us"] = 1e6 * seconds[len(seconds) // 2]  # the median launch
    print(", ".join(f"{k} {v:.1f}" for k, v in out.items()), flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, None, quick="two members, few rounds", key=True)
    p.add_argument("--members", nargs="+", type=int, default=[1, 3, 8, 32])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--threads", nargs="+", type=int, default=[2, 4, 8],
                   help="host threads launching the per-member graphs (a row each)")  # fmt: skip
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("probe_graph_branches.py needs a CUDA device")
    counts, rounds = ([1, 2], 5) if args.quick else (args.members, args.rounds)
    launch = launch_costs()
    rows = []
    for n in counts:
        members = [Member(i) for i in range(n)]
        streams = _streams(n)
        _warm(members, streams)
        rnd, graphs = per_member_graphs(members, streams)
        per_step = kernels_per_replay(graphs[0].replay)
        ways = [("streams", rnd), ("branches", branched_graph(members, streams)[0])]
        pools = [(t, *threaded_launches(graphs, streams, t)) for t in args.threads if 1 < t <= n]
        ways += [(f"threads{t}", r) for t, r, _ in pools]
        for way, round_ in ways:
            wall = timed(round_, rounds)
            rate = n * rounds * per_step / wall
            rows.append({"members": n, "way": way, "kernels_per_step": per_step,
                         "us_per_round": 1e6 * wall / rounds, "kernels_per_s": rate})  # fmt: skip
            print(
                f"{n:3d} members, {way:8s}: {1e6 * wall / rounds:8.1f} µs a round, "
                f"{rate / 1e6:.2f}M kernels/s ({per_step} a step)",
                flush=True,
            )
        for _, _, pool in pools:
            pool.shutdown()
        del members, graphs
    result = {"rounds": rounds, "launch_host_us": launch, "rows": rows}
    if args.out:
        record = {**provenance("cuda"), "command": invocation(__file__, argv), **result}
        save_record(args.out, args.key, record)
    print(markdown_table(["members", "way", "kernels a step", "µs a round", "M kernels/s"],
                         [(r["members"], r["way"], r["kernels_per_step"],
                           round(r["us_per_round"], 1), round(r["kernels_per_s"] / 1e6, 3))
                          for r in rows], "lllrr"))  # fmt: skip
    return result


if __name__ == "__main__":
    main()
