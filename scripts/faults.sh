#!/usr/bin/env bash
# The whole fault matrix with fresh seeds, then the soak; the figures go to
# build/faults-<stamp>.md (copy them into docs/reliability.md).
#
#   scripts/faults.sh                 1 run per scenario, then a 30 min soak
#   RUNS=3 SOAK_MIN=10 scripts/faults.sh
#   ONLY=worker_kill,partition SOAK_MIN=0 scripts/faults.sh
# CI runs every scenario once as an ordinary test (ctest -L integration).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${KOLO_BUILD_DIR:-$root/build}"
[ "${SKIP_BUILD:-0}" = 1 ] || KOLO_BUILD_DIR="$build" "$root/scripts/build.sh"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="$build/faults-$stamp"
rc=0
/usr/bin/python3 "$root/tests/faults/matrix.py" --build "$build" --runs "${RUNS:-1}" \
  ${SEED:+--seed "$SEED"} ${ONLY:+--only "$ONLY"} --md "$out.md" --json "$out.json" \
  --logs "$out-logs" || rc=1
if [ "${SOAK_MIN:-30}" -gt 0 ]; then
  echo "== soak: ${SOAK_MIN:-30} min"
  KOLO="$build/bin/kolo" SOAK_MIN="${SOAK_MIN:-30}" bash "$root/tests/faults/soak.sh" \
    | tee "$out-soak.log" || rc=1
fi
echo "figures: $out.md${SOAK_MIN:+ and $out-soak.log}"
exit $rc
