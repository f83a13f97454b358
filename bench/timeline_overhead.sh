#!/usr/bin/env bash
# bench/timeline_overhead.sh - what the timeline costs a training step.
#
#   bench/timeline_overhead.sh              ROUNDS=5 rounds (~3 min on 2 vCPUs)
#   ROUNDS=10 bench/timeline_overhead.sh
#
# Runs the ResNet-50 gradient step of kolo-bench-allreduce (161 named
# tensors, 102 MB, kolo_allreduce_async then wait on all: agreed by the
# ranks' readiness rounds, which report every op for the timeline, or with
# KOLO_FAST_PATH=0 negotiated by the coordinator, which writes it)
# under `kolo run -np 2`, without and with `--timeline-filename`
# (HOROVOD_TIMELINE), one launch each per round, the order flipping from
# round to round (off,on / on,off ...) so that the drift of this shared
# machine falls on both sides alike. Two more cases per round:
#   * SMALL=1: the same A/B for a 4-byte allreduce, where the per-operation
#     cost of the timeline is the largest share of the time;
#   * TOGGLE=1: one launch of kolo-bench-allreduce's resnet-toggle mode,
#     where rank 0 switches the timeline on and off (kolo_timeline, the call
#     behind hvd.start_timeline/stop_timeline) every TOGGLE_BLOCK steps, in
#     the order off,on,on,off: both modes in the same processes, interleaved
#     a few steps apart, which cancels the drift between launches.
# A launch's figure is its median step (max over ranks); per case the
# summary gives the median over rounds of each mode, their ratio (on/off,
# the overhead) and the median of the per-round ratios. It also reads the
# CPU time of the `kolo run` process (embedded coordinator and agent, not
# the workers) from /proc, a figure less noisy than wall time.
#
# Each "on" timeline is checked: valid JSON (the closing "]" written),
# begin/end events balanced per tensor (not for the toggled case, whose stop
# cuts spans off), and NEGOTIATE_ALLREDUCE spans for every tensor the
# benchmark reduced, at least once per timed iteration. A failed check or
# launch fails the script (after writing the results).
#
# Output: a table on stdout, bench/results/<UTC timestamp>-timeline-overhead
# .{json,md}, and each launch's stdout/stderr in
# build/bench-peers/raw/<UTC timestamp>-timeline-overhead/.
#
# It builds nothing: it needs build/bin/kolo and build/bin/kolo-bench-allreduce
# (cmake --build build). Knobs (environment): ROUNDS (5), NP (2), STEPS
# (ResNet steps per launch, 100, after 3 warm-up steps), SMALL (1; 0 skips
# the small case), SMALL_BYTES (4), TOGGLE (1; 0 skips the toggled case),
# TOGGLE_STEPS (160), TOGGLE_BLOCK (5), LAUNCH_TIMEOUT (300 s),
# KOLO_BUILD_DIR.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${KOLO_BUILD_DIR:-$root/build}"
PY=/usr/bin/python3 # Debian's python, not the pyenv one first on PATH

ROUNDS="${ROUNDS:-5}"
NP="${NP:-2}"
STEPS="${STEPS:-100}"
SMALL="${SMALL:-1}"
SMALL_BYTES="${SMALL_BYTES:-4}"
TOGGLE="${TOGGLE:-1}"
TOGGLE_STEPS="${TOGGLE_STEPS:-160}"
TOGGLE_BLOCK="${TOGGLE_BLOCK:-5}"
LAUNCH_TIMEOUT="${LAUNCH_TIMEOUT:-300}"

# Settings from the caller's environment that would redirect kolo or turn
# the timeline on for the "off" launches.
unset KOLO_RUN_COORDINATOR KOLO_COORDINATOR KOLO_TOKEN_FILE KOLO_TOKEN KOLO_SLOTS KOLO_NAME \
    KOLO_ADDR KOLO_STATE_DIR KOLO_CONFIG KOLO_DATA_ADDR KOLO_FUSION_THRESHOLD \
    HOROVOD_FUSION_THRESHOLD KOLO_DISABLE_SHM HOROVOD_TIMELINE HOROVOD_TIMELINE_MARK_CYCLES \
    2>/dev/null || true
