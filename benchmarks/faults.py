"""Fault injection: the ways a trimtab run gets hurt, and what it does about each; a table and
``faults.json``. Nothing may be lost (a resumed run equals an uninterrupted one) and nothing may
be silent (every bad value is named by the sentinel, every bad file by a one-line error).

    python benchmarks/faults.py [--quick] [--kills N] [--sigints N] [--sigterms N]
                                [--runs DIR] [--out FILE]

Scenarios: ``kill -9``, SIGINT and SIGTERM at random moments of a run, then ``--resume`` until
it is done, compared with an uninterrupted run (metrics.csv, fold results, weights); NaN, Inf and
1e30 written into each sentinel slot's buffer (each source, each watched buffer) under ``halt``;
NaN, Inf and 1e30 in a data file; a full disk at a checkpoint; a corrupted checkpoint; two
concurrent writers of one run directory; bad ticks in training windows and in a test window.
``--quick`` runs one trial of each kind on a few slots (the test suite runs it).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from trimtab.benchmarking import benchmark_parser, invocation, provenance, save_record
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import from_dict, to_toml
from trimtab.rl.data.load import DataError
from trimtab.rl.run import checkpoint as ckpt
from trimtab.rl.train import RunDirError, TrainingHalted, TrainingInterrupted, train

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "faults.json"

#: A run of a few seconds: two folds of a short market, a tiny net, a checkpoint every 4 steps.
TINY: dict[str, Any] = {
    "run": {"progress": False, "checkpoint_every": 4, "log_every": 4, "threads": 1},
    "data": {"synthetic_days": 420},
    "env": {"n_envs": 4, "episode_days": 16},
    "walkforward": {"folds": 2, "steps_per_fold": 24, "learning_starts": 16},
    "agent": {"batch_size": 16, "hidden": 16, "n_atoms": 11, "n_tau": 4, "n_tau_target": 4,
              "iqn_embed": 8, "replay_capacity": 1000, "target_update_period": 5},
}  # fmt: skip

VALUES = {"nan": math.nan, "inf": math.inf, "1e30": 1e30}


def config(out: Path, **run: Any) -> TrainConfig:
    data = copy.deepcopy(TINY)
    data["run"].update(out=str(out), **run)
    return from_dict(TrainConfig, data)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "trimtab", "train", "--no-progress", *args]


def fingerprint(run: Path) -> dict[str, Any]:
    """What must equal between a resumed run and an uninterrupted one."""
    summary = json.loads((run / "summary.json").read_text())
    blob = torch.load(run / "checkpoints" / "last.pt", weights_only=False)["state"]
    weights = {k: v.clone() for k, v in blob["agent"]["online"].items()}
    folds = [{k: f[k] for k in ("sharpe", "total_return", "steps")} for f in summary["folds"]]
    return {"metrics": (run / "metrics.csv").read_text(), "folds": folds, "weights": weights}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a["metrics"] == b["metrics"]
        and a["folds"] == b["folds"]
        and a["weights"].keys() == b["weights"].keys()
        and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    )


def finish(run: Path, toml: Path, notes: list[str]) -> None:
    """``--resume`` until the run is done (one stopped before its first checkpoint starts over
    in place; one stopped before it wrote its config.toml, a fresh start)."""
    for _ in range(5):
        if (run / "summary.json").is_file():
            return
        if (run / "config.toml").is_file():
            if not (run / "checkpoints" / "last.pt").is_file():
                notes.append("stopped before its first checkpoint: --resume started it over")
            proc = subprocess.run(cli("--resume", str(run)), capture_output=True, text=True)
        else:
            notes.append("stopped before it wrote config.toml: started afresh")
            shutil.rmtree(run, ignore_errors=True)
            proc = subprocess.run(cli("--config", str(toml), "--out", str(run)),
                                  capture_output=True, text=True)  # fmt: skip
        if proc.returncode not in (0,):
            notes.append(f"rc {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")


def interrupt_trials(kind: str, n: int, runs: Path, toml: Path, ref: dict, wall: float,
                     rng: random.Random) -> dict[str, Any]:  # fmt: skip
    """``n`` runs stopped by ``kind`` (SIGKILL, SIGINT or SIGTERM) at a random moment, then
    resumed. SIGINT (exit 130) and SIGTERM (exit 143) must print the run directory to resume."""
    sig = {"kill -9": signal.SIGKILL, "SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}[kind]
    ok, notes = 0, []
    for i in range(n):
        run = runs / f"{kind.split()[0]}{i}"
        pipe = subprocess.PIPE
        cmd = cli("--config", str(toml), "--out", str(run))
        proc = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True)
        time.sleep(rng.uniform(0.3, 1.0) * wall)
        proc.send_signal(sig)
        _, err = proc.communicate()
        code = {signal.SIGINT: 130, signal.SIGTERM: 143}.get(sig)
        if code is not None and proc.returncode == code and str(run) not in err:
            notes.append(f"{kind} message without the run dir: {err.strip()[-200:]}")
        if code is not None and proc.returncode not in (code, 0):
            notes.append(f"{kind}: exit {proc.returncode} ({err.strip()[-200:]})")
        finish(run, toml, notes)
        ok += (run / "summary.json").is_file() and same(fingerprint(run), ref)
    return {"scenario": f"{kind} at a random moment, then --resume", "trials": n, "passed": ok,
            "notes": sorted(set(notes))}  # fmt: skip


def slot_trials(runs: Path, slots: list[str] | None, values: list[str]) -> dict[str, Any]:
    """A bad value written into each slot's buffer at its phase's third check, under halt: the
    run must halt naming that slot (or, for a finite value the slot's rule does not bound, a
    slot downstream of it); a run that finishes is silent."""
    names = slots if slots is not None else _all_slots()
    rows, ok = [], 0
    for name in names:
        for label in values:
            out = runs / f"slot-{name}-{label}"

            def poison(learner: Any, name: str = name, label: str = label) -> None:
                learner.stability.checks.fault = (name, 2, VALUES[label])

            try:
                train(config(out, on_nonfinite="halt", log_every=2), setup=poison)
                named = None
            except TrainingHalted as e:
                named = str(e).split("'")[1]
            except RuntimeError as e:  # the hook wrote into a buffer autograd still needs
                rows.append({"slot": name, "value": label, "first_fired": None,
                             "verdict": "not injectable", "error": str(e)[:80]})  # fmt: skip
                shutil.rmtree(out, ignore_errors=True)
                continue
            fired = json.loads((out / "sentinel.json").read_text())["fired"]
            verdict = "named" if named == name else ("downstream" if named else "silent")
            ok += verdict != "silent"
            rows.append({"slot": name, "value": label, "first_fired": named,
                         "verdict": verdict, "fired": len(fired)})  # fmt: skip
            shutil.rmtree(out, ignore_errors=True)
    named = sum(r["verdict"] == "named" for r in rows)
    silent = [f"{r['slot']}={r['value']}" for r in rows if r["verdict"] == "silent"]
    skipped = sorted({r["slot"] for r in rows if r["verdict"] == "not injectable"})
    downstream = [f"{r['slot']}={r['value']} -> {r['first_fired']}" for r in rows
                  if r["verdict"] == "downstream"]  # fmt: skip
    notes = [f"test hook cannot write in place (autograd holds it): {', '.join(skipped)}; its "
             "data is injected at its source slot instead"] if skipped else []  # fmt: skip
    return {"scenario": f"NaN/Inf/1e30 into each sentinel slot ({len(names)} slots), halt",
            "trials": len(rows) - sum(r["verdict"] == "not injectable" for r in rows),
            "passed": ok,
            "notes": [f"{named} named at the slot itself", *notes]
            + [f"named downstream: {d}" for d in downstream] + [f"silent: {s}" for s in silent],
            "rows": rows}  # fmt: skip


def _all_slots() -> list[str]:
    from trimtab.lifecycle import Lifecycle
    from trimtab.rl.agent.learner import build_learner
    from trimtab.rl.envs.registry import make_adapter

    cfg = config(Path("unused"))
    adapter = make_adapter(cfg, torch.device("cpu"))
    with Lifecycle():
        learner = build_learner(cfg, adapter.obs_dim, adapter.branch_sizes, torch.device("cpu"))
    return list(learner.stability.sentinel.names)


def write_market(folder: Path, days: int = 420, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2016-01-01", periods=days)
    paths = []
    for name in ("A", "B"):
        close = 100 * np.exp(np.cumsum(0.01 * rng.standard_normal(days)))
        frame = pd.DataFrame({"Date": dates.date, "Open": close, "High": close * 1.01,
                              "Low": close * 0.99, "Close": close, "Volume": 1000})  # fmt: skip
        path = folder / f"{name}.csv"
        frame.to_csv(path, index=False)
        paths.append(path)
    return paths


def data_trials(runs: Path) -> dict[str, Any]:
    """NaN and Inf in a cell must be a one-line DataError naming line and column; a 1e30 bar
    (consistent OHLC) loads with a dated warning, then either trains (a short position through
    it is ruin, a finite reward) or halts naming ``env.reward`` (a long position's reward beyond
    the sentinel's threshold, a multiple of the measured target bound): loud either way."""
    ok, notes = 0, []
    for label in VALUES:
        folder = runs / f"data-{label}"
        folder.mkdir(parents=True)
        paths = write_market(folder)
        frame = pd.read_csv(paths[0])
        if label == "1e30":
            frame.loc[200, ["Open", "High", "Low", "Close"]] = 1e30
        else:
            frame.loc[200, "Close"] = VALUES[label]
        frame.to_csv(paths[0], index=False)
        data = dict(TINY, data={"paths": [str(p) for p in paths]})
        cfg = from_dict(TrainConfig, {**data, "run": {**TINY["run"], "out": str(folder / "run")}})
        try:
            summary = train(cfg)
            flagged = ("extreme", "bad tick")  # a one-bar spike that reverses is a bad tick
            good = label == "1e30" and any(
                f in w for w in summary["data_warnings"] for f in flagged
            )
            notes.append(f"{label}: trained; warnings {len(summary['data_warnings'])}")
        except DataError as e:
            good = label != "1e30" and "line 202" in str(e) and "'Close'" in str(e)
            notes.append(f"{label}: {str(e)[:90]}...")
        except TrainingHalted as e:  # the run directory holds the summary of what it did
            warned = json.loads((folder / "run" / "summary.json").read_text())["data_warnings"]
            flagged = ("extreme", "bad tick")
            good = label == "1e30" and "'env.reward'" in str(e)
            good = good and any(f in w for w in warned for f in flagged)
            notes.append(f"{label}: halted: {str(e)[:90]}...; warnings {len(warned)}")
        ok += good
    return {"scenario": "NaN/Inf/1e30 in a data file", "trials": 3, "passed": ok, "notes": notes}


def disk_full_trial(runs: Path, ref: dict) -> dict[str, Any]:
    out = runs / "disk-full"
    real, calls = ckpt.atomic_write_bytes, []

    def full(path: Any, data: bytes) -> None:
        calls.append(path)
        if len(calls) == 4:  # config.toml, two checkpoints, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    ckpt.atomic_write_bytes = full  # type: ignore[assignment]
    try:
        train(config(out))
        message = "no error"
    except RunDirError as e:
        message = str(e)
    finally:
        ckpt.atomic_write_bytes = real  # type: ignore[assignment]
    train(config(out), resume=True)
    good = "No space left" in message and "\n" not in message and same(fingerprint(out), ref)
    return {"scenario": "full disk at a checkpoint, then --resume", "trials": 1,
            "passed": int(good), "notes": [message[:160]]}  # fmt: skip


def corrupt_trial(runs: Path, ref: dict) -> dict[str, Any]:
    out = runs / "corrupt"
    with contextlib.suppress(TrainingInterrupted):
        train(config(out), stop_after=36)  # fold 0 done, mid fold 1
    path = out / "checkpoints" / "last.pt"
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 5000] = bytes(b ^ 0x5A for b in data[mid : mid + 5000])
    path.write_bytes(bytes(data))
    try:
        train(config(out), resume=True)
        message = "loaded silently"
    except ckpt.CheckpointError as e:
        message = str(e)
    train(config(out), resume=True, checkpoint=out / "checkpoints" / "fold_0.pt")
    good = "corrupted" in message and "fold_0.pt" in message and same(fingerprint(out), ref)
    return {"scenario": "5 KB corrupted in last.pt, then --resume fold_0.pt", "trials": 1,
            "passed": int(good), "notes": [message[:160]]}  # fmt: skip


