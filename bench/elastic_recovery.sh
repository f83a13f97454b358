#!/usr/bin/env bash
# bench/elastic_recovery.sh - how fast an elastic job recovers from a worker kill.
#
#   bench/elastic_recovery.sh           20 kills, 4 workers (~1-2 min on 2 vCPUs)
#
# One `kolo coordinator` and one `kolo agent --slots 4` on loopback, and an
# elastic job (`kolo run --coordinator ... -np 4 --min-np 2 --max-np 4
# --blacklist-cooldown-range 1 2`) running tests/python/elastic_worker.py
# under /usr/bin/python3: a small linear model, every rank on the same batch,
# a commit every COMMIT steps. The workers SIGKILL themselves on a seeded
# plan: KILLS kills, each of a random rank once the job is back to 4
# workers and has trained a random 3..2*COMMIT+2 steps at that size (so
# every kill hits the steady state, not a job still growing back).
#
# Per kill: recovery = the kill -> the first completed step of the next
# generation (the survivors' collective fails, they roll back to the last
# commit, the coordinator forms the generation without the dead worker, the
# ring re-forms and trains); detect = the kill -> that generation formed
# (coordinator side); back to 4 = the kill -> the first step with 4 workers
# again (after the host's 1-2 s cooldown and a new worker's start-up).
# The final weights are checked against a fault-free run.
#
# Output: a markdown table on stdout and bench/results/<UTC stamp>-elastic-recovery.{json,md};
# the run's files under build/bench-peers/raw/<stamp>-elastic-recovery/.
# Environment knobs: KILLS (20), COMMIT (5), SEED (random), SKIP_BUILD=1,
# TARGET_P50 (2.0 s: the run fails if the recovery p50 is above it).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${KOLO_BUILD_DIR:-$root/build}"
KOLO="$build/bin/kolo"
PY=/usr/bin/python3
KILLS="${KILLS:-20}"
COMMIT="${COMMIT:-5}"
SEED="${SEED:-$(( (RANDOM << 15 | RANDOM) % 1000000 ))}"
TARGET_P50="${TARGET_P50:-2.0}"
NP=4

unset KOLO_RUN_COORDINATOR KOLO_COORDINATOR KOLO_TOKEN_FILE KOLO_TOKEN KOLO_SLOTS KOLO_NAME \
    KOLO_ADDR KOLO_STATE_DIR KOLO_CONFIG KOLO_DATA_ADDR 2>/dev/null || true
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONPATH="$root/python"

ts="$(date -u +%Y%m%dT%H%M%SZ)"
name="$ts-elastic-recovery"
raw="$build/bench-peers/raw/$name"
results="$root/bench/results"
log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    log "building kolo"
    cmake --build "$build" -j2 >/dev/null 2>"$build/elastic-bench-build.log" ||
        { tail -5 "$build/elastic-bench-build.log" >&2; log "build failed"; exit 1; }
fi
[ -x "$KOLO" ] || { log "missing $KOLO"; exit 1; }
"$PY" -c 'import torch, kolo.torch' || { log "$PY cannot import torch and kolo.torch"; exit 1; }
mkdir -p "$raw" "$results" "$raw/marks"

pids=()
tag="bench$$"
cleanup() {
    local rc=$? p
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for p in $(pgrep -f "^$PY $root/tests/python/elastic_worker.py --tag $tag " || true); do
        kill -9 "$p" 2>/dev/null || true
    done
    exit $rc
}
trap cleanup EXIT
wait_for() { # SECONDS COMMAND...
    local end=$(( $(date +%s) + $1 )); shift
    until "$@" >/dev/null 2>&1; do [ "$(date +%s)" -lt $end ] || return 1; sleep 0.1; done
}

"$KOLO" coordinator --listen tcp://127.0.0.1:0 --http 127.0.0.1:0 --db "$raw/coord.db" \
    --lease 2s --heartbeat 300ms --stop-grace 2s >"$raw/coord.out" 2>"$raw/coord.err" &
pids+=($!)
wait_for 10 grep -q ready "$raw/coord.out" || { log "the coordinator did not start"; exit 1; }
RPC=$(sed -n 's/.*rpc=\([^ ]*\).*/\1/p' "$raw/coord.out")
HTTP=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$raw/coord.out")
"$KOLO" agent --coordinator "$RPC" --slots $NP --name bench --state-dir "$raw/agent" \
    >"$raw/agent.out" 2>"$raw/agent.log" &
pids+=($!)
wait_for 10 sh -c "curl -sf '$HTTP/api/v1/hosts' | grep -q '\"state\":\"alive\"'" ||
    { log "the agent did not register"; exit 1; }

RANDOM=$SEED
plan=""   # (steps trained at full size before the kill, rank)
for i in $(seq 1 "$KILLS"); do
    plan="$plan${plan:+, }[$(( 3 + RANDOM % (2 * COMMIT) )), $(( RANDOM % NP ))]"
done
plan="[$plan]"
steps=1000000   # the job ends at the stop file
log "seed $SEED, $KILLS kills, plan (step, rank) $plan"

t0=$(date +%s)
"$KOLO" run --coordinator "$RPC" -np $NP --min-np 2 --max-np $NP --blacklist-cooldown-range 1 2 -- \
    "$PY" "$root/tests/python/elastic_worker.py" --tag "$tag" --steps "$steps" --commit "$COMMIT" \
    --delay 0.02 --kills "$plan" --marks "$raw/marks" --kill-min-size $NP --stop-file "$raw/stop" \
    >"$raw/run.out" 2>"$raw/run.err" &
