#!/usr/bin/env bash
# bench/goodput.sh - goodput under failures: ETTR of kolo elastic against torchrun.
#
#   bench/goodput.sh             6 configurations x W=180 s, REPS=1 (~21 min on 2 vCPUs)
#   SMOKE=1 bench/goodput.sh     one kill per launcher, checks only (~1 min)
#   SPARES=1 bench/goodput.sh    kolo with --spares 1 (hot spares)
#
# The same job (bench/goodput_train.py: the synthetic CNN of
# examples/pytorch/synthetic_benchmark.py at np 4, 16x16 images, batch 16,
# a commit or checkpoint every 10 steps) runs for W seconds under
#   kolo elastic: build/bin/kolo run -np 4 --min-np 2 --max-np 4
#                 --blacklist-cooldown-range 1 2 (hvd.elastic.run, TorchState);
#   torchrun:     /usr/bin/torchrun --standalone --nproc_per_node 4 --max_restarts 1000
#                 (DDP on Gloo, rank 0 checkpoints, every worker loads it at start);
# each with no failures and with a seeded SIGKILL of a random training worker
# every P seconds (PERIODS), the order rotating per repetition. It reports the
# effective training time ratio (the counted steps' time / W), steps redone,
# and the time lost per failure split into detect, re-form, restore and redone
# steps (p50, p99); bench/goodput.py's docstring has the definitions.
# Output: a markdown table on stdout, bench/results/<UTC stamp>-goodput.{json,md};
# every run's event log and launcher output under
# build/bench-peers/raw/<stamp>-goodput/ (bench/goodput.sh --reanalyse DIR
# analyses them again and rewrites that run's results).
#
# SMOKE=1: kolo and torchrun only, one kill 5 s after the first step, each
# run ended 5 steps after its recovery (at most W=60 s); it fails unless the
# analysis found the kill, its detection and steps after the recovery.
# Writes no results file. Exit 77 (skipped) when torchrun or /usr/bin/python3's
# torch is missing, unless CI is set.
#
# Environment knobs: W (180 s), PERIODS ("60 15"), SEED (random), REPS (1),
# IMPLS ("kolo torchrun"), COMMIT_EVERY (10), SMOKE, SKIP_BUILD=1,
# KOLO (the kolo binary; default $KOLO_BUILD_DIR/bin/kolo), TORCHRUN
# (/usr/bin/torchrun).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${KOLO_BUILD_DIR:-$root/build}"
PY=/usr/bin/python3 # Debian's python: the only one that sees python3-torch
case "${1:-}" in
-h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac

# Settings from the caller's environment that would redirect kolo.
unset KOLO_RUN_COORDINATOR KOLO_COORDINATOR KOLO_TOKEN_FILE KOLO_TOKEN KOLO_SLOTS KOLO_NAME \
    KOLO_ADDR KOLO_STATE_DIR KOLO_CONFIG KOLO_DATA_ADDR 2>/dev/null || true
log() { printf '[goodput %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

skip_or_fail() {
    if [ -n "${CI:-}" ]; then log "$1 (CI is set: failing)"; exit 1; fi
    log "$1: skipped"; exit 77
}
TORCHRUN="${TORCHRUN:-/usr/bin/torchrun}"
[ -x "$TORCHRUN" ] || skip_or_fail "no $TORCHRUN"
"$PY" -c 'import importlib.util as u, sys; sys.exit(not u.find_spec("torch"))' ||
    skip_or_fail "$PY cannot import torch"

mkdir -p "$build"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    log "building kolo"
    KOLO_BUILD_DIR="$build" scripts/build.sh >/dev/null 2>"$build/goodput-build.log" ||
        { tail -5 "$build/goodput-build.log" >&2; log "build failed"; exit 1; }
fi
export KOLO="${KOLO:-$build/bin/kolo}" KOLO_BUILD_DIR="$build" TORCHRUN
[ -x "$KOLO" ] || { log "missing $KOLO"; exit 1; }
# One import of torch (seconds on a loaded machine) checks both sides.
PYTHONPATH="$root/python" "$PY" -c 'import torch.distributed, kolo.torch' ||
    { log "$PY cannot import torch.distributed and kolo.torch"; exit 1; }

exec "$PY" "$root/bench/goodput.py" "$@"
