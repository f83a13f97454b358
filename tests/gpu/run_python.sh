#!/usr/bin/env bash
# run_python.sh PYTHON FILE [cuda]: runs one pytest file of the GPU tests;
# 77 (skipped) when that Python lacks pytest or torch, or, with "cuda",
# when its torch sees no CUDA device.
set -uo pipefail
py="$1"; file="$2"; need="${3:-}"
if ! "$py" -c 'import pytest, torch' >/dev/null 2>&1; then
  echo "skipped: $py lacks pytest or torch"
  exit 77
fi
if [ "$need" = cuda ] && ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  echo "skipped: $py's torch sees no CUDA device"
  exit 77
fi
cd "$(dirname "$file")"
exec "$py" -m pytest -q -p no:cacheprovider -x "$file"
