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
#   4. "hosts": H network namespaces x L ranks each, joined by a bridge
#      (shapes HOSTS_SHAPES, "2x2 4x2"): kolo (plain and sealed) vs Open MPI
#      (vader+tcp, default and mpi_yield_when_idle) vs Gloo, allreduce sizes
#      and the ResNet-50 step, beside the TCP round trip across the bridge;
#   5. coordinator capacity: negotiated steps/s of one coordinator for a
#      job of 64 / 256 / 1024 simulated ranks (bench/coord_load.c).
# Every launch reports per-size medians over iterations (see README.md);
# the tables give the median over launches. Output: a markdown table on
# stdout, bench/results/<timestamp>.{json,md}, raw logs under
# build/bench-peers/raw/<timestamp>/.
#
# Environment knobs: REPS (rounds, default 3; QUICK: 1), QUICK=1,
# SIZES / NETNS_SIZES (bytes, space separated), NPS ("2 4"),
# RESNET_STEPS (20), LOCAL=0 to skip the one-host parts (1, 2), NETNS=0 to
# skip the namespace part, HOSTS=0 to skip the hosts part, HOSTS_SHAPES
# ("2x2 4x2": namespaces x ranks per namespace), HOSTS_SIZES ("4 65536
# 1048576 16777216"), HOSTS_SEALED_SHAPES (shapes that also run kolo with
# --encrypt-data, "2x2"; "all" for every shape), HOSTS_RESNET=0 to skip the
# ResNet step there, HOSTS_SPIN_ITERS (100), HOSTS_SPIN_RESNET_STEPS (5)
# and HOSTS_SPIN_TIMEOUT (600 s, QUICK: 300): the iterations, steps and
# time of one launch of Open MPI's default, spinning mode there,
# COORD_LOAD=0 to
# skip the coordinator load, COORD_LOAD_RANKS ("64 256 1024"),
# COORD_LOAD_STEPS (50, batched mode), COORD_LOAD_ROUNDS_STEPS (1000 at
# 100 steps/s), COORD_LOAD_PER_TENSOR_RANKS ("64 256"), SKIP_DEPS=1,
# SKIP_BUILD=1 (kolo is not built; the peer programs still are, when
# missing or older than their source), LAUNCH_TIMEOUT (900 s),
# BUILD_DIR (or KOLO_BUILD_DIR; default build/, relative to the repository).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-${KOLO_BUILD_DIR:-$root/build}}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
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
HOSTS="${HOSTS:-1}"
HOSTS_SHAPES="${HOSTS_SHAPES:-2x2 4x2}"
HOSTS_SIZES="${HOSTS_SIZES:-4 65536 1048576 16777216}"
HOSTS_SEALED_SHAPES="${HOSTS_SEALED_SHAPES:-2x2}"
HOSTS_RESNET="${HOSTS_RESNET:-1}"
# Open MPI's default (spinning) mode in the hosts part takes up to a few
# hundred ms per small allreduce on 2 vCPUs: its launches run at most
# HOSTS_SPIN_ITERS timed iterations per size (0: the usual counts) and
# HOSTS_SPIN_RESNET_STEPS ResNet steps, and stop after HOSTS_SPIN_TIMEOUT s
# (what they measured until then is kept; the launch is listed as failed).
HOSTS_SPIN_ITERS="${HOSTS_SPIN_ITERS:-100}"
HOSTS_SPIN_RESNET_STEPS="${HOSTS_SPIN_RESNET_STEPS:-$((RESNET_STEPS < 5 ? RESNET_STEPS : 5))}"
HOSTS_SPIN_TIMEOUT="${HOSTS_SPIN_TIMEOUT:-$([ "$QUICK" = 1 ] && echo 300 || echo 600)}"
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
hosts_br="" hosts_ns=() # the hosts part's bridge namespace and host namespaces

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
    for i in "${hosts_ns[@]}"; do
        as_root ip netns del "$i" 2>/dev/null
    done
    [ -n "$hosts_br" ] && as_root ip netns del "$hosts_br" 2>/dev/null
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

build_kolo() {
    local try
    for try in 1 2 3; do
        if KOLO_BUILD_DIR="$build" scripts/build.sh >"$tmp/build.log" 2>&1; then
            break
        fi
        log "kolo build failed (try $try; the tree may be mid-change): $(tail -3 "$tmp/build.log")"
        [ "$try" = 3 ] && { cat "$tmp/build.log" >&2; return 1; }
        sleep 60
    done
}

