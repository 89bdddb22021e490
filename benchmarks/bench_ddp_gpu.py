"""The multi-process learner on CUDA (issue 15): the guarded learn step with W ranks against one
process at the same global batch, the cost of the rank-consistent bounds and sentinel over plain
DDP, and whether each variant's step leaves the host free of the device.

    python benchmarks/bench_ddp_gpu.py [--world 2] [--steps 50] [--rounds 5] [--probes 3] \\
        [--count-steps 110] [--train-steps 0] [--quick] [--out benchmarks/results/ddp_h200.json]

The driver launches ``torchrun --nproc-per-node N`` of this file (``--worker``) for N = 1 and
N = ``--world``. One process per GPU on NCCL; where the node has fewer GPUs than ``--world``,
the ranks share GPUs (rank r on GPU r mod count) through gloo, which reduces CUDA tensors in
host memory (NCCL refuses two ranks on one device: ``--probe`` records its answer). Workload:
the default config with the CUDA profile's sizes (``batch_size`` 256 = the global batch, 64
envs), fold 0 of the embedded market, stability ``adaptive``, learn step eager. Variants, each
its own learner, built and warmed up (64 batched env steps, 10 learn steps), then timed interleaved
(``--rounds`` rounds of ``--steps`` steps of each, the median round; per variant the slowest
rank):

- ``single`` (N = 1 only): no process group in the step; ``single_graph``: the same step
  captured in a CUDA graph, which is what ``trimtab train`` runs on one GPU (``cuda_graph =
  "auto"``) and what DDP forbids;
- ``ddp``: plain DDP on the online network (``AgentDDP`` as the trainer builds it, its runtime
  statistics off), each rank's batch the global batch / N, bounds and flags measured per rank;
- ``ddp_rc``: ``Ranks.wrap``, as ``trimtab train`` runs under torchrun: ``ddp`` plus
  ``RankConsistent`` (one all-reduce of bounds, threshold scales and sentinel records per step);
- ``ddp_torch_default`` (not timed): plain ``DistributedDataParallel`` with torch's defaults,
  whose runtime statistics wait on CUDA events every 100th iteration (``AgentDDP`` turns them
  off after the first 10: ``trimtab.rl.run.ddp.NO_RUNTIME_STATS``).

Per variant also, on every rank: **host waits**, ``--probes`` pairs of learn steps, each pair
issued behind a ``torch.cuda._sleep`` of about 60 ms on an idle device (an eager step's
launches take the host about 20 ms): a pair's first step whose host time exceeds half the sleep
waited for the device (:func:`analyse_waits`; the second step's time is no test: it also
waits for launch-queue space). **Host syncs**, counted over ``--count-steps`` steps (enough to
span DDP's 100-iteration statistics cadence) for ``ddp_rc`` and ``ddp_torch_default`` on NCCL,
20 for the others, through torch's GPU trace (``torch.cuda._gpu_trace``, the CUDA sanitizer's
hooks), which sees ``CUDAEvent.synchronize`` as well as stream and device synchronisations,
with one event and one stream synchronisation after the steps as a control that it counts
them. And ``sync_free``: three steps under ``torch.cuda.set_sync_debug_mode("error")`` ("yes"
or the error), which sees stream and device synchronisations only. The sync check
runs last and each rank exits right after it (a rank that raised would otherwise leave the other
waiting in a collective). ``--train-steps S``: also
``bench_ddp.py --device cuda`` (``trimtab train``, 1 fold, S gradient steps split over the
ranks, 1x1 against Nx1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from trimtab.benchmarking import benchmark_parser, provenance, write_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "ddp_h200.json"
SLEEP_CYCLES = 120_000_000  # torch.cuda._sleep: about 60 ms at the H200's 1.98 GHz
FEW_COUNTED = 20  # steps counted for the variants whose DDP statistics are not the question
TORCH_SAMPLE_RATE = (
    100  # DDP's runtime statistics cadence by default (kDDPRuntimeLoggingSampleRate)
)
TIMED = ("single", "single_graph", "ddp", "ddp_rc")


def base_config(quick: bool) -> Any:
    from trimtab.rl.config import DEVICE_PROFILES, TrainConfig
    from trimtab.rl.configio import from_dict

    # the CUDA profile's sizes, set: the market keeps the CPU profile on CUDA, and this
    # benchmark's records are of the larger global batch
    cuda = DEVICE_PROFILES["cuda"]
    data: dict[str, Any] = {
        "run": {"device": "cuda", "progress": False},
        "env": {"n_envs": cuda["env.n_envs"]},
        "agent": {"batch_size": cuda["agent.batch_size"]},
    }
    if quick:
        data["agent"].update(hidden=16, n_tau=2, n_tau_target=2)
    return from_dict(TrainConfig, data)


def build_variant(
    name: str, base: Any, ranks: Any, device: torch.device, quick: bool
) -> dict[str, Any]:
    """One variant's learner on this rank, wrapped, with a filled replay, warmed up."""
    import bench_trainer
    from trimtab.rl.run.ddp import AgentDDP, rank_seed

    world = 1 if ranks is None else ranks.world_size
    rank = 0 if ranks is None else ranks.rank
    batch = base.agent.batch_size // world  # the same global batch at every world size
    run = replace(base.run, seed=rank_seed(base.run.seed, rank),
                  cuda_graph="on" if name == "single_graph" else "off")  # fmt: skip
    cfg = replace(base, run=run, agent=replace(base.agent, batch_size=batch))
    env, learner, replay = bench_trainer.build(cfg, device)
    if name == "ddp":  # DDP alone, as Ranks.wrap builds it, without RankConsistent
        net = learner.agent.online
        ids = [device.index] if device.type == "cuda" else None
        learner.agent.online = AgentDDP(net, device_ids=ids,
                                        broadcast_buffers=False, static_graph=True)  # fmt: skip
        learner.agent.sync_target()
    elif name == "ddp_torch_default":  # AgentDDP's pass-through, torch's statistics cadence
        ids = [device.index] if device.type == "cuda" else None
        ddp = AgentDDP(learner.agent.online, device_ids=ids, broadcast_buffers=False,
                       static_graph=True)  # fmt: skip
        ddp._set_ddp_runtime_logging_sample_rate(TORCH_SAMPLE_RATE)
        learner.agent.online = ddp
        learner.agent.sync_target()
    elif name == "ddp_rc":
        ranks.wrap(learner)
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    obs = bench_trainer.collect(env, learner.agent, replay, env.reset(), 8 if quick else 64)
    for _ in range(10):
        learner.learn_from(replay, gen, batch)
    torch.cuda.synchronize()
    return {"learner": learner, "replay": replay, "gen": gen, "batch": batch, "env": env,
            "obs": obs, "times": []}  # fmt: skip


