#!/usr/bin/env bash
# One device call of the reward-scale grid (benchmarks/scale.py, README "Reward scale") on the
# H200 host: CartPole trials as single-threaded CPU processes, market trials on the GPU, both
# resumable, so a grid spreads over several calls (the run directories stay under .grid/ while
# the machine is held; the call also sends them back as tarballs to resume from elsewhere).
#
#   TRIMTAB_COMMIT=<hash> [CP_DEVICE=cuda] bash benchmarks/tools/h200_grid.sh SECONDS [CARTPOLE_JOBS] \
#       [MARKET_JOBS] [tests]
#
# CP_DEVICE: where the CartPole trials train (cpu: one core each; cuda, the default: the GPU,
# shared by the processes, each with its own core). Market trials train on the GPU.
# SECONDS: the grid's --time-limit (trials still running then stop at their last checkpoint).
# "tests" also runs the GPU test files beside the grid, on the cores it leaves free.
# Before a call on a fresh machine, unpack earlier tarballs: tar xzf grid_*.tgz (from the repo).
set -uo pipefail
OUT=${OUT:-/tmp/trimtab-out}
mkdir -p "$OUT"
limit=${1:?the grid time limit in seconds}
cp_jobs=${2:-12}
mk_jobs=${3:-3}
what=${4:-}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:/tmp/site"
for t in .grid/carry/*.tgz; do [[ -f $t ]] && tar xzf "$t"; done
RUNS=.grid/runs
CP_DEVICE=${CP_DEVICE:-cuda}
R=/tmp/gridout  # tables, plots and logs: one tarball back ($OUT takes at most 8 files)
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
nproc | tee -a "$OUT/gpu.txt"
pids=()
if ((cp_jobs > 0)); then
  python3 benchmarks/scale.py --envs cartpole --device "$CP_DEVICE" --engine pool \
    --jobs "$cp_jobs" --time-limit "$limit" --runs "$RUNS/$CP_DEVICE" --no-units-check \
    --out "$R/scale_cartpole_$CP_DEVICE.json" \
    >"$R/grid_cartpole.log" 2>&1 &
  pids+=($!)
fi
if ((mk_jobs > 0)); then
  python3 benchmarks/scale.py --envs market --device cuda --engine pool --jobs "$mk_jobs" \
    --time-limit "$limit" --runs "$RUNS" --no-units-check --out "$R/scale_market.json" \
    >"$R/grid_market.log" 2>&1 &
  pids+=($!)
fi
if [[ $what == tests ]]; then
  timeout $((limit - 20)) python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests} \
    2>&1 | tee "$OUT/gpu_tests.log" | tail -15
fi
wait "${pids[@]}"
tail -n 5 "$R"/grid_*.log
tar czf "$OUT/grid_results.tgz" -C /tmp gridout
# finished runs: their light files; unfinished: their last checkpoint and config (to resume)
find "$RUNS" -name summary.json -printf '%h\n' | sort >/tmp/done.txt
{ while read -r d; do ls "$d"/*.json "$d"/*.csv "$d"/*.toml "$d"/*.log 2>/dev/null; done </tmp/done.txt
  find "$RUNS" -name .trimtab-sweep -o -name 'seed*.toml'; } >/tmp/light.txt
tar czf "$OUT/grid_done.tgz" -T /tmp/light.txt
for env in cpu/cartpole cuda/cartpole market; do
  find "$RUNS/$env" -mindepth 2 -maxdepth 2 -type d -name 'seed*' 2>/dev/null | while read -r d; do
    grep -qx "$d" /tmp/done.txt || ls "$d"/config.toml "$d"/checkpoints/last.pt "$d"/*.csv 2>/dev/null
  done >"/tmp/open_${env//\//_}.txt"
  [[ -s /tmp/open_${env//\//_}.txt ]] &&
    tar czf "$OUT/grid_open_${env//\//_}.tgz" -T "/tmp/open_${env//\//_}.txt"
done
ls -la "$OUT"
