#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs a
# 4-worker data-parallel training (examples/train.c) on an embedded
# coordinator and agent: no setup, no SSH.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
KOLO_BUILD_DIR="$root/build" "$root/scripts/build.sh"
cd "$root"
exec "$root/build/bin/kolo" run -np 4 -- "$root/build/bin/kolo-example-train" 5
