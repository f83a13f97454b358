#!/usr/bin/env bash
# The Debian package (scripts/package-deb.sh), installed on this machine
# and removed again:
# - its contents: /usr/bin/kolo, libkolo and its links, kolo.h, the Python
#   package under /usr/lib/python3/dist-packages, both systemd units (they
#   pass systemd-analyze verify), /etc/kolo/*.conf as conffiles;
# - its Depends name libssl3 (--encrypt-data opens libcrypto);
# - dpkg -i makes the kolo system user, /var/lib/kolo (0700, kolo's), a
#   0600 token and the kolo-job user (no login shell);
# - a 2-rank Python job runs from installed paths only (no PYTHONPATH, no
#   build tree): kolo and libkolo come from /usr;
# - the units' commands, run by hand as their users with the packaged
#   config files (no systemd here: the coordinator as kolo, the agent as
#   root), form a cluster whose jobs run as kolo-job and can read neither
#   /etc/kolo/token nor /var/lib/kolo;
# - dpkg --purge removes the files, the token, the state and both users;
# - pip install ./python (python/pyproject.toml) works offline.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || skip "installing a package needs root"
command -v dpkg-deb >/dev/null || skip "no dpkg-deb"
/usr/bin/python3 -c "import numpy" 2>/dev/null || skip "no /usr/bin/python3 with numpy"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "$(dirname "$KOLO")/.." && pwd)"
if dpkg-query -W -f='${Status}' kolo 2>/dev/null | grep -q "install ok installed"; then
  fail "a kolo package is installed already; this test installs and purges its own"
fi
# the daemons run as kolo under runuser: stop them (not just runuser) first
purge() {
  pkill -9 -u kolo 2>/dev/null
  wait_for 5 sh -c '! pgrep -u kolo >/dev/null' || true
  dpkg --purge kolo >"$WORK/purge.out" 2>&1
}
trap 'rc=$?; set +e; purge; (exit $rc); cleanup' EXIT

note "build the package"
DEB=$("$ROOT/scripts/package-deb.sh" "$BUILD") || fail "package-deb.sh failed"
dpkg-deb -f "$DEB" Package Version Depends | has "^Package: kolo" || fail "no control file"
dpkg-deb -f "$DEB" Depends | has "libssl3" || fail "libssl3 is not in Depends: $(dpkg-deb -f "$DEB" Depends)"
dpkg-deb -c "$DEB" | awk '{print $6}' >"$WORK/contents"
for f in ./usr/bin/kolo ./usr/lib/libkolo.so ./usr/lib/libkolo.so.0 ./usr/include/kolo.h \
         ./usr/include/kolo/abi.h \
         ./usr/lib/python3/dist-packages/kolo/__init__.py \
         ./usr/lib/python3/dist-packages/kolo/torch/__init__.py \
         ./lib/systemd/system/kolo-coordinator.service ./lib/systemd/system/kolo-agent.service \
         ./etc/kolo/coordinator.conf ./etc/kolo/agent.conf ./usr/share/kolo/poll-termination.sh \
         ./usr/share/kolo/prometheus/kolo-alerts.yml; do
  grep -qx -- "$f" "$WORK/contents" || fail "$f is not in the package"
done
dpkg-deb --ctrl-tarfile "$DEB" | tar -xO ./conffiles | has "^/etc/kolo/agent.conf$" ||
  fail "the config files are not conffiles"

note "pip install ./python (offline, into a folder) and a job on it"
/usr/bin/python3 -m pip install --no-build-isolation --no-deps --no-index --target "$WORK/site" \
  "$ROOT/python" >"$WORK/pip.out" 2>&1 || fail "pip install failed: $(tail -n 5 "$WORK/pip.out")"