export OMP_NUM_THREADS=1

ts="$(date -u +%Y%m%dT%H%M%SZ)"
name="$ts-timeline-overhead"
raw="$build/bench-peers/raw/$name"
results="$root/bench/results"
records="$raw/records.jsonl"
tmp="$(mktemp -d /tmp/kolo-tlo.XXXXXX)"

log() { printf '[timeline-overhead %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

launch_pid=""
clk_tck="$(getconf CLK_TCK)"

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
    [ -x "$f" ] || { log "missing $f (build first: cmake --build build)"; exit 1; }
done
if [ "$TOGGLE" = 1 ] && ! grep -q resnet-toggle "$build/bin/kolo-bench-allreduce"; then
    log "$build/bin/kolo-bench-allreduce predates its resnet-toggle mode: rebuild it" \
        "(cmake --build build --target kolo-bench-allreduce), or TOGGLE=0"
    exit 1
fi
mkdir -p "$raw" "$results"
: >"$records"

# check_timeline FILE CASE ITERS STRICT: one JSON object on stdout describing
# the timeline ("ok": false when it is not what an "on" launch must leave:
# valid JSON, every tensor of the case with at least ITERS NEGOTIATE_ALLREDUCE
# spans and, STRICT=1, every begun span ended); exit status 1 then.
check_timeline() {
    "$PY" - "$@" <<'EOF'
import json, os, sys

path, case, iters, strict = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
out = {"bytes": os.path.getsize(path) if os.path.exists(path) else 0, "ok": False}
problems = []
try:
    with open(path) as f:
        events = json.load(f)
except FileNotFoundError:
    events = None
    problems.append("no timeline file")
except ValueError as e:
    events = None
    problems.append("not valid JSON: %s" % e)
if events is not None and not isinstance(events, list):
    problems.append("not a JSON array")
    events = None
if events is not None:
    names = {}  # pid -> tensor name
    depth = {}  # pid -> open B spans
    neg = {}    # tensor -> NEGOTIATE_ALLREDUCE begins
    nneg_all = ticks = ops = orphan_ends = 0
    for ev in events:
        ph, pid = ev.get("ph"), ev.get("pid")
        if ph == "M" and ev.get("name") == "process_name":
            names[pid] = ev["args"]["name"]
        elif ph == "B":
            depth[pid] = depth.get(pid, 0) + 1
            n = ev.get("name", "")
            if n.startswith("NEGOTIATE_"):
                nneg_all += 1
            if n == "NEGOTIATE_ALLREDUCE":
                t = names.get(pid, "?")
                neg[t] = neg.get(t, 0) + 1
            elif n == "ALLREDUCE":
                ops += 1
        elif ph == "E":
            depth[pid] = depth.get(pid, 0) - 1
            if depth[pid] < 0:
                orphan_ends += 1
                depth[pid] = 0
        elif ph == "X":
            ticks += 1
    unbalanced = [p for p, d in depth.items() if d != 0]
    out["unended_spans"] = sum(depth.values())
    out["ends_without_begin"] = orphan_ends
    if unbalanced and strict:
        problems.append("%d tensor(s) with unended spans" % len(unbalanced))
    if orphan_ends and strict:
        problems.append("%d end(s) without a begin" % orphan_ends)
    if case.startswith("resnet50_step"):
        want = [l.split()[0] for l in open("bench/resnet50_sizes.txt") if l.strip()]
    else:
        want = ["bench.%s" % case.split("_")[-1]]
    short = [t for t in want if neg.get(t, 0) < iters]
    if short:
        problems.append("%d tensor(s) with fewer than %d NEGOTIATE_ALLREDUCE spans (%s ...)"
                        % (len(short), iters, short[0]))
    out.update({"events": len(events), "tensors": len(names),
                "negotiate_allreduce": sum(neg.values()), "negotiate_all": nneg_all,
                "rank_ticks": int(ticks), "allreduce_spans": ops,
                "checked_tensors": len(want)})
out["ok"] = not problems
if problems:
    out["problems"] = problems
print(json.dumps(out))
sys.exit(0 if out["ok"] else 1)
EOF
}

bad_timelines=0

# launch CASE MODE ROUND ORDER ARGS...: one `kolo run`; each result line
# (with the launch's context and, for "on", the timeline check) appended to
# the records. MODE off: no timeline; on: --timeline-filename; toggle: the
# benchmark's resnet-toggle mode, which switches the timeline itself (ARGS
# then end before its TIMELINE argument) and prints an off and an on line.
launch() {
    local case="$1" mode="$2" round="$3" order="$4"
    shift 4
    local tag="$case-$mode-r$round"
    local out="$raw/$tag.out" err="$raw/$tag.err" tl="$tmp/$tag.json" rc=0
    local cmd=("$build/bin/kolo" run -np "$NP" --state-dir "$tmp/state")
    [ "$mode" = on ] && cmd+=(--timeline-filename "$tl")
    cmd+=(-- "$build/bin/kolo-bench-allreduce" "$@")
    [ "$mode" = toggle ] && cmd+=("$tl")
    local load t0 t1
    load="$(cut -d' ' -f1 /proc/loadavg)"
    t0="$(date +%s.%N)"
    timeout --kill-after=20 "$LAUNCH_TIMEOUT" "${cmd[@]}" >"$out" 2>"$err" &
    launch_pid=$!
    # The CPU time of the `kolo run` process itself (its threads: the
    # embedded coordinator and agent; not the workers, its children), read
    # from /proc every 50 ms until it exits: the last reading misses at
    # most its last 50 ms, the same for both modes.
    local kpid="" cpu_ticks="" st
    while kill -0 "$launch_pid" 2>/dev/null; do
        [ -n "$kpid" ] || read -r kpid _ <"/proc/$launch_pid/task/$launch_pid/children" 2>/dev/null || true
        if [ -n "$kpid" ] && read -r -a st <"/proc/$kpid/stat" 2>/dev/null; then
            cpu_ticks=$((st[13] + st[14]))
        fi
        sleep 0.05
    done
    wait "$launch_pid" || rc=$?
    launch_pid=""
    t1="$(date +%s.%N)"
    local lines
    lines="$(sed -n 's/^[^{]*\({"impl".*}\)[[:space:]]*$/\1/p' "$out")"
    local wall
    wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b - a}')"
    local cpu_s=null
    # (a toggled launch's CPU belongs to both modes at once)
    [ -n "$cpu_ticks" ] && [ "$mode" != toggle ] &&
        cpu_s="$(awk -v t="$cpu_ticks" -v hz="$clk_tck" 'BEGIN{printf "%.2f", t / hz}')"
    local ctx="\"round\":$round,\"order\":$order,\"launch\":\"$tag\",\"load1\":$load,\"wall_s\":$wall,\"kolo_cpu_s\":$cpu_s,\"rc\":$rc"
    if [ -z "$lines" ] || [ "$rc" != 0 ]; then
        log "$tag: FAILED rc=$rc (see $err)"
        tail -5 "$err" >&2 || true
        printf '{"case":"%s","mode":"%s",%s,"failed":true}\n' "$case" "$mode" "$ctx" >>"$records"
        return
    fi
    local line m check iters med summary=""
    while IFS= read -r line; do
        m="$mode"
        case "$line" in
        *'"kind":"resnet50_step_tl_off"'*) m=off ;;
        *'"kind":"resnet50_step_tl_on"'*) m=on ;;
        esac
        check="null"
        if [ "$m" = on ]; then
            iters="$(printf '%s' "$line" | sed -n 's/.*"iters":\([0-9]*\).*/\1/p')"
            # A toggled launch's file holds its last "on" phase: 2 blocks,
            # cut off by the stop (its last spans may stay open).
            if [ "$mode" = toggle ]; then
                check="$(check_timeline "$tl" "$case" "$((2 * TOGGLE_BLOCK))" 0)" || true
            else
                check="$(check_timeline "$tl" "$case" "$iters" 1)" || true
            fi
            case "$check" in
            *'"ok": true'*) ;;
            *)
                bad_timelines=$((bad_timelines + 1))
                log "$tag: the timeline failed its check: $check"
                ;;
            esac
            if grep -q 'event(s) dropped' "$err"; then
                log "$tag: the coordinator dropped timeline events"
            fi
        fi
        med="$(printf '%s' "$line" | sed -n 's/.*"median_us":\([0-9.]*\).*/\1/p')"
        summary+=" $m $med us,"
        printf '{"case":"%s","mode":"%s",%s,"timeline":%s,%s\n' "$case" "$m" "$ctx" "$check" \
            "${line#\{}" >>"$records"
    done <<<"$lines"
    rm -f "$tl"
    log "$tag:$summary ${wall} s, load $load"
}

