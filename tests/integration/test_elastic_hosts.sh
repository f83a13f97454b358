#!/usr/bin/env bash
# Elastic across many hosts (issue 29): an elastic job of 64 ranks on 16
# simulated hosts (16 agents with 4 slots each on loopback, each its own
# host id, so the job runs on the hierarchical data plane: shared memory in
# each host, the lanes' TCP links between hosts). The worker is the C
# worker kolo-test-elastic-worker (elastic_c_worker.c): 64 Python+torch
# processes would not fit a 2-CPU machine. Every step it runs an int64
# allreduce below KOLO_HIER_LANES (the leaders' path) and a 160 KiB float32
# one above it (every lane's path) and checks both exactly; it prints WRONG
# and exits otherwise.
#
# 1. every rank joins: 64 ranks, 4 on each of the 16 hosts (REST), every
#    one of them steps in the first generation;
# 2. kill -9 of one worker (seeded pick): the job resets to a generation of
#    63 without it (its host is excluded for 3-5 s), every survivor steps in
#    it (15 hosts of 4 ranks and one of 3: 3 lanes, the 4th rank of every
#    other host beyond them), then the job grows back to 64 (a new worker
#    on that host) at a commit;
# 3. "reset: N ms", the kill -> the first completed step of the next
#    generation (and the kill -> every survivor stepped in it), under a
#    generous bound for a loaded 2-CPU machine (issue 29's target is 0.5 s
#    on a quiet one);
# 4. every step is checked (no WRONG, HANG, INITFAIL), the job ends with
#    exit 0 and every rank's FINAL state is that of a fault-free run (acc =
#    0 + 1 + ... + (S - 1): each step counted once across the rollback);
#    at most one commit interval lost;
# 5. no worker left, no /dev/shm/kolo-* segment of any of its ranks left.
# About a minute on 2 CPUs.
. "$(dirname "$0")/lib.sh"

ELASTIC_WORKER=c
. "$(dirname "$0")/elastic_lib.sh"

HOSTS=16 SLOTS=4 NP=64 COMMIT=5
# A budget below ctest's TIMEOUT (240 s), whose kill would skip the cleanup
# and leave 80 processes behind: past it the script fails and cleans up.
BUDGET=${KOLO_HOSTS_BUDGET:-200}
trap 'STACKS_DONE=1; fail "the test ran past its budget of $BUDGET s"' TERM
( end=$(( $(now_ms) + BUDGET * 1000 ))
  while [ "$(now_ms)" -lt $end ]; do sleep 1; done
  kill -TERM $$ 2>/dev/null ) &
PIDS+=($!)
RESET_BOUND_MS=${KOLO_RESET_BOUND_MS:-20000}

# every pid a rank of the job had (REST and pgrep): their segments are
# /dev/shm/kolo-<job>-<gen>-<creator pid>-*
SEEN_PIDS=" "
remember_pids() {
  local p
  for p in $(worker_pids) $(curl -sf "$HTTP/api/v1/jobs/$JOB" | grep -o '"pid":[0-9]*' | cut -d: -f2); do
    case "$SEEN_PIDS" in *" $p "*) ;; *) SEEN_PIDS="$SEEN_PIDS$p " ;; esac
  done
}
shm_left() {
  local p
  for p in $SEEN_PIDS; do ls /dev/shm/kolo-*-*-"$p"-* 2>/dev/null || true; done
}
EXTRA_CLEANUP='for f in $(shm_left); do rm -f "$f"; done'

