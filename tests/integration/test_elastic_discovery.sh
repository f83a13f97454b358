#!/usr/bin/env bash
# Elastic, a host discovery script (a shell script printing a file that the
# test edits): hosts added to the file make the job grow, a host removed
# makes it shrink gracefully (no rollback, the host not excluded, its
# worker stopped), and once the script starts failing the job keeps the
# last list (no membership change, even when the file changes meanwhile);
# when the script works again the job follows the file again.
. "$(dirname "$0")/lib.sh"
ELASTIC_WORKER=c # the C worker (elastic_c_worker.c): no torch to start
. "$(dirname "$0")/elastic_lib.sh"

COMMIT=5

start_coordinator coord
start_agent a 2
start_agent b 1
start_agent c 1
wait_for 10 hosts_at_least 3 || fail "3 agents did not register"

hosts "# the hosts this job may use" a:2
start_job -np 2 --min-np 1 --max-np 4 --host-discovery-script "$DISCOVER" -- \
    --steps 100000 --commit $COMMIT --delay 0.05
wait_for 60 stepped 2 0 || fail "the job did not train with a's 2 workers"
wait_for 20 progressed $(( 5 + RANDOM % 15 )) || fail "no progress"
workers_exactly 2 || fail "$(count_workers) workers, want 2 (only a is listed)"

note "hosts added to the file: the job grows"
gen0=$(gen_current)
fault add_hosts "b,c"
t_add=$(now_s)
hosts a:2 b c
wait_for 60 gen_after "$gen0" || fail "the job did not grow after b and c were listed"
wait_for 40 stepped 4 "$t_add" || fail "the job did not train with 4 workers"
gen_size_is 4 || fail "the newest generation has $(gen_size) rank(s), want 4"
events | has '"kind":"job.discovered"' || fail "no job.discovered event"

note "a host removed from the file: the job shrinks gracefully"
wait_for 20 progressed $(( $(last_step) + 5 + RANDOM % 10 )) || fail "no progress at 4"
gone_host=$([ $((RANDOM % 2)) -eq 0 ] && echo b || echo c)
kept_host=$([ $gone_host = b ] && echo c || echo b)
gen1=$(gen_current)
fault remove_host "$gone_host"
t_rm=$(now_s)
hosts a:2 "$kept_host"
wait_for 20 gen_after "$gen1" || fail "the job did not leave $gone_host"
gen_size_is 3 || fail "the newest generation has $(gen_size) rank(s), want 3"
wait_for 20 workers_exactly 3 || fail "$(count_workers) workers, want 3: $gone_host's worker was not stopped"
wait_for 20 stepped 3 "$t_rm" || fail "the job did not go on with 3 workers"
events | has '"kind":"host.excluded"' && fail "a host left the list but was excluded"

note "the script fails: the job keeps the last list"
wait_for 20 progressed $(( $(last_step) + 5 )) || fail "no progress at 3"
gen2=$(gen_current)
fault script_fails
touch "$WORK/discovery-fails"
wait_for 10 eval 'events | has "\"kind\":\"job.discovery_failed\""' || fail "no job.discovery_failed event"
hosts a:2 b c     # not seen while the script fails
t_fail=$(now_s)
sleep 3
[ "$(gen_current)" = "$gen2" ] || fail "the membership changed while the script failed: $(gen_cause)"
stepped 3 "$t_fail" || fail "the job stopped training while the script failed"
workers_exactly 3 || fail "$(count_workers) workers while the script failed, want 3"

note "the script works again: the job follows the file again"
fault script_back
t_back=$(now_s)
rm -f "$WORK/discovery-fails"
wait_for 60 gen_after "$gen2" || fail "the job did not grow when the script worked again"
wait_for 40 stepped 4 "$t_back" || fail "the job did not train with 4 workers again"

finish_job 60
report discovery --commit $COMMIT --max-lost 0 --no-change script_fails --check-final
echo PASS