small_case="allreduce_$SMALL_BYTES"
log "np $NP, $ROUNDS round(s); resnet50_step: $STEPS steps per launch$([ "$SMALL" = 1 ] && echo "; $small_case: 1000 iterations per launch")"
log "raw logs in $raw"
for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then modes="off on"; else modes="on off"; fi
    order=0
    for mode in $modes; do
        order=$((order + 1))
        launch resnet50_step "$mode" "$round" "$order" resnet bench/resnet50_sizes.txt "$STEPS"
    done
    if [ "$SMALL" = 1 ]; then
        order=0
        for mode in $modes; do
            order=$((order + 1))
            launch "$small_case" "$mode" "$round" "$order" sizes "$SMALL_BYTES"
        done
    fi
    if [ "$TOGGLE" = 1 ]; then
        launch resnet50_step_toggled toggle "$round" 0 resnet-toggle bench/resnet50_sizes.txt \
            "$TOGGLE_STEPS" "$TOGGLE_BLOCK"
    fi
done

"$PY" - "$records" "$results/$name.json" "$results/$name.md" "$NP" "$ROUNDS" "$STEPS" \
    "$SMALL_BYTES" "$TOGGLE_STEPS" "$TOGGLE_BLOCK" \
    "$("$build/bin/kolo" --version 2>/dev/null | head -1)" <<'EOF'
