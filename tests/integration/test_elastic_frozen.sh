#!/usr/bin/env bash
# Elastic, a frozen worker: one worker is stopped (SIGSTOP) and another
# killed, so the next generation places the stopped one, which never comes
# to its rendezvous. After the elastic timeout the coordinator declares it
# frozen (event worker.frozen), its agent kills it, and the job goes on in
# a generation without it (its host back after the cooldown) and finishes.
. "$(dirname "$0")/lib.sh"
ELASTIC_WORKER=c # the C worker (elastic_c_worker.c): no torch to start
. "$(dirname "$0")/elastic_lib.sh"

start_coordinator coord
for h in a b c d; do start_agent $h 1; done
wait_for 10 hosts_at_least 4 || fail "4 agents did not register"
start_job -np 3 --min-np 2 --max-np 3 --elastic-timeout 10 --blacklist-cooldown-range 1 2 -- \
    --steps 100000 --commit 5 --delay 0.02
wait_for 90 progressed 20 || fail "the job made no progress"
victim=$(worker_pids | tail -n 1)
other=$(worker_pids | head -n 1)
fault freeze "pid $victim stopped, pid $other killed"
kill -STOP "$victim"
kill -9 "$other"
s0=$(last_step)
t0=$(now_ms)
wait_for 60 eval 'events | has "\"kind\":\"worker.frozen\""' ||
  fail "the stopped worker was not declared frozen"
wait_for 60 progressed $(( s0 + 20 )) || fail "no progress after the frozen worker went"
note "training went on $(( $(now_ms) - t0 )) ms after the freeze"
wait_for 15 gone "$victim" || fail "the frozen worker $victim is still there"
finish_job 60
[ "$ORPHANS" -eq 0 ] || fail "$ORPHANS worker(s) left behind"
echo PASS
