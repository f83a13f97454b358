#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test
# (ctest, all labels; the dashboard's in Debian's chromium), then the
# threaded modules again under ThreadSanitizer and AddressSanitizer, then
# the fuzzers (clang's libFuzzer) for a bounded time each. The sanitizer
# and fuzzer trees build while the main tests run, at the lowest CPU
# priority: many of those tests wait (leases, timeouts, a process's
# start), and the build takes only what they leave idle.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh" --test
echo "== browser test tools (playwright-core from npm)"
(cd "$root/tests/browser" && npm ci --no-audit --no-fund --loglevel=error)
echo "== Kubernetes schema tools (kubernetes-models from npm)"
(cd "$root/tests/deploy" && npm ci --no-audit --no-fund --loglevel=error)

jobs="$(nproc)"
sanitizers="address thread"
[ "${KOLO_SKIP_SANITIZERS:-0}" = "1" ] && sanitizers=""
fuzz=1
[ "${KOLO_SKIP_FUZZ:-0}" = "1" ] && fuzz=0
echo "== build"
KOLO_BUILD_DIR="$root/build" "$root/scripts/build.sh"

# The other trees: only the unit label's binaries (kolo_unit_tests) in the
# sanitizer ones, nothing else runs there; the harnesses in the fuzz one.
build_others() {
  local san
  for san in $sanitizers; do
    KOLO_BUILD_DIR="$root/build-$san" CMAKE_BUILD_TYPE=Debug KOLO_BUILD_TARGET=kolo_unit_tests \
      "$root/scripts/build.sh" -DKOLO_SANITIZE="$san" || return 1
  done
  if [ $fuzz = 1 ]; then
    CC=clang KOLO_BUILD_DIR="$root/build-fuzz" CMAKE_BUILD_TYPE=Debug KOLO_BUILD_TARGET=kolo_fuzz_all \
      "$root/scripts/build.sh" -DKOLO_FUZZ=ON -DKOLO_NATIVE=OFF || return 1
  fi
}
others_log="$root/build/other-trees.log"
others_pid=""
if [ -n "$sanitizers" ] || [ $fuzz = 1 ]; then
  echo "== building the sanitizer and fuzzer trees meanwhile (lowest priority; $others_log)"
  # In a session of its own whose autogroup is niced too: where the kernel
  # groups the scheduler by session (sched_autogroup), a process's nice
  # value only counts against its own session, and the tests' workers run
  # in sessions of their own.
  export -f build_others
  export root sanitizers fuzz
  setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 bash -c build_others' \
    >"$others_log" 2>&1 </dev/null &
  others_pid=$!
fi
# a failed test ends the script: the background build goes with it
trap '[ -n "$others_pid" ] && kill -- -"$others_pid" 2>/dev/null; true' EXIT

echo "== tests"
(cd "$root/build" && ctest --output-on-failure -j"$jobs" --timeout 300)

if [ -n "$others_pid" ]; then
  echo "== waiting for the sanitizer and fuzzer trees"
  rc=0
  wait "$others_pid" || rc=$?
  others_pid=""
  [ $rc -eq 0 ] || { cat "$others_log"; echo "building the sanitizer or fuzzer trees failed ($rc)"; exit 1; }
fi

for san in $sanitizers; do
  echo "== tests under -fsanitize=$san (unit label)"
  # ThreadSanitizer only matters where there are threads.
  exclude=""
  [ "$san" = thread ] && exclude="-LE nothreads"
  (cd "$root/build-$san" && ctest --output-on-failure -j"$jobs" -L unit $exclude --timeout 300)
done

if [ $fuzz = 1 ]; then
  echo "== fuzzers (libFuzzer under ASan+UBSan, tests/fuzz)"
  (cd "$root/build-fuzz" && ctest --output-on-failure -j"$jobs" -L fuzz --timeout 300)
fi
echo "== all tests passed"
