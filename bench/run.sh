#!/usr/bin/env bash
# bench/run.sh - kolo against its peers on this machine, side by side.
#
#   bench/run.sh              full run (REPS=3 rounds; ~10-20 min on 2 vCPUs)
#   QUICK=1 bench/run.sh      smoke test: 1 round, fewer sizes and steps
#
# It installs what it needs (Debian packages, as root or through sudo),
# builds kolo (scripts/build.sh) and the peer programs, then runs, in one
# go and interleaved round by round:
#   1. allreduce latency, kolo vs Open MPI MPI_Allreduce (vader) vs
#      torch.distributed all_reduce (Gloo, TCP on lo), np 2 and 4, one host;
#   2. the ResNet-50 gradient step (161 tensors), every impl, np 2 and 4;
#   3. 2 ranks in two network namespaces joined by a veth pair (TCP),
#      kolo vs Open MPI (btl tcp) vs Gloo, large sizes;
#   4. coordinator capacity: negotiated steps/s of one coordinator for a
#      job of 64 / 256 / 1024 simulated ranks (bench/coord_load.c).
# Every launch reports per-size medians over iterations (see README.md);
# the tables give the median over launches. Output: a markdown table on
# stdout, bench/results/<timestamp>.{json,md}, raw logs under
# build/bench-peers/raw/<timestamp>/.
#
# Environment knobs: REPS (rounds, default 3; QUICK: 1), QUICK=1,
# SIZES / NETNS_SIZES (bytes, space separated), NPS ("2 4"),
# RESNET_STEPS (20), LOCAL=0 to skip the one-host parts (1, 2), NETNS=0 to
# skip the namespace part, COORD_LOAD=0 to
# skip the coordinator load, COORD_LOAD_RANKS ("64 256 1024"),
# COORD_LOAD_STEPS (50, batched mode), COORD_LOAD_ROUNDS_STEPS (1000 at
# 100 steps/s), COORD_LOAD_PER_TENSOR_RANKS ("64 256"), SKIP_DEPS=1,
# SKIP_BUILD=1, LAUNCH_TIMEOUT (900 s).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${KOLO_BUILD_DIR:-$root/build}"
bb="$build/bench-peers"
PY=/usr/bin/python3 # Debian's python: the only one that sees python3-torch

QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
    REPS="${REPS:-1}"
    SIZES="${SIZES:-4 65536 1048576 16777216}"
    NETNS_SIZES="${NETNS_SIZES:-4 16777216}"
    RESNET_STEPS="${RESNET_STEPS:-5}"
    COORD_LOAD_RANKS="${COORD_LOAD_RANKS:-64 256}"
    COORD_LOAD_STEPS="${COORD_LOAD_STEPS:-20}"
    COORD_LOAD_ROUNDS_STEPS="${COORD_LOAD_ROUNDS_STEPS:-500}"
    COORD_LOAD_PER_TENSOR_RANKS="${COORD_LOAD_PER_TENSOR_RANKS:-64}"
else
    REPS="${REPS:-3}"
    SIZES="${SIZES:-4 4096 65536 1048576 16777216 67108864 268435456}"
    NETNS_SIZES="${NETNS_SIZES:-4 65536 16777216 67108864 268435456}"
    RESNET_STEPS="${RESNET_STEPS:-20}"
    COORD_LOAD_RANKS="${COORD_LOAD_RANKS:-64 256 1024}"
    COORD_LOAD_STEPS="${COORD_LOAD_STEPS:-50}"
    COORD_LOAD_ROUNDS_STEPS="${COORD_LOAD_ROUNDS_STEPS:-1000}"
    COORD_LOAD_PER_TENSOR_RANKS="${COORD_LOAD_PER_TENSOR_RANKS:-64 256}"
fi
NPS="${NPS:-2 4}"
NETNS="${NETNS:-1}"
LOCAL="${LOCAL:-1}"
COORD_LOAD="${COORD_LOAD:-1}"
LAUNCH_TIMEOUT="${LAUNCH_TIMEOUT:-900}"

