#!/usr/bin/env bash
# Elastic, drain and undrain through REST: POST /api/v1/hosts/{id}/drain
# makes the job leave the host at its next commit, gracefully (every rank
# raises HostsUpdatedInterrupt, no rollback: no step lost), the drained
# host's workers are stopped and the host is not excluded (nothing failed);
# /undrain makes the job grow back to max-np, again without a rollback.
. "$(dirname "$0")/lib.sh"
ELASTIC_WORKER=c # the C worker (elastic_c_worker.c): no torch to start
. "$(dirname "$0")/elastic_lib.sh"

make_token
RUN_ARGS=(--token-file "$WORK/token")
COMMIT=5

post() { curl -s -o "$WORK/post.json" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" "$HTTP$1"; }

start_coordinator coord --token-file "$WORK/token"
start_agent a 2 --token-file "$WORK/token"
wait_hosts 1
start_agent b 2 --token-file "$WORK/token"
wait_hosts 2

start_job -np 4 --min-np 2 --max-np 4 -- --steps 100000 --commit $COMMIT --delay 0.05
wait_for 60 stepped 4 0 || fail "the job did not train with 4 workers"
wait_for 20 progressed $(( 5 + RANDOM % 20 )) || fail "no progress"

victim=$([ $((RANDOM % 2)) -eq 0 ] && echo a || echo b)
vid=$(host_id $victim)
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$HTTP/api/v1/hosts/$vid/drain")
[ "$code" = 401 ] || fail "drain without the token answered $code"

gen0=$(gen_current)
fault drain "$victim"
t_drain=$(now_s)
code=$(post "/api/v1/hosts/$vid/drain")
[ "$code" = 200 ] || fail "drain answered $code: $(cat "$WORK/post.json")"
has '"state":"drained"' <"$WORK/post.json" || fail "host not shown drained: $(cat "$WORK/post.json")"
wait_for 20 gen_after "$gen0" || fail "the job did not leave the drained host"
gen_size_is 2 || fail "the new generation has $(gen_size) rank(s), want 2"
wait_for 20 workers_exactly 2 || fail "$(count_workers) workers alive, want 2: the drained host's were not stopped"
wait_for 20 stepped 2 "$t_drain" || fail "the job did not go on with 2 workers"
events | has '"kind":"job.hosts_updated"' || fail "no job.hosts_updated event"
events | has '"kind":"host.excluded"' && fail "a drained host must not be excluded"
curl -sf "$HTTP/api/v1/hosts" | has "\"running_ranks\":\[{\"job\":$JOB" || fail "no host runs the job"
# no new worker goes to a drained host while it stays drained
sleep 1.5
[ "$(gen_size)" = 2 ] && workers_exactly 2 || fail "the job went back to the drained host"

gen1=$(gen_current)
fault undrain "$victim"
t_undrain=$(now_s)
code=$(post "/api/v1/hosts/$vid/undrain")
[ "$code" = 200 ] || fail "undrain answered $code: $(cat "$WORK/post.json")"
wait_for 60 gen_after "$gen1" || fail "the job did not grow back after undrain"
wait_for 40 stepped 4 "$t_undrain" || fail "the job did not train with 4 workers again"
gen_size_is 4 || fail "the newest generation has $(gen_size) rank(s), want 4"

finish_job 60
events | has '"kind":"host.excluded"' && fail "a host was excluded"
# the resets are timed, negotiation waits are measured, the store is fine
metrics=$(curl -sf "$HTTP/metrics") || fail "GET /metrics failed"
echo "$metrics" | grep -q '^kolo_reset_duration_seconds_count [1-9]' || fail "no reset durations"
echo "$metrics" | grep -q '^kolo_negotiation_wait_seconds_count [1-9]' || fail "no negotiation waits"
echo "$metrics" | grep -q '^kolo_membership_changes_total{cause="capacity"} [1-9]' ||
  fail "drain/undrain not counted as capacity changes"
echo "$metrics" | grep -qx 'kolo_degraded 0' || fail "degraded without a store error"
echo "$metrics" | /usr/bin/python3 "$(dirname "$0")/check_metrics.py" || fail "/metrics is not valid exposition text"
# graceful both ways: no rollback at all
report drain --commit $COMMIT --max-lost 0 --check-final
echo PASS
