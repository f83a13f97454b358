#!/usr/bin/env bash
# bench/torch_synthetic.sh - PyTorch training throughput, kolo against DDP on Gloo.
#
#   bench/torch_synthetic.sh              np 2, REPS=3 launches of each (~4 min on 2 vCPUs)
#   bench/torch_synthetic.sh --np4        np 2 and 4
#   bench/torch_synthetic.sh -- --fp16-allreduce --batch-size 16
#                                          extra options for both benchmarks
#
# Runs, in one go and alternating launch by launch:
#   kolo: build/bin/kolo run -np N -- /usr/bin/python3 examples/pytorch/synthetic_benchmark.py
#         (PYTHONPATH=python; kolo.torch's DistributedOptimizer);
#   ddp:  /usr/bin/python3 bench/ddp_synthetic.py --np N (N local processes,
#         env:// rendezvous on 127.0.0.1, DistributedDataParallel on Gloo over lo);
#   solo: /usr/bin/python3 bench/solo_synthetic.py --np N (N processes training
#         alone, no communication: what the machine computes);
#   solo_lockstep: the same with a barrier after every step and nothing
#         exchanged: the ceiling of any synchronous data-parallel library
#         (SOLO=0 skips both);
# the same model, batch and iterations, OMP_NUM_THREADS=1 and one torch thread
# per worker in both. Each launch reports the mean img/s per worker over its
# timed iterations (times N: total img/s); the table gives the median over
# launches of the total and the ratio kolo/DDP (above 1x kolo is faster),
# the no-communication lockstep ceiling, ceiling/DDP (the most any library
# could beat DDP by here) and kolo/ceiling.
# Output: a markdown table on stdout, bench/results/<timestamp>-torch-synthetic.{json,md},
# raw logs under build/bench-peers/raw/<timestamp>-torch-synthetic/.
#
# Environment knobs: REPS (launches per impl and np, default 3), NPS ("2";
# --np4 makes it "2 4"), SOLO (1), MODEL (cnn), BATCH_SIZE (32), NUM_WARMUP_BATCHES (5),
# NUM_BATCHES_PER_ITER (5), NUM_ITERS (10), SKIP_BUILD=1, LAUNCH_TIMEOUT (600 s).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${KOLO_BUILD_DIR:-$root/build}"
PY=/usr/bin/python3 # Debian's python: the only one that sees python3-torch

NPS="${NPS:-2}"
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
    --np4) NPS="2 4" ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
REPS="${REPS:-3}"
MODEL="${MODEL:-cnn}"
BATCH_SIZE="${BATCH_SIZE:-32}"
NUM_WARMUP_BATCHES="${NUM_WARMUP_BATCHES:-5}"
NUM_BATCHES_PER_ITER="${NUM_BATCHES_PER_ITER:-5}"
NUM_ITERS="${NUM_ITERS:-10}"
LAUNCH_TIMEOUT="${LAUNCH_TIMEOUT:-600}"

# Settings from the caller's environment that would redirect kolo.
unset KOLO_RUN_COORDINATOR KOLO_COORDINATOR KOLO_TOKEN_FILE KOLO_TOKEN KOLO_SLOTS KOLO_NAME \
    KOLO_ADDR KOLO_STATE_DIR KOLO_CONFIG KOLO_DATA_ADDR KOLO_FUSION_THRESHOLD \
    HOROVOD_FUSION_THRESHOLD KOLO_DISABLE_SHM 2>/dev/null || true
export OMP_NUM_THREADS=1 # one compute thread per worker, in both
export PYTHONUNBUFFERED=1

ts="$(date -u +%Y%m%dT%H%M%SZ)"
name="$ts-torch-synthetic"
raw="$build/bench-peers/raw/$name"
results="$root/bench/results"
records="$raw/records.jsonl"
tmp="$(mktemp -d /tmp/kolo-torch-bench.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    log "building kolo"
    if ! KOLO_BUILD_DIR="$build" scripts/build.sh >"$tmp/build.log" 2>&1; then
        tail -5 "$tmp/build.log" >&2
        log "kolo build failed"
        exit 1
    fi
