#!/usr/bin/env bash
# kolo run on a real Slurm: munged, slurmctld and two slurmd on this
# machine (scripts/slurm-local.sh, everything under a temporary folder,
# all stopped at the end):
# - inside `salloc -N2 --ntasks-per-node=2`, `kolo run -np 4` needs no host
#   list: one agent per node through srun, 2 ranks on each node, sums right,
#   and nothing left behind (agents, their state, the step);
# - deploy/slurm/kolo.sbatch runs the same through sbatch;
# - outside an allocation --slurm is refused with the reason;
# - spares: -np 3 --spares 1 in the 4 tasks; a rank killed is replaced by
#   the spare without a process start, the job never trains at 2;
# - elastic: kill -9 of node n2's slurmd, agent and workers during training
#   shrinks the job to n1's 2 ranks, which finish with the fault-free
#   weights.
# Root only (slurmd runs jobs as their users); under CI a missing Slurm
# fails the test instead of skipping it.
. "$(dirname "$0")/lib.sh"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
need() {
  [ "${CI:-}" = true ] && fail "$1"
  skip "$1"
}
[ "$(id -u)" = 0 ] || need "Slurm's daemons need root"
for c in slurmctld slurmd munged salloc sbatch srun scontrol; do
  command -v "$c" >/dev/null || need "no $c (apt-get install slurmd slurmctld slurm-client munge)"
done
/usr/bin/python3 -c "import numpy" 2>/dev/null || need "no numpy for /usr/bin/python3"
export PYTHONPATH="$ROOT/python" KOLO_LIBRARY="${KOLO_LIBRARY:-}"
[ -n "$KOLO_LIBRARY" ] || unset KOLO_LIBRARY
SL="$WORK/slurm"
# a failed check leaves a job's salloc, kolo run, agents and workers: every
# one has the test's folder or tag in its argv
trap 'rc=$?; set +e; pkill -9 -f -- "--tag slurm-spares|$WORK/" 2>/dev/null
      "$ROOT/scripts/slurm-local.sh" stop "$SL"; (exit $rc); cleanup' EXIT
"$ROOT/scripts/slurm-local.sh" start "$SL" >"$WORK/slurm-start.out" 2>&1 ||
  fail "Slurm did not start: $(cat "$WORK/slurm-start.out")"
export SLURM_CONF="$SL/slurm.conf"
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
cat >"$WORK/job.py" <<'PY'
import os, numpy as np, kolo
kolo.init()
got = kolo.allreduce(np.full(2, kolo.rank() + 1.0), op=kolo.Sum)
print("rank %d of %d on %s sum %g" % (kolo.rank(), kolo.size(), os.environ.get("SLURMD_NODENAME"), got[0]), flush=True)
kolo.shutdown()
PY
no_agents() { ! pgrep -f "kolo agent --coordinator .* --name n[12] " >/dev/null; }

note "salloc -N2 --ntasks-per-node=2 kolo run -np 4"
(cd "$WORK" && timeout 120 salloc -Q -N2 --ntasks-per-node=2 "$KOLO" run -np 4 -- \
  /usr/bin/python3 "$WORK/job.py") >"$WORK/salloc.out" 2>"$WORK/salloc.err" ||
  fail "the job failed: $(cat "$WORK/salloc.out" "$WORK/salloc.err")"
[ "$(grep -c 'sum 10$' "$WORK/salloc.out")" -eq 4 ] || fail "wrong results: $(cat "$WORK/salloc.out")"
[ "$(grep -c ' on n1 sum' "$WORK/salloc.out")" -eq 2 ] && [ "$(grep -c ' on n2 sum' "$WORK/salloc.out")" -eq 2 ] ||
  fail "not 2 ranks per node: $(cat "$WORK/salloc.out")"
has "one agent per node on 2 node(s)" <"$WORK/salloc.err" || fail "no Slurm line: $(cat "$WORK/salloc.err")"
has "embedded coordinator .*, dashboard http://" <"$WORK/salloc.err" || fail "no dashboard line: $(cat "$WORK/salloc.err")"
wait_for 10 no_agents || fail "agents left running"
ls "$TMPDIR" | grep -q "^kolo-agent-" && fail "agent state left: $(ls "$TMPDIR")"
[ -z "$(squeue -h)" ] || fail "allocations left: $(squeue)"

note "sbatch deploy/slurm/kolo.sbatch"
(cd "$WORK" && KOLO="$KOLO" sbatch --wait --output="$WORK/sbatch.out" \
  "$ROOT/deploy/slurm/kolo.sbatch" "$WORK/job.py") >"$WORK/sbatch.submit" 2>&1 ||
  fail "sbatch failed: $(cat "$WORK/sbatch.submit" "$WORK/sbatch.out" 2>/dev/null)"
[ "$(grep -c 'sum 10$' "$WORK/sbatch.out")" -eq 4 ] || fail "sbatch: $(cat "$WORK/sbatch.out")"

note "--slurm outside an allocation"
set +e
(env -u SLURM_JOB_ID -u SLURM_JOB_NODELIST "$KOLO" run --slurm -np 2 -- true) >"$WORK/outside.out" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] || fail "--slurm outside an allocation exited $rc"
has "not inside a Slurm allocation" <"$WORK/outside.out" || fail "no reason: $(cat "$WORK/outside.out")"

