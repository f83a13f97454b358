#!/usr/bin/env bash
# bench/observability_overhead.sh - what kolo's observability costs a
# training step (issue 31): the time split (where each rank's time goes),
# the readiness rounds' wait telemetry and the stack dump handler, all on
# by default, against the same build with them off (KOLO_TELEMETRY=0).
#
#   bench/observability_overhead.sh          ROUNDS=5 rounds (~6 min on 2 vCPUs)
#   ROUNDS=9 NP=4 bench/observability_overhead.sh
#
# Per round:
#   * resnet50_step: kolo-bench-allreduce's ResNet-50 gradient step (161
#     named tensors, 102 MB) under `kolo run -np NP`, off and on in the
#     same processes (its resnet-telemetry mode: a new session, kolo_fini
#     and kolo_init with KOLO_TELEMETRY set, every BLOCK steps, in the
#     order off, on, on, off, which cancels the drift between launches):
#     the median and p99 step (max over ranks) of each;
#   * cnn_step: examples/pytorch/synthetic_benchmark.py's model and step
#     (kolo.torch's DistributedOptimizer) under `kolo run -np NP`, off and
#     on in the same processes the same way (bench/cnn_telemetry_toggle.py:
#     hvd.shutdown(), KOLO_TELEMETRY set, hvd.init() every 10 steps);
#   * cnn: synthetic_benchmark.py itself, telemetry on (as users run it),
#     and the peer in the same round, bench/ddp_synthetic.py (DDP on
#     Gloo): total img/s, one launch each. Launch to launch this machine
#     drifts by several per cent (once 2x): the overhead is measured in
#     process, the peers' ratio is a launch's.
# The summary gives each mode's median over rounds, the ratio on/off (the
# overhead: above 1x for a step time, below 1x for img/s means "on" costs)
# and the median of the per-round ratios, the figure least moved by drift.
#
# Output: a table on stdout, bench/results/<UTC timestamp>-observability-
# overhead.{json,md}, each launch's output under build/bench-peers/raw/.
# Builds nothing: needs build/bin/kolo and build/bin/kolo-bench-allreduce.
# Knobs: ROUNDS (5), NP (2), STEPS (ResNet steps per launch, 400), BLOCK
# (ResNet steps per session, 25), CNN (1;
# 0 skips the CNN and DDP), NUM_ITERS (synthetic_benchmark.py, 6),
# LAUNCH_TIMEOUT (300 s), KOLO_BUILD_DIR.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${KOLO_BUILD_DIR:-$root/build}"
PY=/usr/bin/python3 # Debian's python: the only one that sees python3-torch

ROUNDS="${ROUNDS:-5}"
NP="${NP:-2}"
STEPS="${STEPS:-400}"
BLOCK="${BLOCK:-25}"
CNN="${CNN:-1}"
NUM_ITERS="${NUM_ITERS:-6}"
LAUNCH_TIMEOUT="${LAUNCH_TIMEOUT:-300}"

# Settings from the caller's environment that would redirect kolo or change
# what is measured.
unset KOLO_RUN_COORDINATOR KOLO_COORDINATOR KOLO_TOKEN_FILE KOLO_TOKEN KOLO_SLOTS KOLO_NAME \
    KOLO_ADDR KOLO_STATE_DIR KOLO_CONFIG KOLO_DATA_ADDR KOLO_FUSION_THRESHOLD \
    HOROVOD_FUSION_THRESHOLD KOLO_DISABLE_SHM KOLO_TELEMETRY HOROVOD_TIMELINE 2>/dev/null || true
export OMP_NUM_THREADS=1

