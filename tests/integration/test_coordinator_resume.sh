#!/usr/bin/env bash
# kill -9 of the coordinator in the middle of training, three times: the
# job (a fixed-size one, so any reset would fail it) goes on with every
# allreduce correct: the restarted coordinator resumes the negotiation
# from what the ranks hold, without a reset and without losing a step.
. "$(dirname "$0")/lib.sh"
use_python

start_coordinator coord
port=${RPC##*:}
start_agent a 2
start_agent b 2
wait_hosts 2

start_steps 4 2500 0.002
wait_for 30 progress_at_least 8 || fail "training stalled: $(cat "$WORK/run.err")"

for i in 1 2 3; do
  before=$(steps_seen)
  t0=$(now_ms)
  kill -9 "$COORD_PID"
  note "restart $i: coordinator killed at $t0 ms after $before progress lines"
  sleep 0.3
  mv "$WORK/coord.err" "$WORK/coord.$i.err"
  LISTEN="tcp://127.0.0.1:$port" start_coordinator coord
  wait_for 20 grep -q "resumed after a coordinator restart" "$WORK/coord.err" \
    || fail "restart $i: no resume: $(tail -20 "$WORK/coord.err")"
  wait_for 20 progress_at_least $((before + 5)) || fail "restart $i: training stalled"
  note "restart $i: training went on $(( $(now_ms) - t0 )) ms after the kill"
done

set +e
wait "$RUN_PID"
rc=$?
set -e
[ $rc -eq 0 ] || fail "job failed across the restarts ($rc): $(tail -20 "$WORK/run.err")"
[ "$(grep -c '<stdout>:done 2500' "$WORK/run.out")" -eq 4 ] || fail "not every rank finished"
! grep -q WRONG "$WORK/run.out" || fail "a wrong allreduce result"
job=$(curl -sf "$HTTP/api/v1/jobs/1") || fail "GET /api/v1/jobs/1 failed"
echo "$job" | has '"generation":1,' || fail "the job was reset: $job"
metrics=$(curl -sf "$HTTP/metrics") || fail "GET /metrics failed"
echo "$metrics" | has '^kolo_negotiation_resumes_total 1$' || fail "no resume metric"
echo "$metrics" | has '^kolo_negotiation_wait_seconds_count [1-9]' || fail "no negotiation waits"
echo "$metrics" | /usr/bin/python3 "$(dirname "$0")/check_metrics.py" || fail "/metrics is not valid exposition text"
echo PASS
