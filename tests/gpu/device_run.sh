#!/usr/bin/env bash
# device_run.sh [BUILD] [OUT]: the GPU checks on a GPU host, from a build
# made elsewhere (libkolo, kolo, the gpu tests and kolo-bench-nccl in
# BUILD, the shared libraries they need and the host may lack in
# BUILD/deps). Writes each step's output under OUT. Not a ctest: on a GPU
# host with the build dependencies, `ctest -L gpu` runs the same tests.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
B="$(cd "${1:-$root/build-gpu}" && pwd)"
OUT="${2:-/tmp/kolo-gpu-out}"
PY="${KOLO_GPU_PYTHON:-/opt/torch/.venv/bin/python}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KOLO="$B/bin/kolo" KOLO_LIBRARY="$B/lib/libkolo.so"
# NCCL and the CUDA runtime where a pip-installed torch keeps them, when
# they are not on the library path
find_lib() { ldconfig -p | grep -q "$1" && return; find /opt /usr -name "$1" 2>/dev/null | head -1; }
nccl="$(find_lib libnccl.so.2)"; cudart="$(find_lib libcudart.so.13)"
[ -n "$nccl" ] && export KOLO_NCCL_LIBRARY="$nccl" LD_LIBRARY_PATH="$(dirname "$nccl"):$LD_LIBRARY_PATH"
[ -n "$cudart" ] && export KOLO_CUDART_LIBRARY="$cudart" LD_LIBRARY_PATH="$(dirname "$cudart"):$LD_LIBRARY_PATH"
step() { # step NAME TIMEOUT CMD... (ONLY="name ...": just those steps)
  local name="$1" t="$2"; shift 2
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && return
  local t0=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  printf '%-16s rc=%-3s %4ds\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
}
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
# the benchmark with readiness rounds (the default), then through the
# coordinator for every op (KOLO_FAST_PATH=0, sizes up to 1 MiB)
step bench 90 "$KOLO" run -np 1 -- "$B/bin/kolo-bench-nccl"
step bench_coord 40 env KOLO_FAST_PATH=0 "$KOLO" run -np 1 -- "$B/bin/kolo-bench-nccl" 1048576
step errors 60 "$B/tests/gpu/test_gpu_errors"
step collectives 150 "$B/tests/gpu/test_gpu_collectives"
step torch_cuda 130 "$root/tests/gpu/run_python.sh" "$PY" "$root/tests/gpu/test_torch_cuda.py" cuda
grep -h "^\[\|MISMATCH\|refused\|FAIL\|passed\|failed" "$OUT"/*.txt | head -60
