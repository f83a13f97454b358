#!/usr/bin/env bash
# deploy/k8s, validated offline (no cluster runs here): each overlay
# rendered with `kubectl kustomize`, every object checked against the
# Kubernetes API schema with no unknown field, the cross-references
# checked (tests/deploy/validate.mjs), the probe and scrape paths asked of
# a real coordinator (they must answer 200), and mutations that break a
# reference or a type each caught, so the checker can fail. The
# Containerfile's COPY sources must exist. Skips (77) without kubectl or
# the npm modules, except under CI.
. "$(dirname "$0")/../integration/lib.sh"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/tests/deploy"
need() {
  [ "${CI:-}" = true ] && fail "$1 (scripts/install-deps.sh --test and scripts/test.sh set it up)"
  skip "$1"
}
command -v kubectl >/dev/null || need "no kubectl (Debian: kubernetes-client)"
command -v node >/dev/null || need "no node"
[ -d "$HERE/node_modules/kubernetes-models" ] || need "no kubernetes-models (cd tests/deploy && npm ci)"

start_coordinator coord
for overlay in cpu gpu; do
  note "overlay $overlay"
  kubectl kustomize "$ROOT/deploy/k8s/overlays/$overlay" >"$WORK/$overlay.yaml" 2>"$WORK/$overlay.err" ||
    fail "kubectl kustomize $overlay: $(cat "$WORK/$overlay.err")"
  (cd "$HERE" && node validate.mjs "$WORK/$overlay.yaml") >"$WORK/$overlay.paths" 2>"$WORK/$overlay.check" ||
    fail "$overlay: $(cat "$WORK/$overlay.check")"
  cat "$WORK/$overlay.check"
  has "^probe /" <"$WORK/$overlay.paths" || fail "$overlay: no probe found"
  while read -r what p; do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$HTTP$p")
    [ "$code" = 200 ] || fail "$overlay: the $what path $p answers $code on a real coordinator"
  done <"$WORK/$overlay.paths"
done
grep -q "nvidia.com/gpu.present" "$WORK/gpu.yaml" || fail "the gpu overlay selects no GPU nodes"
grep -q "image: kolo-gpu:" "$WORK/gpu.yaml" || fail "the gpu overlay keeps the CPU image"
grep -q "nvidia" "$WORK/cpu.yaml" && fail "the cpu overlay mentions GPUs"

note "mutations the checker must catch"
catch() { # sed-expression what-the-problem-says
  sed "$1" "$WORK/cpu.yaml" >"$WORK/bad.yaml"
  if (cd "$HERE" && node validate.mjs "$WORK/bad.yaml") >/dev/null 2>"$WORK/bad.err"; then
    fail "not caught: $1"
  fi
  grep -q -- "$2" "$WORK/bad.err" || fail "$1: expected '$2', got $(grep PROBLEM "$WORK/bad.err")"
}
catch 's/^  replicas: 1$/  replica: 1/' "spec.replica is no field"
catch 's/containerPort: 7070/containerPort: "7070x"/' "must be integer"
catch 's/  serviceName: kolo-coordinator/  serviceName: kolo-coord/' "serviceName kolo-coord is not a Service"
catch '0,/secretName: kolo-token/s//secretName: kolo-tokn/' "names Secret kolo-tokn"
catch 's/targetPort: http/targetPort: web/' "targetPort web is no named port"
catch 's|tcp://kolo-coordinator:7070|tcp://kolo-coordinater:7070|' "Service kolo-coordinater"

note "Containerfile"
sed -n 's/^COPY \([^ ]*\) .*/\1/p' "$ROOT/deploy/Containerfile" >"$WORK/copies"
[ -s "$WORK/copies" ] || fail "no COPY in the Containerfile"
while read -r src; do
  case "$src" in
    build/kolo_*.deb) grep -q "kolo_\${version}_\${arch}.deb" "$ROOT/scripts/package-deb.sh" ||
                        fail "package-deb.sh does not make $src" ;;
    *) [ -e "$ROOT/$src" ] || fail "the Containerfile copies $src, which is not in the tree" ;;
  esac
done <"$WORK/copies"
grep -q "^FROM debian:12" "$ROOT/deploy/Containerfile" || fail "not on Debian 12"
echo PASS
