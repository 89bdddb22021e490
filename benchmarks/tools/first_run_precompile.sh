#!/usr/bin/env bash
# A machine's first `trimtab train --device cuda` with and without run.precompile, on one host:
# records the manifest of kernel variants on this machine (benchmarks/record_variants.py,
# into the package unless MANIFEST_DIR is set), then alternates cold runs (each with an empty
# Triton cache of its own: benchmarks/default_run.py --cold) of run.precompile = "off" and the
# default "auto", then one warm run after a cold one in a shared cache (the stamp path: no worker
# starts). Records go to OUT (default benchmarks/results/default_run_h200.json) under KEY_*.
# Usage: bash benchmarks/tools/first_run_precompile.sh [ROUNDS] [KEY]
# Made the cold_precompile_* and warm_precompile_* records of default_run_h200.json.
set -euo pipefail
rounds=${1:-2} key=${2:-precompile}
out=${OUT_JSON:-benchmarks/results/default_run_h200.json}
dir=${MANIFEST_DIR:-src/trimtab/kernels/variants}
python3 benchmarks/record_variants.py --out "$dir"
if [[ $dir != src/trimtab/kernels/variants ]]; then mkdir -p src/trimtab/kernels/variants; cp "$dir"/triton-*.json src/trimtab/kernels/variants/; fi
for r in $(seq 1 "$rounds"); do
  python3 benchmarks/default_run.py --device cuda --seeds 0 --jobs 1 --cold \
    --variant off run.precompile=off --out "$out" --key "cold_${key}_off_$r"
  python3 benchmarks/default_run.py --device cuda --seeds 0 --jobs 1 --cold \
    --out "$out" --key "cold_${key}_auto_$r"
done
cache=$(mktemp -d)
for k in first warm; do
  TRITON_CACHE_DIR=$cache python3 benchmarks/default_run.py --device cuda --seeds 0 --jobs 1 \
    --out "$out" --key "warm_${key}_$k"
done
