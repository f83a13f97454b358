#!/usr/bin/env bash
# The data plane between "hosts": network namespaces (a, b, c) joined by
# veth pairs to a bridge in a namespace of its own (a switch: traffic stays
# on this machine, real TCP between the hosts), an agent in each, the
# coordinator and `kolo run` in a's. data/hosts_collectives.py checks
# every collective exactly (every op and dtype, 0 to 300000 elements,
# uneven allgather/alltoall/reducescatter, broadcast from every root,
# barrier, join, process sets, the topology):
#  1. 2 hosts x 2 ranks (-H a:2,b:2);
#  2+3. 3 hosts with uneven local sizes (-H a:2,b:1,c:2), the TCP data
#     plane sealed (--encrypt-data: the leaders' path of small tensors and
#     the lanes' of large ones, both sealed);
#  4. kill -9 of a rank on b while the job trains: the job ends within
#     30 s naming the lost rank, every rank gone;
#  5. the link between b and c cut (nftables: a silent drop both ways,
#     the coordinator still reaches every agent) while a 3-host job trains:
#     the job fails within a bounded time (its data plane's liveness
#     window, KOLO_TIMEOUT_MS=15000, plus slack) naming a rank, never
#     hangs; healed, the same hosts run a job again;
#  6. 3 hosts x 2 ranks with KOLO_HIER_LANES=0: every allreduce, even of
#     one element, split over both lanes between the hosts (by default
#     only those of 32 KiB or more; smaller ones go through the leaders).
# Needs root, `ip netns`, veth, a bridge, nft and /usr/bin/python3 with
# torch; skipped (77) otherwise, with the reason.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
$PY -c "import numpy, torch" 2>/dev/null || skip "no /usr/bin/python3 with numpy and torch"
[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no ip(8)"
command -v nft >/dev/null || skip "no nft"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$ROOT/python"
# the library of the kolo under test (ctest passes KOLO_LIBRARY), never
# another build tree's
KOLO_LIBRARY="${KOLO_LIBRARY:-$(cd "$(dirname "$KOLO")/.." && pwd)/lib/libkolo.so}"
[ -f "$KOLO_LIBRARY" ] || fail "no libkolo at $KOLO_LIBRARY (set KOLO_LIBRARY)"
export KOLO_LIBRARY
WORKER="$ROOT/tests/integration/data/hosts_collectives.py"
RANKS="^$PY $WORKER .*--tag $MARK"  # the ranks' command lines (pgrep -f)
HOSTS=(a b c)
NSS=()
SW=""

# hosts_netns TAG NET COUNT: COUNT namespaces NSS[i] with ADDRS[i] =
# NET.(i+1)/24 on DEVS[i], a veth whose peer is a port of bridge br0 in
# the namespace $SW; lo up everywhere; $WORK/kolo-ns<i> runs $KOLO_BIN in
# NSS[i]. Skips where a namespace, a veth or a bridge cannot be made.
hosts_netns() {
  local tag=$1 net=$2 count=$3 s=$(( MARK % 100000 )) i ns dev out
  SW="kolo-${tag}sw-$s"
  out=$(ip netns add "$SW" 2>&1) || { SW=""; skip "ip netns add: $out"; }
  ip -n "$SW" link set lo up
  out=$(ip -n "$SW" link add br0 type bridge 2>&1) || skip "ip link add type bridge: $out"
  ip -n "$SW" link set br0 up
  for ((i = 0; i < count; i++)); do
    ns="kolo-${tag}$i-$s" dev="k${tag}$i$s"
    out=$(ip netns add "$ns" 2>&1) || skip "ip netns add: $out"
    NSS+=("$ns")
    out=$(ip link add "$dev" netns "$ns" type veth peer name "${dev}p" netns "$SW" 2>&1) ||
      skip "ip link add type veth: $out"
    ip -n "$SW" link set "${dev}p" master br0
    ip -n "$SW" link set "${dev}p" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$net.$((i + 1))/24" dev "$dev"
    ip -n "$ns" link set "$dev" up
    ADDRS[i]="$net.$((i + 1))" DEVS[i]=$dev
    printf '#!/bin/sh\nexec ip netns exec %s %s "$@"\n' "$ns" "$KOLO_BIN" >"$WORK/kolo-ns$i"
    chmod +x "$WORK/kolo-ns$i"
  done
}
hosts_netns_del() {
  local ns
  for ns in "${NSS[@]}" $SW; do ip netns del "$ns" 2>/dev/null || true; done
}

# the ranks' pids (from REST), to sweep their shared-memory segments
# (/dev/shm/kolo-<job>-<gen>-<creator pid>-*) should any be left
RANK_PIDS=()
job_pids() {
  local p
  for p in $(curl -sf "$HTTP/api/v1/jobs/$1" | grep -o '"pid":[0-9]*' | cut -d: -f2); do
    RANK_PIDS+=("$p")
  done
}
shm_left() {
  local p
  for p in "${RANK_PIDS[@]}"; do ls /dev/shm/kolo-*-*-"$p"-* 2>/dev/null || true; done
}

on_exit() {
  local rc=$? p
  # a hung rank's threads, before anything is killed
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && stacks
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pkill -9 -f "$RANKS" 2>/dev/null || true
  wait_for 10 eval '! pgrep -f "$RANKS"' || true
  for p in $(shm_left); do rm -f "$p"; done
  hosts_netns_del
  set +e
  (exit $rc)
  cleanup
}
trap on_exit EXIT
# A budget below ctest's TIMEOUT (whose kill would skip the cleanup and
# leave the namespaces): past it, the jobs' processes are killed, so the
# step that waits on them fails, and the script is told to stop.
# No stacks then (gdb takes long on a loaded machine): the cleanup first.
BUDGET=${KOLO_HOSTS_BUDGET:-540}
trap 'STACKS_DONE=1; fail "the test ran past its budget of $BUDGET s"' TERM
( end=$(( $(now_ms) + BUDGET * 1000 ))
  while [ "$(now_ms)" -lt $end ]; do sleep 1; done
  echo "-- past the budget of $BUDGET s: stopping the jobs" >&2
  pkill -9 -f "$RANKS" || true
  pkill -9 -f -- " run -np .*--tag $MARK" || true
  kill -TERM $$ 2>/dev/null ) &
PIDS+=($!)

KOLO_BIN=$KOLO
hosts_netns h 10.215.0 3
curl() { ip netns exec "${NSS[0]}" curl "$@"; }
KOLO="$WORK/kolo-ns0"
make_token

# a long lease: no section needs one to end, and a crowded machine (the
# coordinator standing still for seconds) must not lose an idle agent
LISTEN="tcp://${ADDRS[0]}:0" LEASE=120s start_coordinator coord --token-file "$WORK/token"
for i in 0 1 2; do
  KOLO="$WORK/kolo-ns$i" start_agent "${HOSTS[i]}" 2 --token-file "$WORK/token" --addr "${ADDRS[i]}"
  wait_for 20 hosts_at_least $((i + 1)) ||
    fail "agent ${HOSTS[i]} (in ${NSS[i]}) did not register: $(tail -n 5 "$WORK/agent-${HOSTS[i]}.log")"
done
JOBS=0

# run_check NAME HOSTS LAYOUT [kolo run flags...]: the collectives worker
# as one job; every rank must print "checked N, 0 wrong".
run_check() {
  local name=$1 hosts=$2 layout=$3 np=0 rc=0 t0 h; shift 3
  for h in ${hosts//,/ }; do np=$((np + ${h#*:})); done
  t0=$(now_ms)
  timeout -k 5 200 "$KOLO" run -np "$np" -H "$hosts" --coordinator "$RPC" \
    --token-file "$WORK/token" "$@" -- "$PY" "$WORKER" --layout "$layout" --tag "$MARK" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  JOBS=$((JOBS + 1))
  job_pids $JOBS
  grep WRONG "$WORK/$name.out" | head -n 40 || true
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$name: kolo run still ran after 200 s (a hang)"
  [ $rc -eq 0 ] || fail "$name: the job failed ($rc): $(tail -n 20 "$WORK/$name.err")"
  ! grep -q WRONG "$WORK/$name.out" || fail "$name: wrong results"
  [ "$(grep -c '<stdout>:checked [0-9]*, 0 wrong' "$WORK/$name.out")" -eq "$np" ] ||
    fail "$name: not every rank checked everything: $(grep checked "$WORK/$name.out")"
  note "$name: $np ranks, $(grep -o 'hosts: .*' "$WORK/$name.out"), $(grep -m1 -o 'checked [0-9]*' "$WORK/$name.out") results on a rank, $(( ($(now_ms) - t0) / 1000 )) s"
}

note "1. 2 hosts x 2 ranks, every collective"
run_check two a:2,b:2 2,2

[ ${#RANK_PIDS[@]} -eq 4 ] || fail "REST listed ${#RANK_PIDS[@]} rank pids of job 1, not 4"

note "2+3. 3 hosts, uneven (2, 1, 2), the TCP data plane sealed"
run_check sealed a:2,b:1,c:2 2,1,2 --encrypt-data
grep -q "<stdout>:hosts: .* encrypt=1" "$WORK/sealed.out" || fail "sealed: the job ran without KOLO_DATA_ENCRYPT=1"

# start_loop NAME HOSTS [kolo run flags...]: the worker's training loop
# (no end), rank 0's step in $WORK/NAME.progress; waits for step 20.
start_loop() {
  local name=$1 hosts=$2 np=0 h; shift 2
  for h in ${hosts//,/ }; do np=$((np + ${h#*:})); done
  "$KOLO" run -np "$np" -H "$hosts" --coordinator "$RPC" --token-file "$WORK/token" "$@" -- \
    "$PY" "$WORKER" --loop 1000000 --progress "$WORK/$name.progress" --tag "$MARK" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" &
  RUN_PID=$!
  PIDS+=("$RUN_PID")
  JOBS=$((JOBS + 1))
  wait_for 90 eval "[ \"\$(cat $WORK/$name.progress 2>/dev/null || echo 0)\" -ge 20 ]" ||
    fail "$name: training did not start: $(tail -n 20 "$WORK/$name.err")"
  job_pids $JOBS
}
# ranks_in NS: the pids of this test's ranks in namespace NS
ranks_in() {
  local p
  for p in $(pgrep -f "$RANKS"); do
    [ "$(ip netns identify "$p" 2>/dev/null)" = "$1" ] && echo "$p"
  done
  true
}
# ended_within NAME SECONDS T0: kolo run (RUN_PID) exits non-zero within
# SECONDS of T0 and no rank of the test is left; sets ELAPSED (ms).
ended_within() {
  local name=$1 secs=$2 t0=$3 rc=0
  wait_for "$secs" eval '! kill -0 $RUN_PID 2>/dev/null' ||
    fail "$name: kolo run still runs $secs s later (a hang): $(tail -n 20 "$WORK/$name.err")"
  ELAPSED=$(( $(now_ms) - t0 ))
  wait "$RUN_PID" || rc=$?
  [ $rc -ne 0 ] || fail "$name: kolo run succeeded"
  ! grep -q WRONG "$WORK/$name.out" || fail "$name: a wrong result: $(grep -m3 WRONG "$WORK/$name.out")"
  wait_for 20 eval '[ -z "$(pgrep -f "$RANKS")" ]' ||
    fail "$name: ranks left 20 s after the job ended: $(pgrep -fa "$RANKS")"
  note "$name: kolo run exited $rc, $ELAPSED ms after the fault: $(grep -m1 'job [0-9]* failed' "$WORK/$name.err")"
}

note "4. kill -9 of a rank on host b while the job trains"
start_loop kill a:2,b:2
victims=($(ranks_in "${NSS[1]}"))
[ ${#victims[@]} -eq 2 ] || fail "want 2 ranks in ${NSS[1]}, found ${#victims[@]}"
victim=${victims[1]}
vrank=$(tr '\0' '\n' <"/proc/$victim/environ" | sed -n 's/^KOLO_RANK=//p')
[ -n "$vrank" ] || fail "no KOLO_RANK in the environment of $victim"
t0=$(now_ms)
kill -9 "$victim"
ended_within kill 30 "$t0"
grep -E "rank $vrank( on host b)? (was killed by signal 9|closed the connection)|rank $vrank\b.*(lost|died|killed|closed)" \
  "$WORK/kill.err" >/dev/null || fail "no error naming the lost rank $vrank: $(tail -n 8 "$WORK/kill.err")"

note "5. the link between hosts b and c cut while a 3-host job trains"
# the liveness window, and the rendezvous deadline too: not so short that
# ranks started slowly on a loaded machine miss it
export KOLO_TIMEOUT_MS=15000
start_loop cut a:2,b:1,c:2
unset KOLO_TIMEOUT_MS
for i in 1 2; do
  other=${ADDRS[3 - i]}
  ip netns exec "${NSS[i]}" nft -f - <<EOF || fail "nft in ${NSS[i]}"
table inet kolo_cut {
  chain in { type filter hook input priority 0; policy accept; ip saddr $other drop; }
}
EOF
done
t0=$(now_ms)
s0=$(cat "$WORK/cut.progress")
ended_within cut 60 "$t0"
note "cut: rank 0 at step $s0 when cut, $(cat "$WORK/cut.progress") at the end"
# the ranks' errors name the peer they lost or waited for
grep -E "HorovodInternalError: .*rank [0-9]+" "$WORK/cut.err" >/dev/null ||
  fail "cut: no rank's error names a rank: $(tail -n 8 "$WORK/cut.err")"
grep -q "job [0-9]* failed: rank [0-9]* on host [abc]" "$WORK/cut.err" ||
  fail "cut: kolo run's reason names no rank: $(tail -n 3 "$WORK/cut.err")"
grep -E '^\[[0-9]+\]<stderr>:.*HorovodInternalError' "$WORK/cut.err" | sed -n '1,8s/^/   /p'
for i in 1 2; do ip netns exec "${NSS[i]}" nft delete table inet kolo_cut; done
wait_for 20 hosts_at_least 3 || fail "an agent was lost after the cut healed: $(hosts_alive) alive"
rc=0
timeout -k 5 90 "$KOLO" run -np 5 -H a:2,b:1,c:2 --coordinator "$RPC" --token-file "$WORK/token" -- \
  "$PY" "$WORKER" --loop 30 --tag "$MARK" >"$WORK/healed.out" 2>"$WORK/healed.err" || rc=$?
JOBS=$((JOBS + 1))
job_pids $JOBS
[ $rc -eq 0 ] || fail "healed: a job across the healed link failed ($rc): $(tail -n 10 "$WORK/healed.err")"
[ "$(grep -c '<stdout>:done 30' "$WORK/healed.out")" -eq 5 ] || fail "healed: not every rank finished"
note "healed: a 3-host job ran 30 steps again"

note "6. 3 hosts x 2 ranks, every allreduce over the lanes (KOLO_HIER_LANES=0)"
KOLO_HIER_LANES=0 run_check lanes a:2,b:2,c:2 2,2,2
grep -q "<stdout>:hosts: .* hier_lanes=0" "$WORK/lanes.out" || fail "lanes: the job ran without KOLO_HIER_LANES=0"

left=$(shm_left)
[ -z "$left" ] || fail "shared-memory segments of the test's ranks left behind: $left"
echo "PASS"