def _steps(m: dict[str, Any], n: int) -> None:
    for _ in range(n):
        m["learner"].learn_from(m["replay"], m["gen"], m["batch"])


def _barrier(ranks: Any) -> None:
    if ranks is not None:
        dist.barrier()


def host_waits(m: dict[str, Any], ranks: Any, pairs: int) -> dict[str, Any]:
    """``pairs`` pairs of learn steps, each behind a device sleep: the host ms of every step,
    the sleep's ms, and :func:`analyse_waits` of them."""
    host, sleeps = [], []
    for _ in range(pairs):
        torch.cuda.synchronize()
        _barrier(ranks)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(SLEEP_CYCLES)
        end.record()
        for _ in range(2):
            t0 = time.perf_counter()
            _steps(m, 1)
            host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        sleeps.append(start.elapsed_time(end))
    return {"sleep_ms": min(sleeps), "host_ms": host, **analyse_waits(host, min(sleeps))}


def analyse_waits(host_ms: list[float], sleep_ms: float) -> dict[str, Any]:
    """A pair's first step starts on an empty launch queue, with nothing of the learner pending
    but the sleep: if its host time exceeds half the sleep, the step waited for the device.
    The second step's time is no such test: it can wait for launch-queue space (an eager step
    issues several hundred launches, which queue behind the sleep) as well as for a sync."""
    first, second = host_ms[::2], host_ms[1::2]
    return {
        "pairs": len(first),
        "first_steps_waited": sum(h > sleep_ms / 2 for h in first),
        "first_step_host_ms_median": statistics.median(first),
        "second_step_host_ms_median": statistics.median(second),
    }