# placement: the job's running ranks (REST) grouped by host name, as
# "<ranks> <hosts> <min per host> <max per host>"
placement() {
  curl -sf "$HTTP/api/v1/jobs/$JOB" | "$PY" -c '
import collections, json, sys
ranks = [r for r in json.load(sys.stdin)["ranks"] if r.get("state") == "running"]
per = collections.Counter(r["host_name"] for r in ranks)
print(len(ranks), len(per), min(per.values(), default=0), max(per.values(), default=0))'
}
placed() { [ "$(placement)" = "$1" ]; }
# workers (wids) that printed a STEP in generation $1
stepped_in() {
  awk -v g="$1" '/<stdout>:STEP / { for (i = 1; i < NF; i++) if ($i == "gen" && $(i + 1) == g) {
      for (j = 1; j < NF; j++) if ($j == "wid") w[$(j + 1)] = 1 } }
    END { n = 0; for (k in w) n++; print n }' "$WORK/run.out"
}
all_stepped_in() { [ "$(stepped_in "$1")" -ge "$2" ]; }
# the t of the first STEP line of generation $1, and the t at which $2
# workers had stepped in generation $1
first_step_in() { nth_worker_step "$1" 1; }
nth_worker_step() {
  awk -v g="$1" -v n="$2" '/<stdout>:STEP / { gen = 0; t = 0; w = ""
      for (i = 1; i < NF; i++) { if ($i == "gen") gen = $(i + 1); if ($i == "t") t = $(i + 1)
                                 if ($i == "wid") w = $(i + 1) }
      if (gen == g && !(w in first)) first[w] = t }
    END { k = 0; for (w in first) ts[++k] = first[w]; if (k < n) exit
          # the n-th smallest first step time
          for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (ts[j] + 0 < ts[i] + 0) {
            x = ts[i]; ts[i] = ts[j]; ts[j] = x }
          print ts[n] }' "$WORK/run.out"
}
# the first generation above $1 that stepped at size $2
gen_stepped_at() {
  awk -v g="$1" -v n="$2" '/<stdout>:STEP / { gen = 0; s = 0
      for (i = 1; i < NF; i++) { if ($i == "gen") gen = $(i + 1); if ($i == "size") s = $(i + 1) }
      if (gen + 0 > g + 0 && s == n && (m == "" || gen + 0 < m + 0)) m = gen }
    END { print m }' "$WORK/run.out"
}
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%d", (b - a) * 1000 }'; }
gen_field() { # GEN FIELD: a field of generation GEN (REST)
  gens_json | "$PY" -c '
import json, sys
for g in json.load(sys.stdin)["generations"]:
    if g["generation"] == int(sys.argv[1]):
        print(g[sys.argv[2]])' "$1" "$2"
}

# stacks (lib.sh's, on a failure): the threads of a few workers only; gdb
# on 64 workers and their shims at once outlasts the test's timeout
stacks() {
  command -v gdb >/dev/null && [ -z "${STACKS_DONE:-}" ] || return 0
  STACKS_DONE=1
  local p
  for p in $(worker_pids | head -n 4); do
    echo "---- stacks of worker $p"
    timeout 20 gdb -p "$p" -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E '^(Thread|#)' || true
  done
}

note "1. $NP ranks on $HOSTS hosts ($HOSTS agents x $SLOTS slots)"
# A lease far above the heartbeat: 16 agents and 64 workers on 2 CPUs
# (and whatever runs beside them) must not lose a host by starvation; the
# fault here is a worker's death, which the agent reports at once.
LEASE=30s HEARTBEAT=1s start_coordinator coord
for i in $(seq 1 $HOSTS); do start_agent "$(printf 'h%02d' "$i")" $SLOTS; done
wait_for 30 hosts_at_least $HOSTS || fail "$(hosts_alive) of $HOSTS agents registered"

t_submit=$(now_ms)
start_job -np $NP --min-np $(( NP / 2 )) --max-np $NP --blacklist-cooldown-range 3 4 \
    --elastic-timeout 60 -- --commit $COMMIT --delay-ms 20
wait_for 90 stepped $NP 0 || fail "the job did not train with $NP workers: $(tail -n 5 "$WORK/run.err")"
note "first step at $NP ranks $(( $(now_ms) - t_submit )) ms after the submission"
g0=$(gen_current)
wait_for 30 all_stepped_in "$g0" $NP || fail "only $(stepped_in "$g0") of $NP workers stepped in generation $g0"
[ "$(count_workers)" -eq $NP ] || fail "$(count_workers) worker processes, want $NP"
placed "$NP $HOSTS $SLOTS $SLOTS" || fail "placement (ranks hosts min max): $(placement), want $NP $HOSTS $SLOTS $SLOTS"
remember_pids

