#!/usr/bin/env bash
# Issue 12's wall-clock targets on the GPU machine, in one call (run from the repository root with
# .whl carried): the default `trimtab train` alone (target <= 30 s wall), CartPole-v1 with
# examples/cartpole_gpu.toml over 3 seeds at once (target: solved, <= 60 s wall, adaptive), and
# the captured collection's GPU tests. JSON records go to $OUT (default benchmarks/results).
#   TRIMTAB_COMMIT=<hash> bash benchmarks/tools/h200_speed.sh [tests] [market] [cartpole] [sample] [profile]
#   sample: the default run with the GPU defaults against the CPU's on the GPU, seeds 0-2 at once
#   profile: where the default run's wall time goes (benchmarks/experiments/profile_loop.py, 1 fold)
#   CARTPOLE_SETS="--set agent.lr=2.5e-4 ...": overrides for the cartpole part
set -uo pipefail
out=${OUT:-benchmarks/results}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/site OMP_NUM_THREADS=1
parts=("$@")
[[ ${#parts[@]} -eq 0 ]] && parts=(tests market cartpole)
for part in "${parts[@]}"; do
  echo "=== $part $(date -u +%T)"
  case $part in
    tests)
      timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/rl/run/test_collect.py 2>&1 | tail -15 ;;
    market)
      # a first process compiles trimtab's Triton kernels into Triton's on-disk cache (about 45 s
      # of a first run, README "On the H200"): a --quick run first, recorded apart, so the timed
      # run measures a machine that has run trimtab before
      timeout 200 python3 benchmarks/default_run.py --device cuda --seeds 0 --jobs 1 --quick \
        --out "$out/default_run_h200.json" --key "warmup_${TRIMTAB_COMMIT:0:7}" 2>&1 | tail -2
      timeout 300 python3 benchmarks/default_run.py --device cuda --seeds 0 --jobs 1 \
        --out "$out/default_run_h200.json" --key "alone_${TRIMTAB_COMMIT:0:7}" 2>&1 | tail -4 ;;
    cartpole)
      timeout 400 python3 benchmarks/cartpole.py --config examples/cartpole_gpu.toml --device cuda \
        --modes adaptive --seeds 1 2 3 --jobs 3 --runs /tmp/cartpole-gpu ${CARTPOLE_SETS:-} \
        --out "$out/cartpole_h200.json" --key "gpu_${TRIMTAB_COMMIT:0:7}" 2>&1 | tail -6
      for s in 1 2 3; do  # the training curve: when the returns reached 475
        python3 - "/tmp/cartpole-gpu/adaptive-s$s/metrics.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(sys.argv[1].split("/")[-2], [(r["step"], r["episode_return"][:5]) for r in rows[::10]])
PY
      done ;;
    profile)
      timeout 200 python3 benchmarks/experiments/profile_loop.py --device cuda \
        --out "$out/profile_loop_h200.json" --key "market_${TRIMTAB_COMMIT:0:7}" 2>&1 | tail -12 ;;
    sample)
      timeout 500 python3 benchmarks/default_run.py --device cuda --seeds 0 1 2 --jobs 6 \
        --variant gpu_defaults --variant cpu_defaults env.n_envs=16 agent.batch_size=64 \
        --out "$out/default_run_h200.json" --key "sample_${TRIMTAB_COMMIT:0:7}" 2>&1 | tail -10 ;;
  esac
done