import json, os, platform, random, statistics, sys, time

(records_path, json_path, md_path, np_, rounds, steps, small_bytes, toggle_steps, toggle_block,
 kolo_version) = sys.argv[1:11]
recs = [json.loads(l) for l in open(records_path) if l.strip()]
med = statistics.median


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


machine = {
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "nproc": os.cpu_count(), "cpu_model": cpu_model(), "kernel": platform.release(),
    "loadavg_end": open("/proc/loadavg").read().split()[:3], "kolo": kolo_version,
}
config = {"np": int(np_), "rounds": int(rounds), "resnet_steps": int(steps),
          "small_bytes": int(small_bytes), "toggle_steps": int(toggle_steps),
          "toggle_block": int(toggle_block),
          "timeline_dir": "/tmp (local disk)"}

def iters_run(r):
    """Iterations a launch negotiated: the timed ones and the warm-up
    (kolo_allreduce.c: 3 steps for resnet; iters/10 + 2, and one checked
    allreduce, for sizes)."""
    if r["kind"] == "resnet50_step":
        return r["iters"] + 3
    return r["iters"] + r["iters"] // 10 + 3


def boot_ci(xs, n=2000):
    """95% bootstrap interval of the median of xs (resampled rounds; fixed
    seed, so a summary is reproducible from its records)."""
    rng = random.Random(1)
    meds = sorted(med(rng.choices(xs, k=len(xs))) for _ in range(n))
    return [meds[int(0.025 * n)], meds[int(0.975 * n) - 1]]


def cpu_med(rs):
    v = [r["kolo_cpu_s"] for r in rs if r.get("kolo_cpu_s") is not None]
    return med(v) if v else None


