# lib.sh - shared helpers for kolo's integration tests: real processes on
# loopback, port 0 everywhere, everything under one temporary directory,
# and a cleanup trap that leaves no process behind.
set -euo pipefail

KOLO="${KOLO:?set KOLO to the kolo binary}"
WORK="$(mktemp -d /tmp/kolo-it.XXXXXX)"
# A marker in worker command lines so the test can find (and reap) them:
# `sleep 1000.NNNN` is a plain sleep whose argv is unique to this test.
MARK="$(( (RANDOM << 15 | RANDOM) % 100000 + 1 ))$$"
SLEEP="1000.$MARK"
PIDS=()

# stacks: on failure, the threads of every process of this test that is
# not a kolo daemon (workers, wrappers), where gdb is installed: what a
# hung worker was waiting for.
stacks() {
  command -v gdb >/dev/null && [ -z "${STACKS_DONE:-}" ] || return 0
  STACKS_DONE=1
  local p pids=() gdbs=()
  for p in $(pgrep -f -- "$MARK" || true); do
    case "$(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null)" in
      *" coordinator "*|*" agent "*|*" run "*|sleep*|"") continue ;;
    esac
    pids+=("$p")
    # Python workers that registered faulthandler on SIGUSR1 print their
    # Python stacks to their stderr (the job's output)
    case "$(cat /proc/$p/comm) $(tr '\0' ' ' </proc/$p/cmdline)" in
      python*elastic_worker.py*) kill -USR1 "$p" 2>/dev/null ;;
    esac
    # all at once: gdb reads torch's symbols for seconds per process
    echo "$(tr '\0' ' ' </proc/$p/cmdline | cut -c1-120)" >"$WORK/stacks.$p"
    timeout 40 gdb -p "$p" -batch -ex "thread apply all bt 15" >>"$WORK/stacks.$p" 2>/dev/null &
    gdbs+=($!)
  done
  [ ${#gdbs[@]} -eq 0 ] || wait "${gdbs[@]}"
  for p in "${pids[@]}"; do
    echo "---- stacks of pid $p: $(head -n 1 "$WORK/stacks.$p")"
    grep -E '^(Thread|#)' "$WORK/stacks.$p" || true
  done
}

cleanup() {
  local rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && stacks
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pkill -9 -f "$SLEEP" 2>/dev/null || true
  if [ $rc -ne 0 ]; then
    for f in "$WORK"/*.out "$WORK"/*.err "$WORK"/*.log; do
      [ -f "$f" ] && { echo "---- $f"; tail -n 40 "$f"; }
    done
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# has PATTERN: like grep -q, but reads all its input, so the writer of a
# pipe never dies of SIGPIPE (which pipefail would report as a failure).
has() { grep -- "$1" >/dev/null; }
note() { echo "-- $*"; }

# wait_for SECONDS COMMAND...: polls every 0.1 s until COMMAND succeeds.
wait_for() {
  local deadline=$(( $(date +%s%N) / 1000000 + $1 * 1000 )); shift
  while ! "$@" >/dev/null 2>&1; do
    [ $(( $(date +%s%N) / 1000000 )) -lt $deadline ] || return 1
    sleep 0.1
  done
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# Seeds bash's RANDOM from KOLO_SEED, or from a fresh seed, and prints it,
# so a test whose faults land at random instants replays with
# KOLO_SEED=<seed> (tests/faults/matrix.py passes one per run).
seed_random() {
  SEED="${KOLO_SEED:-$(( (RANDOM << 15 | RANDOM) % 1000000 ))}"
  RANDOM=$SEED
  note "seed $SEED (KOLO_SEED=$SEED replays this run)"
}

# use_python: jobs run /usr/bin/python3 with numpy and the source tree's
# kolo package (PYTHONPATH); the test is skipped where there is none. Sets
# ROOT, the repository.
use_python() {
  command -v /usr/bin/python3 >/dev/null && /usr/bin/python3 -c "import numpy" 2>/dev/null \
    || { echo "SKIP: no /usr/bin/python3 with numpy"; exit 77; }
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  export PYTHONPATH="$ROOT/python"
}

# make_token: a fresh cluster token in $WORK/token (mode 0600); sets TOKEN.
make_token() {
  TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf '%s\n' "$TOKEN" >"$WORK/token"
  chmod 600 "$WORK/token"
}

# token_cluster SLOTS: a coordinator and one agent ("a", SLOTS slots), both
# with a fresh token (make_token); waits for the agent.
token_cluster() {
  make_token
  start_coordinator coord --token-file "$WORK/token"
  start_agent a "$1" --token-file "$WORK/token"
  wait_hosts 1
}

# start_steps NP STEPS PAUSE [kolo run flags...]: runs data/allreduce_steps.py
# (every allreduce checked) under kolo run on $RPC, output in $WORK/run.out
# and run.err; sets RUN_PID and waits for its first progress line.
# steps_seen / progress_at_least N follow it.
start_steps() {
  local np=$1 steps=$2 pause=$3; shift 3
  "$KOLO" run -np "$np" --coordinator "$RPC" "$@" -- /usr/bin/python3 \
    "$(dirname "${BASH_SOURCE[0]}")/data/allreduce_steps.py" "$steps" "$pause" \
    >"$WORK/run.out" 2>"$WORK/run.err" &
  RUN_PID=$!
  PIDS+=("$RUN_PID")
  wait_for 30 progress_at_least 1 || fail "training did not start: $(cat "$WORK/run.err")"
}
steps_seen() { grep -c '<stdout>:step' "$WORK/run.out" 2>/dev/null || true; }
progress_at_least() { [ "$(steps_seen)" -ge "$1" ]; }

# start_coordinator NAME [flags...]: sets COORD_PID, RPC, HTTP.
start_coordinator() {
  local name=$1; shift
  "$KOLO" coordinator --listen "${LISTEN:-tcp://127.0.0.1:0}" --http 127.0.0.1:0 \
      --db "$WORK/$name.db" --lease "${LEASE:-2s}" --heartbeat "${HEARTBEAT:-300ms}" \
      --stop-grace 2s "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  COORD_PID=$!
  PIDS+=("$COORD_PID")
  wait_for 10 grep -q "ready" "$WORK/$name.out" || fail "coordinator $name did not start"
  RPC=$(sed -n 's/.*rpc=\([^ ]*\).*/\1/p' "$WORK/$name.out")
  HTTP=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$WORK/$name.out")
}

# start_agent NAME SLOTS [flags...]: sets AGENT_PID.
start_agent() {
  local name=$1 slots=$2; shift 2
  "$KOLO" agent --coordinator "$RPC" --slots "$slots" --name "$name" \
      --state-dir "$WORK/agent-$name" --log-level info "$@" \
      >"$WORK/agent-$name.out" 2>"$WORK/agent-$name.log" &
  AGENT_PID=$!
  PIDS+=("$AGENT_PID")
}

# hosts_alive: number of live hosts from the REST API.
hosts_alive() {
  curl -sf "$HTTP/api/v1/hosts" | grep -o '"state":"alive"' | wc -l
}

hosts_at_least() { [ "$(hosts_alive)" -ge "$1" ]; }
hosts_exactly() { [ "$(hosts_alive)" -eq "$1" ]; }

wait_hosts() {
  wait_for 10 hosts_at_least "$1" || fail "expected $1 live host(s), have $(hosts_alive)"
}

# count_marked: processes whose command line holds this test's marker.
count_marked() { pgrep -f "^sleep $SLEEP\$" | wc -l; }
marked_exactly() { [ "$(count_marked)" -eq "$1" ]; }

# metric NAME: the coordinator's /metrics value of NAME; negotiates: its
# WorkerService.Negotiate calls so far.
metric() { curl -sf "$HTTP/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
negotiates() { metric 'kolo_rpc_requests_total{method="WorkerService.Negotiate"}'; }
# progress: rank 0's last step (data/rounds_steps.py --progress $WORK/progress).
progress() { cat "$WORK/progress" 2>/dev/null || echo 0; }

# rounds_again FROM TO WHAT: between rank 0's steps FROM and TO (or more) the job
# made (almost) no Negotiate call: its tensors are agreed by readiness
# rounds. The long-polls re-park about once a second per rank.
rounds_again() {
  wait_for 60 eval "[ \"\$(progress)\" -ge $1 ]" || fail "$3: stuck at step $(progress)"
  local s0 n0 s1 n1 to
  s0=$(progress); n0=$(negotiates)
  # at least 20 steps, however far the job got while we looked
  to=$(( $2 > s0 + 20 ? $2 : s0 + 20 ))
  wait_for 60 eval "[ \"\$(progress)\" -ge $to ]" || fail "$3: stuck at step $(progress)"
  s1=$(progress); n1=$(negotiates)
  note "$3: steps $s0 -> $s1, Negotiate calls $n0 -> $n1"
  [ $(( (n1 - n0) * 4 )) -lt $(( s1 - s0 )) ] ||
    fail "$3: rounds did not go on, $((n1 - n0)) Negotiate calls in $((s1 - s0)) steps"
}

# skip REASON: the test cannot run here (ctest reads 77 as skipped).
skip() {
  echo "skipped: $*"
  exit 77
}

# two_hosts TAG NET: two "hosts" made of network namespaces joined by a
# veth pair: $NS0 with $ADDR0 = NET.1/24, $NS1 with $ADDR1 = NET.2/24, lo
# up in both; $WORK/kolo-ns0 and $WORK/kolo-ns1 run kolo ($KOLO_HOST_BIN)
# inside them. Skips the test where they cannot be made (not root, no
# ip(8), no veth). The caller's cleanup runs two_hosts_del.
two_hosts() {
  local tag=$1 net=$2 s=$(( MARK % 100000 )) out
  [ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
  command -v ip >/dev/null || skip "no ip(8)"
  NS0="kolo-${tag}0-$s" NS1="kolo-${tag}1-$s" V0="k${tag}0$s" V1="k${tag}1$s"
  ADDR0="$net.1" ADDR1="$net.2" KOLO_HOST_BIN=$KOLO
  out=$(ip netns add "$NS0" 2>&1) || skip "ip netns add: $out"
  out=$(ip netns add "$NS1" 2>&1) || skip "ip netns add: $out"
  out=$(ip link add "$V0" netns "$NS0" type veth peer name "$V1" netns "$NS1" 2>&1) ||
    skip "ip link add type veth: $out"
  ip -n "$NS0" link set lo up
  ip -n "$NS1" link set lo up
  ip -n "$NS0" addr add "$ADDR0/24" dev "$V0"
  ip -n "$NS1" addr add "$ADDR1/24" dev "$V1"
  ip -n "$NS0" link set "$V0" up
  ip -n "$NS1" link set "$V1" up
  printf '#!/bin/sh\nexec ip netns exec %s %s "$@"\n' "$NS0" "$KOLO_HOST_BIN" >"$WORK/kolo-ns0"
  printf '#!/bin/sh\nexec ip netns exec %s %s "$@"\n' "$NS1" "$KOLO_HOST_BIN" >"$WORK/kolo-ns1"
  chmod +x "$WORK/kolo-ns0" "$WORK/kolo-ns1"
}
two_hosts_del() {
  [ -n "${NS0:-}" ] && ip netns del "$NS0" 2>/dev/null
  [ -n "${NS1:-}" ] && ip netns del "$NS1" 2>/dev/null
  true
}
