#!/usr/bin/env bash
# Builds kolo_<version>_<arch>.deb from the build tree (scripts/build.sh):
# `cmake --install` into a staging root with prefix /usr (the binary, libkolo,
# kolo.h, the Python package where Debian's python3 finds it), plus
# deploy/: the systemd units, /etc/kolo/*.conf (conffiles) and the
# maintainer scripts (the kolo user, /var/lib/kolo 0700, a 0600 token made
# at install, the kolo-job user jobs run as). libssl3 is a dependency:
# --encrypt-data's AEAD is libcrypto's (worker/transport/seal.c opens it at run time). Prints the .deb's path. dpkg-deb stands in for
# `cpack -G DEB`: the same package, with Debian's own tool.
#
#   scripts/package-deb.sh [BUILD_DIR]     (default: build; writes BUILD_DIR/kolo_*.deb)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
[ -x "$build/bin/kolo" ] || { echo "package-deb.sh: no kolo in $build (run scripts/build.sh)" >&2; exit 1; }
version="$(sed -n 's/^project(kolo VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")"
arch="$(dpkg --print-architecture)"
stage="$(mktemp -d "${TMPDIR:-/tmp}/kolo-deb.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"

DESTDIR="$stage" cmake --install "$build" --prefix /usr >/dev/null
install -D -m 0644 "$root/deploy/systemd/kolo-coordinator.service" "$stage/lib/systemd/system/kolo-coordinator.service"
install -D -m 0644 "$root/deploy/systemd/kolo-agent.service" "$stage/lib/systemd/system/kolo-agent.service"
install -D -m 0644 "$root/deploy/etc/coordinator.conf" "$stage/etc/kolo/coordinator.conf"
install -D -m 0644 "$root/deploy/etc/agent.conf" "$stage/etc/kolo/agent.conf"
install -D -m 0644 "$root/README.md" "$stage/usr/share/doc/kolo/README.md"
install -D -m 0755 "$root/deploy/spot/poll-termination.sh" "$stage/usr/share/kolo/poll-termination.sh"
install -D -m 0644 "$root/deploy/prometheus/kolo-alerts.yml" "$stage/usr/share/kolo/prometheus/kolo-alerts.yml"
install -d "$stage/DEBIAN"
for f in postinst prerm postrm; do install -m 0755 "$root/deploy/debian/$f" "$stage/DEBIAN/$f"; done
install -m 0644 "$root/deploy/debian/conffiles" "$stage/DEBIAN/conffiles"
size_kb="$(du -sk --exclude=DEBIAN "$stage" | cut -f1)"
cat >"$stage/DEBIAN/control" <<CONTROL
Package: kolo
Version: $version
Architecture: $arch
Maintainer: kolo developers <kolo@localhost>
Installed-Size: $size_kb
Depends: libc6, libnng1 (>= 1.5), libprotobuf-c1, libuv1, libsqlite3-0, libssl3 | libssl3t64, adduser, python3, python3-numpy
Recommends: python3-torch, python3-cloudpickle
Section: science
Priority: optional
Description: elastic data-parallel training with a Horovod-compatible API
 A coordinator that keeps membership, tensor negotiation and committed
 training state in SQLite and survives restarts, agents that start and
 watch the training processes, libkolo for the collectives, and the
 kolo Python package (import kolo.torch as hvd). systemd units:
 kolo-coordinator.service and kolo-agent.service, configured in /etc/kolo.
CONTROL
out="$build/kolo_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$out" >/dev/null
echo "$out"