def extra_cpu(on, off, both):
    """Median over rounds of (on - off) kolo CPU, per negotiated iteration, ms."""
    d = [(on[k]["kolo_cpu_s"] - off[k]["kolo_cpu_s"]) * 1000 / iters_run(on[k]) for k in both
         if on[k].get("kolo_cpu_s") is not None and off[k].get("kolo_cpu_s") is not None]
    return med(d) if d else None


summary = []
per_round = []
for case in dict.fromkeys(r["case"] for r in recs):
    ok = [r for r in recs if r["case"] == case and not r.get("failed")]
    off = {r["round"]: r for r in ok if r["mode"] == "off"}
    on = {r["round"]: r for r in ok if r["mode"] == "on"}
    both = sorted(set(off) & set(on))
    if not both:
        continue
    off_us = [off[k]["median_us"] for k in both]
    on_us = [on[k]["median_us"] for k in both]
    paired = [on[k]["median_us"] / off[k]["median_us"] for k in both]
    ratio = med(on_us) / med(off_us)
    s = {
        "case": case, "rounds": len(both),
        "failed_launches": sum(1 for r in recs if r["case"] == case and r.get("failed")),
        "off_median_us": med(off_us), "on_median_us": med(on_us),
        "off_range_us": [min(off_us), max(off_us)], "on_range_us": [min(on_us), max(on_us)],
        "ratio_on_off": ratio, "overhead_pct": (ratio - 1) * 100,
        "paired_ratio_median": med(paired), "paired_ratio_range": [min(paired), max(paired)],
        "paired_ratio_ci95": boot_ci(paired),
        "rounds_on_slower": sum(1 for p in paired if p > 1),
        "off_min_us_median": med(off[k]["min_us"] for k in both),
        "on_min_us_median": med(on[k]["min_us"] for k in both),
        "mean_load1": statistics.mean(r["load1"] for r in ok),
        # the kolo run process's own CPU (embedded coordinator + agent)
        "off_kolo_cpu_s_median": cpu_med(off[k] for k in both),
        "on_kolo_cpu_s_median": cpu_med(on[k] for k in both),
        "extra_kolo_cpu_ms_per_iter": extra_cpu(on, off, both),
        "timeline_bytes_median": med(on[k]["timeline"]["bytes"] for k in both),
        "timeline_events_median": med(on[k]["timeline"]["events"] for k in both),
        "timeline_negotiate_allreduce_median":
            med(on[k]["timeline"]["negotiate_allreduce"] for k in both),
        "timelines_ok": all(on[k]["timeline"]["ok"] for k in both),
        "within_5pct": ratio <= 1.05,
    }
    summary.append(s)
    for k in both:
        per_round.append({"case": case, "round": k,
                          "first": ("blocks" if off[k]["order"] == 0
                                    else "off" if off[k]["order"] == 1 else "on"),
                          "off_us": off[k]["median_us"], "on_us": on[k]["median_us"],
                          "ratio": on[k]["median_us"] / off[k]["median_us"],
                          "off_kolo_cpu_s": off[k].get("kolo_cpu_s"),
                          "on_kolo_cpu_s": on[k].get("kolo_cpu_s"),
                          "load1": (off[k]["load1"] + on[k]["load1"]) / 2})

with open(json_path, "w") as f:
    json.dump({"machine": machine, "config": config, "summary": summary,
               "per_round": per_round, "records": recs}, f, indent=1)


def unit(case):
    return "ms" if case.startswith("resnet50_step") else "µs"


def fmt(case, us):
    return "%.2f" % (us / 1000) if case.startswith("resnet50_step") else "%.0f" % us


