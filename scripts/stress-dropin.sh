#!/usr/bin/env bash
# The drop-in stress, full seeded run (issue 30, item 2): Horovod-style
# module sequences (tests/python/horovod_style/test_stress.py) in seeded
# random orders, one launch per seed, at np 2, 3 and 4 on this host with
# two busy loops beside the job, then at np 2 and 4 across two network
# namespaces (root only; skipped otherwise). Every pass (np, seed) is
# recorded as one JSON line in $KOLO_STRESS_RECORD (default
# build/stress-dropin.jsonl, appended) with the failing tests, if any;
# the summary lines are printed at the end. Exit 0 when every pass passed.
#
#   scripts/stress-dropin.sh [SEEDS]      SEEDS: 1-20 (default), or 3,17
#
# KOLO_BUILD_DIR picks the build tree (default build/).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${KOLO_BUILD_DIR:-$root/build}"
seeds="${1:-1-20}"
record="${KOLO_STRESS_RECORD:-$build/stress-dropin.jsonl}"
export KOLO="${KOLO:-$build/bin/kolo}"
export KOLO_LIBRARY="${KOLO_LIBRARY:-$build/lib/libkolo.so}"
[ -x "$KOLO" ] || { echo "no kolo at $KOLO (scripts/build.sh first)" >&2; exit 2; }
driver=(/usr/bin/python3 "$root/tests/python/stress_dropin.py" --record "$record"
        --seeds "$seeds" --busy 2 --keep-output "$build/stress-dropin-failed")
rc=0
summary=()
"${driver[@]}" --np 2,3,4 | tee "$build/stress-dropin.local.log" || rc=1
summary+=("$(grep '^\[stress\] summary' "$build/stress-dropin.local.log")")
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null; then
  "${driver[@]}" --np 2,4 --hosts netns | tee "$build/stress-dropin.netns.log" || rc=1
  summary+=("$(grep '^\[stress\] summary' "$build/stress-dropin.netns.log")")
else
  summary+=("[stress] netns: skipped (needs root and ip(8))")
fi
echo "== drop-in stress, seeds $seeds (record: $record)"
printf '%s\n' "${summary[@]}"
exit $rc
