#!/usr/bin/env bash
# run_pytest.sh PYTHON FILE: runs one pytest file; 77 (skipped) when that
# Python has no pytest/torch/numpy (the C tests still run).
set -uo pipefail
py="$1"; file="$2"
if ! "$py" -c 'import pytest, numpy, torch' >/dev/null 2>&1; then
  echo "skipped: $py lacks pytest, numpy or torch (scripts/install-deps.sh installs them)"
  exit 77
fi
cd "$(dirname "$file")"
exec "$py" -m pytest -q -p no:cacheprovider -x "$file"
