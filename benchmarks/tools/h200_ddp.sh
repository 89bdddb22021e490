#!/usr/bin/env bash
# Issue 15, the multi-process learner on CUDA, in one device call (from the repository root, .whl
# carried; JSON to $OUT, default benchmarks/results, named by the machine's GPU count):
#   bench  benchmarks/bench_ddp_gpu.py: the learn step on WORLD ranks (default 2) against 1 at
#          one global batch, RankConsistent over plain DDP, host waits and sync-freedom; one
#          process per GPU on NCCL, or (fewer GPUs than ranks) the ranks sharing them via gloo
#   tests  tests/rl/run/test_ddp_gpu.py: a NaN on rank 1 halts both ranks with one report; every
#          rank's learn step sync-free (NCCL, one rank per GPU)
#   train  bench_ddp.py --device cuda --full: the default `trimtab train`, 1 process against
#          one per GPU: wall time and fold table (about 2 min on 1 GPU, longer eager under DDP)
#   TRIMTAB_COMMIT=<hash> bash benchmarks/tools/h200_ddp.sh [bench] [tests] [train]
# On 2 GPUs (kind nvidia-h200-x2): `bench tests` in one call (about 3-4 min), `train` in another
# (the default run captured on 1 GPU, about 110 s, then eager under DDP on 2: unmeasured).
# One GPU (2 ranks sharing it through gloo) ran `bench tests` at dce95fe: README, ddp_h200_1gpu.json
set -uo pipefail
out=${OUT:-benchmarks/results}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/site OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
world=${WORLD:-2}
parts=("$@")
[[ ${#parts[@]} -eq 0 ]] && parts=(bench tests)
for part in "${parts[@]}"; do
  echo "=== $part $(date -u +%T), $gpus GPU(s)"
  case $part in
    bench)
      timeout ${BENCH_TIMEOUT:-170} python3 benchmarks/bench_ddp_gpu.py --world "$world" \
        --steps 30 --rounds 3 --timeout 110 --out "$out/ddp_h200_${gpus}gpu.json" ;;
    tests)
      timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -x -p no:cacheprovider \
        tests/rl/run/test_ddp_gpu.py 2>&1 | tail -25 ;;
    train)
      timeout 560 python3 benchmarks/bench_ddp.py --device cuda --full --repeats 1 \
        --layouts 1x1 "${gpus}x1" --out "$out/ddp_train_h200_${gpus}gpu.json" ;;
  esac
done