run_pid=$!
pids+=($run_pid)
# when the last kill is done and the job is back to 4 workers, stop it
all_back() {
    [ -e "$raw/marks/kill$((KILLS - 1))" ] || return 1
    local t; t=$(awk '/<stdout>:KILL /{ for (i = 1; i < NF; i++) if ($i == "t") t = $(i + 1) } END { print t }' "$raw/run.out")
    [ -n "$t" ] && awk -v t="$t" -v n=$NP '/<stdout>:STEP /{ for (i = 1; i < NF; i++) { if ($i == "size") s = $(i + 1); if ($i == "t") u = $(i + 1) }
        if (s == n && u > t) { f = 1; exit } } END { exit !f }' "$raw/run.out"
}
end=$(( $(date +%s) + 400 ))
until all_back; do
    kill -0 $run_pid 2>/dev/null || { log "the job ended before all kills (see $raw)"; exit 1; }
    [ "$(date +%s)" -lt $end ] || { log "the kills did not all happen in 400 s (see $raw)"; exit 1; }
    sleep 0.2
done
touch "$raw/stop"
wait_for 60 sh -c "! kill -0 $run_pid" || { log "the job did not stop"; exit 1; }
rc=0
wait "$run_pid" || rc=$?
[ $rc -eq 0 ] || { log "kolo run exited $rc (see $raw/run.err)"; exit 1; }
wall=$(( $(date +%s) - t0 ))
curl -sf "$HTTP/api/v1/jobs/1/generations" >"$raw/gens.json"
sleep 1
orphans=$(pgrep -f "^$PY $root/tests/python/elastic_worker.py --tag $tag " | wc -l || true)

set +e
"$PY" tests/integration/elastic_report.py --name elastic-recovery --seed "$SEED" --kills \
    --out "$raw/run.out" --gens "$raw/gens.json" --commit "$COMMIT" --full $NP --check-final \
    --orphans "$orphans" --json "$raw/report.json" >"$raw/report.txt"
report_rc=$?
set -e
grep -v '^RESULT ' "$raw/report.txt" >&2

"$PY" - "$raw/report.json" "$results/$name" "$TARGET_P50" "$wall" "$SEED" "$KILLS" "$COMMIT" <<'EOF'
import json, os, platform, subprocess, sys, time
rep = json.load(open(sys.argv[1]))
out, target, wall, seed, kills, commit = sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
try:
    cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
except Exception:
    cpu = platform.processor()
load = os.getloadavg()[0]
import torch
machine = {"cpus": os.cpu_count(), "cpu": cpu, "torch": torch.__version__, "load1_end": load}
rec, det, back = rep["recover_s"], rep["detect_s"], rep["regrow_s"]
doc = {"bench": "elastic-recovery", "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "machine": machine, "np": 4, "kills": kills, "commit_interval": commit, "seed": seed,
       "wall_s": wall, "target_p50_s": target, "meets_target": rec["p50"] is not None and rec["p50"] <= target,
       "recovery_s": rec, "detect_s": det, "back_to_full_s": back,
       "resets_survived": rep["resets_survived"], "resets_attempted": rep["resets_attempted"],
       "steps_lost": rep["steps_lost"], "orphans": rep["orphans"],
       "final_matches_fault_free": rep["final_matches"], "errors": rep["errors"],
       "per_kill": [{k: r.get(k) for k in ("t", "detail", "generation", "size", "detect_s", "recover_s",
                                           "regrow_s", "steps_lost")} for r in rep["faults_detail"]]}
json.dump(doc, open(out + ".json", "w"), indent=1)
f = lambda v: "-" if v is None else "%.3f" % v
md = ["# Elastic recovery: worker kill -> next generation's first step", "",
      "%s, %d CPUs (%s), torch %s; one agent with 4 slots on loopback, 4 workers "
      "(min-np 2, max-np 4, cooldown 1-2 s), commit every %d steps; %d kills (seed %s), %d s in all."
      % (doc["utc"], machine["cpus"], cpu, machine["torch"], commit, kills, seed, wall), "",
      "| figure | p50 s | max s |", "|---|---|---|",
      "| recovery: kill -> first step of the next generation | %s | %s |" % (f(rec["p50"]), f(rec["max"])),
      "| detect: kill -> next generation formed | %s | %s |" % (f(det["p50"]), f(det["max"])),
      "| back to 4 workers: kill -> first step at size 4 | %s | %s |" % (f(back["p50"]), f(back["max"])), "",
      "Target recovery p50 <= %.1f s: %s. Resets survived %d/%d; steps lost per kill max %s "
      "(commit interval %d); final weights %s a fault-free run; orphan processes %s; load1 at the end %.2f."
      % (target, "met" if doc["meets_target"] else "NOT met", doc["resets_survived"],
         doc["resets_attempted"], max(doc["steps_lost"]) if doc["steps_lost"] else "-", commit,
         "equal to" if doc["final_matches_fault_free"] else "DIFFERENT FROM", doc["orphans"], load), "",
      "| kill | step, rank | recovery s | detect s | back to 4 s | steps lost |", "|---|---|---|---|---|---|"]
for i, r in enumerate(doc["per_kill"]):
    md.append("| %d | %s | %s | %s | %s | %s |" % (i + 1, r["detail"], f(r["recover_s"]), f(r["detect_s"]),
                                                 f(r["regrow_s"]), r["steps_lost"]))
open(out + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(0 if doc["meets_target"] else 3)
EOF
md_rc=$?
log "wrote $results/$name.{json,md}"
[ $report_rc -eq 0 ] || { log "checks failed: see $raw/report.txt"; exit 1; }
exit $md_rc
