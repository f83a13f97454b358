#!/usr/bin/env bash
# Readiness rounds (issue 13) as a user runs them: a 2-rank job on a
# standalone coordinator, 12 named tensors a step and a barrier every 10.
#  - after the first step the ranks agree among themselves: the coordinator
#    sees no Negotiate call per step (only each rank's parked long-poll),
#    and /metrics counts the rounds' ops from the ranks' telemetry;
#  - a rank that sleeps 50 ms before every step is flagged as the
#    straggler by REST (/ranks), from the ranks' reported waits;
#  - the coordinator stopped (SIGSTOP) for 5 s: training goes on meanwhile;
#  - the timeline started and stopped at run time, ranks submitting with
#    random delays (so they fall on different sides of the round that
#    switches): every step completes, and once it stopped the steps are
#    agreed by rounds again;
#  - one rank frozen (SIGSTOP) for 3 s: its peer, blocked in a round,
#    says "waiting on rank 1 since T", and training goes on after SIGCONT;
#  - KOLO_FAST_PATH=0 runs the same job through the coordinator alone;
#  - the coordinator killed (-9) and restarted mid-training, then the
#    timeline switched on and off: the ops it sends to the new coordinator
#    go in full (it never gave the ranks' cache ids) and every step is right;
#  - a rank shuts down while the coordinator stands still and its peer
#    waits for a cached op: the peer fails within 3 s with Horovod's
#    shutdown text, told by the leaver's last round (ROUND_F_SHUTDOWN);
#  - the coordinator killed and restarted again, one rank reporting a
#    response cache that differs from its peer's (KOLO_FAULT_CACHE_SKEW):
#    the coordinator clears every rank's cache at one log entry, every
#    step is right, and the tensors are agreed by rounds again afterwards.
. "$(dirname "$0")/lib.sh"
use_python
PY=/usr/bin/python3
STEPS_PY="$ROOT/tests/integration/data/rounds_steps.py"

# a lease longer than the 5 s the coordinator is stopped for
LEASE=30s start_coordinator coord
start_agent a 2
wait_hosts 1

steps_of() { grep -c "<stdout>:step" "$1" 2>/dev/null || true; }
# job_done NAME STEPS: the job started in the background ($RUN_PID, output in
# $WORK/NAME.out and .err) succeeded, both ranks finished STEPS steps, and
# every sum was right.
job_done() {
  local rc=0
  wait "$RUN_PID" || rc=$?
  [ $rc -eq 0 ] || fail "job $1 failed ($rc): $(tail -20 "$WORK/$1.err")"
  [ "$(grep -c "<stdout>:done $2" "$WORK/$1.out")" -eq 2 ] || fail "job $1: not every rank finished"
  ! grep -q WRONG "$WORK/$1.out" || fail "job $1: a wrong result"
}
# end_job NAME STEPS: the checks on job NAME are done, and its steps left
# only had to outlast them: it ends 20 steps after rank 0's step now (its
# --end-file $WORK/NAME.end), or at STEPS if that comes first; job_done.
end_job() {
  local at=$(( $(progress) + 20 ))
  [ $at -lt $2 ] || at=$2
  echo $at >"$WORK/$1.end.tmp"
  mv "$WORK/$1.end.tmp" "$WORK/$1.end"
  job_done "$1" $at
}

# ---- 1. rounds: no coordinator call per step; the straggler; SIGSTOP
"$KOLO" run -np 2 --coordinator "$RPC" -- "$PY" "$STEPS_PY" --steps 400 --slow-rank 1 \
  --slow-s 0.05 --progress "$WORK/progress" --end-file "$WORK/run.end" >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 30 eval '[ "$(steps_of "$WORK/run.out")" -ge 40 ]' || fail "training did not start: $(tail "$WORK/run.err")"
s0=$(( $(steps_of "$WORK/run.out") / 2 )); n0=$(negotiates)
wait_for 30 eval '[ "$(steps_of "$WORK/run.out")" -ge $(( s0 * 2 + 80 )) ]' || fail "no progress"
s1=$(( $(steps_of "$WORK/run.out") / 2 )); n1=$(negotiates)
note "steps $s0 -> $s1: Negotiate calls $n0 -> $n1 (12 tensors and 2 ranks a step)"
# the coordinator path would make 24 calls a step; the long-polls re-park
# about once a second per rank
[ $(( (n1 - n0) * 4 )) -lt $(( s1 - s0 )) ] || fail "$((n1 - n0)) Negotiate calls in $((s1 - s0)) steps"
ops=$(metric kolo_negotiation_round_ops_total)
[ "${ops:-0}" -ge $(( 12 * 40 )) ] || fail "the rounds' telemetry counts $ops ops"
metric kolo_negotiation_wait_seconds_count | has '^[1-9]' || fail "no negotiation waits from the rounds"

