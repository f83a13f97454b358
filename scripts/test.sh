#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test
# (ctest, all labels; the dashboard's in Debian's chromium), then the
# threaded modules again under ThreadSanitizer and AddressSanitizer, then
# the fuzzers (clang's libFuzzer) for a bounded time each.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh" --test
echo "== browser test tools (playwright-core from npm)"
(cd "$root/tests/browser" && npm ci --no-audit --no-fund --loglevel=error)
echo "== Kubernetes schema tools (kubernetes-models from npm)"
(cd "$root/tests/deploy" && npm ci --no-audit --no-fund --loglevel=error)

jobs="$(nproc)"
echo "== build"
KOLO_BUILD_DIR="$root/build" "$root/scripts/build.sh"
echo "== tests"
(cd "$root/build" && ctest --output-on-failure -j"$jobs" --timeout 300)

if [ "${KOLO_SKIP_SANITIZERS:-0}" != "1" ]; then
  for san in address thread; do
    echo "== tests under -fsanitize=$san (unit label)"
    # only the unit label's binaries (kolo_unit_tests): nothing else runs here
    KOLO_BUILD_DIR="$root/build-$san" CMAKE_BUILD_TYPE=Debug KOLO_BUILD_TARGET=kolo_unit_tests \
      "$root/scripts/build.sh" -DKOLO_SANITIZE="$san"
    # ThreadSanitizer only matters where there are threads.
    exclude=""
    [ "$san" = thread ] && exclude="-LE nothreads"
    (cd "$root/build-$san" && ctest --output-on-failure -j"$jobs" -L unit $exclude --timeout 300)
  done
fi

if [ "${KOLO_SKIP_FUZZ:-0}" != "1" ]; then
  echo "== fuzzers (libFuzzer under ASan+UBSan, tests/fuzz)"
  CC=clang KOLO_BUILD_DIR="$root/build-fuzz" CMAKE_BUILD_TYPE=Debug KOLO_BUILD_TARGET=kolo_fuzz_all \
    "$root/scripts/build.sh" -DKOLO_FUZZ=ON -DKOLO_NATIVE=OFF
  (cd "$root/build-fuzz" && ctest --output-on-failure -j"$jobs" -L fuzz --timeout 300)
fi
echo "== all tests passed"