# Settings from the caller's environment that would redirect kolo.
unset KOLO_RUN_COORDINATOR KOLO_COORDINATOR KOLO_TOKEN_FILE KOLO_TOKEN KOLO_SLOTS KOLO_NAME \
    KOLO_ADDR KOLO_STATE_DIR KOLO_CONFIG KOLO_DATA_ADDR KOLO_FUSION_THRESHOLD \
    HOROVOD_FUSION_THRESHOLD KOLO_DISABLE_SHM 2>/dev/null || true
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ncpu="$(getconf _NPROCESSORS_ONLN)" # not nproc: it obeys OMP_NUM_THREADS

ts="$(date -u +%Y%m%dT%H%M%SZ)"
raw="$bb/raw/$ts"
results="$root/bench/results"
records="$raw/records.jsonl"
tmp="$(mktemp -d /tmp/kolo-bench.XXXXXX)"
bg_pids=()
ns_a="" ns_b=""

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

SUDO=()
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { log "run as root (or install sudo)"; exit 1; }
    SUDO=(sudo)
fi
as_root() { "${SUDO[@]}" "$@"; }

# stop_pids PID...: SIGTERM, up to 15 s to exit, then SIGKILL; reaps them.
# (Bounded on purpose: a `kolo agent` whose coordinator vanished at the same
# moment was seen to hang in its shutdown.)
stop_pids() {
    local pid left i
    for pid in "$@"; do
        kill "$pid" 2>/dev/null || true
    done
    for i in $(seq 150); do
        left=0
        for pid in "$@"; do
            kill -0 "$pid" 2>/dev/null && left=1
        done
        [ "$left" = 0 ] && break
        sleep 0.1
    done
    for pid in "$@"; do
        if kill -0 "$pid" 2>/dev/null; then
            log "pid $pid ignored SIGTERM for 15 s: SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
}