# fresh OUT IN...: OUT exists and is newer than every IN.
fresh() {
    local out="$1" f
    shift
    for f in "$@"; do
        [ "$out" -nt "$f" ] || return 1
    done
}

# The peer programs, each when missing or older than its sources (or, for
# coord_load, than the kolo libraries it links).
build_peers() {
    mkdir -p "$bb"
    fresh "$bb/mpi_allreduce" bench/mpi_allreduce.c bench/bench_clock.h ||
        mpicc -O2 -o "$bb/mpi_allreduce" bench/mpi_allreduce.c
    fresh "$bb/coord_load" bench/coord_load.c "$build/common/libkolo_common.a" \
        "$build/libkolo_proto.a" ||
        gcc -O2 -D_GNU_SOURCE -Icommon -Iinclude -Iworker/runtime -I"$build/proto" bench/coord_load.c \
            "$build/common/libkolo_common.a" "$build/libkolo_proto.a" \
            -lnng -lprotobuf-c -lpthread -o "$bb/coord_load"
    fresh "$bb/tcp_rtt" bench/tcp_rtt.c bench/bench_clock.h bench/bench_net.h || gcc -O2 -o "$bb/tcp_rtt" bench/tcp_rtt.c
    # -O3 -march=native: the flags of kolo's own reductions (worker/CMakeLists.txt)
    fresh "$bb/copy_floor" bench/copy_floor.c bench/bench_clock.h bench/bench_net.h ||
        gcc -O3 -march=native -o "$bb/copy_floor" bench/copy_floor.c
}

