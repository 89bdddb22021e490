#!/usr/bin/env bash
# One device call of chosen parts (GPU tests, the precompile manifest, censuses, timings); JSON,
# logs and the manifest land in $OUT. Run from the repository root with .whl carried:
#   TRIMTAB_COMMIT=<hash> bash benchmarks/tools/gpu_parts.sh PART [PART ...]
# Parts (in the order given; each under its own time limit, so one that hangs leaves the rest):
#   tests     the GPU tests of the kernels, the sentinel's fold, the envs, replay and collection
#   variants  re-record the precompile manifest (benchmarks/record_variants.py) into $OUT/variants
#   census    eager kernels a batched step: the default market run and examples/cartpole_fast.toml
#   default   the default `trimtab train --device cuda`, warm (a --quick run fills the caches first)
#   envstep   benchmarks/bench_env_step.py (the env-step kernels against their references)
#   pop32     32 seeds of examples/cartpole_fast.toml as one population
#   startup   where the default run's time outside its own timings goes (profile_startup.py)
#   kernels   the library kernels' benchmarks (sentinel, quantile, optimizer); on an H200 only
#   market    the market figure on the GPU: agent_vs_baselines.py --device cuda, seeds 0-9
#   threads   whether graph launches from several host threads overlap (probe_graph_branches.py)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
out=${OUT:-/tmp/trimtab-out}
c=${TRIMTAB_COMMIT:-dev}
c=${c:0:7}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
: > /tmp/empty.toml  # the default config
for part in "$@"; do
  echo "=== $part $(date -u +%T)"
  case $part in
    tests)
      timeout 480 python3 -m pytest -q -m "" -p no:cacheprovider tests/test_market_kernel.py \
        tests/test_ema_kernel.py tests/test_cartpole_kernel.py tests/rl/agent/test_checks.py \
        tests/rl/envs/test_env.py tests/rl/envs/test_cartpole_env.py tests/rl/agent/test_replay.py \
        tests/rl/run/test_collect.py \
        tests/rl/agent/test_learner_gpu.py 2>&1 | tee "$out/tests.log" | tail -30 ;;
    variants)
      mkdir -p "$out/variants"
      timeout 300 python3 benchmarks/record_variants.py --out "$out/variants" 2>&1 | tail -5 ;;
    census)
      timeout 240 python3 benchmarks/experiments/profile_member_step.py --census --config /tmp/empty.toml \
        --skip 1000 --steps 20 --out "$out/census.json" --key "market_census_$c" 2>&1 | tail -4
      timeout 240 python3 benchmarks/experiments/profile_member_step.py --census \
        --config examples/cartpole_fast.toml --steps 20 --out "$out/census.json" \
        --key "cartpole_fast_census_$c" 2>&1 | tail -4 ;;
    default)
      timeout 200 python3 benchmarks/default_run.py --device cuda --seeds 0 --jobs 1 --quick \
        --runs /tmp/dq --out "$out/default_run.json" --key "warmup_$c" 2>&1 | tail -2
      timeout 200 python3 benchmarks/default_run.py --device cuda --seeds 0 --jobs 1 \
        --runs /tmp/dw --out "$out/default_run.json" --key "warm_$c" 2>&1 | tail -4 ;;
    envstep)
      timeout 300 python3 benchmarks/bench_env_step.py --device cuda --out "$out/env_step.json" \
        2>&1 | tail -16 ;;
    pop32)
      timeout 240 python3 benchmarks/population.py --device cuda --config examples/cartpole_fast.toml \
        --seeds $(seq 1 32) --ways population --out "$out/population.json" --key "pop32_$c" \
        2>&1 | tail -6 ;;
    startup)
      timeout 200 python3 benchmarks/experiments/profile_startup.py --device cuda --warm \
        --out "$out/startup.json" --key "default_$c" 2>&1 | tail -16 ;;
    kernels)
      if [[ $gpu != *H200* ]]; then echo "not an H200 ($gpu): kernel benchmarks skipped"; continue; fi
      timeout 200 python3 benchmarks/bench_sentinel.py --device cuda --out "$out/sentinel.json" 2>&1 | tail -12
      timeout 200 python3 benchmarks/bench_quantile.py --out "$out/quantile.json" 2>&1 | tail -20
      timeout 200 python3 benchmarks/bench_optim.py --out "$out/optim.json" 2>&1 | tail -12 ;;
    market)
      timeout 420 python3 benchmarks/agent_vs_baselines.py --device cuda --seeds $(seq 0 9) \
        --jobs 10 --runs /tmp/avb --out "$out/agent_vs_baselines.json" --key "n4_gpu_$c" \
        2>&1 | tail -12 ;;
    threads)
      timeout 300 python3 benchmarks/experiments/probe_graph_branches.py --members 8 32 \
        --threads 2 4 8 --out "$out/graph_branches.json" --key "threads_$c" 2>&1 | tail -12 ;;
    *) echo "unknown part $part" ;;
  esac
done
