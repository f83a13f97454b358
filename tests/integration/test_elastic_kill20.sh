#!/usr/bin/env bash
# Elastic, 20 kill -9s in one job of the C elastic worker (elastic_c_worker.c)
# on four agents with one slot each: a seeded plan of 20 (step, rank) pairs
# at random steps; the worker that holds that rank at that step SIGKILLs
# itself (a marker file makes each kill happen once, even when the step is
# replayed after the rollback). Each kill excludes its host for 1-2 s, so
# the job shrinks, goes on, and grows back. Checks: every reset survived,
# no kill loses more steps than the commit interval, every rank's final
# state is a fault-free run's (each step counted once), no orphan.
# Prints recovery p50/max (kill -> first step of the next generation).
. "$(dirname "$0")/lib.sh"
ELASTIC_WORKER=c # the C worker (elastic_c_worker.c): no torch to start
. "$(dirname "$0")/elastic_lib.sh"

COMMIT=5
KILLS=${KOLO_KILLS:-20}
GAP=30    # steps between planned kills, about

start_coordinator coord
for h in a b c d; do start_agent $h 1; done
wait_for 10 hosts_at_least 4 || fail "4 agents did not register"

plan="" s=15
for i in $(seq 1 "$KILLS"); do
  s=$(( s + GAP / 2 + RANDOM % GAP ))
  plan="$plan${plan:+, }[$s, $(( RANDOM % 4 ))]"
done
plan="[$plan]"
steps=$(( s + 20 ))
note "kill plan (step, rank): $plan; $steps steps"
mkdir -p "$WORK/marks"

# A worker that never comes to a new generation's rendezvous is replaced
# after the elastic timeout (worker.frozen); its stacks are printed below.
start_job -np 4 --min-np 2 --max-np 4 --blacklist-cooldown-range 1 2 --elastic-timeout 40 -- \
    --steps "$steps" --commit $COMMIT --delay 0.02 --kills "$plan" --marks "$WORK/marks"
# Alone on 2 CPUs: ~60 s through the coordinator, ~95 s with readiness
# rounds (a survivor blocked in a round sees the dead peer first, resets on
# its own and adds a generation: recovery 0.3-0.4 s instead of 0.1 s); up
# to ~170 s with the rest of the suite running beside it.
frozen_stacks() {
  events | has '"kind":"worker.frozen"' || return 0
  note "a worker was declared frozen; the Python stacks printed at its SIGTERM:"
  cat "$WORK/run.out" "$WORK/run.err" | grep -E '<stderr>:(Thread 0x|Current thread|  File )' | head -n 60 || true
}
wait_for 230 gone "$RUN_PID" || { frozen_stacks; fail "the job did not end within 230 s ($(ls "$WORK/marks" | wc -l) kills done, step $(last_step))"; }
frozen_stacks
rc=0
wait "$RUN_PID" || rc=$?
[ $rc -eq 0 ] || fail "kolo run exited $rc: $(tail -n 5 "$WORK/run.err")"
wait_for 10 workers_exactly 0 || true
ORPHANS=$(count_workers)
done_kills=$(grep -c '<stdout>:KILL ' "$WORK/run.out" || true)
[ "$done_kills" -eq "$KILLS" ] || fail "$done_kills of $KILLS planned kills happened"
report kill20 --kills --commit $COMMIT --max-lost $COMMIT --check-final
events | has '"kind":"host.readmitted"' || fail "no host came back after its cooldown"
echo PASS
