#!/usr/bin/env bash
# The dashboard in a real browser: a coordinator, four agents (one slot
# each, so every worker is on its own "host"), and a 4-worker elastic
# digits job (train_job.py) whose rank 2 sleeps in every step; then
# test_dashboard.mjs drives Debian's chromium through the pages and kills
# a worker. Screenshots land in $KOLO_ARTIFACTS (build/test-artifacts/
# dashboard by default).
#
# Skips (77) without chromium, node or playwright-core (npm ci in
# tests/browser), unless CI is set: CI installs them, so there it fails.
. "$(cd "$(dirname "$0")" && pwd)/browser_lib.sh" dashboard torch sklearn
# a lease long enough that a crowded CI machine loses no host by accident
LEASE=10s start_coordinator coord
for a in a b c d; do start_agent "$a" 1; done
wait_hosts 4

"$KOLO" run --coordinator "$RPC" -np 4 --min-np 2 --max-np 4 \
    --timeline-filename "$WORK/timeline.json" -- \
    "$PY" "$HERE/train_job.py" --slow-rank 2 --slow-s 0.12 --stop-file "$WORK/stop" \
    --tag "$SLEEP" >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
job_running() { curl -sf "$HTTP/api/v1/jobs" | has '"state":"running"'; }
wait_for 30 job_running || fail "the job did not start"
JOB=$(curl -sf "$HTTP/api/v1/jobs" | grep -o '"id":[0-9]*' | tail -n 1 | cut -d: -f2)
note "job $JOB running, dashboard $HTTP/#/jobs/$JOB"

rc=0
# the dashboard's link with its key (a job's output is its owner's)
KOLO_VIEW_KEY=$(sed 's/.*?key=//' "$WORK/coord.db.dashboard")
export KOLO_VIEW_KEY
node "$HERE/test_dashboard.mjs" "$HTTP" "$JOB" "$ARTIFACTS" || rc=$?
[ $rc -eq 0 ] || fail "the browser checks failed (screenshots in $ARTIFACTS)"

# the job ends cleanly at the stop file
# kolo stop takes every rank's stacks before it stops them (issue 31):
# the ended job's page shows them, at 1280 and 390 px
"$KOLO" stop --coordinator "$RPC" --reason "the browser test is done" "$JOB" >"$WORK/stop.out" 2>&1 ||
  fail "kolo stop failed: $(cat "$WORK/stop.out")"
gone() { ! kill -0 "$1" 2>/dev/null; }
wait_for 60 gone "$RUN_PID" || fail "the job did not end after kolo stop"
rc=0
wait "$RUN_PID" || rc=$?
[ $rc -eq 143 ] || fail "kolo run exited $rc after kolo stop, want 143: $(tail -n 5 "$WORK/run.err")"
rc=0
node "$HERE/test_dashboard.mjs" "$HTTP" "$JOB" "$ARTIFACTS" ended || rc=$?
[ $rc -eq 0 ] || fail "the browser checks of the ended job failed (screenshots in $ARTIFACTS)"
note "screenshots in $ARTIFACTS"