note "2. kill -9 of one worker"
wait_for 60 progressed $(( $(last_step) + 10 + RANDOM % 10 )) || fail "no progress at $NP (step $(last_step))"
pids=($(worker_pids))
victim=${pids[RANDOM % ${#pids[@]}]}
venv=$(tr '\0' '\n' </proc/"$victim"/environ)
vrank=$(sed -n 's/^KOLO_RANK=//p' <<<"$venv")
vwid=$(sed -n 's/^KOLO_WORKER_ID=//p' <<<"$venv")
vhost=$(curl -sf "$HTTP/api/v1/hosts" | "$PY" -c '
import json, sys
for h in json.load(sys.stdin)["hosts"]:
    if h["id"] == sys.argv[1]:
        print(h["name"])' "$(sed -n 's/^KOLO_HOST_ID=//p' <<<"$venv")")
g0=$(gen_current)
s_kill=$(last_step)
fault worker_kill "pid $victim wid $vwid rank $vrank (of gen 1) host $vhost step $s_kill gen $g0"
t_kill=$(now_s)
kill -9 "$victim"
wait_for 5 gone "$victim" || fail "the victim $victim did not die"
wait_for 30 gen_after "$g0" || fail "no new generation 30 s after the kill ($(gen_cause))"
# The next generation: the first after the kill that is not a survivor's
# own reset (one that saw the dead peer before the coordinator did asks
# for a generation of the same members, which cannot form; kolo waits
# 250 ms for the agent's report to avoid it, a loaded machine may not).
next_gen() {
  gens_json | "$PY" -c '
import json, re, sys
for g in sorted(json.load(sys.stdin)["generations"], key=lambda g: g["generation"]):
    if g["generation"] > int(sys.argv[1]) and not re.match(r"rank \d+ reset and asked", g["cause"]):
        print(g["generation"], g["size"], g["cause"])
        break' "$g0"
}
wait_for 10 eval '[ -n "$(next_gen)" ]' || fail "no generation after $g0 but the survivors' own resets"
read -r g1 size1 cause1 <<<"$(next_gen)"
note "generation $g1: $size1 ranks, cause: $cause1"
[ "$size1" -eq $(( NP - 1 )) ] || fail "generation $g1 has $size1 ranks, want $(( NP - 1 )) (cause: $cause1)"
has "on host $vhost was killed by signal 9" <<<"$cause1" || fail "the cause of generation $g1 does not name the kill on $vhost: $cause1"
# why a generation did not train: its members' failures
fails_in() { grep "<stdout>:FAIL gen $1 " "$WORK/run.out" | head -n 4 || true; }
wait_for 30 all_stepped_in "$g1" $(( NP - 1 )) ||
  fail "only $(stepped_in "$g1") of $(( NP - 1 )) survivors stepped in generation $g1 (generations since: $(gen_current)); failures in it: $(fails_in "$g1")"
t_first=$(first_step_in "$g1")
t_all=$(nth_worker_step "$g1" $(( NP - 1 )))

note "3. the reset's time"
reset_ms=$(ms_between "$t_kill" "$t_first")
all_ms=$(ms_between "$t_kill" "$t_all")
detect_ms=$(ms_between "$t_kill" "$(awk -v t="$(gen_field "$g1" ts_ms)" 'BEGIN { printf "%.3f", t / 1000 }')")
echo "reset: $reset_ms ms (kill -> the first step of generation $g1; the generation formed after $detect_ms ms; every survivor stepped after $all_ms ms)"
[ "$reset_ms" -lt "$RESET_BOUND_MS" ] || fail "the reset took $reset_ms ms (bound $RESET_BOUND_MS ms)"

note "the job grows back to $NP (host $vhost's exclusion cools down in 3-5 s)"
wait_for 60 eval '[ -n "$(gen_stepped_at "$g1" $NP)" ]' ||
  fail "the job did not train with $NP workers again: $(gen_cause)"
g2=$(gen_stepped_at "$g1" $NP)
wait_for 30 all_stepped_in "$g2" $NP || fail "only $(stepped_in "$g2") of $NP workers stepped in generation $g2"
wait_for 10 placed "$NP $HOSTS $SLOTS $SLOTS" || fail "placement after the regrowth: $(placement)"
remember_pids
note "back to $NP in generation $g2 ($(gen_field "$g2" cause)) $(( $(now_ms) - ${t_kill/./} )) ms after the kill"
wait_for 30 progressed $(( $(last_step) + 5 )) || fail "no progress after the regrowth"

note "4. the job ends; every step was right"
finish_job 60
remember_pids
for w in WRONG HANG INITFAIL; do
  ! grep -q "<stdout>:$w " "$WORK/run.out" || fail "$w: $(grep -m 3 "<stdout>:$w " "$WORK/run.out")"
done
"$PY" - "$WORK/run.out" $NP <<'EOF' || fail "the final states are not a fault-free run's"
import json, re, sys
finals = [l.split("<stdout>:FINAL ", 1)[1] for l in open(sys.argv[1], errors="replace")
          if "<stdout>:FINAL " in l]
steps = set()
for f in finals:
    s, d = f.split(" ", 1)
    s, d = int(s), json.loads(d)
    steps.add(s)
    if d["acc"] != s * (s - 1) // 2:
        sys.exit("worker %s: acc %d at step %d, want %d" % (d["wid"], d["acc"], s, s * (s - 1) // 2))
if len(finals) != int(sys.argv[2]) or len(steps) != 1:
    sys.exit("%d FINAL lines (want %s) at steps %s" % (len(finals), sys.argv[2], sorted(steps)))
print("-- %d ranks ended at step %d, each step counted once" % (len(finals), steps.pop()))
EOF
report hosts --commit $COMMIT --max-lost $COMMIT

note "5. no worker, no shared-memory segment left"
[ "$ORPHANS" -eq 0 ] || fail "$ORPHANS worker(s) left: $(worker_pids)"
left=$(shm_left)
[ -z "$left" ] || fail "shared-memory segments left: $left"
echo "reset: $reset_ms ms"
echo PASS