def writers_trial(runs: Path, toml: Path, ref: dict) -> dict[str, Any]:
    """Two fresh runs on one --out at once, then a --resume of a running run."""
    out = runs / "writers"
    cmd = cli("--config", str(toml), "--out", str(out))
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
             for _ in range(2)]  # fmt: skip
    while not (out / "checkpoints" / "last.pt").is_file() and procs[0].poll() is None:
        time.sleep(0.1)
    second = subprocess.run(cli("--resume", str(out)), capture_output=True, text=True)
    results = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(rc for rc, _ in results)
    refused = [err.strip() for rc, err in results if rc == 2]
    good = codes == [0, 2] and second.returncode == 2 and "in use" in second.stderr
    good = good and same(fingerprint(out), ref)
    return {"scenario": "two writers of one run dir (fresh x2, then --resume of a running run)",
            "trials": 1, "passed": int(good),
            "notes": [f"exit codes {codes}; resume: {second.stderr.strip()[:100]}",
                      *(r[:100] for r in refused)]}  # fmt: skip


def tick_trials(runs: Path) -> dict[str, Any]:
    notes, ok = [], 0
    for where in ("training windows", "test window"):
        folder = runs / f"tick-{where.split()[0]}"
        folder.mkdir(parents=True)
        paths = write_market(folder)
        frame = pd.read_csv(paths[0])
        days = range(60, 400, 7) if where == "training windows" else [len(frame) - 15]
        for d in days:
            frame.loc[d, ["Open", "High", "Low", "Close"]] *= 1000
        frame.to_csv(paths[0], index=False)
        data = {**TINY, "data": {"paths": [str(p) for p in paths]}}
        runs_dict = {**TINY["run"], "out": str(folder / "run"), "on_nonfinite": "halt"}
        summary = train(from_dict(TrainConfig, {**data, "run": runs_dict}))
        flagged = bool(summary["folds"][-1]["data_flags"])
        good = summary["halted"] is None and bool(summary["data_warnings"])
        good = good and (flagged if where == "test window" else True)
        notes.append(f"{where}: halted={summary['halted']}, last fold flagged={flagged}")
        ok += good
    return {"scenario": "bad ticks (x1000 for a day)", "trials": 2, "passed": ok, "notes": notes}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, quick="one trial of each kind, a few slots")
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--sigints", type=int, default=3)
    p.add_argument("--sigterms", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=Path, help="where the runs go (default: a temporary folder)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    runs = args.runs or Path(tempfile.mkdtemp(prefix="trimtab-faults-"))
    runs.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    toml = runs / "tiny.toml"
    toml.write_text(to_toml(config(Path(""))))
    t0 = time.perf_counter()
    subprocess.run(cli("--config", str(toml), "--out", str(runs / "ref")), check=True,
                   capture_output=True)  # fmt: skip
    wall = time.perf_counter() - t0
    ref = fingerprint(runs / "ref")
    kills, sigints, sigterms = (
        (1, 1, 1) if args.quick else (args.kills, args.sigints, args.sigterms)
    )
    slots = ["env.reward", "replay.reward", "loss", "grad.trunk.0.weight"] if args.quick else None
    values = ["nan"] if args.quick else list(VALUES)
    results = [
        interrupt_trials("kill -9", kills, runs, toml, ref, wall, rng),
        interrupt_trials("SIGINT", sigints, runs, toml, ref, wall, rng),
        interrupt_trials("SIGTERM", sigterms, runs, toml, ref, wall, rng),
        slot_trials(runs, slots, values),
        data_trials(runs),
        disk_full_trial(runs, ref),
        corrupt_trial(runs, ref),
        writers_trial(runs, toml, ref),
        tick_trials(runs),
    ]
    print(f"{'scenario':<72} {'passed':>9}")
    for r in results:
        print(f"{r['scenario']:<72} {r['passed']:>4} of {r['trials']:<3}")
        for n in r["notes"][:6]:
            print(f"    {n}")
    record = {**provenance("cpu"), "quick": args.quick, "seed": args.seed,
              "command": invocation(__file__, argv), "results": results}  # fmt: skip
    save_record(args.out, "quick" if args.quick else "full", record, indent=2)
    return record


if __name__ == "__main__":
    main()