fi
[ -x "$build/bin/kolo" ] || { log "missing $build/bin/kolo"; exit 1; }
PYTHONPATH="$root/python" "$PY" -c 'import kolo.torch' ||
    { log "$PY cannot import kolo.torch from $root/python"; exit 1; }
"$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' ||
    { log "$PY cannot use torch.distributed with gloo"; exit 1; }
mkdir -p "$raw" "$results"
: >"$records"

bench_args=(--model "$MODEL" --batch-size "$BATCH_SIZE" --num-warmup-batches "$NUM_WARMUP_BATCHES"
    --num-batches-per-iter "$NUM_BATCHES_PER_ITER" --num-iters "$NUM_ITERS" --threads 1 --json
    "${extra[@]}")

# cmd_<impl> NP sets CMD, the command line of one launch.
cmd_kolo() {
    CMD=(env PYTHONPATH="$root/python" "$build/bin/kolo" run -np "$1" --state-dir "$tmp/state" --
        "$PY" examples/pytorch/synthetic_benchmark.py "${bench_args[@]}")
}
cmd_ddp() {
    CMD=(env GLOO_SOCKET_IFNAME=lo "$PY" bench/ddp_synthetic.py --np "$1" "${bench_args[@]}")
}
cmd_solo() {
    CMD=("$PY" bench/solo_synthetic.py --np "$1" "${bench_args[@]}")
}
cmd_solo_lockstep() {
    CMD=("$PY" bench/solo_synthetic.py --np "$1" --lockstep "${bench_args[@]}")
}

# launch IMPL NP ROUND: runs one launch, keeps its output and appends its
# JSON line to the records with the launch's context.
launch() {
    local impl="$1" np="$2" round="$3"
    local tag="$impl-np$np-r$round"
    local out="$raw/$tag.out" err="$raw/$tag.err" rc=0 load t0=$SECONDS
    "cmd_$impl" "$np"
    load="$(cut -d' ' -f1 /proc/loadavg)"
    timeout --kill-after=20 "$LAUNCH_TIMEOUT" "${CMD[@]}" >"$out" 2>"$err" || rc=$?
    local line
    line="$(sed -n 's/^[^{]*\({"impl".*}\)[[:space:]]*$/\1/p' "$out" | tail -1)"
    if [ "$rc" = 0 ] && [ -n "$line" ]; then
        printf '%s\n' "$line" |
            sed "s/^{/{\"round\":$round,\"launch\":\"$tag\",\"load1\":$load,/" >>"$records"
        log "$tag: $(sed -n 's/.*\(Total img\/sec.*\)$/\1/p' "$out" | tail -1), $((SECONDS - t0)) s, load $load"
    else
        printf '{"impl":"%s","np":%s,"round":%s,"launch":"%s","failed":true,"rc":%s}\n' \
            "$impl" "$np" "$round" "$tag" "$rc" >>"$records"
        log "$tag: failed, rc=$rc"
        tail -5 "$err" >&2 || true
    fi
}