#: the host syncs counted by torch's GPU trace (torch.cuda._gpu_trace, the CUDA sanitizer's
#: hooks): c10's stream and device synchronisations, at::cuda::CUDAEvent::synchronize
SYNC_KINDS = ("event", "stream", "device")
_SYNCS: dict[str, int] = {}


def count_syncs(m: dict[str, Any], steps: int) -> dict[str, Any]:
    """Host synchronisations in ``steps`` learn steps, by kind, counted through torch's GPU
    trace (which also sees ``cudaEventSynchronize``, unlike ``set_sync_debug_mode``); then one
    event and one stream synchronisation as a control that the counting sees them."""
    from torch.cuda import _gpu_trace

    if not _SYNCS:  # once per process: the trace cannot be turned off again
        torch._C._activate_gpu_trace()

        def bump(kind: str) -> Any:
            return lambda *_: _SYNCS.__setitem__(kind, _SYNCS[kind] + 1)

        _gpu_trace.register_callback_for_event_synchronization(bump("event"))
        _gpu_trace.register_callback_for_stream_synchronization(bump("stream"))
        _gpu_trace.register_callback_for_device_synchronization(bump("device"))
    torch.cuda.synchronize()
    _SYNCS.update(dict.fromkeys(SYNC_KINDS, 0))
    _steps(m, steps)
    in_steps = dict(_SYNCS)
    event = torch.cuda.Event()
    event.record()
    event.synchronize()
    torch.cuda.current_stream().synchronize()
    control = {k: _SYNCS[k] - in_steps[k] for k in SYNC_KINDS}
    torch.cuda.synchronize()
    return {"steps": steps, "syncs": in_steps, "control_seen": control}


def probes(name: str, backend: str, args: argparse.Namespace) -> int:
    """Steps whose host syncs are counted: ``--count-steps`` (enough to span DDP's
    100-iteration statistics cadence) for the DDP variants on NCCL, 20 for the others."""
    long = name in ("ddp_rc", "ddp_torch_default") and backend == "nccl"
    return args.count_steps if long else min(args.count_steps, FEW_COUNTED)


