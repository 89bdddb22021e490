#!/usr/bin/env bash
# The stress proof in parallel on a many-core machine: one process per (market, mode, seed)
# cell, one torch thread each, then one merged table and JSON.
#   SEEDS=5 STEPS=800 bash benchmarks/stress_parallel.sh OUT_DIR
set -uo pipefail
out=${1:-/tmp/stress}
seeds=${SEEDS:-5}
steps=${STEPS:-800}
limit=${LIMIT:-540}
mkdir -p "$out/shards"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
for market in default stress; do
  for mode in adaptive fixed off; do
    for ((seed = 0; seed < seeds; seed++)); do
      timeout "$limit" python3 benchmarks/stress.py --device cpu --steps "$steps" \
        --markets "$market" --modes "$mode" --seed-list "$seed" \
        --out "$out/shards/$market-$mode-$seed.json" >"$out/shards/$market-$mode-$seed.log" 2>&1 &
    done
  done
done
wait
shards=("$out"/shards/*.json)
echo "shards finished: ${#shards[@]} of $((2 * 3 * seeds))"
python3 benchmarks/stress.py --device cpu --steps "$steps" --seed-list --merge "${shards[@]}" \
  --out "$out/stress.json"
