"""What a machine's first ``trimtab train --device cuda`` spends compiling: every Triton kernel
variant it compiles, with Triton's own timing of each stage (``triton.knobs.compilation.
listener``: IR build, ttir, ttgir, llir, ptx, cubin), its constexprs and launch options.

    python benchmarks/experiments/probe_compile.py --device cuda [--set KEY=VALUE ...] \\
        [--cache DIR] [--out FILE --key NAME]

The run is the default market run in this process (``--set`` overrides it), with Triton's
cache in an empty temporary directory unless ``--cache`` names one (set before Triton is
imported): a first run. Prints one line per compiled variant, slowest first, and the run's wall
time; ``--out`` adds a JSON record (machine, date, commit).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from trimtab.benchmarking import (
        benchmark_parser,
        invocation,
        own_triton_cache,
        provenance,
        save_record,
    )

    p = benchmark_parser(__doc__, None, device="cuda", key=True, out_help="JSON to add a record to")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--cache", type=Path, default=None, help="Triton cache (default: empty temp)")
    args = p.parse_args(argv)
    own_triton_cache("probe_compile", args.cache)  # before anything imports Triton

    import triton

    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict
    from trimtab.rl.run.runner import train

    compiles: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def listener(*, src: Any, metadata: Any, times: Any, cache_hit: bool, **_: Any) -> None:
        stages = {name: us / 1e6 for name, us in times.lowering_stages}
        total = times.ir_initialization / 1e6 + sum(stages.values()) + times.store_results / 1e6
        constexprs = getattr(src, "constexprs", None) or getattr(src, "constants", {})
        compiles.append({
            "name": getattr(src, "name", "?"), "cache_hit": cache_hit, "total_s": total,
            "ir_s": times.ir_initialization / 1e6, "stages_s": stages,
            "at_s": time.perf_counter() - t0,
            "num_warps": metadata.get("num_warps") if isinstance(metadata, dict) else None,
            "constexprs": {str(k): repr(v) for k, v in dict(constexprs).items()},
            "signature": {str(k): str(v) for k, v in dict(src.signature).items()},
        })  # fmt: skip

    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.compilation, "listener"):
        raise SystemExit(f"probe_compile: Triton {triton.__version__} has no compile listener")
    knobs.compilation.listener = listener
    with tempfile.TemporaryDirectory(prefix="probe-compile-") as tmp:
        sets = [f'run.device="{args.device}"', "run.progress=false", f'run.out="{tmp}/run"',
                *args.sets]  # fmt: skip
        cfg = from_dict(TrainConfig, apply_overrides({}, sets))
        summary = train(cfg)
    wall = time.perf_counter() - t0
    compiled = [c for c in compiles if not c["cache_hit"]]
    compiled.sort(key=lambda c: -c["total_s"])
    for c in compiled:
        stages = " ".join(f"{k} {v:.2f}" for k, v in c["stages_s"].items())
        print(f"{c['total_s']:6.2f} s  at {c['at_s']:6.1f} s  {c['name']:24} ir {c['ir_s']:.2f} "
              f"{stages}", flush=True)  # fmt: skip
    total = sum(c["total_s"] for c in compiled)
    print(f"{len(compiled)} variants compiled, {total:.1f} s of compile; run wall {wall:.1f} s, "
          f"train {summary['seconds']:.1f} s")  # fmt: skip
    record = {**provenance(args.device), "command": invocation(__file__, argv), "sets": args.sets,
              "wall_s": wall, "train_s": summary["seconds"], "compile_s": total,
              "variants": len(compiled), "compiles": compiled}  # fmt: skip
    if args.out is not None:
        save_record(args.out, args.key, record)
    return record


if __name__ == "__main__":
    main()
