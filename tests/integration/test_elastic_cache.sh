#!/usr/bin/env bash
# An elastic generation starts with the last one's response cache (issue
# 29): after a reset, the first steps' tensors are agreed by the ranks'
# readiness rounds, none negotiated through the coordinator again.
#
# A coordinator, agents a (2 slots) and b (1); `kolo run -np 3 --min-np 2`
# of the C worker (elastic_c_worker.c: two allreduces a step, checked
# exactly, and a commit every 5 steps).
# 1. the job trains at 3; the coordinator's kolo_negotiation_log_ops_total
#    stops growing once its tensors are cached;
# 2. kill -9 of a rank: the job resets to 2; the new generation started
#    with the cached ids (kolo_negotiation_carried_ids_total grew by at
#    least the two tensors), trains on, and the coordinator negotiated no
#    operation from before the kill to 10 steps after it;
# 3. it grows back to 3 (a new process, which gets the table in its
#    rendezvous reply) and still negotiates nothing;
# 4. the job ends with every step counted once, no worker left.
. "$(dirname "$0")/lib.sh"

ELASTIC_WORKER=c
. "$(dirname "$0")/elastic_lib.sh"

COMMIT=5
log_ops() { metric kolo_negotiation_log_ops_total; }
carried() { metric kolo_negotiation_carried_ids_total; }

start_coordinator coord
start_agent a 2
start_agent b 1
wait_for 10 hosts_at_least 2 || fail "2 agents did not register"

note "1. three ranks train; their tensors get cached"
start_job -np 3 --min-np 2 --max-np 3 --blacklist-cooldown-range 1 1 -- --commit $COMMIT --delay-ms 20
wait_for 60 stepped 3 0 || fail "the job did not train with 3 workers: $(tail -n 5 "$WORK/run.err")"
wait_for 30 progressed $(( $(last_step) + 2 * COMMIT )) || fail "no progress at 3"
ops0=$(log_ops)
wait_for 30 progressed $(( $(last_step) + 2 * COMMIT )) || fail "no progress at 3"
[ "$(log_ops)" = "$ops0" ] || fail "the coordinator still negotiates at 3: $ops0 -> $(log_ops) ops"
carried0=$(carried)
note "negotiated ops so far: $ops0, carried ids: $carried0"

note "2. kill -9 of a rank: the next generation starts with the cache"
kill_rank "$(worker_pids | sort -R | head -n 1)"
t_kill=$T_KILL
wait_for 30 stepped 2 "$t_kill" || fail "the job did not train at 2 after the kill"
wait_for 30 progressed $(( $(last_step) + 10 )) || fail "no progress at 2"
carried1=$(carried)
ops1=$(log_ops)
note "after the reset: negotiated ops $ops0 -> $ops1, carried ids $carried0 -> $carried1"
[ $(( carried1 - carried0 )) -ge 2 ] ||
  fail "the new generation did not start with the cached tensors ($carried0 -> $carried1 ids)"
[ "$ops1" = "$ops0" ] ||
  fail "the coordinator negotiated $(( ops1 - ops0 )) op(s) again after the reset"

note "3. back to 3 ranks: the new process gets the table too"
g1=$(gen_current)
wait_for 60 eval 'gen_after $g1 && gen_size_is 3' || fail "the job did not grow back to 3 ($(gen_cause))"
t_grow=$(now_s)
wait_for 30 stepped 3 "$t_grow" || fail "the job did not train at 3 after growing"
wait_for 30 progressed $(( $(last_step) + 10 )) || fail "no progress at 3 again"
ops2=$(log_ops)
note "after growing back: negotiated ops $ops2, carried ids $(carried)"
[ "$ops2" = "$ops0" ] ||
  fail "the coordinator negotiated $(( ops2 - ops0 )) op(s) again after growing back"

finish_job 60
report cache --commit $COMMIT --max-lost $COMMIT
echo PASS
