"""Trainer throughput and the cost of the stability guard: environment steps/s, gradient steps/s
per stability mode, and (on CUDA) a proof that the guarded step makes no host synchronisation.

    python benchmarks/bench_trainer.py [--device cuda] [--quick] [--out PATH]

Workload: the default ``trimtab train`` config (4 assets, 16 envs, batch 64, the default net),
fold 0 of the embedded market. Env steps/s counts single-env transitions (16 per batched
step: act, env step, replay insert). A gradient step is sample + loss + backward + clip +
optimizer step + every sentinel check of the mode. The modes' gradient steps are timed
interleaved (rounds of 50 steps of each mode in turn, the median round per mode), so all three
see the same machine state. ``guard overhead`` = adaptive / off.

On CUDA every mode is also timed with its learn step captured in a CUDA graph
(``run.cuda_graph = "on"``, ``Learner.learn_from``: the replay's sample, the step and the
priority update in one graph, the target sync on the host), interleaved with the eager ones
(``learn`` on ``replay.sample``, as before); the JSON's
``captured`` holds those rows, ``captured_guard_overhead`` their adaptive / off, and
``capture_s`` the host seconds each capture took (warm-up steps not included).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import (
    benchmark_parser,
    invocation,
    markdown_table,
    provenance,
    save_record,
    write_json,
)
from trimtab.lifecycle import Lifecycle
from trimtab.rl.agent.dqn import DQNAgent
from trimtab.rl.agent.learner import build_learner
from trimtab.rl.config import TrainConfig, measure_every
from trimtab.rl.envs.trading import BatchedTradingEnv
from trimtab.rl.run.walkforward import fold_arrays, load_market, make_folds

DEFAULT_OUT = Path(__file__).parent / "results" / "trainer.json"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mode_config(cfg: TrainConfig, mode: str, device: torch.device, cuda_graph: str) -> TrainConfig:
    """``cfg`` in stability ``mode`` on ``device``, the learn step captured or not."""
    return replace(cfg, run=replace(cfg.run, stability=mode, device=str(device),
                                    cuda_graph=cuda_graph))  # fmt: skip


def build(cfg: TrainConfig, device: torch.device) -> tuple[Any, ...]:
    market = load_market(cfg)
    fold = make_folds(market.n_days, cfg)[0]
    feats, _ = fold_arrays(market, fold, cfg.env.feature_bins)
    env = BatchedTradingEnv(
        feats[fold.train_start : fold.fit_end],
        market.fills.slice(fold.train_start, fold.fit_end),
        n_envs=cfg.env.n_envs, window_len=cfg.env.episode_days, levels=cfg.env.levels,
        costs=market.costs, device=device, seed=0,
    )  # fmt: skip
    n = market.features.shape[1]
    with Lifecycle():
        learner = build_learner(cfg, env.obs_dim, [len(cfg.env.levels)] * n, device)
    return env, learner, learner.agent.make_replay()


def collect(env: BatchedTradingEnv, agent: DQNAgent, replay: Any, obs: torch.Tensor, n: int):
    for i in range(n):
        action = agent.act(obs, 10_000 + i)
        res = env.step(action)
        replay.add(obs, action, res.reward, res.final_obs, res.terminated, res.truncated)
        obs = res.obs
    return obs


def prepare(cfg: TrainConfig, device: torch.device) -> dict[str, Any]:
    """One mode's agent, warmed up (kernels compiled, tables built, moments allocated, and with
    ``run.cuda_graph = "on"`` the step captured), with its environment steps/s measured."""
    env, learner, replay = build(cfg, device)
    agent = learner.agent
    gen = torch.Generator(device=device).manual_seed(0)
    obs = collect(env, agent, replay, env.reset(), 64)
    for _ in range(10):
        learner.learn_from(replay, gen, cfg.agent.batch_size)
    _sync(device)
    t0 = time.perf_counter()
    obs = collect(env, agent, replay, obs, 64)
    _sync(device)
    rate = 64 * env.n_envs / (time.perf_counter() - t0)
    return {"cfg": cfg, "env": env, "learner": learner, "replay": replay, "gen": gen, "obs": obs,
            "env_steps_per_s": rate, "times": [], "cpu_times": []}  # fmt: skip


def time_updates(m: dict[str, Any], device: torch.device, steps: int) -> float:
    """Wall time per step; also records this thread's CPU time per step in ``m["cpu_times"]``
    (on the CPU, with one torch thread, the step's own compute: other jobs on a shared machine
    inflate it far less than the wall time)."""
    _sync(device)
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        m["learner"].learn_from(m["replay"], m["gen"], m["cfg"].agent.batch_size)
    _sync(device)
    m["cpu_times"].append((time.thread_time() - c0) / steps)
    return (time.perf_counter() - t0) / steps


def measure_all(cfgs: dict[Any, TrainConfig], device: torch.device, steps: int, rounds: int):
    """Gradient-step time per mode, the modes interleaved: ``rounds`` rounds, each timing
    ``steps`` steps of every mode in turn, and the median round per mode. Interleaving puts
    every mode under the same machine state (clocks, other load), which drifted by ~20% between
    back-to-back runs of one mode on the H200 host."""
    modes = {name: prepare(cfg, device) for name, cfg in cfgs.items()}
    for _ in range(rounds):
        for m in modes.values():
            m["times"].append(time_updates(m, device, steps))
    rows = {}
    for name, m in modes.items():
        ms = statistics.median(m["times"]) * 1e3
        rows[name] = {"env_steps_per_s": m["env_steps_per_s"], "grad_step_ms": ms,
                      "grad_steps_per_s": 1e3 / ms,
                      "round_ms": [round(t * 1e3, 3) for t in m["times"]]}  # fmt: skip
        if device.type == "cpu":
            rows[name]["grad_step_cpu_ms"] = statistics.median(m["cpu_times"]) * 1e3
            rows[name]["round_cpu_ms"] = [round(t * 1e3, 3) for t in m["cpu_times"]]
        graph = m["learner"].sampled_graph
        if graph is not None:
            rows[name].update(captures=graph.captures, capture_s=graph.capture_seconds,
                              replay_ms=replay_ms(graph.graph, steps))  # fmt: skip
        if device.type == "cuda":
            rows[name]["sync_free"] = sync_free(
                m["env"], m["learner"], m["replay"], m["obs"], m["gen"], m["cfg"]
            )
    return rows


def replay_ms(graph: torch.cuda.CUDAGraph, n: int) -> float:
    """The captured step's graph alone, replayed ``n`` times back to back on its last batch:
    the GPU's time per step (the gradient step's time less the host's sample and copy)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def sync_free(env, learner, replay, obs, gen, cfg) -> str:
    """Run collect + guarded update under set_sync_debug_mode("error"): 'yes' or the error."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            obs = collect(env, learner.agent, replay, obs, 1)
            learner.learn_from(replay, gen, cfg.agent.batch_size)
        return "yes"
    except RuntimeError as e:
        import traceback

        frames = [f for f in traceback.extract_tb(e.__traceback__) if "trimtab" in f.filename]
        where = f" at {frames[-1].filename.split('src/')[-1]}:{frames[-1].lineno}" if frames else ""
        traceback.print_exc()
        return f"no: {str(e).splitlines()[0]}{where}"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser(__doc__, DEFAULT_OUT, quick="few steps, a small net", device="auto")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per mode and round")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (median)")
    parser.add_argument(
        "--every", type=int, nargs="*", default=[],
        help="also time adaptive at these run.measure_every (eager; interleaved with the rest)",
    )  # fmt: skip
    parser.add_argument(
        "--key", default=None,
        help="store the record as this key of --out (a file of named records; default: "
        "the whole file is this run's record)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cfg = TrainConfig()
    torch.set_num_threads(cfg.run.threads)  # as `trimtab train` runs
    steps = args.steps
    if args.quick:
        cfg = replace(cfg, agent=replace(cfg.agent, hidden=16, n_tau=2, n_tau_target=2))
        steps = 5
    modes = ("off", "fixed", "adaptive")
    graphs = ("off", "on") if device.type == "cuda" else ("off",)
    cfgs = {(m, g): mode_config(cfg, m, device, g) for g in graphs for m in modes}
    for k in args.every:  # adaptive at other cadences, eager
        c = mode_config(cfg, "adaptive", device, "off")
        cfgs[(f"adaptive, measure_every={k}", "off")] = replace(
            c, run=replace(c.run, measure_every=k)
        )
    measured = measure_all(cfgs, device, steps, 2 if args.quick else args.rounds)
    rows = {m: measured[(m, "off")] for m, g in cfgs if g == "off"}
    captured = {m: measured[(m, "on")] for m in modes if (m, "on") in measured}
    overhead = rows["adaptive"]["grad_step_ms"] / rows["off"]["grad_step_ms"]
    print(f"trainer throughput on {device} ({'quick' if args.quick else 'default config'})\n")
    header = ["stability", "learn step", "env steps/s", "gradient steps/s",
              "ms per gradient step", "sync-free"]  # fmt: skip
    body = [(mode, kind, f"{r['env_steps_per_s']:,.0f}", f"{r['grad_steps_per_s']:.1f}",
             f"{r['grad_step_ms']:.3f}", r.get("sync_free", "n/a (CPU)"))
            for kind, table in (("eager", rows), ("CUDA graph", captured))
            for mode, r in table.items()]  # fmt: skip
    print(markdown_table(header, body, "llrrrl"))
    print(f"\nguard overhead (adaptive / off), eager: {overhead:.2f}x")
    result = {"benchmark": "trainer", **provenance(device), "quick": args.quick,
              "steps": steps, "rounds": 2 if args.quick else args.rounds, "modes": rows,
              "guard_overhead": overhead}  # fmt: skip
    if device.type == "cpu":  # per round (the modes interleaved), then the median of those
        result["measure_every"] = measure_every(cfgs[("adaptive", "off")].run, device)
        for name in [m for m in rows if m.startswith("adaptive")]:
            per_round = [a / o for a, o in zip(rows[name]["round_cpu_ms"],
                                               rows["off"]["round_cpu_ms"])]  # fmt: skip
            suffix = "" if name == "adaptive" else f" [{name}]"
            result["guard_overhead_cpu_time" + suffix] = statistics.median(per_round)
            result["guard_overhead_cpu_time_rounds" + suffix] = [round(r, 4) for r in per_round]
            print(
                f"guard overhead ({name} / off), CPU time of the step: "
                f"{statistics.median(per_round):.2f}x (median of {len(per_round)} rounds; "
                f"min {min(per_round):.2f}, max {max(per_round):.2f})"
            )
    if captured:
        c = captured["adaptive"]["grad_step_ms"] / captured["off"]["grad_step_ms"]
        print(
            f"guard overhead (adaptive / off), CUDA graph: {c:.3f}x; adaptive captured "
            f"{captured['adaptive']['grad_step_ms']:.3f} ms (targets: <= 1.05x, <= 1.5 ms)"
        )
        result.update(captured=captured, captured_guard_overhead=c)
    if args.key is not None:
        result["command"] = invocation(__file__, argv)
        save_record(args.out, args.key, result)
    else:
        write_json(args.out, result, indent=2)
    return result


if __name__ == "__main__":
    main()
