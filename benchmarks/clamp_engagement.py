"""How often each adaptive clamp binds in a run: read from run directories (metrics.csv, the last
checkpoint, summary.json), so the clamp-policy ablation needs no extra instrumentation.

    python benchmarks/clamp_engagement.py RUN_DIR [RUN_DIR ...] [--out JSON] [--key NAME]

Per run: the trunk clamp's and the target clamp's engaged fraction (mean of the metrics rows,
each the fraction of clamped elements since the previous row), the bounds' exceedance fraction
that the engagement test sees (elements above the measured quantile, cumulative to the last
checkpoint: 1 - run.bound_quantile when the estimate is right), Adam's weight clamp (engaged
fraction of the weights, per parameter group), the gradient clip (fraction of steps clipped,
and of steps its engagement test counted: the norm above the bound itself, whatever
``run.clip_headroom`` is; since 2b10a86 the test counts a window of steps at a time, so this is
the mean of its windows' fractions), ``engaged/grad_clip``'s mean where the run logged it,
the C51 support's range after the first 1000 steps (a collapse shows as a small minimum), and
the greedy return when the run finished.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import torch

from trimtab.benchmarking import benchmark_parser, invocation, provenance, save_record

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "clamp_engagement.json"


def _frac(engaged: Any, seen: Any) -> list[float | None]:
    e, s = torch.as_tensor(engaged).double(), torch.as_tensor(seen).double()
    return [None if n == 0 else float(k / n) for k, n in zip(e.reshape(-1), s.reshape(-1))]


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if math.isfinite(x)]
    return math.fsum(xs) / len(xs) if xs else None


def engagement(run_dir: Path) -> dict[str, Any]:
    """The engaged fractions of one run directory (see the module docstring)."""
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))

    def col(name: str) -> list[float]:
        return [float(r[name]) for r in rows if r.get(name) not in (None, "")]

    out: dict[str, Any] = {"run_dir": str(run_dir), "rows": len(rows)}
    out["trunk_clamp"] = _mean(col("engaged/trunk_clamp"))
    out["target_clamp"] = _mean(col("engaged/target_clamp"))
    if rows and "engaged/grad_clip" in rows[0]:
        out["grad_clip_logged"] = _mean(col("engaged/grad_clip"))
    late = [float(r["bound/support"]) for r in rows if int(r["step"]) > 1000]
    out["support_after_1000"] = [min(late), max(late)] if late else None
    ckpt = run_dir / "checkpoints" / "last.pt"
    if ckpt.is_file():
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["state"]
        stab, agent = state["stability"], state["agent"]
        out["checkpoint_step"] = state["progress"]["global_step"]
        cfg = state["config"]["run"]
        out["config"] = {k: cfg.get(k) for k in ("stability", "seed", "ablate", "bound_quantile",
                                                  "clamp_headroom", "clip_headroom",
                                                  "weight_headroom")}  # fmt: skip
        if stab.get("bounds"):
            eng = stab["bounds"]["engagement"]
            out["bounds"] = dict(zip(stab["bounds"]["names"],
                                     _frac(eng["engaged_total"], eng["seen_total"])))  # fmt: skip
        opt = agent["optimizer"].get("trimtab")
        if opt:
            eng = opt["engagement"]
            out["weight_clamp"] = _frac(eng["engaged_total"], eng["seen_total"])
        if stab.get("clip"):
            out["grad_clip_steps"] = _frac(stab["clip"]["engaged"], stab["clip"]["count"])[0]
            eng = stab["clip"]["engagement"]  # the test's: norms above the bound itself
            out["grad_clip_test"] = _frac(eng["engaged_total"], eng["seen_total"])[0]
    summary = run_dir / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        if s.get("eval"):
            out["greedy_return"] = s["eval"]["mean_return"]
        out["env_steps"] = s.get("env_steps")
        out["run_commit"] = (s.get("identity") or {}).get("commit")  # the source it ran
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = benchmark_parser(__doc__, DEFAULT_OUT, key=True)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--note", default="", help="what the runs were (stored with the record)")
    args = p.parse_args(argv)
    runs = [engagement(r) for r in args.runs]
    for r in runs:
        print(json.dumps({k: v for k, v in r.items() if k != "run_dir"}), r["run_dir"])
    record = {
        **provenance(),
        "command": invocation(__file__, argv),
        "note": args.note,
        "runs": runs,
    }
    save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
