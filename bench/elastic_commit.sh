#!/usr/bin/env bash
# Commit overhead of elastic training (issue: <= 5% of a 30 s epoch for a
# 100 MB state committed every epoch). Runs bench/elastic_commit.py on 2
# workers three ways - no commit, Horovod's in-memory commit, kolo's
# durable commit - with the same steps per epoch, and writes
# bench/results/<stamp>-elastic-commit.{json,md}.
#   SKIP_BUILD=1 bench/elastic_commit.sh [--state-mb 100] [--epochs 4]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ "${SKIP_BUILD:-0}" = 1 ] || "$root/scripts/build.sh" >/dev/null
kolo="${KOLO_BUILD_DIR:-$root/build}/bin/kolo"
export PYTHONPATH="$root/python" OMP_NUM_THREADS=1
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="$root/bench/results/$stamp-elastic-commit"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {
  "$kolo" run -np 2 --min-np 1 --max-np 2 -- /usr/bin/python3 "$root/bench/elastic_commit.py" "$@" \
    2>"$tmp/err" | sed -n 's/^\[0\]<stdout>://p' | grep '^{' | tail -1
}
# calibrate the steps per epoch once, then use them for every mode
first=$(run --mode none "$@")
steps=$(echo "$first" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["steps"])')
{
  echo "$first"
  run --mode memory --steps "$steps" "$@"
  run --mode durable --steps "$steps" "$@"
  run --mode none --steps "$steps" "$@"
} >"$tmp/runs.jsonl"
/usr/bin/python3 - "$tmp/runs.jsonl" "$out" <<'PY'
import json, statistics, sys, platform, os
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in runs:
    by.setdefault(r["mode"], []).extend(r["epoch_s"][1:])   # first epoch warms up
med = {m: statistics.median(v) for m, v in by.items()}
calls = {r["mode"]: statistics.median(r["commit_call_s"][1:]) for r in runs if r["mode"] != "none"}
base = med["none"]
rows = []
for m in ("memory", "durable"):
    added = med[m] - base
    rows.append((m, med[m], added, added / 30.0 * 100, calls[m]))
res = {"machine": platform.node(), "cpus": os.cpu_count(), "state_mb": runs[0]["state_mb"],
       "steps_per_epoch": runs[0]["steps"], "epoch_median_s": med,
       "commit_call_median_s": calls,
       "overhead_pct_of_30s_epoch": {m: round(p, 2) for m, _, _, p, _ in rows}, "runs": runs}
json.dump(res, open(sys.argv[2] + ".json", "w"), indent=1)
with open(sys.argv[2] + ".md", "w") as f:
    f.write("# Elastic commit overhead, %d MB state, commit every epoch\n\n" % res["state_mb"])
    f.write("2 workers, %d steps per epoch; medians over epochs 2..N of each run.\n\n" % res["steps_per_epoch"])
    f.write("| commit | epoch (s) | added per epoch (s) | share of a 30 s epoch | commit() call (s) |\n|---|---|---|---|---|\n")
    f.write("| none | %.3f | | | |\n" % base)
    for m, e, added, pct, call in rows:
        f.write("| %s | %.3f | %.3f | %.1f%% | %.3f |\n" % (m, e, added, pct, call))
print(open(sys.argv[2] + ".md").read())
PY
