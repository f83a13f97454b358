#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs a
# 4-worker data-parallel PyTorch training (examples/pytorch/digits.py, an
# MLP on scikit-learn's bundled digits) through kolo.torch on an embedded
# coordinator and agent: no setup, no SSH. Rank 0 prints per-epoch time,
# loss and accuracy, then the final test accuracy.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
KOLO_BUILD_DIR="$root/build" "$root/scripts/build.sh"
cd "$root"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$root/build/bin/kolo" run -np 4 -- /usr/bin/python3 "$root/examples/pytorch/digits.py" "$@"