log "model $MODEL, batch $BATCH_SIZE, $NUM_ITERS x $NUM_BATCHES_PER_ITER steps after $NUM_WARMUP_BATCHES, np [$NPS], $REPS round(s)"
log "results go to $results/$name.{json,md}; raw logs in $raw"
for round in $(seq 1 "$REPS"); do
    for np in $NPS; do
        # Rotate which implementation goes first.
        impls=(kolo ddp)
        [ "${SOLO:-1}" = 1 ] && impls+=(solo solo_lockstep)
        k=$(((round - 1) % ${#impls[@]}))
        order="${impls[*]:k} ${impls[*]:0:k}"
        for impl in $order; do
            launch "$impl" "$np" "$round"
        done
    done
done

# ---------------------------------------------------------------- report

"$PY" - "$records" "$results/$name.json" "$results/$name.md" "$build/bin/kolo" <<'EOF'
import datetime, json, os, platform, statistics, subprocess, sys

import torch

records_path, json_path, md_path, kolo = sys.argv[1:5]
records = [json.loads(l) for l in open(records_path) if l.strip()]
ok = [r for r in records if not r.get("failed")]


def median_total(impl, np_, key="img_sec_total"):
    v = [r[key] for r in ok if r["impl"] == impl and r["np"] == np_]
    return (statistics.median(v), min(v), max(v), len(v)) if v else None


def cell(m):
    return "%.1f (%.1f..%.1f)" % m[:3] if m else "failed"


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


first = ok[0] if ok else {}
machine = {
    "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
    "nproc": os.cpu_count(), "cpu_model": cpu_model(), "kernel": platform.release(),
    "torch": torch.__version__, "python": sys.version.split()[0],
    "kolo": subprocess.run([kolo, "--version"], stdout=subprocess.PIPE, universal_newlines=True).stdout.strip(),
    "loadavg_end": " ".join(open("/proc/loadavg").read().split()[:3]),
}
config = {k: first.get(k) for k in ("model", "batch_size", "num_iters", "num_batches_per_iter", "fp16_allreduce", "threads")}
summary = []
lines = ["# PyTorch synthetic benchmark: kolo vs DDP (Gloo)", "",
         "%s, %s CPUs (%s), torch %s; model %s, batch %s per worker, %s x %s steps per launch%s." % (
             machine["date"], machine["nproc"], machine["cpu_model"], machine["torch"], config["model"],
             config["batch_size"], config["num_iters"], config["num_batches_per_iter"],
             ", fp16 allreduce" if config["fp16_allreduce"] else ""),
         "Total img/s: median over launches (min..max); kolo/DDP above 1x means kolo is faster.",
         "Ceiling: bench/solo_synthetic.py --lockstep, the same training with a barrier after every "
         "step and no communication, what a synchronous job would make if exchanging gradients cost "
         "nothing: ceiling/DDP is the most any library could beat DDP by on this machine. Free: "
         "the same processes with no barrier (what the machine computes; N x the slowest in brackets).", "",
         "| np | kolo img/s | DDP Gloo img/s | kolo/DDP | ceiling img/s | ceiling/DDP | kolo/ceiling "
         "| free img/s [N x slowest] | free/DDP | launches (kolo, DDP, ceiling, free) | mean load1 |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
def ratio_of(a, b):
    return a[0] / b[0] if a and b else None
def fmt(r):
    return "%.2fx" % r if r else "-"
for np_ in sorted({r["np"] for r in records}):
    k, d = median_total("kolo", np_), median_total("ddp_gloo", np_)
    c = median_total("solo_lockstep", np_)
    free = median_total("solo", np_)
    slowest = median_total("solo", np_, "img_sec_lockstep")
    loads = [r["load1"] for r in ok if r["np"] == np_]
    ratio = ratio_of(k, d)
    lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %d, %d, %d, %d | %.2f |" % (
        np_, cell(k), cell(d), fmt(ratio), cell(c) if c else "-", fmt(ratio_of(c, d)), fmt(ratio_of(k, c)),
        "%s [%.1f]" % (cell(free), slowest[0]) if free else "-", fmt(ratio_of(free, d)),
        k[3] if k else 0, d[3] if d else 0, c[3] if c else 0, free[3] if free else 0,
        statistics.mean(loads) if loads else float("nan")))
    summary.append({"np": np_, "kolo_img_sec_total_median": k[0] if k else None,
                    "ddp_img_sec_total_median": d[0] if d else None, "kolo_over_ddp": ratio,
                    "ceiling_lockstep_median": c[0] if c else None,
                    "free_median": free[0] if free else None,
                    "free_n_x_slowest_median": slowest[0] if slowest else None,
                    "ceiling_over_ddp": ratio_of(c, d), "kolo_over_ceiling": ratio_of(k, c),
                    "free_over_ddp": ratio_of(free, d)})
failed = [r["launch"] for r in records if r.get("failed")]
if failed:
    lines += ["", "Failed launches: " + ", ".join(failed)]
md = "\n".join(lines) + "\n"
with open(md_path, "w") as f:
    f.write(md)
with open(json_path, "w") as f:
    json.dump({"machine": machine, "config": config, "summary": summary, "records": records}, f, indent=1)
sys.stdout.write(md)
EOF
log "wrote $results/$name.json and $results/$name.md"
