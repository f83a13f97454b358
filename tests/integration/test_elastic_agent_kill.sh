#!/usr/bin/env bash
# Elastic, kill -9 of an agent: its workers die with it, its lease runs out,
# the job shrinks to the other host and goes on (rolling back to the last
# commit, losing fewer steps than the commit interval); the agent restarts
# with the same state dir (the same host id), and once its exclusion cooled
# down the job grows back to max-np. Then the other agent is killed and
# restarted at once (within the lease): its new registration is the signal,
# the job shrinks and grows back again. The final weights equal a
# fault-free run's.
. "$(dirname "$0")/lib.sh"
ELASTIC_WORKER=c # the C worker (elastic_c_worker.c): no torch to start
. "$(dirname "$0")/elastic_lib.sh"

COMMIT=5
LEASE=2s start_coordinator coord
start_agent a 2
A_PID=$AGENT_PID
wait_hosts 1
start_agent b 2
B_PID=$AGENT_PID
wait_hosts 2

start_job -np 4 --min-np 2 --max-np 4 --blacklist-cooldown-range 1 2 -- \
    --steps 100000 --commit $COMMIT --delay 0.05
wait_for 60 stepped 4 0 || fail "the job did not train with 4 workers"
wait_for 20 progressed $(( 10 + RANDOM % 20 )) || fail "no progress"

if [ $((RANDOM % 2)) -eq 0 ]; then victim=a; vpid=$A_PID; else victim=b; vpid=$B_PID; fi
vid=$(host_id $victim)
fault agent_kill "$victim"
t_kill=$(now_s)
kill -9 "$vpid"
# its workers die with it (the shim's parent-death signal): at once
wait_for 3 workers_exactly 2 || fail "$(count_workers) worker(s) alive after the agent died, want 2"
# A survivor may see its dead peers first (a data-plane error) and reset on
# its own: the coordinator, which cannot know yet, forms a generation with
# the same members, which cannot join. The lease decides: a generation
# without the host follows within the lease.
wait_for 10 gen_size_is 2 || fail "no generation of 2 after the agent died ($(gen_size), $(gen_cause))"
gen_cause | has "host $victim lost" || fail "cause: $(gen_cause)"
wait_for 30 stepped 2 "$t_kill" || fail "the job did not go on with 2 workers"
events | has '"kind":"host.excluded"' || fail "no host.excluded event"

sleep "0.$((RANDOM % 10))"
gen1=$(gen_current)
fault agent_restart "$victim"
t_back=$(now_s)
start_agent $victim 2
[ $victim = a ] && A_PID=$AGENT_PID || B_PID=$AGENT_PID
wait_hosts 2
[ "$(host_id $victim)" = "$vid" ] || fail "host $victim came back with another id"
wait_for 40 gen_after "$gen1" || fail "the job did not grow back"
wait_for 40 stepped 4 "$t_back" || fail "the job did not train with 4 workers again"
gen_size_is 4 || fail "the newest generation has $(gen_size) rank(s), want 4"
wait_for 5 workers_exactly 4 || fail "$(count_workers) workers, want 4"

# F14: kill -9 of the other agent and a restart at once, well within the
# lease: its new registration (same host id, a new session) tells the
# coordinator that its workers are gone, so the job shrinks without
# waiting for the lease, then grows back after the cooldown.
wait_for 20 progressed $(( $(last_step) + 5 + RANDOM % 10 )) || fail "no progress at 4"
if [ $victim = a ]; then victim=b; vpid=$B_PID; else victim=a; vpid=$A_PID; fi
vid=$(host_id $victim)
fault agent_restart_fast "$victim"
t_kill=$(now_s)
kill -9 "$vpid"
wait_for 3 workers_exactly 2 || fail "$(count_workers) worker(s) alive after the agent died, want 2"
start_agent $victim 2
wait_for 10 gen_size_is 2 || fail "no generation of 2 after the agent restarted ($(gen_size), $(gen_cause))"
[ "$(host_id $victim)" = "$vid" ] || fail "host $victim came back with another id"
[ "$(curl -sf "$HTTP/metrics" | awk '$1 == "kolo_leases_expired_total" { print $2 }')" = 1 ] ||
  fail "a lease expired: the restart should have been noticed first"
gen2=$(gen_current)
wait_for 40 gen_after "$gen2" || fail "the job did not grow back after the fast restart"
wait_for 40 stepped 4 "$t_kill" || fail "the job did not train with 4 workers again"

finish_job 60
events | has '"kind":"host.readmitted"' || fail "no host.readmitted event"
report agent_kill --commit $COMMIT --max-lost $COMMIT --max-detect 4 --full 4 --check-final
echo PASS