rm -rf "$ROOT/python/build" "$ROOT/python/kolo.egg-info"
[ -f "$WORK/site/kolo/torch/__init__.py" ] || fail "pip installed no kolo.torch"
[ -f "$WORK/site/kolo/torch/elastic/state.py" ] || fail "pip installed no kolo.torch.elastic"
[ -f "$WORK/site/kolo/horovod_alias/horovod/__init__.py" ] || fail "pip installed no horovod alias"
(cd "$WORK" && env -u PYTHONPATH PYTHONPATH="$WORK/site" KOLO_LIBRARY="$BUILD/lib/libkolo.so" \
  "$KOLO" run -np 2 -- /usr/bin/python3 -c '
import numpy as np, kolo
kolo.init()
print("pip", kolo.__file__, float(kolo.allreduce(np.ones(1), op=kolo.Sum)[0]), flush=True)
kolo.shutdown()') >"$WORK/pip-job.out" 2>&1 || fail "the job failed: $(cat "$WORK/pip-job.out")"
[ "$(grep -c "pip $WORK/site/kolo/__init__.py 2.0" "$WORK/pip-job.out")" -eq 2 ] ||
  fail "not the pip-installed package: $(cat "$WORK/pip-job.out")"

note "install"
dpkg -i "$DEB" >"$WORK/install.out" 2>&1 || fail "dpkg -i failed: $(cat "$WORK/install.out")"
getent passwd kolo >/dev/null || fail "no kolo user"
getent passwd kolo-job | has ":/usr/sbin/nologin$" || fail "no kolo-job user without a login shell: $(getent passwd kolo-job)"
[ "$(stat -c '%a %U' /var/lib/kolo)" = "700 kolo" ] || fail "/var/lib/kolo is $(stat -c '%a %U' /var/lib/kolo)"
[ "$(stat -c '%a %U' /etc/kolo/token)" = "600 kolo" ] || fail "/etc/kolo/token is $(stat -c '%a %U' /etc/kolo/token)"
[ "$(wc -c </etc/kolo/token)" -ge 64 ] || fail "the token is short"
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify /lib/systemd/system/kolo-coordinator.service \
    /lib/systemd/system/kolo-agent.service >"$WORK/verify.out" 2>&1 ||
    fail "systemd-analyze verify: $(cat "$WORK/verify.out")"
fi

note "a C program builds against the installed header and library"
printf '#include <kolo.h>\n#include <stdio.h>\nint main(void) { printf("%%s %%zu\\n", kolo_dtype_name(KOLO_FLOAT32), kolo_dtype_size(KOLO_FLOAT32)); return 0; }\n' >"$WORK/use.c"
cc -o "$WORK/use" "$WORK/use.c" -lkolo 2>"$WORK/cc.err" || fail "cc against /usr/include/kolo.h failed: $(cat "$WORK/cc.err")"
[ "$("$WORK/use")" = "float32 4" ] || fail "the program printed $("$WORK/use")"

note "a 2-rank job from installed paths only"
mkdir -p "$WORK/home"
cat >"$WORK/job.py" <<'PY'
import numpy as np
import kolo
kolo.init()
got = kolo.allreduce(np.full(3, kolo.rank() + 1.0, dtype=np.float32), op=kolo.Sum)
lib = [l.split()[-1] for l in open("/proc/self/maps") if "libkolo" in l][0]
print("result", " ".join("%g" % v for v in got), kolo.__file__, lib, flush=True)
kolo.shutdown()
PY
(cd "$WORK" && env -i PATH=/usr/bin:/bin HOME="$WORK/home" /usr/bin/kolo run -np 2 -- \
  /usr/bin/python3 "$WORK/job.py") >"$WORK/job.out" 2>&1 || fail "the job failed: $(cat "$WORK/job.out")"
[ "$(grep -c 'result 3 3 3 /usr/lib/python3/dist-packages/kolo/__init__.py /usr/lib/libkolo.so' "$WORK/job.out")" -eq 2 ] ||
  fail "not from installed paths: $(cat "$WORK/job.out")"

note "the units' commands as their users (coordinator: kolo, agent: root), with the packaged config files"
runuser -u kolo -- /usr/bin/kolo coordinator --config /etc/kolo/coordinator.conf \
  --listen tcp://127.0.0.1:0 --http 127.0.0.1:0 >"$WORK/svc-coord.out" 2>"$WORK/svc-coord.err" &
PIDS+=($!)
wait_for 10 grep -q "ready" "$WORK/svc-coord.out" || fail "the coordinator did not start: $(cat "$WORK/svc-coord.err")"
RPC=$(sed -n 's/.*rpc=\([^ ]*\).*/\1/p' "$WORK/svc-coord.out")
HTTP=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$WORK/svc-coord.out")
[ -f /var/lib/kolo/kolo.db ] || fail "no database in /var/lib/kolo"
grep -q "^User=" /lib/systemd/system/kolo-agent.service && fail "the agent's unit names a user: it must run as root to switch to kolo-job"
/usr/bin/kolo agent --config /etc/kolo/agent.conf --coordinator "$RPC" \
  --slots 2 >"$WORK/svc-agent.out" 2>"$WORK/svc-agent.err" &
SVC_AGENT=$!
PIDS+=("$SVC_AGENT")
wait_hosts 1
/usr/bin/kolo run -np 2 --coordinator "$RPC" --token-file /etc/kolo/token -- sh -c '
  id -un
  if cat /etc/kolo/token >/dev/null 2>&1; then echo token=read; else echo token=denied; fi
  if ls /var/lib/kolo >/dev/null 2>&1; then echo state=read; else echo state=denied; fi' \
  >"$WORK/svc-job.out" 2>&1 || fail "the job failed: $(cat "$WORK/svc-job.out")"
[ "$(grep -c '<stdout>:kolo-job$' "$WORK/svc-job.out")" -eq 2 ] || fail "the job did not run as kolo-job: $(cat "$WORK/svc-job.out")"
[ "$(grep -c '<stdout>:token=denied$' "$WORK/svc-job.out")" -eq 2 ] || fail "the job read /etc/kolo/token: $(cat "$WORK/svc-job.out")"
[ "$(grep -c '<stdout>:state=denied$' "$WORK/svc-job.out")" -eq 2 ] || fail "the job read /var/lib/kolo: $(cat "$WORK/svc-job.out")"
kill -TERM "$SVC_AGENT"
wait_for 10 sh -c "! kill -0 $SVC_AGENT 2>/dev/null" || fail "the agent did not stop on SIGTERM"

note "purge"
purge || fail "dpkg --purge failed: $(cat "$WORK/purge.out")"
for f in /usr/bin/kolo /usr/lib/libkolo.so.0 /usr/lib/python3/dist-packages/kolo /etc/kolo /var/lib/kolo \
         /lib/systemd/system/kolo-agent.service; do
  [ ! -e "$f" ] || fail "$f is left after purge"
done
getent passwd kolo >/dev/null && fail "the kolo user is left after purge"
getent passwd kolo-job >/dev/null && fail "the kolo-job user is left after purge"
echo PASS
