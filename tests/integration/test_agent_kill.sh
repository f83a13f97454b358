#!/usr/bin/env bash
# kill -9 of an agent: its host is lost within lease + 1 s, its workers are
# gone, and the job fails.
. "$(dirname "$0")/lib.sh"

LEASE=2s start_coordinator coord
start_agent a 2
wait_hosts 1
start_agent b 2
B_PID=$AGENT_PID
wait_hosts 2

"$KOLO" run -np 4 --coordinator "$RPC" -- sleep "$SLEEP" >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 10 marked_exactly 4 || fail "workers did not start ($(count_marked))"

t0=$(now_ms)
kill -9 "$B_PID"
wait_for 5 hosts_exactly 1 || fail "host b not lost"
lost_after=$(( $(now_ms) - t0 ))
note "host lost after $lost_after ms (lease 2000 ms)"
[ $lost_after -le 3000 ] || fail "lost after $lost_after ms > lease + 1 s"
# b's workers die with their agent; a's are stopped because the job failed
wait_for 5 marked_exactly 0 || fail "$(count_marked) worker(s) survived"
set +e
wait "$RUN_PID"
rc=$?
set -e
[ $rc -ne 0 ] || fail "kolo run should fail"
grep -q "host b lost" "$WORK/run.err" || fail "no reason: $(cat "$WORK/run.err")"
curl -sf "$HTTP/api/v1/events" | has '"kind":"host.lost"' || fail "no host.lost event"
curl -sf "$HTTP/metrics" | has 'kolo_leases_expired_total 1' || fail "lease metric"
echo PASS