[ "${SKIP_DEPS:-0}" = 1 ] || ensure_deps
[ "${SKIP_BUILD:-0}" = 1 ] || { log "building kolo in $build"; build_kolo; }
build_peers
for f in "$build/bin/kolo" "$build/bin/kolo-bench-allreduce" "$bb/mpi_allreduce" "$bb/coord_load" "$bb/tcp_rtt" "$bb/copy_floor"; do
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
# cmd_FN may also set CMD_IMPL (the "impl" its records report as, e.g.
# openmpi-yield) and CMD_TIMEOUT (seconds, instead of LAUNCH_TIMEOUT; the
# records a launch printed before its timeout are kept); LAUNCH_EXTRA
# ('"k":v,' pairs) is added to every record.
CMD_IMPL=""
CMD_TIMEOUT=""
LAUNCH_EXTRA=""
launch() {
    local scenario="$1" round="$2" tag="$3"
    shift 3
    CMD_IMPL=""
    CMD_TIMEOUT=""
    "$@" # sets CMD
    local out="$raw/$tag.out" err="$raw/$tag.err" rc=0
    local load
    load="$(cut -d' ' -f1 /proc/loadavg)"
    local t0=$SECONDS
    timeout --kill-after=20 "${CMD_TIMEOUT:-$LAUNCH_TIMEOUT}" "${CMD[@]}" >"$out" 2>"$err" || rc=$?
    local n
    n="$(grep -c '{"impl"' "$out" || true)"
    log "$tag: rc=$rc, $n result(s), $((SECONDS - t0)) s, load $load"
    local rename="s/^/ /"
    [ -n "$CMD_IMPL" ] && rename="s/^{\"impl\":\"[^\"]*\"/ {\"impl\":\"$CMD_IMPL\"/"
    sed -n 's/^[^{]*\({"impl".*}\)[[:space:]]*$/\1/p' "$out" | sed "$rename" |
        sed "s/^ *{/{\"scenario\":\"$scenario\",\"round\":$round,\"launch\":\"$tag\",\"load1\":$load,$LAUNCH_EXTRA/" \
            >>"$records"
    if [ "$rc" != 0 ]; then
        printf '{"scenario":"%s","round":%s,"launch":"%s",%s"failed":true,"rc":%s}\n' \
            "$scenario" "$round" "$tag" "$LAUNCH_EXTRA" "$rc" >>"$records"
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

# Open MPI's nonblocking form, MPI_Iallreduce + MPI_Wait: the shape of
# kolo's calls (an async op, then a wait on its handle).
cmd_mpinb_local() {
    local np="$1"
    shift
    [ "$1" = sizes ] && shift
    cmd_mpi_local "$np" isizes "$@"
}

# ROUND IMPL...: the impls, their order rotated from round to round.
impl_order() {
    local r="$1" i
    shift
    local a=("$@")
    for ((i = 0; i < ${#a[@]}; i++)); do
        printf '%s ' "${a[$(((i + r) % ${#a[@]}))]}"
    done
}

log "results go to $results/$ts.{json,md}; raw logs in $raw"
if [ "$LOCAL" = 1 ]; then
    log "allreduce: sizes [$SIZES], np [$NPS], $REPS round(s)"
    for round in $(seq 1 "$REPS"); do
        for np in $NPS; do
            for impl in $(impl_order "$round" kolo mpi mpinb gloo); do
                # shellcheck disable=SC2086
                launch local "$round" "sizes-$impl-np$np-r$round" "cmd_${impl}_local" "$np" sizes $SIZES
            done
        done
    done

    log "resnet50 step: $RESNET_STEPS steps, np [$NPS], $REPS round(s)"
    for round in $(seq 1 "$REPS"); do
        for np in $NPS; do
            for impl in $(impl_order "$round" kolo mpi gloo); do
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
        for impl in $(impl_order "$round" kolo mpi gloo) kolosealed; do
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

# ---------------------------------------------------------------- hosts

# H emulated hosts of L ranks each: H network namespaces kbH<pid>-<i>, each
# with one veth (kbh<i>, 10.78.0.<i+1>/24) whose peer (kbp<i>) is a port of
# the bridge kbbr0 in a namespace of its own (kbHbr<pid>), so the root
# namespace is untouched and every packet stays on this machine.
hosts_up() { # H
    local h="$1" i ns
    hosts_br="kbHbr$$"
    as_root ip netns add "$hosts_br"
    as_root ip -n "$hosts_br" link set lo up
    as_root ip -n "$hosts_br" link add kbbr0 type bridge
    as_root ip -n "$hosts_br" link set kbbr0 up
    hosts_ns=()
    for ((i = 0; i < h; i++)); do
        ns="kbH$$-$i"
        as_root ip netns add "$ns"
        hosts_ns+=("$ns")
        as_root ip link add "kbp$i" netns "$hosts_br" type veth peer name "kbh$i" netns "$ns"
        as_root ip -n "$hosts_br" link set "kbp$i" master kbbr0
        as_root ip -n "$hosts_br" link set "kbp$i" up
        as_root ip -n "$ns" addr add "10.78.0.$((i + 1))/24" dev "kbh$i"
        as_root ip -n "$ns" link set lo up
        as_root ip -n "$ns" link set "kbh$i" up
    done
}
hosts_down() {
    local ns
    for ns in "${hosts_ns[@]}"; do
        as_root ip netns del "$ns" 2>/dev/null || true
    done
    hosts_ns=()
    [ -n "$hosts_br" ] && { as_root ip netns del "$hosts_br" 2>/dev/null || true; }
    hosts_br=""
}
# Bytes the bridge delivered to the hosts (TX of its ports), all ports.
bridge_tx() {
    local i s=0 n
    for ((i = 0; i < ${#hosts_ns[@]}; i++)); do
        n="$(as_root ip -n "$hosts_br" -s link show "kbp$i" | awk '/TX:/{getline; print $1; exit}')"
        s=$((s + n))
    done
    echo "$s"
}
# The impls of one round of the hosts part, rotating from round to round.
hosts_order() {
    local a=(kolo mpi mpiyield gloo) r=$(($1 % 4))
    echo "${a[*]:r} ${a[*]:0:r}"
}

if [ "$HOSTS" = 1 ]; then
    for shape in $HOSTS_SHAPES; do
        nh="${shape%x*}"
        nl="${shape#*x}"
        if ! [[ "$nh" =~ ^[0-9]+$ && "$nl" =~ ^[0-9]+$ ]] || [ "$nh" -lt 2 ] || [ "$nh" -gt 200 ] ||
            [ "$nl" -lt 1 ]; then
            log "hosts: bad shape '$shape' (want HxL, 2 <= H <= 200, L >= 1): skipped"
            continue
        fi
        np=$((nh * nl))
        sc="hosts-$shape"
        LAUNCH_EXTRA="\"shape\":\"$shape\",\"hosts\":$nh,\"ranks_per_host\":$nl,"
        sealed=0
        case " $HOSTS_SEALED_SHAPES " in *" all "* | *" $shape "*) sealed=1 ;; esac
        log "hosts $shape: $nh namespaces on a bridge, $nl rank(s) each (np $np), sizes [$HOSTS_SIZES]"
        hosts_up "$nh"
        nsmap="" hostlist="" hostfile="$tmp/hosts-$shape.ompi"
        : >"$hostfile"
        for ((i = 0; i < nh; i++)); do
            nsmap+="10.78.0.$((i + 1))=${hosts_ns[$i]} "
            hostlist+="${hostlist:+,}h$i:$nl"
            echo "10.78.0.$((i + 1)) slots=$nl" >>"$hostfile"
        done
        export KOLO_BENCH_NSMAP="$nsmap"
        ns0="${hosts_ns[0]}"

        # kolo: a coordinator in host 0's namespace, one agent with L slots
        # per namespace (names h0, h1, ...). --lease 60s (default 5 s): the
        # peers' launches can hold both CPUs for seconds, and a host that
        # misses its heartbeats meanwhile must not be dropped (this measures
        # the data plane, not failure detection).
        [ -s "$tmp/token" ] || { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/token"; }
        chmod 600 "$tmp/token"
        rm -f "$tmp/hosts-coord.db"*
        "${SUDO[@]}" ip netns exec "$ns0" "$build/bin/kolo" coordinator --listen tcp://10.78.0.1:0 \
            --http '' --db "$tmp/hosts-coord.db" --token-file "$tmp/token" --lease 60s --log-level warn \
            >"$raw/$sc-coordinator.out" 2>"$raw/$sc-coordinator.err" &
        h_coord_pid=$!
        bg_pids+=("$h_coord_pid")
        coord_url=""
        for _ in $(seq 100); do
            coord_url="$(sed -n 's/.*ready rpc=\([^ ]*\).*/\1/p' "$raw/$sc-coordinator.out")"
            [ -n "$coord_url" ] && break
            sleep 0.1
        done
        [ -n "$coord_url" ] || { log "hosts coordinator did not start"; cat "$raw/$sc-coordinator.err" >&2; exit 1; }
        h_agent_pids=()
        hosts_agent() { # I: (re)starts agent h<I> in namespace I
            "${SUDO[@]}" ip netns exec "${hosts_ns[$1]}" "$build/bin/kolo" agent --coordinator "$coord_url" \
                --token-file "$tmp/token" --slots "$nl" --name "h$1" --state-dir "$tmp/$sc-agent-$1" \
                --log-level warn >>"$raw/$sc-agent-$1.log" 2>&1 &
            h_agent_pids[$1]=$!
            bg_pids+=($!)
        }
        # The agents the coordinator does not list as alive.
        hosts_agents_lost() {
            local st i
            st="$(as_root ip netns exec "$ns0" "$build/bin/kolo" status --coordinator "$coord_url" \
                --token-file "$tmp/token" 2>/dev/null || true)"
            for ((i = 0; i < nh; i++)); do
                grep -Eq "[[:space:]]h${i}[[:space:]].*[[:space:]]alive[[:space:]]" <<<"$st" || echo "h$i"
            done
        }
        # Before every kolo launch: all agents alive within 20 s, or the lost
        # ones are restarted (a peer launch that keeps the CPUs busy can make
        # an agent miss its heartbeats; one was seen to hang for good in the
        # redial that follows). Every restart is recorded and reported.
        hosts_agents_ready() { # TAG: the launch about to run
            local lost="" a t0=$SECONDS
            while :; do
                lost="$(hosts_agents_lost)"
                [ -z "$lost" ] && return 0
                [ $((SECONDS - t0)) -ge 20 ] && break
                sleep 0.2
            done
            log "hosts $shape: agent(s) $(tr '\n' ' ' <<<"$lost")not alive before $1: restarting them"
            local pids=()
            for a in $lost; do
                pids+=("${h_agent_pids[${a#h}]}")
            done
            stop_pids "${pids[@]}"
            for a in $lost; do
                hosts_agent "${a#h}"
                printf '{"scenario":"%s","round":%s,"launch":"%s",%s"agent_restart":"%s"}\n' \
                    "$sc" "$round" "$1" "$LAUNCH_EXTRA" "$a" >>"$records"
            done
            t0=$SECONDS
            while [ $((SECONDS - t0)) -lt 30 ]; do
                [ -z "$(hosts_agents_lost)" ] && return 0
                sleep 0.2
            done
            log "hosts $shape: agents still not alive before $1: $(hosts_agents_lost | tr '\n' ' ')"
        }
        for ((i = 0; i < nh; i++)); do
            hosts_agent "$i"
        done
        round=0
        hosts_agents_ready start

        kolo_run_flags=()
        cmd_kolo_hosts() {
            CMD=("${SUDO[@]}" ip netns exec "$ns0" "$build/bin/kolo" run --coordinator "$coord_url"
                --token-file "$tmp/token" -np "$np" -H "$hostlist" "${kolo_run_flags[@]}"
                -- "$build/bin/kolo-bench-allreduce" "$@")
        }
        cmd_kolosealed_hosts() {
            kolo_run_flags=(--encrypt-data)
            cmd_kolo_hosts "$@"
            kolo_run_flags=()
        }
        # Open MPI from host 0's namespace, L slots per namespace address
        # (ranks fill a host before the next), orted started in the other
        # namespaces by nsrsh.sh; vader between the ranks of a namespace,
        # tcp across the bridge. --bind-to none: every emulated host would
        # otherwise bind its ranks to the same first cores. Default mode:
        # iterations and steps capped (HOSTS_SPIN_*, see the knobs above).
        cmd_mpi_hosts() {
            local args=("$@")
            CMD_TIMEOUT="$HOSTS_SPIN_TIMEOUT"
            if [ "$1" = resnet ]; then
                args=(resnet "$2" "$HOSTS_SPIN_RESNET_STEPS")
            fi
            cmd_mpi_hosts_any -x "MPI_BENCH_MAX_ITERS=$HOSTS_SPIN_ITERS" -- "${args[@]}"
        }
        cmd_mpi_hosts_any() { # MPIRUN_OPTS... -- ARGS...
            local opts=()
            while [ "$1" != -- ]; do
                opts+=("$1")
                shift
            done
            shift
            CMD=("${SUDO[@]}" env KOLO_BENCH_NSMAP="$KOLO_BENCH_NSMAP" ip netns exec "$ns0"
                mpirun --allow-run-as-root --bind-to none -np "$np" --hostfile "$hostfile"
                --map-by slot --display-map --mca plm_rsh_agent "$root/bench/nsrsh.sh"
                --mca btl "vader,self,tcp" --mca btl_tcp_if_include 10.78.0.0/24
                --mca oob_tcp_if_include 10.78.0.0/24 "${opts[@]}" "$bb/mpi_allreduce" "$@")
        }
        # The same with mpi_yield_when_idle: with slots = L no node counts as
        # oversubscribed, so by default Open MPI's ranks spin while they wait,
        # although H x L ranks share the machine's CPUs.
        cmd_mpiyield_hosts() {
            cmd_mpi_hosts_any --mca mpi_yield_when_idle 1 -- "$@"
            CMD_IMPL=openmpi-yield
        }
        # Gloo: rank r in namespace r / L, GLOO_SOCKET_IFNAME its veth.
        cmd_gloo_hosts() {
            local nsargs=() i j
            for ((i = 0; i < nh; i++)); do
                for ((j = 0; j < nl; j++)); do
                    nsargs+=(--ns "${hosts_ns[$i]}:kbh$i")
                done
            done
            CMD=("${SUDO[@]}" "$PY" bench/torch_gloo.py --np "$np" --master-addr 10.78.0.1
                "${nsargs[@]}" "$@")
        }
        # The floor under a small allreduce: a 4-byte TCP ping-pong between
        # host 0 and host 1 through the bridge.
        cmd_tcp_rtt_hosts() {
            "${SUDO[@]}" ip netns exec "${hosts_ns[1]}" timeout 60 "$bb/tcp_rtt" server 7979 &
            rtt_server=$!
            CMD=("${SUDO[@]}" ip netns exec "$ns0" "$bb/tcp_rtt" client 10.78.0.2 7979 2000)
        }
        # With 2 ranks a host, the floor of the whole pattern: that ping-pong
        # with each host's second rank handing its 4 bytes to the first
        # through shared memory and waiting for the result (yield, then
        # futex: ranks outnumber CPUs here), tcp_rtt's "local" mode.
        cmd_tcp_rtt_local_hosts() {
            "${SUDO[@]}" ip netns exec "${hosts_ns[1]}" timeout 60 "$bb/tcp_rtt" server 7979 local &
            rtt_server=$!
            CMD=("${SUDO[@]}" ip netns exec "$ns0" "$bb/tcp_rtt" client 10.78.0.2 7979 2000 local)
        }
        # On 2 hosts, the floor under the largest allreduce: only the copies,
        # reductions and TCP transfers of the hierarchical pattern, with no
        # waiting between a host's ranks (bench/copy_floor.c).
        floor_bytes="$(tr ' ' '\n' <<<"$HOSTS_SIZES" | sort -n | tail -1)"
        cmd_copy_floor_hosts() {
            "${SUDO[@]}" ip netns exec "${hosts_ns[1]}" timeout 120 "$bb/copy_floor" server 7980 \
                "$nl" "$floor_bytes" 20 &
            rtt_server=$!
            CMD=("${SUDO[@]}" ip netns exec "$ns0" "$bb/copy_floor" client 10.78.0.2 7980 "$nl"
                "$floor_bytes" 20)
        }
        # One launch of IMPL (mode sizes|resnet), with the bridge's bytes.
        hosts_launch() {
            local impl="$1" mode="$2" tag tx0 tx1
            tag="$sc-$mode-$impl-r$round"
            case "$impl" in kolo*) hosts_agents_ready "$tag" ;; esac
            tx0="$(bridge_tx)"
            if [ "$mode" = sizes ]; then
                # shellcheck disable=SC2086
                launch "$sc" "$round" "$tag" "cmd_${impl}_hosts" sizes $HOSTS_SIZES
            else
                launch "$sc" "$round" "$tag" "cmd_${impl}_hosts" resnet bench/resnet50_sizes.txt "$RESNET_STEPS"
            fi
            tx1="$(bridge_tx)"
            printf '{"scenario":"%s","round":%s,"launch":"%s",%s"impl_tag":"%s","mode":"%s","bridge_tx_bytes":%s}\n' \
                "$sc" "$round" "$tag" "$LAUNCH_EXTRA" "$impl" "$mode" "$((tx1 - tx0))" >>"$records"
        }
        modes=sizes
        [ "$HOSTS_RESNET" = 1 ] && modes="sizes resnet"
        for round in $(seq 1 "$REPS"); do
            launch "$sc" "$round" "$sc-tcp-rtt-r$round" cmd_tcp_rtt_hosts
            wait "$rtt_server" 2>/dev/null || true # it ends with its client
            if [ "$nl" = 2 ]; then
                launch "$sc" "$round" "$sc-tcp-rtt-local-r$round" cmd_tcp_rtt_local_hosts
                wait "$rtt_server" 2>/dev/null || true
            fi
            # whole halves of whole shards (copy_floor's rule)
            if [ "$nh" = 2 ] && [ "$floor_bytes" -ge $((1 << 20)) ] &&
                [ $((floor_bytes % (8 * nl))) = 0 ]; then
                launch "$sc" "$round" "$sc-copy-floor-r$round" cmd_copy_floor_hosts
                wait "$rtt_server" 2>/dev/null || true
            fi
            for mode in $modes; do
                impls="$(hosts_order "$round")"
                [ "$sealed" = 1 ] && impls+=" kolosealed"
                for impl in $impls; do
                    hosts_launch "$impl" "$mode"
                done
            done
        done
        stop_pids "${h_agent_pids[@]}"
        stop_pids "$h_coord_pid"
        bg_pids=()
        hosts_down
        LAUNCH_EXTRA=""
    done
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
    printf '"hosts_shapes":"%s","hosts_sizes":"%s","hosts_sealed_shapes":"%s",' \
        "$([ "$HOSTS" = 1 ] && echo "$HOSTS_SHAPES")" "$HOSTS_SIZES" "$HOSTS_SEALED_SHAPES"
    printf '"hosts_spin_iters":%s,"hosts_spin_resnet_steps":%s,"hosts_spin_timeout":%s,' \
        "$HOSTS_SPIN_ITERS" "$HOSTS_SPIN_RESNET_STEPS" "$HOSTS_SPIN_TIMEOUT"
    printf '"reps":%s,"quick":%s,"sizes":"%s","netns_sizes":"%s","nps":"%s","resnet_steps":%s}\n' \
        "$REPS" "$QUICK" "$SIZES" "$NETNS_SIZES" "$NPS" "$RESNET_STEPS"
} >"$machine"

"$PY" bench/aggregate.py "$records" "$machine" "$results/$ts.json" "$results/$ts.md"
cat "$results/$ts.md"
log "wrote $results/$ts.json and $results/$ts.md"
