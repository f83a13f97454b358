#!/usr/bin/env bash
# A real Slurm on this one machine, for kolo's Slurm tests: munged,
# slurmctld and two slurmd (`slurmd -N n1`, `slurmd -N n2`, each on its own
# port), with every config, key, state and log file under DIR.
#
#   scripts/slurm-local.sh start DIR   # prints SLURM_CONF=DIR/slurm.conf
#   scripts/slurm-local.sh stop DIR    # stops them all
#
# Needs root (slurmd runs jobs as their users), Debian's slurmd,
# slurmctld, slurm-client and munge (scripts/install-deps.sh --test).
set -euo pipefail
cmd="${1:?start or stop}"
dir="${2:?a directory}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

stop() {
  for f in "$dir"/slurmd-n1.pid "$dir"/slurmd-n2.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  sleep 0.5
  for f in "$dir"/slurmd-n1.pid "$dir"/slurmd-n2.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  # whatever else runs from this folder's config (slurmctld's helpers, a
  # daemon that rewrote its pid file, steps that outlived their slurmd)
  pkill -9 -f -- "$dir/" 2>/dev/null || true
  for _ in $(seq 50); do pgrep -f -- "$dir/" >/dev/null || break; sleep 0.1; done
}
[ "$cmd" = stop ] && { stop; exit 0; }
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ctl_port=$(free_port); p1=$(free_port); p2=$(free_port)
while [ "$p2" = "$p1" ] || [ "$p1" = "$ctl_port" ] || [ "$p2" = "$ctl_port" ]; do p2=$(free_port); done
cpus=$(nproc)
host=$(hostname -s)
mkdir -p "$dir/state" "$dir/spool-n1" "$dir/spool-n2" "$dir/munge"
chmod 0700 "$dir/munge"

head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 0400 "$dir/munge/munge.key"
munged --force --key-file "$dir/munge/munge.key" --socket "$dir/munge/munge.socket" \
  --pid-file "$dir/munged.pid" --log-file "$dir/munged.log" --seed-file "$dir/munge/seed"

cat >"$dir/slurm.conf" <<CONF
ClusterName=kolotest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
LaunchParameters=use_interactive_step
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=5
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p1 CPUs=$cpus State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p2 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N n1
slurmd -f "$SLURM_CONF" -N n2
for _ in $(seq 100); do
  idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle' || true)
  [ "$idle" -ge 2 ] && { echo "SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.2
done
echo "slurm-local.sh: the two nodes did not come up:" >&2
sinfo -N >&2 || true
tail -n 5 "$dir"/slurmctld.log "$dir"/slurmd-n1.log >&2 || true
stop
exit 1