lines = [
    "# Timeline overhead (%s)" % machine["date"], "",
    "%s, %d CPUs (%s), kernel %s; np %s under `kolo run` (embedded coordinator), "
    "%s rounds. resnet50_step and allreduce_%s: one launch without and one with "
    "`--timeline-filename` per round, the order flipping every round; resnet50_step: %s "
    "steps per launch after 3 warm-up steps; allreduce: 1000 iterations. "
    "resnet50_step_toggled: one launch per round of %s steps in which rank 0 switches the "
    "timeline off/on (kolo_timeline) every %s steps (off,on,on,off), each mode's steps "
    "summarised apart. A launch's figure is its median step or iteration (max over ranks); "
    "the table gives the median over rounds (min..max), on/off the ratio of those medians, "
    "paired on/off the median (min..max) of each round's ratio, with a 95%% bootstrap "
    "interval over rounds. \"Timeline per launch\": "
    "size and events of the file (toggled: its last \"on\" phase only)."
    % (kolo_version, machine["nproc"], machine["cpu_model"], machine["kernel"], np_, rounds,
       small_bytes, steps, toggle_steps, toggle_block), "",
    "| case | timeline off | timeline on | on/off | overhead | paired on/off | paired 95% CI | rounds on slower | median of launch minima off / on | timeline per launch | mean load1 |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
for s in summary:
    c = s["case"]
    lines.append(
        "| %s (%s) | %s (%s..%s) | %s (%s..%s) | %.3f | %+.1f%% | %.3f (%.3f..%.3f) | %.3f..%.3f | %d of %d | %s / %s | %.1f MB, %d events%s | %.2f |" % (
            c, unit(c), fmt(c, s["off_median_us"]), fmt(c, s["off_range_us"][0]),
            fmt(c, s["off_range_us"][1]), fmt(c, s["on_median_us"]), fmt(c, s["on_range_us"][0]),
            fmt(c, s["on_range_us"][1]), s["ratio_on_off"], s["overhead_pct"],
            s["paired_ratio_median"], s["paired_ratio_range"][0], s["paired_ratio_range"][1],
            s["paired_ratio_ci95"][0], s["paired_ratio_ci95"][1],
            s["rounds_on_slower"], s["rounds"], fmt(c, s["off_min_us_median"]),
            fmt(c, s["on_min_us_median"]), s["timeline_bytes_median"] / 1e6,
            s["timeline_events_median"], "" if s["timelines_ok"] else ", CHECK FAILED",
            s["mean_load1"]))
lines += ["", "CPU of the `kolo run` process itself (embedded coordinator and agent, not the "
          "workers; utime+stime from /proc, 10 ms ticks), median over rounds:", "",
          "| case | off (s per launch) | on (s per launch) | on - off per negotiated iteration (ms, median of rounds) |",
          "|---|---|---|---|"]
for s in summary:
    if s["off_kolo_cpu_s_median"] is None:
        continue
    lines.append("| %s | %.2f | %.2f | %+.3f |" % (
        s["case"], s["off_kolo_cpu_s_median"], s["on_kolo_cpu_s_median"],
        s["extra_kolo_cpu_ms_per_iter"]))


def cpu(v):
    return "-" if v is None else "%.2f" % v


lines += ["", "Per round:", "",
          "| case | round | first | off | on | on/off | kolo CPU off / on (s) | load1 |",
          "|---|---|---|---|---|---|---|---|"]
for r in per_round:
    c = r["case"]
    lines.append("| %s | %d | %s | %s | %s | %.3f | %s / %s | %.2f |" % (
        c, r["round"], r["first"], fmt(c, r["off_us"]), fmt(c, r["on_us"]), r["ratio"],
        cpu(r["off_kolo_cpu_s"]), cpu(r["on_kolo_cpu_s"]), r["load1"]))
lines += ["", "Every \"on\" timeline was checked (valid JSON; NEGOTIATE_ALLREDUCE for every "
          "tensor at least once per timed iteration; spans balanced, except in the toggled "
          "case, where starting and stopping mid-step cuts spans off): %s." %
          ("all passed" if all(s["timelines_ok"] for s in summary) else "SOME FAILED"), ""]
with open(md_path, "w") as f:
    f.write("\n".join(lines))
print("\n".join(lines))
EOF
log "wrote $results/$name.json and $results/$name.md"
if [ "$bad_timelines" != 0 ]; then
    log "$bad_timelines timeline(s) failed the check"
    exit 1
fi
if grep -q '"failed":true' "$records"; then
    log "some launches failed"
    exit 1
fi