ts="$(date -u +%Y%m%dT%H%M%SZ)"
name="$ts-observability-overhead"
raw="$build/bench-peers/raw/$name"
results="$root/bench/results"
records="$raw/records.jsonl"
tmp="$(mktemp -d /tmp/kolo-obs.XXXXXX)"
log() { printf '[observability-overhead %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

launch_pid=""
cleanup() {
    local rc=$?
    set +e
    if [ -n "$launch_pid" ]; then
        kill "$launch_pid" 2>/dev/null
        wait "$launch_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for f in "$build/bin/kolo" "$build/bin/kolo-bench-allreduce"; do
    [ -x "$f" ] || { log "missing $f (build first: scripts/build.sh)"; exit 1; }
done
mkdir -p "$raw" "$results"
: >"$records"

# launch CASE MODE ROUND CMD...: one launch (MODE off: KOLO_TELEMETRY=0);
# its last JSON result line goes to the records with the launch's context.
launch() {
    local case="$1" mode="$2" round="$3"
    shift 3
    local tag="$case-$mode-r$round" rc=0 load t0=$SECONDS
    local out="$raw/$tag.out" err="$raw/$tag.err"
    local telemetry=1
    [ "$mode" = off ] && telemetry=0 # toggle: the benchmark sets it itself
    load="$(cut -d' ' -f1 /proc/loadavg)"
    KOLO_TELEMETRY=$telemetry PYTHONPATH="$root/python" \
        timeout --kill-after=20 "$LAUNCH_TIMEOUT" "$@" >"$out" 2>"$err" &
    launch_pid=$!
    wait "$launch_pid" || rc=$?
    launch_pid=""
    local line lines m
    lines="$(sed -n 's/^[^{]*\({"impl".*}\)[[:space:]]*$/\1/p' "$out")"
    line="$(printf '%s\n' "$lines" | tail -1)"
    if [ "$rc" != 0 ] || [ -z "$line" ]; then
        log "$tag: FAILED rc=$rc (see $err)"
        tail -5 "$err" >&2 || true
        printf '{"case":"%s","mode":"%s","round":%s,"failed":true,"rc":%s}\n' \
            "$case" "$mode" "$round" "$rc" >>"$records"
        return
    fi
    while IFS= read -r line; do
        m="$mode"
        case "$line" in
        *'"kind":"resnet50_step_telemetry_off"'* | *'"kind": "cnn_step_telemetry_off"'*) m=off ;;
        *'"kind":"resnet50_step_telemetry_on"'* | *'"kind": "cnn_step_telemetry_on"'*) m=on ;;
        esac
        [ "$mode" = toggle ] && [ "$m" = toggle ] && continue
        printf '{"case":"%s","mode":"%s","round":%s,"load1":%s,%s\n' "$case" "$m" "$round" \
            "$load" "${line#\{}" >>"$records"
        log "$tag $m: $(printf '%s' "$line" | grep -o '"\(median_us\|img_sec_total\)": *[0-9.]*' | head -1), $((SECONDS - t0)) s, load $load"
    done <<<"$lines"
}

resnet() {
    launch resnet50_step toggle "$1" "$build/bin/kolo" run -np "$NP" --state-dir "$tmp/state" -- \
        "$build/bin/kolo-bench-allreduce" resnet-telemetry bench/resnet50_sizes.txt "$STEPS" "$BLOCK"
}
cnn_toggle() {
    launch cnn_step toggle "$1" "$build/bin/kolo" run -np "$NP" --state-dir "$tmp/state" -- \
        "$PY" bench/cnn_telemetry_toggle.py
}
cnn() {
    launch cnn "$1" "$2" "$build/bin/kolo" run -np "$NP" --state-dir "$tmp/state" -- \
        "$PY" examples/pytorch/synthetic_benchmark.py --num-iters "$NUM_ITERS" --json
}
ddp() {
    launch cnn ddp "$1" env GLOO_SOCKET_IFNAME=lo "$PY" bench/ddp_synthetic.py --np "$NP" \
        --num-iters "$NUM_ITERS" --json
}

log "np $NP, $ROUNDS round(s): resnet50_step ($STEPS steps)$([ "$CNN" = 1 ] && echo ", cnn ($NUM_ITERS iterations) and DDP"); raw logs in $raw"
for round in $(seq 1 "$ROUNDS"); do
    resnet "$round"
    if [ "$CNN" = 1 ]; then
        cnn_toggle "$round"
        if [ $((round % 2)) = 1 ]; then cnn on "$round"; ddp "$round"; else ddp "$round"; cnn on "$round"; fi
    fi