straggler() {
  curl -sf "$HTTP/api/v1/jobs/1/ranks" | "$PY" -c '
import json, sys
r = json.load(sys.stdin)["ranks"]
sys.exit(0 if r[1]["straggler"] and not r[0]["straggler"] and r[1]["lag_s"] >= 0.02 else 1)'
}
wait_for 15 straggler || fail "rank 1 is not flagged: $(curl -sf "$HTTP/api/v1/jobs/1/ranks")"

before=$(progress)
kill -STOP "$COORD_PID"
sleep 5
during=$(progress)
kill -CONT "$COORD_PID"
note "coordinator stopped for 5 s: steps $before -> $during meanwhile"
[ $(( during - before )) -ge 10 ] || fail "training stopped with the coordinator (steps $before -> $during)"

end_job run 400

# ---- 2. the timeline on from step 20 to 40, jittered submissions
rm -f "$WORK/progress"
"$KOLO" run -np 2 --coordinator "$RPC" -- "$PY" "$STEPS_PY" --steps 200 --jitter 0.002 \
  --timeline "$WORK/tl.json" --timeline-steps 20,40 --progress "$WORK/progress" \
  >"$WORK/tl.out" 2>"$WORK/tl.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
rounds_again 100 160 "after the timeline stopped"
job_done tl 200
grep -q '"grad.3"' "$WORK/tl.json" || fail "the timeline has no span of grad.3"

# ---- 3. a frozen rank: its peer names it (stall limit 1 s: warning 2 s / 2);
# the freeze comes at step 20, the other steps only have to outlast it
rm -f "$WORK/progress"
HOROVOD_STALL_CHECK_TIME_SECONDS=2 "$KOLO" run -np 2 --log-level warn --coordinator "$RPC" -- "$PY" "$STEPS_PY" \
  --steps 200 --pause 0.02 --progress "$WORK/progress" >"$WORK/frz.out" 2>"$WORK/frz.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 60 eval '[ "$(progress)" -ge 20 ]' || fail "frozen-rank job did not start: $(tail "$WORK/frz.err")"
rank1=""
for p in $(pgrep -f "$STEPS_PY --steps 200 --pause"); do
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'KOLO_RANK=1' && rank1=$p
done
[ -n "$rank1" ] || fail "no rank 1 process found"
kill -STOP "$rank1"
sleep 3
kill -CONT "$rank1"
# blocked in a round, or (stopped between the round and the op) in the op
wait_for 20 eval 'grep -Eq "\[0\]<stderr>:.*rank 0: waiting on rank 1 since .* in a (readiness round|collective)" "$WORK/frz.err"' ||
  fail "rank 0 did not say it waits on rank 1: $(tail -5 "$WORK/frz.err")"
note "$(grep -o 'rank 0: waiting on rank 1 since .*' "$WORK/frz.err" | head -1)"
job_done frz 200

# ---- 4. KOLO_FAST_PATH=0: every op through the coordinator
n0=$(negotiates)
KOLO_FAST_PATH=0 "$KOLO" run -np 2 --coordinator "$RPC" -- "$PY" "$STEPS_PY" --steps 20 \
  >"$WORK/slow.out" 2>"$WORK/slow.err" || fail "the slow-path job failed: $(tail "$WORK/slow.err")"
n1=$(negotiates)
[ "$(grep -c '<stdout>:done 20' "$WORK/slow.out")" -eq 2 ] || fail "slow path: not every rank finished"
[ $(( n1 - n0 )) -ge $(( 20 * 2 )) ] || fail "KOLO_FAST_PATH=0 made only $((n1 - n0)) Negotiate calls in 20 steps"
note "KOLO_FAST_PATH=0: $((n1 - n0)) Negotiate calls in 20 steps"
curl -sf "$HTTP/metrics" | "$PY" "$(dirname "$0")/check_metrics.py" || fail "/metrics is not valid exposition text"