if [ -n "${KOLO_ELASTIC_WORKER:-}" ]; then
  # spares: 3 ranks and a spare fill the allocation's 4 tasks; a rank
  # killed (rank 0, whose worker prints every step) is replaced by the
  # spare without a process start, and the job never trains at 2
  note "spares: -np 3 --spares 1 in 4 tasks, a rank killed"
  (cd "$WORK" && timeout 150 salloc -Q --no-kill -N2 --ntasks-per-node=2 "$KOLO" run -np 3 --min-np 2 \
    --spares 1 --elastic-timeout 60 -- "$KOLO_ELASTIC_WORKER" --tag slurm-spares \
    --stop-file "$WORK/spares.stop" --commit 5 --delay-ms 20) \
    >"$WORK/spares.out" 2>"$WORK/spares.err" &
  SP=$!
  PIDS+=("$SP")
  spare_steps() { [ "$(grep -c '<stdout>:STEP .* size 3 ' "$WORK/spares.out" 2>/dev/null || true)" -ge "$1" ]; }
  wait_for 90 spare_steps 30 || fail "no training on 3 ranks: $(tail -n 5 "$WORK/spares.err")"
  workers() { pgrep -f "^$KOLO_ELASTIC_WORKER --tag slurm-spares " || true; }
  wait_for 30 eval '[ "$(workers | wc -l)" -eq 4 ]' || fail "$(workers | wc -l) workers, want 3 ranks and a spare"
  before=" $(workers | tr '\n' ' ')"
  wid=$(grep -o '<stdout>:STEP .* wid [0-9]*' "$WORK/spares.out" | tail -n 1 | awk '{print $NF}')
  victim=""
  for p in $(workers); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "KOLO_WORKER_ID=$wid" && victim=$p
  done
  [ -n "$victim" ] || fail "no worker with KOLO_WORKER_ID=$wid"
  t_kill=$(date +%s.%N)
  kill -9 "$victim"
  wait_for 30 grep -qF "took 1 hot spare(s), no process start" "$WORK/spares.err" ||
    fail "the spare was not taken: $(tail -n 8 "$WORK/spares.err")"
  wait_for 30 awk -v t="$t_kill" '/<stdout>:STEP .* size 3 / { if ($NF + 0 > t + 0) f = 1 } END { exit !f }' \
    "$WORK/spares.out" || fail "no step at 3 ranks after the kill"
  awk -v t="$t_kill" '/<stdout>:STEP .* size 2 / { if ($NF + 0 > t + 0) f = 1 } END { exit !f }' \
    "$WORK/spares.out" && fail "the job trained at 2 ranks after the kill"
  # every rank now is a process that ran before the kill
  for p in $(workers); do
    case "$before" in *" $p "*) ;; *) new_after=$p ;; esac
  done
  note "ranks after the kill: $(workers | tr '\n' ' ')(a new spare: ${new_after:-none yet})"
  touch "$WORK/spares.stop"
  wait_for 60 sh -c "! kill -0 $SP 2>/dev/null" || fail "the spares job did not end: $(tail -n 5 "$WORK/spares.err")"
  wait "$SP" || fail "the spares job failed: $(tail -n 20 "$WORK/spares.err")"
  wait_for 20 eval '[ -z "$(workers)" ]' || fail "workers left: $(workers)"
else
  note "KOLO_ELASTIC_WORKER is not set: the spares part is skipped"
fi

if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  note "elastic: node n2 dies during training"
  (cd "$WORK" && timeout 150 salloc -Q --no-kill -N2 --ntasks-per-node=2 "$KOLO" run -np 4 --min-np 2 \
    --elastic-timeout 60 -- /usr/bin/python3 "$ROOT/tests/python/elastic_worker.py" --steps 150 \
    --commit 5 --delay 0.05) \
    >"$WORK/elastic.out" 2>"$WORK/elastic.err" &
  EL=$!
  PIDS+=("$EL")
  full_steps() { [ "$(grep -c '<stdout>:STEP .* size 4 ' "$WORK/elastic.out" 2>/dev/null || true)" -ge "$1" ]; }
  wait_for 90 full_steps 40 || fail "no training on 4 ranks: $(tail -n 5 "$WORK/elastic.err")"
  # the node goes: its slurmd, and its agent (whose workers die with it)
  kill -9 "$(cat "$SL/slurmd-n2.pid")"
  AG=$(pgrep -f "kolo agent --coordinator .* --name n2 " || true)
  [ -n "$AG" ] || fail "no agent on n2"
  kill -9 $AG
  note "killed n2: its slurmd and agent $AG"
  wait_for 160 sh -c "! kill -0 $EL 2>/dev/null" || fail "the elastic job hangs: $(tail -n 10 "$WORK/elastic.err")"
  wait "$EL" || fail "the elastic job failed: $(tail -n 20 "$WORK/elastic.err")"
  has '<stdout>:STEP .* size 2 ' <"$WORK/elastic.out" || fail "the job did not go on with 2 ranks"
  has '<stdout>:RESET size 2 ' <"$WORK/elastic.out" || fail "no reset to 2 ranks"
  [ "$(grep -c '<stdout>:FINAL 150 ' "$WORK/elastic.out")" -eq 2 ] || fail "the survivors did not finish: $(grep FINAL "$WORK/elastic.out")"
else
  note "no torch: the elastic part is skipped"
fi
echo PASS
