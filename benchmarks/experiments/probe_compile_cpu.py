"""Whether ``torch.compile`` (inductor's CPU backend) makes the CPU learn step of
``examples/cartpole.toml`` cheaper, per stability mode, with every check of the step still fed.

    python benchmarks/experiments/probe_compile_cpu.py [--config examples/cartpole.toml] \\
        [--modes off adaptive] [--regions trunk head c51] [--steps 200] [--rounds 9] \\
        [--quick] [--out FILE --key NAME] [--note TEXT]

One thread. Per mode, two learners are built alike (``profile_cpu_step.py``'s ``build``: the same
weights, the same replay, each with its own sampling generator seeded alike, so both draw the
same batches); in one, the chosen regions are compiled (``torch.compile(dynamic=False)``, with
a fresh inductor cache and dynamo's caches reset per mode, so its first step is a cold
compile). Both are warmed up, then timed in interleaved rounds (``--rounds`` rounds of
``--steps`` steps each, the order alternating; the median round, in this thread's CPU time).
Reported per mode: eager and compiled ms a step, their ratio, the compiled learner's first step
(the compile, wall seconds; a tiny function compiled first pays the process's one-time start-up)
and the largest |loss difference| between the two over the timed steps. Prints a table;
``--out`` adds a JSON record (machine, date, commit, the regions).

Only regions whose outputs the eager step differentiates through are compiled: the sentinel's
hook on the trunk output (``Learner.guarded_step``) must still get its gradient. Compiled
whole, ``agent.predict`` (or the whole guarded step) returns the trunk output from inside one
graph whose backward the gradient reaches through the logits, and the hook gets None (the
check then fails on it). The script counts the hook's calls in both learners, passing on what
arrives, and fails unless every step's call got a gradient.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the experiments
from profile_cpu_step import CONFIG, FILL, ROOT, _config, build  # one way to build the step

from trimtab.benchmarking import benchmark_parser, provenance, save_record

#: region -> what it compiles; each is compiled apart, its output used by eager code after it
REGIONS = {
    "trunk": "online.trunk and target.trunk, the Linear-ReLU layers (the trunk clamp, "
    "trunk_out, stays eager); Module.compile, in place",
    "head": "online.c51_head and target.c51_head; Module.compile, in place",
    "c51": "trimtab.rl.agent.losses.c51_projection and c51_loss, as agent.loss calls them "
    "(dqn's names rebound during the compiled learner's steps only)",
}


@contextmanager
def _using(fns: dict[str, Callable[..., Any]]) -> Iterator[None]:
    """``trimtab.rl.agent.dqn``'s module-level loss functions replaced by ``fns`` for the
    duration: both learners share that module, and only the compiled one's steps run inside."""
    from trimtab.rl.agent import dqn

    before = {name: getattr(dqn, name) for name in fns}
    for name, fn in fns.items():
        setattr(dqn, name, fn)
    try:
        yield
    finally:
        for name, fn in before.items():
            setattr(dqn, name, fn)


def compile_regions(m: dict[str, Any], regions: list[str]) -> None:
    """Compile ``regions`` of ``m``'s learner (at its next step: torch.compile is lazy)."""
    from trimtab.rl.agent import losses

    agent = m["learner"].agent
    for net in (agent.online, agent.target):
        if "trunk" in regions:
            net.trunk.compile(dynamic=False)
        if "head" in regions:
            net.c51_head.compile(dynamic=False)
    if "c51" in regions:
        m["swap"] = {name: torch.compile(getattr(losses, name), dynamic=False)
                     for name in ("c51_projection", "c51_loss")}  # fmt: skip


def count_trunk_grads(m: dict[str, Any]) -> None:
    """Count what the trunk-output hook receives: a gradient, or None (a check gone silent).
    The hook itself still runs on whatever arrives; the count only watches."""
    checks = m["learner"].stability.checks
    hook, seen = checks.trunk_grad, m["trunk_grads"]

    def counted(g: Tensor | None) -> None:
        seen["gradient" if isinstance(g, Tensor) else "none"] += 1
        hook(g)

    checks.trunk_grad = counted


