#!/usr/bin/env bash
# bench/shm_large.sh - large allreduces on one host, kolo's shared-memory
# backend beside Open MPI's vader, in place and out of place.
#
#   bench/shm_large.sh                     RUNS=5 runs of 64 MiB at np 2 (~1 min)
#   RUNS=10 SIZES=16777216,67108864 NP=2,4 bench/shm_large.sh
#
# One run measures, back to back, the four cells
#   kolo in place, kolo out of place, Open MPI in place, Open MPI out of
#   place
# with bench/shmcoll_bench.c (its -m mode is the same loop around
# MPI_Allreduce, under mpirun), the order of the four rotating from run to
# run so the drift of a shared machine falls on every cell alike. Each cell
# reports the median and the p99 (nearest rank) of its iterations, an
# iteration being the slowest rank's time; ITER_MULT (3) multiplies
# shmcoll_bench's iteration counts (10 at 64 MiB).
#
# The summary gives, per run, kolo over Open MPI like for like (in place
# over in place, out of place over out of place) and kolo's out of place
# over Open MPI's in place (its faster mode), at p50 and at p99, then the
# median and the worst of each ratio over the runs.
#
# Output: a table on stdout and bench/results/<UTC timestamp>-shm-large.md.
# It builds the two programs from an existing build (scripts/build.sh);
# KOLO_BUILD_DIR selects it.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${KOLO_BUILD_DIR:-$root/build}"
PY=/usr/bin/python3

RUNS="${RUNS:-5}"
SIZES="${SIZES:-67108864}"
NP="${NP:-2}"
ITER_MULT="${ITER_MULT:-3}"

for lib in worker/libkolo_worker.a negotiation/libkolo_negotiation.a common/libkolo_common.a libkolo_proto.a; do
    [ -f "$build/$lib" ] || { echo "shm_large: missing $build/$lib (run scripts/build.sh)" >&2; exit 1; }
done
command -v mpicc >/dev/null || { echo "shm_large: mpicc not found (apt-get install libopenmpi-dev openmpi-bin)" >&2; exit 1; }

tmp="$(mktemp -d /tmp/kolo-shm-large.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
libs=("$build/worker/libkolo_worker.a" "$build/negotiation/libkolo_negotiation.a"
      "$build/common/libkolo_common.a" "$build/libkolo_proto.a")
flags=(-O3 -D_GNU_SOURCE -Iinclude -Iworker/coll -Icommon -Inegotiation -I"$build/proto")
gcc "${flags[@]}" bench/shmcoll_bench.c "${libs[@]}" \
    -lnng -lprotobuf-c -lcrypto -lm -lpthread -ldl -o "$tmp/kolo"
mpicc "${flags[@]}" -DKOLO_BENCH_MPI bench/shmcoll_bench.c "${libs[@]}" \
    -lnng -lprotobuf-c -lcrypto -lm -lpthread -ldl -o "$tmp/mpi"

