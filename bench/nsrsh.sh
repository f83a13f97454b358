#!/bin/sh
# nsrsh.sh - an ssh stand-in for mpirun (--mca plm_rsh_agent) in the
# network-namespace benchmark of bench/run.sh. mpirun calls it as
#   nsrsh.sh [ssh-like options] HOST COMMAND...
# and it runs COMMAND (a shell command line, as ssh would) inside the
# namespace that owns HOST's address, in a fresh UTS namespace with its own
# hostname (Open MPI keys shared-memory segment names on the hostname).
# The address-to-namespace map comes from KOLO_BENCH_NSMAP, e.g.
#   "10.77.0.1=kbA123 10.77.0.2=kbB123".
while [ $# -gt 0 ]; do
    case "$1" in
    -*) shift ;;
    *) break ;;
    esac
done
host="$1"
shift
ns=""
for pair in $KOLO_BENCH_NSMAP; do
    if [ "${pair%%=*}" = "$host" ]; then
        ns="${pair#*=}"
    fi
done
if [ -z "$ns" ]; then
    echo "nsrsh.sh: no namespace for host '$host' (KOLO_BENCH_NSMAP='$KOLO_BENCH_NSMAP')" >&2
    exit 255
fi
exec ip netns exec "$ns" unshare --uts sh -c "hostname '$ns-host' && $*"
