#!/usr/bin/env bash
# Installs the Debian 12 packages kolo needs to build, test and run.
# With --test, also what the browser tests need: Debian's chromium, and
# Node.js with npm where no node is on PATH (tests/browser then gets
# playwright-core from npm: scripts/test.sh), gdb (a failed integration
# test prints the stacks of the workers it leaves behind) and clang with
# its libFuzzer runtime (tests/fuzz). openssl makes TLS files
# (scripts/tls-certs.sh, and the TLS tests); libssl3's libcrypto is what
# an encrypted data plane (--encrypt-data) loads at run time.
# Idempotent: installs only what is missing, so running it twice is cheap.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libprotobuf-c-dev protobuf-c-compiler libnng-dev libuv1-dev libsqlite3-dev
  sqlite3 curl procps iproute2 nftables python3 openssl libssl3
  python3-numpy python3-torch python3-pytest python3-sklearn python3-cloudpickle
  python3-optuna python3-yaml
)
if [ "${1:-}" = "--test" ]; then
  packages+=(chromium gdb clang libclang-rt-14-dev)
  # a real Jupyter kernel for kolo.run from a notebook cell (tests/python/test_notebook.py)
  packages+=(python3-nbclient python3-ipykernel)
  # a real Slurm on this machine for tests/integration/test_slurm.sh
  packages+=(slurmd slurmctld slurm-client munge)
  command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
  # a real Prometheus scrapes /metrics and checks deploy/prometheus's alerting
  # rules (tests/integration/test_prometheus.sh: prometheus, promtool)
  packages+=(prometheus)
  # kubectl kustomize renders deploy/k8s offline (tests/deploy)
  command -v kubectl >/dev/null || packages+=(kubernetes-client)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
