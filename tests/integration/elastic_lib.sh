# elastic_lib.sh - helpers for the elastic fault tests, sourced after lib.sh.
#
# The job runs tests/python/elastic_worker.py (every rank trains on the same
# batch, so the final weights equal a fault-free run's whatever the faults),
# submitted with `kolo run --coordinator` to the test's coordinator. Faults
# are drawn from $SEED (KOLO_SEED sets it; it is printed, so a failing run
# replays) and each one's instant goes to $WORK/faults.log, which
# elastic_report.py turns into the figures: resets survived/attempted, steps
# lost, time to detect and to recover, orphans.
#
# A test with another worker sets WORKER_CMD (an array: the worker's argv
# before --tag) before it sources this file, or ELASTIC_WORKER=c for the C
# worker kolo-test-elastic-worker (ctest passes its path in
# KOLO_ELASTIC_WORKER); it then needs no torch (elastic_report.py still
# runs under /usr/bin/python3; --check-final checks its "acc").
PY=/usr/bin/python3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORKER="$ROOT/tests/python/elastic_worker.py"
REPORT="$ROOT/tests/integration/elastic_report.py"
export PYTHONPATH="$ROOT/python" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
if [ "${ELASTIC_WORKER:-}" = c ]; then
  [ -n "${KOLO_ELASTIC_WORKER:-}" ] && [ -x "$KOLO_ELASTIC_WORKER" ] ||
    skip "KOLO_ELASTIC_WORKER (the kolo-test-elastic-worker binary) is not set (run it from ctest)"
  WORKER_CMD=("$KOLO_ELASTIC_WORKER")
fi
if [ -z "${WORKER_CMD+set}" ]; then
  WORKER_CMD=("$PY" "$WORKER")
  if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    echo "skipped: $PY has no torch"
    trap - EXIT
    rm -rf "$WORK"
    exit 77
  fi
elif ! command -v "$PY" >/dev/null; then
  echo "skipped: no $PY"
  trap - EXIT
  rm -rf "$WORK"
  exit 77
fi
seed_random
: >"$WORK/faults.log"
RUN_ARGS=()      # extra `kolo run` flags (--token-file)
JOB=""
RUN_PID=""

# Workers, found by the unique marker in their argv (not kolo run's own).
worker_pids() { pgrep -f "^${WORKER_CMD[*]} --tag $MARK " || true; }
count_workers() { worker_pids | wc -l; }
workers_exactly() { [ "$(count_workers)" -eq "$1" ]; }

elastic_cleanup() {
  local rc=$?
  local p
  set +e   # every step below must run, whatever fails
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && stacks
  for p in $(worker_pids); do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${EXTRA_CLEANUP:-}" ] && eval "$EXTRA_CLEANUP"
  # KEEP_WORK=DIR keeps a copy of the test's files there (debugging)
  [ -n "${KEEP_WORK:-}" ] && { rm -rf "$KEEP_WORK"; cp -r "$WORK" "$KEEP_WORK"; }
  (exit $rc)
  cleanup
}
trap elastic_cleanup EXIT

now_s() { local n; n=$(date +%s%N); echo "${n:0:10}.${n:10:3}"; }

# fault NAME [DETAIL]: logs the fault's instant (just before it is done).
fault() {
  local t; t=$(now_s)
  echo "FAULT $1 $t ${2:-}" >>"$WORK/faults.log"
  note "fault $1 at $t ${2:-} (seed $SEED)"
}

# start_job [kolo run flags...] -- [worker flags...]
start_job() {
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  "$KOLO" run --coordinator "$RPC" "${RUN_ARGS[@]}" "${flags[@]}" -- \
      "${WORKER_CMD[@]}" --tag "$MARK" --stop-file "$WORK/stop" "$@" \
      >"$WORK/run.out" 2>"$WORK/run.err" &
  RUN_PID=$!
  PIDS+=("$RUN_PID")
  wait_for 20 job_known || fail "the job was not submitted"
  JOB=$(curl -sf "$HTTP/api/v1/jobs" | grep -o '"id":[0-9]*' | tail -n 1 | cut -d: -f2)
}
job_known() { curl -sf "$HTTP/api/v1/jobs" | has '"id":'; }