done

"$PY" - "$records" "$results/$name.json" "$results/$name.md" "$NP" "$ROUNDS" <<'EOF'
import json, os, statistics, sys, time

records_path, json_path, md_path, np_, rounds = sys.argv[1:6]
recs = [json.loads(l) for l in open(records_path) if l.strip()]
ok = [r for r in recs if not r.get("failed")]
med = statistics.median
rows, summary = [], {}
for case, key, better in (("resnet50_step", "median_us", "lower"), ("resnet50_step", "p99_us", "lower"),
                          ("cnn_step", "median_us", "lower"), ("cnn_step", "p99_us", "lower"),
                          ("cnn", "img_sec_total", "higher")):
    by = {m: {r["round"]: r[key] for r in ok if r["case"] == case and r["mode"] == m and key in r}
          for m in ("off", "on", "ddp")}
    if case == "cnn" and by["on"] and by["ddp"]:
        on, ddp = med(by["on"].values()), med(by["ddp"].values())
        summary["cnn img_sec_total"] = {"on": on, "ddp": ddp, "on_vs_ddp": on / ddp}
        rows.append("| cnn (synthetic_benchmark.py) | img_sec_total | - | %.0f img/s | - | - | - | "
                    "%.0f img/s (kolo / DDP %.2fx) |" % (on, ddp, on / ddp))
        continue
    if not by["off"] or not by["on"]:
        continue
    off, on = med(by["off"].values()), med(by["on"].values())
    paired = [by["on"][k] / by["off"][k] for k in by["on"] if k in by["off"] and by["off"][k]]
    cost = (on / off - 1) if better == "lower" else (off / on - 1)
    s = {"off": off, "on": on, "ratio_on_off": on / off,
         "paired_ratio_median": med(paired) if paired else None, "cost": cost,
         "rounds": len(paired)}
    if by["ddp"]:
        s["ddp"] = med(by["ddp"].values())
        s["on_vs_ddp"] = s["on"] / s["ddp"]
    summary["%s %s" % (case, key)] = s
    fmt = (lambda x: "%.0f img/s" % x) if key == "img_sec_total" else (lambda x: "%.2f ms" % (x / 1e3))
    rows.append("| %s | %s | %s | %s | %.3fx | %s | %+.1f %% | %s |" % (
        case, key, fmt(off), fmt(on), on / off,
        "%.3fx" % s["paired_ratio_median"] if paired else "-", 100 * cost,
        "%s (kolo on / DDP %.2fx)" % (fmt(s["ddp"]), s["on_vs_ddp"]) if by["ddp"] else "-"))
failed = [r for r in recs if r.get("failed")]
head = ("| case | figure | off (KOLO_TELEMETRY=0) | on (default) | on/off | per-round on/off, median "
        "| cost | DDP on Gloo |\n|---|---|---|---|---|---|---|---|")
md = ["# Observability overhead, np %s, %s round(s), %s" % (np_, rounds,
                                                           time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())),
      "", "Time split, rounds' wait telemetry and the stack handler on (the default) against off "
      "(KOLO_TELEMETRY=0), the same build, in the same processes (a new session every few steps, "
      "off, on, on, off); medians over rounds of each launch's median (or p99) step. cost: how much "
      "slower \"on\" is (negative: faster, i.e. noise). The last row: synthetic_benchmark.py as "
      "users run it against DDP on Gloo, a launch each per round.", "", head] + rows
if failed:
    md += ["", "%d launch(es) failed: %s" % (len(failed), ", ".join(
        "%s-%s-r%s" % (r["case"], r["mode"], r["round"]) for r in failed))]
md += ["", "Load average at the end: %s; %d CPUs." % (" ".join(open("/proc/loadavg").read().split()[:3]),
                                                    os.cpu_count())]
open(md_path, "w").write("\n".join(md) + "\n")
json.dump({"np": int(np_), "rounds": int(rounds), "summary": summary, "records": recs},
          open(json_path, "w"), indent=1)
print("\n".join(md))
sys.exit(1 if failed else 0)
EOF