def inductor_startup() -> float:
    """Wall seconds of a tiny function's first compiled call: what the process's first compile
    costs once (imports, the compile workers' start), kept out of each mode's compile time."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with (
        tempfile.TemporaryDirectory(prefix="probe_compile_cpu_") as cache,
        temporary_cache_dir(cache),
    ):
        fn = torch.compile(lambda x: torch.relu(2 * x + 1), dynamic=False)
        t0 = time.perf_counter()
        fn(torch.ones(8))
        return time.perf_counter() - t0


def _steps(m: dict[str, Any], n: int) -> list[Tensor]:
    learner, replay, gen = m["learner"], m["replay"], m["gen"]
    with _using(m["swap"]):
        return [learner.learn_from(replay, gen, m["cfg"].agent.batch_size)["loss"]
                for _ in range(n)]  # fmt: skip


def _weights(m: dict[str, Any]) -> dict[str, Tensor]:
    agent = m["learner"].agent
    return {f"{name}.{k}": v for name, net in (("online", agent.online), ("target", agent.target))
            for k, v in net.state_dict().items()}  # fmt: skip


def probe_mode(cfg: Any, regions: list[str], fill: int, warm: int, steps: int,
               rounds: int) -> dict[str, Any]:  # fmt: skip
    """One mode: the eager and the compiled learner, timed interleaved (see the docstring)."""
    from torch._dynamo.utils import counters
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    eager, comp = (build(cfg, fill) for _ in range(2))
    w_eager, w_comp = _weights(eager), _weights(comp)
    if any(not torch.equal(w_eager[k], w_comp[k]) for k in w_eager):
        raise RuntimeError("two learners built from one config differ: the comparison needs "
                           "the same start (is the network's initialisation seeded?)")  # fmt: skip
    for m in (eager, comp):
        m["swap"], m["trunk_grads"], m["loss"] = {}, Counter(), []
        count_trunk_grads(m)
    torch._dynamo.reset()
    counters.clear()
    with (
        tempfile.TemporaryDirectory(prefix="probe_compile_cpu_") as cache,
        temporary_cache_dir(cache),
    ):
        compile_regions(comp, regions)
        first = {}
        for name, m in (("eager", eager), ("compiled", comp)):
            t0 = time.perf_counter()
            _steps(m, 1)
            first[name] = time.perf_counter() - t0
        for m in (eager, comp):
            _steps(m, warm - 1)
        graphs = counters["stats"]["unique_graphs"]
        for r in range(rounds):
            # alternate which goes first, so neither always runs after the other
            for m in (eager, comp) if r % 2 == 0 else (comp, eager):
                c0 = time.thread_time()
                losses = _steps(m, steps)
                m["cpu_ms"].append(1e3 * (time.thread_time() - c0) / steps)
                m["loss"].extend(losses)
    for name, m in (("eager", eager), ("compiled", comp)):
        got = m["trunk_grads"]
        if got["none"] or got["gradient"] != warm + rounds * steps:
            raise RuntimeError(
                f"the {name} learner's trunk-output hook got {dict(got)} over "
                f"{warm + rounds * steps} steps: a compiled region hid the gradient the "
                "sentinel's backward_heads check reads; compile a region the eager step "
                "differentiates through instead"
            )
    loss_e, loss_c = torch.stack(eager["loss"]), torch.stack(comp["loss"])
    w_eager, w_comp = _weights(eager), _weights(comp)
    e_ms, c_ms = statistics.median(eager["cpu_ms"]), statistics.median(comp["cpu_ms"])
    return {
        "measure_every": cfg.run.measure_every,
        "eager_ms": e_ms,
        "compiled_ms": c_ms,
        "ratio": c_ms / e_ms,
        "compile_s": first["compiled"],
        "eager_first_step_s": first["eager"],
        "loss_max_abs_diff": (loss_e - loss_c).abs().max().item(),
        "loss_mean_abs": loss_e.abs().mean().item(),
        "weights_max_abs_diff": max((w_eager[k] - w_comp[k]).abs().max().item()
                                    for k in w_eager if w_eager[k].is_floating_point()),
        "graphs": graphs,
        "graphs_while_timed": counters["stats"]["unique_graphs"] - graphs,
        "graph_breaks": sum(counters["graph_break"].values()),
        "trunk_grad_hook": {"eager": dict(eager["trunk_grads"]),
                            "compiled": dict(comp["trunk_grads"])},
        "eager_round_ms": [round(x, 3) for x in eager["cpu_ms"]],
        "compiled_round_ms": [round(x, 3) for x in comp["cpu_ms"]],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, None, quick="a few steps of one mode (the test)", key=True,
                         out_help="a JSON file of records")  # fmt: skip
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--modes", nargs="+", default=["off", "adaptive"],
                   choices=["off", "fixed", "adaptive"])  # fmt: skip
    p.add_argument("--regions", nargs="+", default=list(REGIONS), choices=list(REGIONS),
                   help="what to compile (default: all)")  # fmt: skip
    p.add_argument("--steps", type=int, default=200, help="steps per learner and round")
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (the median)")
    p.add_argument("--warmup", type=int, default=50, help="steps of each before timing")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--note", default=None, help="what the run was (stored with the record)")
    args = p.parse_args(argv)
    steps, rounds, fill, warm, modes = args.steps, args.rounds, FILL, args.warmup, args.modes
    if args.quick:
        steps, rounds, fill, warm, modes = 4, 1, 300, 2, modes[:1]
    torch.set_num_threads(1)
    sets = [*args.sets, *(["agent.batch_size=16"] if args.quick else [])]
    config = args.config.resolve()
    shown = config.relative_to(ROOT) if config.is_relative_to(ROOT) else config
    record: dict[str, Any] = {
        **provenance("cpu"), "config": shown.as_posix(), "sets": sets,
        "regions": {r: REGIONS[r] for r in args.regions}, "fill": fill, "warmup": warm,
        "steps": steps, "rounds": rounds, "modes": {},
    }  # fmt: skip
    record["inductor_startup_s"] = inductor_startup()
    for mode in modes:
        row = probe_mode(_config(args.config, mode, sets), args.regions, fill, warm, steps, rounds)
        record["modes"][mode] = row
        rounds_ms = f"{row['eager_round_ms']} / {row['compiled_round_ms']}"
        print(f"{mode}: eager {row['eager_ms']:.3f} ms, compiled {row['compiled_ms']:.3f} ms "
              f"(rounds {rounds_ms})", flush=True)  # fmt: skip
    record["table"] = [
        {"mode": mode, "eager_ms": round(r["eager_ms"], 3),
         "compiled_ms": round(r["compiled_ms"], 3), "ratio": round(r["ratio"], 3),
         "compile_s": round(r["compile_s"], 1), "loss_max_abs_diff": r["loss_max_abs_diff"],
         "graph_breaks": r["graph_breaks"]}
        for mode, r in record["modes"].items()
    ]  # fmt: skip
    print(f"regions compiled: {', '.join(args.regions)}; {steps} steps x {rounds} rounds, "
          "CPU ms a step (median round), one thread")  # fmt: skip
    print(f"{'mode':10}{'eager ms':>10}{'compiled ms':>13}{'ratio':>8}{'compile s':>11}"
          f"{'max |dloss|':>13}")  # fmt: skip
    for r in record["table"]:
        print(f"{r['mode']:10}{r['eager_ms']:10.3f}{r['compiled_ms']:13.3f}{r['ratio']:8.3f}"
              f"{r['compile_s']:11.1f}{r['loss_max_abs_diff']:13.2e}", flush=True)  # fmt: skip
    if args.note is not None:
        record["note"] = args.note
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