mpirun_flags=(--allow-run-as-root --bind-to none --mca btl vader,self)
cell() { # cell <kolo|mpi> <in|out> <np>
    local o=()
    [ "$2" = out ] && o=(-o)
    if [ "$1" = kolo ]; then
        timeout 300 "$tmp/kolo" "${o[@]}" -n "$3" -s "$SIZES" -x "$ITER_MULT"
    else
        timeout 300 mpirun "${mpirun_flags[@]}" -np "$3" "$tmp/mpi" -m "${o[@]}" -s "$SIZES" -x "$ITER_MULT"
    fi
}

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
raw="$tmp/rows.txt"
: >"$raw"
cells=("kolo in" "kolo out" "mpi in" "mpi out")
load_start="$(cut -d' ' -f1 /proc/loadavg)"
for run in $(seq 1 "$RUNS"); do
    for np in ${NP//,/ }; do
        for i in 0 1 2 3; do
            c=(${cells[$(((i + run - 1) % 4))]})
            if ! cell "${c[0]}" "${c[1]}" "$np" >"$tmp/cell.out" 2>"$tmp/cell.err" ||
                grep -q FAILED "$tmp/cell.out"; then
                echo "shm_large: ${c[0]} ${c[1]} of place, np $np, run $run failed:" >&2
                tail -5 "$tmp/cell.out" "$tmp/cell.err" >&2
                exit 1
            fi
            # rows: ranks bytes p50 p99 busbw (tag); keep the numbers
            awk -v run="$run" -v who="${c[0]}" -v where="${c[1]}" \
                '$1 ~ /^[0-9]+$/ {print run, who, where, $1, $2, $3, $4}' "$tmp/cell.out" >>"$raw"
        done
    done
    echo "run $run of $RUNS done" >&2
done
load_end="$(cut -d' ' -f1 /proc/loadavg)"

mkdir -p bench/results
out="bench/results/$stamp-shm-large.md"
"$PY" - "$raw" "$out" "$stamp" "$load_start" "$load_end" "$ITER_MULT" <<'EOF'
import collections, platform, statistics, subprocess, sys
raw, out, stamp, l0, l1, mult = sys.argv[1:]
cells = collections.defaultdict(dict)  # (np, bytes) -> {(run, who, where): (p50, p99)}
for line in open(raw):
    run, who, where, np, size, p50, p99 = line.split()
    cells[(int(np), int(size))][(int(run), who, where)] = (float(p50), float(p99))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
lines = [f"# Large allreduce on one host: kolo shmcoll vs Open MPI vader ({stamp})", "",
         f"Machine: {cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} CPUs; "
         f"load {l0} at the start, {l1} at the end. `bench/shm_large.sh`, float32 SUM, "
         f"shmcoll_bench iterations x{mult}; times in ms, an iteration being the slowest rank's; "
         "ratios are kolo's time over Open MPI's (below 1x kolo is faster).", ""]
def ratio(a, b):
    return a / b if a and b else float("nan")
for (np, size), d in sorted(cells.items()):
    runs = sorted({r for r, _, _ in d})
    lines += [f"## np {np}, {size / 2**20:g} MiB", "",
              "| run | kolo in p50 / p99 | kolo out p50 / p99 | MPI in p50 / p99 | MPI out p50 / p99 "
              "| in/in p50 / p99 | out/out p50 / p99 | kolo out / MPI in p50 / p99 |",
              "|---|---|---|---|---|---|---|---|"]
    rs = collections.defaultdict(list)
    for r in runs:
        g = lambda who, where: d.get((r, who, where), (None, None))
        ki, ko, mi, mo = g("kolo", "in"), g("kolo", "out"), g("mpi", "in"), g("mpi", "out")
        ms = lambda us: f"{us / 1e3:.2f}" if us >= 1e3 else f"{us / 1e3:.4f}"
        row = [str(r)] + [f"{ms(c[0])} / {ms(c[1])}" if c[0] else "-" for c in (ki, ko, mi, mo)]
        for name, a, b in (("in/in", ki, mi), ("out/out", ko, mo), ("out/MPI in", ko, mi)):
            p50, p99 = ratio(a[0], b[0]), ratio(a[1], b[1])
            rs[name].append((p50, p99))
            row.append(f"{p50:.2f}x / {p99:.2f}x")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| ratio | median p50 | worst p50 | median p99 | worst p99 |", "|---|---|---|---|---|"]
    for name, v in rs.items():
        p50s = [a for a, _ in v if a == a]
        p99s = [b for _, b in v if b == b]
        if p50s:
            lines.append(f"| {name} | {statistics.median(p50s):.2f}x | {max(p50s):.2f}x | "
                         f"{statistics.median(p99s):.2f}x | {max(p99s):.2f}x |")
    lines.append("")
text = "\n".join(lines)
open(out, "w").write(text + "\n")
print(text)
EOF
echo "wrote $out" >&2
