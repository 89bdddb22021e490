"""Record the manifest of Triton kernel variants that ``run.precompile`` compiles in worker
processes on a machine's first CUDA run (:mod:`trimtab.kernels.precompile`).

    python benchmarks/record_variants.py [--set KEY=VALUE ...] [--out DIR]

Runs the default ``trimtab train --device cuda`` (``--set`` overrides it) in this process, with
Triton's cache in an empty temporary directory and ``run.precompile = "off"``, so that every
variant the run launches is compiled here, and writes what Triton serialised for each (with its
compile seconds, which order the workers' shares) to
``src/trimtab/kernels/variants/triton-<version>-<backend>-<arch>.json``: one manifest per Triton
version and GPU architecture, recorded on a machine that has them. Rerun it after a change to a
kernel's arguments or to what the default run launches: ``benchmarks/default_run.py --cold``
shows how many variants a first run still compiles itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> Path:
    from trimtab.benchmarking import benchmark_parser, own_triton_cache

    own_triton_cache("record_variants")  # an empty one, before anything imports Triton

    p = benchmark_parser(__doc__, None, out_help="the manifests' folder (default: the package's)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)

    from trimtab.kernels import precompile
    from trimtab.rl.config import TrainConfig
    from trimtab.rl.configio import apply_overrides, from_dict
    from trimtab.rl.run.runner import train

    with tempfile.TemporaryDirectory(prefix="record-variants-") as tmp:
        sets = ['run.device="cuda"', 'run.precompile="off"', "run.progress=false",
                f'run.out="{tmp}/run"', *args.sets]  # fmt: skip
        cfg = from_dict(TrainConfig, apply_overrides({}, sets))
        with precompile.record() as entries:
            train(cfg)
    source = "trimtab train --device cuda" + "".join(f" --set {s}" for s in args.sets)
    path = precompile.write_manifest(entries, source, args.out or precompile.MANIFESTS)
    total = sum(e["seconds"] for e in entries)
    print(f"{len(entries)} variants ({total:.1f} s of compile) -> {path}")
    return path


if __name__ == "__main__":
    main()