# ---- 5. the coordinator killed (-9) and restarted during cached training,
# then the timeline on and off: its ops go to the new coordinator, which
# never gave the ranks' cache ids (they must go in full, not by id)
rm -f "$WORK/progress"
port=${RPC##*:}
"$KOLO" run -np 2 --coordinator "$RPC" -- "$PY" "$STEPS_PY" --steps 300 --pause 0.02 \
  --timeline "$WORK/tl2.json" --timeline-steps 150,170 --progress "$WORK/progress" \
  --end-file "$WORK/rs.end" >"$WORK/rs.out" 2>"$WORK/rs.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 60 eval '[ "$(progress)" -ge 20 ]' || fail "restart job did not start: $(tail "$WORK/rs.err")"
kill -9 "$COORD_PID"
before=$(progress)
sleep 0.3
mv "$WORK/coord.err" "$WORK/coord.1.err"
LISTEN="tcp://127.0.0.1:$port" LEASE=30s start_coordinator coord
wait_for 30 grep -q "resumed after a coordinator restart" "$WORK/coord.err" ||
  fail "no resume after the restart: $(tail -5 "$WORK/coord.err")"
note "coordinator restarted at step $before; resumed at step $(progress)"
[ "$(progress)" -lt 150 ] || note "(the timeline step passed before the resume)"
# past the step that stops the timeline, the job may end
wait_for 60 eval '[ "$(progress)" -ge 170 ]' || fail "restart job stuck at step $(progress)"
end_job rs 300
grep -q '"grad.3"' "$WORK/tl2.json" || fail "the timeline after the restart has no span of grad.3"
restored=$(sed -n 's/.*resumed after a coordinator restart.* \([0-9][0-9]*\) response cache id(s) restored.*/\1/p' "$WORK/coord.err" | tail -1)
[ "${restored:-0}" -ge 12 ] || fail "the new coordinator restored ${restored:-no} cache ids, not the 12 tensors'"
! grep -q "job.cache_reset" "$WORK/coord.err" || fail "caches that agreed were reset: $(grep cache_reset "$WORK/coord.err")"
note "the new coordinator took back $restored cache ids from the ranks"

# ---- 6. a rank shuts down while the coordinator stands still
"$KOLO" run -np 2 --coordinator "$RPC" -- "$PY" "$ROOT/tests/integration/data/shutdown_paused.py" \
  --ready "$WORK/sd.ready" --go "$WORK/sd.go" --result "$WORK/sd.result" \
  >"$WORK/sd.out" 2>"$WORK/sd.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 60 test -e "$WORK/sd.ready" || fail "the shutdown job did not start: $(tail "$WORK/sd.err")"
kill -STOP "$COORD_PID"
touch "$WORK/sd.go"
told=0
wait_for 15 test -e "$WORK/sd.result" && told=1
kill -CONT "$COORD_PID"
[ $told -eq 1 ] || fail "rank 0's op did not fail while the coordinator stood still"
note "rank 0, the coordinator stopped: $(cat "$WORK/sd.result")"
grep -q "^HorovodInternalError .*Horovod has been shut down" "$WORK/sd.result" ||
  fail "rank 0 did not get Horovod's shutdown text: $(cat "$WORK/sd.result")"
awk '{ exit !($2 < 3.0) }' "$WORK/sd.result" || fail "rank 0 learnt it late: $(cat "$WORK/sd.result")"
wait_for 60 eval '! kill -0 $RUN_PID 2>/dev/null' || fail "the shutdown job did not end"
# ---- 7. a restart with caches that disagree: every rank clears its cache
# at one log entry and the job goes on, with rounds again afterwards
rm -f "$WORK/progress"
"$KOLO" run -np 2 --coordinator "$RPC" -- sh -c \
  '[ "$KOLO_RANK" = 1 ] && export KOLO_FAULT_CACHE_SKEW=1; exec "$0" "$@"' \
  "$PY" "$STEPS_PY" --steps 600 --pause 0.01 --progress "$WORK/progress" --end-file "$WORK/sk.end" \
  >"$WORK/sk.out" 2>"$WORK/sk.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 60 eval '[ "$(progress)" -ge 20 ]' || fail "skew job did not start: $(tail "$WORK/sk.err")"
kill -9 "$COORD_PID"
sleep 0.3
mv "$WORK/coord.err" "$WORK/coord.2.err"
LISTEN="tcp://127.0.0.1:$port" LEASE=30s start_coordinator coord
wait_for 30 grep -q "job.cache_reset" "$WORK/coord.err" ||
  fail "no cache reset after a restart with caches that disagree: $(tail -5 "$WORK/coord.err")"
note "$(grep -o 'job.cache_reset: .*' "$WORK/coord.err" | head -1)"
at=$(progress)
rounds_again $(( at + 40 )) $(( at + 120 )) "after the cache reset"
end_job sk 600
echo PASS
