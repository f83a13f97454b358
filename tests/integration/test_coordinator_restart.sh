#!/usr/bin/env bash
# Restarting the coordinator on the same database keeps hosts and jobs, and
# agents re-attach without losing their running workers.
. "$(dirname "$0")/lib.sh"

sleepers() { [ "$(pgrep -f "^sleep 3.$MARK\$" | wc -l)" -eq "$1" ]; }

start_coordinator coord
port=${RPC##*:}
kill "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
rm -f "$WORK/coord.out"
LISTEN="tcp://127.0.0.1:$port" start_coordinator coord
start_agent a 2
wait_hosts 1
start_agent b 2
wait_hosts 2

"$KOLO" run -np 1 --coordinator "$RPC" -- true >/dev/null 2>&1 || fail "first job failed"
"$KOLO" run -np 4 --coordinator "$RPC" -- \
  sh -c "echo started \$KOLO_RANK; sleep 3.$MARK; echo finished \$KOLO_RANK" >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 10 sleepers 4 || fail "workers did not start"

note "kill -9 the coordinator and start it again on the same database"
kill -9 "$COORD_PID"
sleep 0.5
rm -f "$WORK/coord.out"
LISTEN="tcp://127.0.0.1:$port" start_coordinator coord
wait_hosts 2
sleepers 4 || fail "workers were lost"
curl -sf "$HTTP/api/v1/jobs" | has '"id":1' || fail "job 1 forgotten"
curl -sf "$HTTP/api/v1/hosts" | has '"name":"a"' || fail "host a forgotten"

set +e
wait "$RUN_PID"
rc=$?
set -e
[ $rc -eq 0 ] || fail "job failed across the restart ($rc): $(cat "$WORK/run.err")"
[ "$(grep -c 'finished' "$WORK/run.out")" -eq 4 ] || fail "not every rank finished: $(cat "$WORK/run.out")"
curl -sf "$HTTP/api/v1/jobs/2" | has '"state":"succeeded"' || fail "job 2 not succeeded"
grep -q "re-registered with running workers" "$WORK/coord.err" || fail "no re-attach logged"
echo PASS
