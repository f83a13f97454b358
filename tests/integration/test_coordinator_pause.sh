#!/usr/bin/env bash
# The coordinator stands still (issue 15, F9: "a host lost to the
# coordinator's own fault must not be excluded"): SIGSTOP for three times
# the lease, in the middle of a job, then SIGCONT. The heartbeats it could
# not read were its own fault: no host is declared lost, the job goes on
# and finishes with every allreduce right.
. "$(dirname "$0")/lib.sh"
use_python

start_coordinator coord
start_agent a 1
start_agent b 1
wait_hosts 2
start_steps 2 200 0.02
note "the coordinator stops for 6 s (the lease is 2 s)"
kill -STOP "$COORD_PID"
sleep 6
kill -CONT "$COORD_PID"
wait_for 90 sh -c "! kill -0 $RUN_PID 2>/dev/null" || fail "the job did not finish"
wait "$RUN_PID" || fail "the job failed: $(tail -5 "$WORK/run.out") $(cat "$WORK/run.err")"
grep -q "done 200" "$WORK/run.out" || fail "steps missing: $(tail -3 "$WORK/run.out")"
curl -sf "$HTTP/api/v1/events" | has '"host.lost"' && fail "a host was declared lost for the coordinator's pause"
[ "$(hosts_alive)" -eq 2 ] || fail "hosts: $(curl -sf "$HTTP/api/v1/hosts")"
grep -q "stood still" "$WORK/coord.err" || fail "the pause was not noticed: $(tail -5 "$WORK/coord.err")"
echo PASS
