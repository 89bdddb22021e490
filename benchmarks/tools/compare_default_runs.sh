#!/usr/bin/env bash
# The default `trimtab train` of two source trees over seeds, all runs at once, and the mean fold
# Sharpe per tree (mean over seeds ± s.e. of each seed's mean over folds) into a JSON.
# Usage: bash benchmarks/tools/compare_default_runs.sh OLD_SRC NEW_SRC OUT.json [DEVICE] [SEEDS...]
#   OLD_SRC, NEW_SRC: the src/ folders of two checkouts (e.g. of `git worktree add`)
# Made benchmarks/results/default_run_old_vs_new_h200.json (device cuda, seeds 0 1 2).
set -uo pipefail
old=$1 new=$2 out=$3 device=${4:-cpu}
shift 4 2>/dev/null || shift $#
seeds=("$@")
[[ ${#seeds[@]} -eq 0 ]] && seeds=(0 1 2)
runs=$(mktemp -d)
for s in "${seeds[@]}"; do
  for tree in old new; do
    src=$old; [[ $tree == new ]] && src=$new
    PYTHONPATH=$src${PYTHONPATH:+:$PYTHONPATH} python3 -m trimtab train --device "$device" \
      --seed "$s" --set run.progress=false --out "$runs/$tree$s" > "$runs/$tree$s.log" 2>&1 &
  done
done
wait
python3 - "$runs" "$out" <<'PY'
import glob, json, math, sys
runs, out = sys.argv[1], sys.argv[2]
rows = {}
for path in sorted(glob.glob(f"{runs}/*/summary.json")):
    s = json.load(open(path))
    rows[path.split("/")[-2]] = {
        "folds": [{k: f.get(k) for k in ("fold", "sharpe", "buy_hold_sharpe", "nonfinite")}
                  for f in s["folds"]], "halted": s.get("halted"), "seconds": s.get("seconds")}
result = {"runs": rows}
for tree in ("old", "new"):
    vals = [sum(f["sharpe"] for f in r["folds"]) / len(r["folds"])
            for n, r in rows.items() if n.startswith(tree) and r["folds"]]
    n = len(vals)
    mean = sum(vals) / n if n else float("nan")
    se = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1) / n) if n > 1 else float("nan")
    result[tree] = {"n": n, "mean_fold_sharpe": mean, "stderr": se, "per_seed": vals}
    print(tree, result[tree])
json.dump(result, open(out, "w"), indent=1)
PY