cleanup() {
    local rc=$?
    set +e
    # Newest first: agents before the coordinator they talk to.
    local i
    for ((i = ${#bg_pids[@]} - 1; i >= 0; i--)); do
        stop_pids "${bg_pids[$i]}"
    done
    [ -n "$ns_a" ] && as_root ip netns del "$ns_a" 2>/dev/null
    [ -n "$ns_b" ] && as_root ip netns del "$ns_b" 2>/dev/null
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- setup

ensure_deps() {
    local pkgs=(openmpi-bin libopenmpi-dev python3-torch python3-numpy iproute2)
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    # kolo's own build dependencies.
    if [ -x scripts/install-deps.sh ] && ! command -v protoc-c >/dev/null; then
        scripts/install-deps.sh
    fi
}

build_all() {
    local try
    for try in 1 2 3; do
        if KOLO_BUILD_DIR="$build" scripts/build.sh >"$tmp/build.log" 2>&1; then
            break
        fi
        log "kolo build failed (try $try; the tree may be mid-change): $(tail -3 "$tmp/build.log")"
        [ "$try" = 3 ] && { cat "$tmp/build.log" >&2; return 1; }
        sleep 60
    done
    mkdir -p "$bb"
    mpicc -O2 -o "$bb/mpi_allreduce" bench/mpi_allreduce.c
    gcc -O2 -D_GNU_SOURCE -Icommon -Iinclude -Iworker -I"$build/proto" bench/coord_load.c \
        "$build/common/libkolo_common.a" "$build/libkolo_proto.a" \
        -lnng -lprotobuf-c -lpthread -o "$bb/coord_load"
    gcc -O2 -o "$bb/tcp_rtt" bench/tcp_rtt.c
}

[ "${SKIP_DEPS:-0}" = 1 ] || ensure_deps
[ "${SKIP_BUILD:-0}" = 1 ] || { log "building kolo and the peer programs"; build_all; }
for f in "$build/bin/kolo" "$build/bin/kolo-bench-allreduce" "$bb/mpi_allreduce" "$bb/coord_load" "$bb/tcp_rtt"; do
    [ -x "$f" ] || { log "missing $f"; exit 1; }
done
export OMP_NUM_THREADS=1 # as peers-bench.md: one compute thread per rank
"$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' ||
    { log "$PY cannot use torch.distributed with gloo"; exit 1; }
mkdir -p "$raw" "$results"
: >"$records"

# ---------------------------------------------------------------- launches

# launch SCENARIO ROUND TAG cmd_FN ARGS...: runs one launch (the command
# cmd_FN puts in CMD), keeps its output, and
# appends its JSON lines to the records with the launch's context.
launch() {
    local scenario="$1" round="$2" tag="$3"
    shift 3
    "$@" # sets CMD
    local out="$raw/$tag.out" err="$raw/$tag.err" rc=0
    local load
    load="$(cut -d' ' -f1 /proc/loadavg)"
    local t0=$SECONDS
    timeout --kill-after=20 "$LAUNCH_TIMEOUT" "${CMD[@]}" >"$out" 2>"$err" || rc=$?
    local n
    n="$(grep -c '{"impl"' "$out" || true)"
    log "$tag: rc=$rc, $n result(s), $((SECONDS - t0)) s, load $load"
    sed -n 's/^[^{]*\({"impl".*}\)[[:space:]]*$/\1/p' "$out" |
        sed "s/^{/{\"scenario\":\"$scenario\",\"round\":$round,\"launch\":\"$tag\",\"load1\":$load,/" \
            >>"$records"
    if [ "$rc" != 0 ]; then
        printf '{"scenario":"%s","round":%s,"launch":"%s","failed":true,"rc":%s}\n' \
            "$scenario" "$round" "$tag" "$rc" >>"$records"
        tail -5 "$err" >&2 || true
    fi
}

# cmd_<impl>_<scenario> NP ARGS... sets CMD, the command line of one launch.
cmd_kolo_local() {
    local np="$1"
    shift
    CMD=("$build/bin/kolo" run -np "$np" --state-dir "$tmp/state" -- "$build/bin/kolo-bench-allreduce" "$@")
}
cmd_mpi_local() {
    local np="$1"
    shift
    CMD=(mpirun --oversubscribe --allow-run-as-root -np "$np" --mca btl "vader,self" "$bb/mpi_allreduce" "$@")
}
cmd_gloo_local() {
    local np="$1"
    shift
    CMD=(env GLOO_SOCKET_IFNAME=lo "$PY" bench/torch_gloo.py --np "$np" "$@")
}

# The order of the three impls rotates from round to round.
impl_order() {
    case $(($1 % 3)) in
    0) echo "kolo mpi gloo" ;;
    1) echo "mpi gloo kolo" ;;
    *) echo "gloo kolo mpi" ;;
    esac
}

log "results go to $results/$ts.{json,md}; raw logs in $raw"
if [ "$LOCAL" = 1 ]; then
    log "allreduce: sizes [$SIZES], np [$NPS], $REPS round(s)"
    for round in $(seq 1 "$REPS"); do
        for np in $NPS; do
            for impl in $(impl_order "$round"); do
                # shellcheck disable=SC2086
                launch local "$round" "sizes-$impl-np$np-r$round" "cmd_${impl}_local" "$np" sizes $SIZES
            done
        done
    done

    log "resnet50 step: $RESNET_STEPS steps, np [$NPS], $REPS round(s)"
    for round in $(seq 1 "$REPS"); do
        for np in $NPS; do
            for impl in $(impl_order "$round"); do
                launch local "$round" "resnet-$impl-np$np-r$round" "cmd_${impl}_local" "$np" \
                    resnet bench/resnet50_sizes.txt "$RESNET_STEPS"
            done
        done
    done
fi

# ---------------------------------------------------------------- namespaces

veth_tx() { as_root ip -n "$ns_a" -s link show kbv0 | awk '/TX:/{getline; print $1; exit}'; }

if [ "$NETNS" = 1 ]; then
    log "netns: two namespaces joined by a veth pair, 2 ranks, sizes [$NETNS_SIZES]"
    ns_a="kbA$$"
    ns_b="kbB$$"
    as_root ip netns add "$ns_a"
    as_root ip netns add "$ns_b"
    as_root ip link add kbv0 netns "$ns_a" type veth peer name kbv1 netns "$ns_b"
    as_root ip -n "$ns_a" addr add 10.77.0.1/24 dev kbv0
    as_root ip -n "$ns_b" addr add 10.77.0.2/24 dev kbv1
    for ns in "$ns_a" "$ns_b"; do
        as_root ip -n "$ns" link set lo up
    done
    as_root ip -n "$ns_a" link set kbv0 up
    as_root ip -n "$ns_b" link set kbv1 up
    export KOLO_BENCH_NSMAP="10.77.0.1=$ns_a 10.77.0.2=$ns_b"
    ns_agent_pids=()

    # kolo: a coordinator on 10.77.0.1 (a token is required off loopback)
    # and one agent with one slot in each namespace.
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/token"
    chmod 600 "$tmp/token"
    "${SUDO[@]}" ip netns exec "$ns_a" "$build/bin/kolo" coordinator --listen tcp://10.77.0.1:0 --http '' \
        --db "$tmp/netns-coord.db" --token-file "$tmp/token" --log-level warn \
        >"$raw/netns-coordinator.out" 2>"$raw/netns-coordinator.err" &
    ns_coord_pid=$!
    bg_pids+=("$ns_coord_pid")
    coord_url=""
    for _ in $(seq 100); do
        coord_url="$(sed -n 's/.*ready rpc=\([^ ]*\).*/\1/p' "$raw/netns-coordinator.out")"
        [ -n "$coord_url" ] && break
        sleep 0.1
    done
    [ -n "$coord_url" ] || { log "netns coordinator did not start"; cat "$raw/netns-coordinator.err" >&2; exit 1; }
    for side in A B; do
        ns="$ns_a"
        [ "$side" = B ] && ns="$ns_b"
        "${SUDO[@]}" ip netns exec "$ns" "$build/bin/kolo" agent --coordinator "$coord_url" \
            --token-file "$tmp/token" --slots 1 --name "ns$side" --state-dir "$tmp/agent-$side" \
            --log-level warn >"$raw/netns-agent-$side.log" 2>&1 &
        ns_agent_pids+=($!)
        bg_pids+=($!)
    done
    for _ in $(seq 100); do
        alive="$(as_root ip netns exec "$ns_a" "$build/bin/kolo" status --coordinator "$coord_url" \
            --token-file "$tmp/token" 2>/dev/null | grep -c ' alive ' || true)"
        [ "$alive" -ge 2 ] && break
        sleep 0.2
    done

    kolo_run_flags=()
    cmd_kolo_netns() {
        CMD=("${SUDO[@]}" ip netns exec "$ns_a" "$build/bin/kolo" run --coordinator "$coord_url"
            --token-file "$tmp/token" -np 2 -H "nsA:1,nsB:1" "${kolo_run_flags[@]}"
            -- "$build/bin/kolo-bench-allreduce" "$@")
    }
    # The same with the data plane sealed (--encrypt-data, AES-256-GCM):
    # what encryption costs, beside the peers.
    cmd_kolosealed_netns() {
        kolo_run_flags=(--encrypt-data)
        cmd_kolo_netns "$@"
        kolo_run_flags=()
    }
    cmd_mpi_netns() {
        # --bind-to none: each emulated host would bind its rank to core 0
        # of the same 2 cores.
        CMD=("${SUDO[@]}" env KOLO_BENCH_NSMAP="$KOLO_BENCH_NSMAP" ip netns exec "$ns_a"
            mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2
            --host "10.77.0.1:1,10.77.0.2:1" --mca plm_rsh_agent "$root/bench/nsrsh.sh"
            --mca btl "tcp,self" --mca btl_tcp_if_include 10.77.0.0/24
            --mca oob_tcp_if_include 10.77.0.0/24 "$bb/mpi_allreduce" "$@")
    }
    cmd_gloo_netns() {
        CMD=("${SUDO[@]}" "$PY" bench/torch_gloo.py --np 2 --master-addr 10.77.0.1
            --ns "$ns_a:kbv0" --ns "$ns_b:kbv1" "$@")
    }
    # The floor under a small allreduce between the namespaces: the TCP
    # round trip of a 4-byte ping-pong, measured in each round beside them.
    cmd_tcp_rtt() {
        "${SUDO[@]}" ip netns exec "$ns_b" timeout 60 "$bb/tcp_rtt" server 7979 &
        rtt_server=$!
        CMD=("${SUDO[@]}" ip netns exec "$ns_a" "$bb/tcp_rtt" client 10.77.0.2 7979 2000)
    }
    for round in $(seq 1 "$REPS"); do
        launch netns "$round" "netns-tcp-rtt-r$round" cmd_tcp_rtt
        wait "$rtt_server" 2>/dev/null || true # it ends with its client
        for impl in $(impl_order "$round") kolosealed; do
            tx0="$(veth_tx)"
            # shellcheck disable=SC2086
            launch netns "$round" "netns-$impl-r$round" "cmd_${impl}_netns" sizes $NETNS_SIZES
            tx1="$(veth_tx)"
            printf '{"scenario":"netns","round":%s,"launch":"netns-%s-r%s","impl_tag":"%s","veth_tx_bytes":%s}\n' \
                "$round" "$impl" "$round" "$impl" "$((tx1 - tx0))" >>"$records"
        done
    done
    stop_pids "${ns_agent_pids[@]}"
    stop_pids "$ns_coord_pid"
    bg_pids=()
    as_root ip netns del "$ns_a"
    as_root ip netns del "$ns_b"
    ns_a="" ns_b=""
fi

# ---------------------------------------------------------------- coordinator load

cmd_coord_load() { # URL RANKS COORDINATOR_PID MODE STEPS
    CMD=("$bb/coord_load" --coordinator "$1" --ranks "$2" --steps "$5" --mode "$4"
        --tensors bench/resnet50_sizes.txt --coord-pid "$3")
}

# What the coordinator does per training step, by what libkolo sends it:
# rounds (the default: telemetry only, paced at 100 steps/s for
# COORD_LOAD_ROUNDS_STEPS steps), per-tensor (KOLO_FAST_PATH=0: one
# Negotiate per tensor; COORD_LOAD_PER_TENSOR_RANKS only, it is slow),
# batched (one Negotiate per step, the coordinator path's best case).
if [ "$COORD_LOAD" = 1 ]; then
    log "coordinator load: ranks [$COORD_LOAD_RANKS], 161 tensors a step"
    for spec in $(for n in $COORD_LOAD_RANKS; do echo "rounds:$n:$COORD_LOAD_ROUNDS_STEPS" "batched:$n:$COORD_LOAD_STEPS"; done) \
        $(for n in $COORD_LOAD_PER_TENSOR_RANKS; do echo "per-tensor:$n:3"; done); do
        mode="${spec%%:*}"; rest="${spec#*:}"; n="${rest%%:*}"; steps="${rest#*:}"
        ctx=$((4 * n + 256))
        [ "$ctx" -lt 1024 ] && ctx=1024
        rm -f "$tmp/load-coord.db"*
        "$build/bin/kolo" coordinator --listen tcp://127.0.0.1:0 --http '' --db "$tmp/load-coord.db" \
            --rpc-contexts "$ctx" --log-level warn >"$raw/load-coordinator-$n.out" \
            2>"$raw/load-coordinator-$n.err" &
        cpid=$!
        bg_pids+=("$cpid")
        url=""
        for _ in $(seq 100); do
            url="$(sed -n 's/.*ready rpc=\([^ ]*\).*/\1/p' "$raw/load-coordinator-$n.out")"
            [ -n "$url" ] && break
            sleep 0.1
        done
        if [ -n "$url" ]; then
            launch coord_load 1 "coord-load-$mode-$n" cmd_coord_load "$url" "$n" "$cpid" "$mode" "$steps"
        else
            log "load coordinator did not start"
        fi
        stop_pids "$cpid"
        bg_pids=()
    done
fi

# ---------------------------------------------------------------- report

machine="$raw/machine.json"
{
    printf '{"date":"%s",' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf '"nproc":%s,' "$ncpu"
    printf '"cpu_model":"%s",' "$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
    printf '"kernel":"%s",' "$(uname -r)"
    printf '"os":"%s",' "$(sed -n 's/^PRETTY_NAME="\(.*\)"$/\1/p' /etc/os-release)"
    printf '"mem_gib":%s,' "$(awk '/MemTotal/{printf "%.1f", $2/1048576}' /proc/meminfo)"
    printf '"loadavg_end":"%s",' "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf '"openmpi":"%s",' "$(mpirun --version 2>/dev/null | head -1)"
    printf '"torch":"%s",' "$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
    printf '"kolo":"%s",' "$("$build/bin/kolo" --version 2>/dev/null | head -1)"
    printf '"reps":%s,"quick":%s,"sizes":"%s","netns_sizes":"%s","nps":"%s","resnet_steps":%s}\n' \
        "$REPS" "$QUICK" "$SIZES" "$NETNS_SIZES" "$NPS" "$RESNET_STEPS"
} >"$machine"

"$PY" bench/aggregate.py "$records" "$machine" "$results/$ts.json" "$results/$ts.md"
cat "$results/$ts.md"
log "wrote $results/$ts.json and $results/$ts.md"
