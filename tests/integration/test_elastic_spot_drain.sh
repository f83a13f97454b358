#!/usr/bin/env bash
# A spot notice: SIGTERM to one of two agents while an elastic job trains
# on both. The agent drains its own host (AdminService.DrainHost, leaving)
# instead of killing its workers: the job leaves the host at its next
# commit (no step lost, the host not excluded), the agent exits once its
# workers are gone, the job goes on with the other host's ranks. A new
# agent on that host (the instance came back) undrains it and the job
# grows back. Figures: elastic_report.py.
. "$(dirname "$0")/lib.sh"
ELASTIC_WORKER=c # the C worker (elastic_c_worker.c): no torch to start
. "$(dirname "$0")/elastic_lib.sh"
COMMIT=5

start_coordinator coord
start_agent a 2
wait_hosts 1
start_agent b 2 --drain-grace 30s
B_PID=$AGENT_PID
wait_hosts 2

start_job -np 4 --min-np 2 --max-np 4 -- --steps 100000 --commit $COMMIT --delay 0.05
wait_for 60 stepped 4 0 || fail "the job did not train with 4 workers"
wait_for 20 progressed $(( 5 + RANDOM % 20 )) || fail "no progress"

gen0=$(gen_current)
fault spot_notice b
t_notice=$(now_s)
kill -TERM "$B_PID"
wait_for 20 gen_after "$gen0" || fail "the job did not leave the host whose agent got SIGTERM"
gen_size_is 2 || fail "the new generation has $(gen_size) rank(s), want 2"
gens_json | has '"cause":"host b drained' || fail "the reset's cause is not the drain: $(gen_cause)"
wait_for 30 gone "$B_PID" || fail "agent b did not exit after its workers left"
grep -q "host drained, waiting" "$WORK/agent-b.log" || fail "agent b did not drain: $(tail -5 "$WORK/agent-b.log")"
grep -q "every worker left" "$WORK/agent-b.log" || fail "agent b stopped workers itself: $(tail -5 "$WORK/agent-b.log")"
wait_for 20 stepped 2 "$t_notice" || fail "the job did not go on with 2 workers"
curl -sf "$HTTP/api/v1/events" | has "drained: no new work, elastic jobs leave it through its agent's shutdown" || fail "no host.drained event"
events | has '"kind":"host.excluded"' && fail "a host that left on notice must not be excluded"

gen1=$(gen_current)
fault agent_back b
t_back=$(now_s)
start_agent b 2
wait_for 30 gen_after "$gen1" || fail "the job did not grow back when b's agent returned"
wait_for 40 stepped 4 "$t_back" || fail "the job did not train with 4 workers again"
curl -sf "$HTTP/api/v1/events" | has "undrained: usable again through its agent's return" ||
  fail "b was not undrained by its agent's return"

finish_job 60
report spot_drain --commit $COMMIT --max-lost 0 --check-final
echo PASS
