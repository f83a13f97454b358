#!/usr/bin/env bash
# Small-op latency with and without readiness rounds (issue 13), side by
# side with Open MPI (vader) and Gloo, interleaved in one run: for each of
# REPS rounds, one launch of each. Prints every launch's JSON line (p50
# and p99 of per-iteration maxima over ranks) and a summary of medians.
#
#   bench/fast_path.sh            # np 2, sizes 4 and 4096 B, REPS=3
#   NP=4 REPS=5 bench/fast_path.sh
# Needs a build (scripts/build.sh) and, for the peers, openmpi-bin,
# libopenmpi-dev and python3-torch (bench/run.sh installs them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
NP="${NP:-2}"
REPS="${REPS:-3}"
SIZES="${SIZES:-4 4096}"
out="$(mktemp -d /tmp/kolo-fastpath.XXXXXX)"
trap 'rm -rf "$out"' EXIT
bb=build/bench-peers
mkdir -p "$bb"
if command -v mpicc >/dev/null && [ ! -x "$bb/mpi_allreduce" ]; then
  mpicc -O2 -o "$bb/mpi_allreduce" bench/mpi_allreduce.c
fi
for rep in $(seq 1 "$REPS"); do
  for fast in 1 0; do
    KOLO_FAST_PATH=$fast timeout 300 build/bin/kolo run -np "$NP" -- \
      build/bin/kolo-bench-allreduce sizes $SIZES 2>/dev/null |
      grep -o '{.*' | sed "s/\"impl\":\"kolo\"/\"impl\":\"kolo-fast$fast\"/" >>"$out/all.jsonl"
  done
  if [ -x "$bb/mpi_allreduce" ]; then
    timeout 300 mpirun --oversubscribe --allow-run-as-root -np "$NP" --mca btl vader,self \
      "$bb/mpi_allreduce" sizes $SIZES 2>/dev/null | grep '^{' >>"$out/all.jsonl" || true
  fi
  if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    GLOO_SOCKET_IFNAME=lo timeout 300 /usr/bin/python3 bench/torch_gloo.py --np "$NP" sizes $SIZES \
      2>/dev/null | grep '^{' >>"$out/all.jsonl" || true
  fi
done
cat "$out/all.jsonl"
/usr/bin/python3 - "$out/all.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in rows:
    groups.setdefault((r["bytes"], r["impl"]), []).append(r)
print("\n| bytes | impl | launches | p50 µs (median of launches) | p99 µs (median of launches) |")
print("|---:|---|---:|---:|---:|")
for (b, impl), rs in sorted(groups.items()):
    p50 = statistics.median(r["median_us"] for r in rs)
    p99 = statistics.median(r.get("p99_us", float("nan")) for r in rs)
    print("| %d | %s | %d | %.2f | %.2f |" % (b, impl, len(rs), p50, p99))
PY
