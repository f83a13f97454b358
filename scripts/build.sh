#!/usr/bin/env bash
# Configures and builds kolo into ./build (or $KOLO_BUILD_DIR).
# Extra arguments go to cmake's configure step, e.g. -DKOLO_SANITIZE=address;
# KOLO_BUILD_TARGET builds one target instead of all (e.g. kolo_fuzz_all).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${KOLO_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
cmake --build "$build" -j"$(nproc)" ${KOLO_BUILD_TARGET:+--target "$KOLO_BUILD_TARGET"}
