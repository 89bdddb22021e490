#!/usr/bin/env bash
# One device call: GPU tests, then every GPU benchmark; JSON and logs land in $OUT.
# Usage on the device machine: bash benchmarks/tools/gpu_tier.sh [tests|bench|all] [bench names...]
set -uo pipefail
OUT=${OUT:-/tmp/trimtab-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
what=${1:-all}
shift || true
benches=("$@")
[[ ${#benches[@]} -eq 0 ]] && benches=(quantile sentinel optim)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
rc=0
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -p no:cacheprovider tests -k "not supervised" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  rc=${PIPESTATUS[0]}
fi
if [[ $what == bench || $what == all ]]; then
  for b in "${benches[@]}"; do
    if [[ -f benchmarks/bench_$b.py ]]; then
      echo "== bench_$b"
      timeout 240 python3 benchmarks/bench_$b.py ${BENCH_ARGS:-} --out "$OUT/$b.json" 2>&1 | tee "$OUT/bench_$b.log" | tail -30
    fi
  done
fi
exit $rc
