#!/usr/bin/env bash
# A coordinator, two agents with 2 slots each, and a 4-process job whose
# output shows every rank exactly once with the right values.
. "$(dirname "$0")/lib.sh"

start_coordinator coord
start_agent a 2
wait_hosts 1
start_agent b 2
wait_hosts 2

note "4 ranks over 2 agents"
"$KOLO" run -np 4 --coordinator "$RPC" -- \
  sh -c 'echo $KOLO_RANK $KOLO_SIZE $KOLO_LOCAL_RANK $KOLO_LOCAL_SIZE $KOLO_CROSS_RANK $KOLO_CROSS_SIZE $HOROVOD_RANK $HOROVOD_HOSTNAME; echo "err $KOLO_RANK" >&2' \
  >"$WORK/run.out" 2>"$WORK/run.err" || fail "kolo run failed: $(cat "$WORK/run.err")"
cat "$WORK/run.out"
[ "$(grep -c '<stdout>:' "$WORK/run.out")" -eq 4 ] || fail "expected 4 stdout lines"
for r in 0 1 2 3; do
  line=$(grep "^\[$r\]<stdout>:" "$WORK/run.out") || fail "rank $r missing"
  [ "$(grep -c "^\[$r\]<stdout>:" "$WORK/run.out")" -eq 1 ] || fail "rank $r printed twice"
  set -- ${line#*:}
  [ "$1" = "$r" ] && [ "$2" = 4 ] && [ "$3" = $((r % 2)) ] && [ "$4" = 2 ] || fail "rank $r: bad values: $line"
  [ "$5" = $((r / 2)) ] && [ "$6" = 2 ] && [ "$7" = "$r" ] || fail "rank $r: bad cross values: $line"
  host=$([ $r -lt 2 ] && echo a || echo b)
  [ "$8" = "$host" ] || fail "rank $r ran on $8, expected $host"
  grep -q "^\[$r\]<stderr>:err $r$" "$WORK/run.err" || fail "rank $r stderr missing"
done

note "-H picks hosts in its order"
"$KOLO" run -np 3 -H b:1,a:2 --coordinator "$RPC" -- sh -c 'echo $KOLO_RANK $HOROVOD_HOSTNAME' \
  >"$WORK/run2.out" 2>&1 || fail "kolo run -H failed"
grep -q '^\[0\]<stdout>:0 b$' "$WORK/run2.out" || fail "rank 0 should be on b: $(cat "$WORK/run2.out")"
grep -q '^\[2\]<stdout>:2 a$' "$WORK/run2.out" || fail "rank 2 should be on a"

note "np over the slots: pending with a reason, then a start-timeout failure"
set +e
"$KOLO" run -np 9 --start-timeout 1s --coordinator "$RPC" -- true >"$WORK/run3.out" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] || fail "np 9 on 4 slots should fail"
grep -q "waiting for slots" "$WORK/run3.out" || fail "no pending reason shown: $(cat "$WORK/run3.out")"

note "kolo status lists hosts and jobs"
"$KOLO" status --coordinator "$RPC" >"$WORK/status.out"
grep -q "HOSTS (2)" "$WORK/status.out" || fail "status: $(cat "$WORK/status.out")"
grep -q "succeeded" "$WORK/status.out" || fail "status shows no succeeded job"

note "REST shows the job with ranks, exit codes and events"
curl -sf "$HTTP/api/v1/jobs/1" >"$WORK/job1.json"
grep -q '"state":"succeeded"' "$WORK/job1.json" || fail "job 1 not succeeded"
grep -q '"exit_code":0' "$WORK/job1.json" || fail "no exit code"
grep -q '"kind":"job.started"' "$WORK/job1.json" || fail "no events"
curl -sf "$HTTP/metrics" | has 'kolo_jobs{state="succeeded"} 2' || fail "metrics"
echo PASS
