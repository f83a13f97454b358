#!/usr/bin/env bash
# A step of the coordinator's wall clock (issue 15, F9): +10 minutes in the
# middle of a job, then back. Freshness checks run on a clock that steps do
# not move (now_stepless_ms), so no RPC is refused, no host is lost or
# excluded, and the job finishes with every allreduce right. The step is
# made for the coordinator process only (KOLO_TEST_WALL_OFFSET_FILE), not
# for the machine. Then a coordinator whose clock is wrong from its start:
# clients learn its time from its authenticated refusal of their first
# request and ask again on it, so agents, `kolo status`, `kolo run` and
# the workers all work with it.
. "$(dirname "$0")/lib.sh"
use_python

make_token
echo 0 >"$WORK/offset"
KOLO_TEST_WALL_OFFSET_FILE="$WORK/offset" start_coordinator coord --token-file "$WORK/token"
start_agent a 1 --token-file "$WORK/token"
start_agent b 1 --token-file "$WORK/token"
wait_hosts 2

start_steps 2 300 0.02 --token-file "$WORK/token"

note "the coordinator's clock jumps 10 minutes ahead"
echo 600000 >"$WORK/offset"
sleep 4 # longer than the 2 s lease: heartbeats must keep being accepted
[ "$(hosts_alive)" -eq 2 ] || fail "hosts lost after the step: $(curl -sf "$HTTP/api/v1/hosts")"
note "and back"
echo 0 >"$WORK/offset"
wait_for 90 sh -c "! kill -0 $RUN_PID 2>/dev/null" || fail "the job did not finish"
wait "$RUN_PID" || fail "the job failed: $(tail -5 "$WORK/run.out") $(cat "$WORK/run.err")"
grep -q "done 300" "$WORK/run.out" || fail "steps missing: $(tail -3 "$WORK/run.out")"
[ "$(hosts_alive)" -eq 2 ] || fail "a host was lost"
curl -sf "$HTTP/api/v1/events" | has '"host.lost"' && fail "a host was declared lost"
curl -sf "$HTTP/metrics" | has 'kolo_auth_failures_total{listener="rpc"} 0' ||
  fail "requests refused: $(curl -sf "$HTTP/metrics" | grep auth_failures)"

note "a coordinator whose clock is 10 minutes ahead from its start"
echo 600000 >"$WORK/offset2"
KOLO_TEST_WALL_OFFSET_FILE="$WORK/offset2" start_coordinator coord2 --token-file "$WORK/token"
start_agent c 1 --token-file "$WORK/token"
wait_hosts 1
"$KOLO" status --coordinator "$RPC" --token-file "$WORK/token" >"$WORK/st.out" 2>&1 ||
  fail "kolo status refused: $(cat "$WORK/st.out")"
"$KOLO" run -np 1 --coordinator "$RPC" --token-file "$WORK/token" -- /usr/bin/python3 \
  "$(dirname "$0")/data/allreduce_steps.py" 20 0 >"$WORK/run2.out" 2>&1 ||
  fail "a job failed: $(tail -n 20 "$WORK/run2.out")"
grep -q "done 20" "$WORK/run2.out" || fail "steps missing: $(tail -3 "$WORK/run2.out")"
grep -q "differs from ours by +[56][0-9][0-9][0-9][0-9][0-9] ms" "$WORK/agent-c.log" ||
  fail "the agent did not learn the coordinator's time: $(tail -n 5 "$WORK/agent-c.log")"
echo PASS
