#!/usr/bin/env bash
# kolo run with its embedded coordinator and agent: it runs a job, and
# Ctrl-C stops the job and leaves no process behind.
. "$(dirname "$0")/lib.sh"
export XDG_STATE_HOME="$WORK/state"

note "embedded run"
"$KOLO" run -np 4 -- sh -c 'echo rank $KOLO_RANK of $KOLO_SIZE' >"$WORK/run.out" 2>"$WORK/run.err" \
  || fail "embedded run failed: $(cat "$WORK/run.err")"
[ "$(grep -c 'of 4$' "$WORK/run.out")" -eq 4 ] || fail "$(cat "$WORK/run.out")"
ls "$WORK/state/kolo/runs/"run-*.db >/dev/null || fail "no run database in the state directory"
grep -q "dashboard http://127.0.0.1:" "$WORK/run.err" || fail "no dashboard address"

note "exit code of the job"
set +e
"$KOLO" run -np 2 -- sh -c 'exit $((KOLO_RANK + 4))' >/dev/null 2>&1
rc=$?
set -e
[ $rc -eq 4 ] || [ $rc -eq 5 ] || fail "exit $rc, want 4 or 5"

note "Ctrl-C"
"$KOLO" run -np 3 -- sh -c "trap '' TERM; sleep $SLEEP" >"$WORK/int.out" 2>"$WORK/int.err" &
RUN_PID=$!
wait_for 10 marked_exactly 3 || fail "workers did not start"
kill -INT "$RUN_PID"
set +e
wait "$RUN_PID"
rc=$?
set -e
[ $rc -eq 130 ] || fail "kolo run exited $rc after SIGINT, want 130"
[ "$(count_marked)" -eq 0 ] || fail "$(count_marked) worker(s) left behind"
kill -0 "$RUN_PID" 2>/dev/null && fail "kolo run still running"
grep -q "stopping job" "$WORK/int.err" || fail "no stop message"
echo PASS
