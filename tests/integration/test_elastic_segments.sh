#!/usr/bin/env bash
# An elastic reset keeps the hosts' shared segments (issue 29, item 6):
# a host whose ranks are the same processes in the same order re-arms the
# segment they kept instead of making a new one; a host whose membership
# changed gets a new one.
#
# A coordinator, agents a (3 slots) and b (2); `kolo run -np 4 --spares 1`
# of the C worker (elastic_c_worker.c: two allreduces a step, one above
# the lanes' threshold, checked exactly) with host discovery listing a:2
# and b:2, so each host runs 2 ranks; a's third slot, listed once they
# train, takes the spare.
# 1. four ranks train, two on each host, the spare waits on a;
# 2. kill -9 of a's second rank (local rank 1): the spare takes its place
#    in the next generation. b's two ranks are unchanged: its leader logs
#    "host b keeps its shared segment" and the job trains on, exactly; a's
#    membership changed (the spare is new): a makes a new segment after
#    the rendezvous, under the name its ranks derive from the generation's
#    key (its leader kept the old one and made none before), and trains;
# 3. a commit later the spare's slot is taken from the discovery list: no
#    new generation; the job ends with every step counted once and no
#    worker or segment left.
#
# SEGMENTS_WORKER=torch (test_elastic_segments_torch.sh) runs the same with
# the torch worker (tests/python/elastic_worker.py: kolo.torch and
# hvd.elastic, as a Horovod user's script), whose final weights must be a
# fault-free run's.
. "$(dirname "$0")/lib.sh"

COMMIT=5
if [ "${SEGMENTS_WORKER:-c}" = c ]; then
  ELASTIC_WORKER=c
  WORKER_FLAGS=(--commit $COMMIT --delay-ms 20)
else
  WORKER_FLAGS=(--commit $COMMIT --delay 0.02 --steps 100000)
fi
. "$(dirname "$0")/elastic_lib.sh"

# how many times host $1 (its name) said it keeps its segment in generation $2
kept_in() { grep -c "host $(host_id "$1") keeps its shared segment in generation $2 " "$WORK/run.err" || true; }

start_coordinator coord
start_agent a 3
start_agent b 2
wait_for 10 hosts_at_least 2 || fail "2 agents did not register"
hosts a:2 b:2

note "1. four ranks, two on each host, and a spare"
export KOLO_LOG_LEVEL=info
start_job -np 4 --min-np 2 --max-np 4 --spares 1 --blacklist-cooldown-range 30 30 \
    --host-discovery-script "$DISCOVER" -- "${WORKER_FLAGS[@]}"
unset KOLO_LOG_LEVEL
wait_for 60 stepped 4 0 || fail "the job did not train with 4 workers: $(tail -n 5 "$WORK/run.err")"
# a's third slot, listed now: the only free one, for the spare
hosts a:3 b:2
wait_for 60 eval '[ -n "$(spares)" ]' || fail "no spare waiting: $(job_json)"
read -r spare_pid spare_host <<<"$(spares)"
note "ranks: $(ranks | tr '\n' ' '); spare $spare_pid on $spare_host"
seen_pids="$(worker_pids | tr '\n' ' ')"
# ranks per host, as "2 2 " (the REST listing may lag the first steps)
per_host() { ranks | awk '{ print $2 }' | sort | uniq -c | awk '{ print $1 }' | tr '\n' ' '; }
wait_for 10 eval '[ "$(per_host)" = "2 2 " ]' || fail "want 2 ranks on each host: $(ranks | tr '\n' ' ')"
[ "$(kept_in b 1)$(kept_in a 1)" = "00" ] || fail "a first generation kept a segment"

note "2. kill -9 of $spare_host's second rank: the spare replaces it"
other=$([ "$spare_host" = a ] && echo b || echo a)
wait_for 30 progressed $(( $(last_step) + 5 + RANDOM % 10 )) || fail "no progress at 4"
g1=$(gen_current)
read -r victim _ <<<"$(ranks | awk -v h="$spare_host" '$2 == h && $3 == 1')"
[ -n "$victim" ] || fail "no local rank 1 on $spare_host: $(ranks | tr '\n' ' ')"
kill_rank "$victim" "$spare_host"
t_kill=$T_KILL
g2=$(gen_current)
wait_for 30 stepped 4 "$t_kill" || fail "the job did not train at 4 after the kill: $(tail -n 5 "$WORK/run.err")"
wait_for 30 progressed $(( $(last_step) + 10 )) || fail "no progress after the kill"
wait_for 10 eval 'ranks | grep -q "^$spare_pid $spare_host "' ||
  fail "the spare $spare_pid is not a rank: $(ranks | tr '\n' ' ')"
[ "$(kept_in "$other" "$g2")" = 1 ] ||
  fail "host $other (unchanged) did not keep its segment in generation $g2: $(grep -i segment "$WORK/run.err" | tail -n 5)"
[ "$(kept_in "$spare_host" "$g2")" = 0 ] ||
  fail "host $spare_host kept its segment although a member changed"
grep -q "host $(host_id "$spare_host") makes a new shared segment in generation $g2: its ranks changed" "$WORK/run.err" ||
  fail "host $spare_host did not make its segment after the rendezvous: $(grep -i segment "$WORK/run.err" | tail -n 5)"
[ "$(gen_current)" = "$g2" ] || fail "more generations than the kill's: $g1 -> $(gen_current) ($(gen_cause))"

note "3. the spare's slot leaves the list; the job ends"
hosts "$spare_host:2" "$other:2"
wait_for 30 progressed $(( $(last_step) + 5 )) || fail "no progress at the end"
finish_job 60
report segments --commit $COMMIT --max-lost $COMMIT --check-final
# the segments of this job's processes (another test's coordinator may
# number its job 1 too): /dev/shm/kolo-<job>-<gen>-<creator pid>-*
left=""
for p in $seen_pids; do
  left="$left$(ls /dev/shm/kolo-"$JOB"-*-"$p"-* 2>/dev/null || true)"
done
[ -z "$left" ] || fail "segments of job $JOB left: $left"
echo PASS
