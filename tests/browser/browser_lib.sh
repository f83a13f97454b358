# browser_lib.sh - what the browser tests' scripts share, on top of
# integration/lib.sh: paths, and the skip (77) when chromium, node,
# playwright-core or a Python module they need is missing, except under CI,
# which installs them all (there a missing one fails the test).
#
#   . browser_lib.sh ARTIFACT_NAME PYTHON_MODULE...
# sets HERE, ROOT, PY and ARTIFACTS ($KOLO_ARTIFACTS, or
# build/test-artifacts/ARTIFACT_NAME).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/../integration/lib.sh"
PY=/usr/bin/python3
ROOT="$(cd "$HERE/../.." && pwd)"
ARTIFACTS="${KOLO_ARTIFACTS:-$ROOT/build/test-artifacts/$1}"
shift

missing=""
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || missing="$missing chromium"
command -v node >/dev/null || missing="$missing node"
[ -d "$HERE/node_modules/playwright-core" ] || missing="$missing playwright-core(npm ci in tests/browser)"
for m in "$@"; do
  "$PY" -c "import $m" 2>/dev/null || missing="$missing $m"
done
if [ -n "$missing" ]; then
  [ -n "${CI:-}" ] && fail "CI must have:$missing"
  echo "skipped: no$missing"
  trap - EXIT
  rm -rf "$WORK"
  exit 77
fi
export PYTHONPATH="$ROOT/python" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