gens_json() { curl -sf "$HTTP/api/v1/jobs/$JOB/generations"; }
gen_current() { gens_json | grep -o '"current":[0-9]*' | cut -d: -f2; }
# size of the newest generation
gen_size() { gens_json | grep -o '"size":[0-9]*' | tail -n 1 | cut -d: -f2; }
gen_size_is() { [ "$(gen_size)" = "$1" ]; }
gen_cause() { gens_json | grep -o '"cause":"[^"]*"' | tail -n 1; }
gen_after() { [ "$(gen_current)" -gt "$1" ]; }

# stepped SIZE SINCE: a worker printed a step at that size after SINCE (s).
stepped() {
  awk -v n="$1" -v since="$2" '/<stdout>:STEP / {
      s = ""; t = 0
      for (i = 1; i < NF; i++) { if ($i == "size") s = $(i + 1); if ($i == "t") t = $(i + 1) }
      if (s == n && t + 0 > since + 0) { found = 1; exit }
    } END { exit !found }' "$WORK/run.out"
}
# the highest step printed so far
last_step() {
  awk '/<stdout>:STEP / { split($1, a, ":"); s = $2 + 0; if (s > m) m = s } END { print m + 0 }' \
      "$WORK/run.out"
}
progressed() { [ "$(last_step)" -ge "$1" ]; }

events() { curl -sf "$HTTP/api/v1/jobs/$JOB/events"; }
host_id() { curl -sf "$HTTP/api/v1/hosts" | "$PY" -c '
import json, sys
for h in json.load(sys.stdin)["hosts"]:
    if h["name"] == sys.argv[1]:
        print(h["id"])' "$1"; }

gone() { ! kill -0 "$1" 2>/dev/null; }

# The job's REST view: the job, "<pid> <host> <local rank>" of every running
# rank and "<pid> <host>" of every waiting spare, one per line.
job_json() { curl -sf "$HTTP/api/v1/jobs/$JOB"; }
ranks() {
  job_json | "$PY" -c '
import json, sys
for r in json.load(sys.stdin)["ranks"]:
    if r.get("state") == "running":
        print(r["pid"], r["host_name"], r["local_rank"])'
}
spares() {
  job_json | "$PY" -c '
import json, sys
for s in json.load(sys.stdin)["elastic_state"]["spares"]:
    if s["state"] == "waiting":
        print(s["pid"], s["host"])'
}

# Host discovery from a file (kolo run --host-discovery-script
# "$DISCOVER"): the script prints what the last `hosts HOST:SLOTS...` set,
# and fails while $WORK/discovery-fails exists.
DISCOVER="$WORK/discover.sh"
cat >"$DISCOVER" <<EOF
#!/bin/sh
[ -e "$WORK/discovery-fails" ] && { echo "discovery is down" >&2; exit 3; }
cat "$WORK/hosts.txt"
EOF
chmod +x "$DISCOVER"
hosts() { printf '%s\n' "$@" >"$WORK/hosts.tmp"; mv "$WORK/hosts.tmp" "$WORK/hosts.txt"; }


# kill_rank PID [HOST]: kill -9 of a rank's worker, the fault logged first;
# sets T_KILL and waits for the next generation.
kill_rank() {
  local g0; g0=$(gen_current)
  fault worker_kill "pid $1${2:+ on $2}, step $(last_step), gen $g0"
  T_KILL=$(now_s)
  kill -9 "$1"
  wait_for 30 gen_after "$g0" || fail "no new generation after the kill ($(gen_cause))"
}

# finish_job: asks the workers to stop at their next commit; the job must
# succeed. Then no worker of the test may be left.
finish_job() {
  touch "$WORK/stop"
  wait_for "${1:-60}" gone "$RUN_PID" || fail "the job did not end after the stop file"
  local rc=0
  wait "$RUN_PID" || rc=$?
  [ $rc -eq 0 ] || fail "kolo run exited $rc: $(tail -n 5 "$WORK/run.err")"
  wait_for 10 workers_exactly 0 || true
  ORPHANS=$(count_workers)
}

# report NAME [elastic_report.py flags...]: prints the figures and checks.
report() {
  local name=$1; shift
  gens_json >"$WORK/gens.json" || fail "cannot read the generations"
  "$PY" "$REPORT" --name "$name" --seed "$SEED" --out "$WORK/run.out" --gens "$WORK/gens.json" \
      --faults "$WORK/faults.log" --orphans "${ORPHANS:-0}" "$@" || fail "the checks above failed"
}
