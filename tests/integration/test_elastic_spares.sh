#!/usr/bin/env bash
# Hot spares with host discovery (issue 32): `kolo run -np 2 --spares 1
# --host-discovery-script` on a cluster of its own (a coordinator, agents
# a with 2 slots and b with 1, the script listing both).
#
# 1. two ranks train, the spare waits in kolo_init on the third slot
#    (REST: elastic_state.spares, state "waiting", its pid);
# 2. kill -9 of a rank: the next generation takes the spare - back at 2
#    ranks without a process start (a rank is the spare's pid, `kolo run`
#    says "took 1 hot spare(s), no process start") and it trains on at
#    2, never at 1;
# 3. a new spare starts in the killed rank's slot once its host's
#    exclusion cooled down;
# 4. the discovery script takes that slot away (lists the ranks' slots
#    only): the spare is stopped, the ranks train on in the same
#    generation (a spare is no member);
# 5. the job ends with every step counted once (elastic_report.py) and no
#    worker left.
# The worker is the C worker (elastic_c_worker.c): no torch to import.
. "$(dirname "$0")/lib.sh"

ELASTIC_WORKER=c
. "$(dirname "$0")/elastic_lib.sh"

COMMIT=5
spare_waits_on() { spares | grep -q " $1\$"; }

start_coordinator coord
start_agent a 2
start_agent b 1
wait_for 10 hosts_at_least 2 || fail "2 agents did not register"
hosts a:2 b:1

note "1. two ranks and a spare on the 3 slots"
start_job -np 2 --min-np 1 --max-np 2 --spares 1 --blacklist-cooldown-range 1 1 \
    --host-discovery-script "$DISCOVER" -- --commit $COMMIT --delay-ms 20
wait_for 60 stepped 2 0 || fail "the job did not train with 2 workers: $(tail -n 5 "$WORK/run.err")"
wait_for 60 eval '[ -n "$(spares)" ]' || fail "no spare waiting: $(job_json)"
read -r spare_pid spare_host <<<"$(spares)"
note "ranks: $(ranks | tr '\n' ' '); spare $spare_pid on $spare_host"
[ "$(ranks | wc -l)" -eq 2 ] || fail "want 2 ranks: $(ranks)"
has "\"kind\":\"worker.spare_started\"" <<<"$(events)" || fail "no worker.spare_started event"
"$KOLO" jobs --coordinator "$RPC" >"$WORK/jobs.txt" || fail "kolo jobs failed"
grep -Eq "^  $JOB +.* running +2/2\+1 " "$WORK/jobs.txt" || fail "kolo jobs does not show the spare: $(cat "$WORK/jobs.txt")"

note "2. kill -9 of a rank: the spare takes its place"
wait_for 30 progressed $(( $(last_step) + 5 + RANDOM % 10 )) || fail "no progress at 2"
read -r victim victim_host _ <<<"$(ranks | sort -R | head -n 1)"
kill_rank "$victim" "$victim_host"
t_kill=$T_KILL
wait_for 30 stepped 2 "$t_kill" || fail "the job did not train at 2 after the kill"
wait_for 10 eval 'ranks | grep -q "^$spare_pid $spare_host "' || fail "the spare $spare_pid is not a rank: $(ranks)"
has "took 1 hot spare(s), no process start" <"$WORK/run.err" ||
  fail "kolo run did not say the spare was taken: $(tail -n 8 "$WORK/run.err")"
stepped 1 "$t_kill" && fail "the job trained at 1 rank after the kill: the spare was not taken at once"

note "3. a new spare in its place, on $victim_host once its cooldown passed"
wait_for 60 eval 'spares | grep -vq "^$spare_pid "' || fail "no new spare after the kill: $(job_json)"
read -r spare2 spare2_host <<<"$(spares)"
[ "$spare2_host" = "$victim_host" ] || fail "the new spare $spare2 is on $spare2_host, want $victim_host (the only free slot)"
[ "$(events | grep -o '"kind":"worker.spare_started"' | wc -l)" -ge 2 ] || fail "one spare start in the events"

note "4. discovery takes the spare's slot away: the spare goes, the ranks train on"
wait_for 30 progressed $(( $(last_step) + 5 )) || fail "no progress with the new spare"
gen1=$(gen_current)
# the file lists the ranks' slots only
listed=$(ranks | awk '{ n[$2]++ } END { for (h in n) print h ":" n[h] }' | sort)
fault remove_spare_slot "$(echo $listed)"
t_drop=$(now_s)
hosts $listed
wait_for 30 eval '! spares | grep -q "^$spare2 "' || fail "the spare $spare2 is still there after its slot left: $(spares)"
wait_for 20 gone "$spare2" || fail "the spare's process $spare2 was not stopped"
wait_for 30 stepped 2 "$t_drop" || fail "the job stopped training at 2 after the spare left"
[ "$(gen_current)" = "$gen1" ] || fail "losing a spare changed the membership: $(gen_cause)"

finish_job 60
report spares --commit $COMMIT --max-lost $COMMIT --no-change remove_spare_slot
echo PASS