def sync_check(m: dict[str, Any]) -> str:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _steps(m, 3)
        return "yes"
    except RuntimeError as e:
        import traceback

        frames = [f for f in traceback.extract_tb(e.__traceback__) if "/src/" in f.filename
                  or "torch/" in f.filename]  # fmt: skip
        where = f" at {frames[-1].filename.split('/')[-1]}:{frames[-1].lineno}" if frames else ""
        return f"no: {str(e).splitlines()[0]}{where}"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def worker(args: argparse.Namespace) -> None:
    """One rank (under torchrun): time the variants, write ``rank{r}.json`` into ``--part``."""
    from trimtab.rl.run.ddp import Ranks

    part = Path(args.part)
    ranks = Ranks.init("cuda", args.backend)
    torch.set_num_threads(1)
    base = base_config(args.quick)
    names = [*TIMED, "ddp_torch_default"]
    if ranks.world_size > 1:  # no one-process variants
        names = names[2:]
    built = {}
    for name in names:
        t0 = time.perf_counter()
        built[name] = build_variant(name, base, ranks, ranks.device, args.quick)
        built[name]["build_s"] = time.perf_counter() - t0
    timed = {name: m for name, m in built.items() if name in TIMED}
    for _ in range(args.rounds):
        for m in timed.values():
            torch.cuda.synchronize()
            _barrier(ranks)
            t0 = time.perf_counter()
            _steps(m, args.steps)
            torch.cuda.synchronize()
            m["times"].append((time.perf_counter() - t0) / args.steps * 1e3)
    mine: dict[str, Any] = {"rank": ranks.rank, "backend": ranks.backend,
                            "device": str(ranks.device), "variants": {}}  # fmt: skip
    for name, m in built.items():
        row = {"batch_per_rank": m["batch"], "build_s": m["build_s"],
               "host_waits": host_waits(m, ranks, args.probes)}  # fmt: skip
        if m["times"]:
            row.update(step_ms=statistics.median(m["times"]), round_ms=m["times"])
        mine["variants"][name] = row
    (part / f"rank{ranks.rank}.json").write_text(json.dumps(mine))
    torch.cuda.synchronize()
    _barrier(ranks)
    for name, m in built.items():  # the GPU trace stays on: last but for the sync check
        mine["variants"][name]["host_syncs"] = count_syncs(m, probes(name, ranks.backend, args))
    (part / f"rank{ranks.rank}.json").write_text(json.dumps(mine))
    sync = {name: sync_check(m) for name, m in built.items()}
    (part / f"sync{ranks.rank}.json").write_text(json.dumps(sync))
    print(f"rank {ranks.rank}: sync-free {sync}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # no collective after the sync check (module docstring)


def probe_nccl_shared() -> None:
    """Two NCCL ranks on GPU 0 (under torchrun): what NCCL answers to an all-reduce."""
    from datetime import timedelta

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", timeout=timedelta(seconds=40))
    x = torch.ones(4, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"rank {dist.get_rank()}: all_reduce on a shared GPU gave {x.tolist()}", flush=True)
    dist.destroy_process_group()


def launch(n: int, args: argparse.Namespace, extra: list[str], timeout: float) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(n), __file__, *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -9, f"timed out after {timeout} s\n{out[-3000:]}"
    return done.returncode, done.stdout + done.stderr


def measure(n: int, backend: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    part = tmp / f"world{n}"
    part.mkdir()
    extra = ["--worker", "--part", str(part), "--backend", backend, "--steps", str(args.steps),
             "--rounds", str(args.rounds), "--probes", str(args.probes),
             "--count-steps", str(args.count_steps),
             *(["--quick"] if args.quick else [])]  # fmt: skip
    rc, log = launch(n, args, extra, args.timeout)
    ranks = [json.loads(f.read_text()) for f in sorted(part.glob("rank*.json"))]
    sync = [json.loads(f.read_text()) for f in sorted(part.glob("sync*.json"))]
    out: dict[str, Any] = {"world_size": n, "backend": backend, "rc": rc, "ranks": ranks,
                           "sync_free_per_rank": sync}  # fmt: skip
    if rc != 0 or len(ranks) < n:
        out["log_tail"] = log[-4000:]
    if ranks:
        out["variants"] = {}
        for name in ranks[0]["variants"]:
            rows = [r["variants"][name] for r in ranks]
            waits = [r["host_waits"] for r in rows]
            v: dict[str, Any] = {
                "first_steps_waited_per_rank": [w["first_steps_waited"] for w in waits],
                "pairs": waits[0]["pairs"],
                "sleep_ms": min(w["sleep_ms"] for w in waits),
                "first_step_host_ms": max(w["first_step_host_ms_median"] for w in waits),
                "host_syncs_per_rank": [r.get("host_syncs") for r in rows],
                "sync_free": [s.get(name, "not run") for s in sync] or ["not run"],
            }
            if "step_ms" in rows[0]:
                ms = max(r["step_ms"] for r in rows)  # the slowest rank sets the pace
                samples = sum(r["batch_per_rank"] for r in rows)
                v.update(step_ms=ms, steps_per_s=1e3 / ms, samples_per_s=1e3 / ms * samples)
            out["variants"][name] = v
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, quick="a tiny net, few steps")
    p.add_argument("--world", type=int, default=2, help="ranks to compare with one process")
    p.add_argument("--steps", type=int, default=50, help="learn steps per timed round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--probes", type=int, default=3, help="step pairs behind a device sleep")
    p.add_argument("--count-steps", type=int, default=110, help="steps whose syncs are counted")
    p.add_argument("--train-steps", type=int, default=0, help="also trimtab train (bench_ddp)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per torchrun launch")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
    if args.probe:
        probe_nccl_shared()
        return {}
    if not torch.cuda.is_available():
        raise SystemExit("bench_ddp_gpu.py needs CUDA (bench_ddp.py measures the CPU)")
    if args.world < 2:
        raise SystemExit("--world must be at least 2 (it is compared with one process)")
    if args.quick:
        args.steps, args.rounds, args.probes = min(args.steps, 5), min(args.rounds, 2), 2
        args.count_steps = min(args.count_steps, 4)
    gpus = torch.cuda.device_count()
    backend = "nccl" if gpus >= args.world else "gloo"
    result: dict[str, Any] = {"benchmark": "ddp_gpu", **provenance("cuda"), "gpus": gpus,
                              "quick": args.quick, "steps": args.steps, "rounds": args.rounds,
                              "global_batch": base_config(args.quick).agent.batch_size}  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="bench_ddp_gpu-"))
    probe = None
    if gpus < args.world:  # what NCCL says to ranks sharing a GPU (beside the first launch)
        from concurrent.futures import ThreadPoolExecutor

        probe = ThreadPoolExecutor(1).submit(launch, 2, args, ["--probe"], 60)
    for n, b in ((1, "nccl"), (args.world, backend)):
        key = f"world{n}_{b}"
        result[key] = measure(n, b, args, tmp)
        for name, v in result[key].get("variants", {}).items():
            timing = ""
            if "step_ms" in v:
                timing = f"{v['step_ms']:.3f} ms/step, {v['samples_per_s']:,.0f} samples/s, "
            syncs = [c and (c["syncs"], c["steps"], c["control_seen"])
                     for c in v["host_syncs_per_rank"]]  # fmt: skip
            print(f"{key} {name}: {timing}first steps behind a {v['sleep_ms']:.0f} ms sleep: "
                  f"{v['first_step_host_ms']:.1f} ms host, waited in "
                  f"{v['first_steps_waited_per_rank']} of {v['pairs']}; host syncs (in steps, "
                  f"control) {syncs}; sync-free {v['sync_free']}", flush=True)  # fmt: skip
        if "log_tail" in result[key]:
            print(result[key]["log_tail"], flush=True)
        write(args.out, result)  # what is measured so far survives a later part's failure
        if probe is not None:
            rc, log = probe.result()
            said = [
                line[:400]
                for line in log.splitlines()
                if any(w in line for w in ("NCCL", "nccl", "Duplicate", "Error", "gave"))
            ]
            result["nccl_two_ranks_one_gpu"] = {"rc": rc, "said": said[:12]}
            print(f"NCCL, 2 ranks on one GPU: rc {rc}", *said[:6], sep="\n", flush=True)
            probe = None
    one = result["world1_nccl"].get("variants")
    many = result[f"world{args.world}_{backend}"].get("variants")
    if one and many:  # ratios of step times at the same global batch: > 1 = the first slower
        w, rc_many = args.world, many["ddp_rc"]["step_ms"]
        result["summary"] = {
            f"single_1_over_ddp_rc_{w}": one["single"]["step_ms"] / rc_many,
            f"single_graph_1_over_ddp_rc_{w}": one["single_graph"]["step_ms"] / rc_many,
            "ddp_rc_over_ddp_1": one["ddp_rc"]["step_ms"] / one["ddp"]["step_ms"],
            f"ddp_rc_over_ddp_{w}": rc_many / many["ddp"]["step_ms"],
        }
        for k, v in result["summary"].items():
            print(f"{k}: {v:.3f}", flush=True)
    if args.train_steps:
        import bench_ddp

        train_out = tmp / "train.json"
        layouts = ["1x1", f"{args.world}x1"]
        train_args = ["--device", "cuda", "--steps", str(args.train_steps), "--repeats", "1",
                      "--layouts", *layouts, "--out", str(train_out)]  # fmt: skip
        if backend != "nccl":
            train_args += ["--dist-backend", backend]
        try:
            result["train"] = bench_ddp.main(train_args)
        except SystemExit as e:  # a failed layout: keep what the steps measured
            result["train"] = {"error": str(e)[-3000:]}
            print(result["train"]["error"], flush=True)
    write(args.out, result)
    return result


def write(out: Path, result: dict[str, Any]) -> None:
    write_json(out, result, indent=1)


if __name__ == "__main__":
    main()
