#!/usr/bin/env bash
# A failing worker fails the job with its exit code and stops the others.
. "$(dirname "$0")/lib.sh"

start_coordinator coord
start_agent a 2
wait_hosts 1
start_agent b 2
wait_hosts 2

t0=$(now_ms)
set +e
"$KOLO" run -np 4 --coordinator "$RPC" -- \
  sh -c "if [ \$KOLO_RANK = 2 ]; then sleep 0.5; echo bye; exit 3; fi; exec sleep $SLEEP" \
  >"$WORK/run.out" 2>"$WORK/run.err"
rc=$?
set -e
took=$(( $(now_ms) - t0 ))
[ $rc -eq 3 ] || fail "kolo run exited $rc, want 3: $(cat "$WORK/run.err")"
grep -q "rank 2 on host b exited with code 3" "$WORK/run.err" || fail "no reason: $(cat "$WORK/run.err")"
grep -q '^\[2\]<stdout>:bye$' "$WORK/run.out" || fail "the failing rank's last line is missing"
[ $took -lt 8000 ] || fail "took $took ms to fail"
wait_for 5 marked_exactly 0 || fail "$(count_marked) worker(s) still running"
curl -sf "$HTTP/api/v1/jobs/1" | has '"state":"failed"' || fail "job not failed"

note "a worker killed by a signal: 128+signal"
set +e
"$KOLO" run -np 1 --coordinator "$RPC" -- sh -c 'kill -9 $$' >"$WORK/run2.out" 2>&1
rc=$?
set -e
[ $rc -eq 137 ] || fail "exit $rc, want 137"

note "a command that does not exist: 127 and a clear message"
set +e
"$KOLO" run -np 2 --coordinator "$RPC" -- /nonexistent/program >"$WORK/run3.out" 2>&1
rc=$?
set -e
[ $rc -eq 127 ] || fail "exit $rc, want 127: $(cat "$WORK/run3.out")"
grep -q "nonexistent" "$WORK/run3.out" || fail "no message: $(cat "$WORK/run3.out")"
echo PASS
