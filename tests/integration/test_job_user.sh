#!/usr/bin/env bash
# Jobs run as --job-user (issue 28): the agent's files and the cluster
# token stay out of their reach.
#   1. an agent run as root with --job-user nobody: the ranks run as
#      nobody, with nobody's groups and no capability, cannot read a
#      root-only file beside them, and are still stopped (SIGTERM to their
#      process group) when the job is stopped;
#   2. an agent run as an ordinary user (daemon) that holds CAP_SETUID,
#      CAP_SETGID and CAP_KILL as ambient capabilities (what systemd's
#      AmbientCapabilities= gives): the ranks run as nobody and hold none
#      of those capabilities (a change between two non-root users would
#      keep them);
#   3. without the capabilities such an agent refuses to start.
# Root only (skipped otherwise); setpriv for 2 and 3.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root"
getent passwd nobody >/dev/null || skip "no user nobody"
chmod 0755 "$WORK" # the users below reach their own files here, not the others'
make_token
printf 'agent secret\n' >"$WORK/secret"
chmod 0600 "$WORK/secret"
JOB='echo "user=$(id -un) groups=$(id -G)"; grep -E "^Cap(Eff|Prm|Amb)" /proc/self/status | tr "\t\n" "  "; echo;
  if cat '"$WORK/secret"' >/dev/null 2>&1; then echo secret=read; else echo secret=denied; fi'

check_job() { # $1: what
  "$KOLO" run -np 2 --coordinator "$RPC" --token-file "$WORK/token" -- sh -c "$JOB" \
    >"$WORK/job.out" 2>"$WORK/job.err" || fail "$1: the job failed: $(cat "$WORK/job.out" "$WORK/job.err")"
  [ "$(grep -c "<stdout>:user=nobody groups=$(id -g nobody)\$" "$WORK/job.out")" = 2 ] ||
    fail "$1: the ranks did not run as nobody with its groups: $(cat "$WORK/job.out")"
  [ "$(grep -c "CapPrm: 0\{16\} CapEff: 0\{16\} CapAmb: 0\{16\}" "$WORK/job.out")" = 2 ] ||
    fail "$1: the ranks hold capabilities: $(grep Cap "$WORK/job.out")"
  [ "$(grep -c '<stdout>:secret=denied$' "$WORK/job.out")" = 2 ] ||
    fail "$1: a rank read a root-only file: $(cat "$WORK/job.out")"
}

note "1. an agent run as root, --job-user nobody"
start_coordinator coord --token-file "$WORK/token"
start_agent a 2 --token-file "$WORK/token" --job-user nobody
wait_hosts 1
grep -q "workers run as nobody" "$WORK/agent-a.log" || fail "the agent does not say who runs the workers"
check_job "root agent"
"$KOLO" run -np 2 --coordinator "$RPC" --token-file "$WORK/token" -- sleep "$SLEEP" \
  >"$WORK/sleep.out" 2>"$WORK/sleep.err" &
RUN=$!
PIDS+=("$RUN")
wait_for 10 marked_exactly 2 || fail "the sleeping job did not start"
for p in $(pgrep -f "^sleep $SLEEP\$"); do
  [ "$(stat -c %U /proc/$p)" = nobody ] || fail "sleep $p runs as $(stat -c %U /proc/$p)"
done
kill -INT "$RUN"
wait_for 15 marked_exactly 0 || fail "the job's ranks (as nobody) were not stopped"
kill -9 "$AGENT_PID" 2>/dev/null; wait "$AGENT_PID" 2>/dev/null || true
wait_for 10 hosts_exactly 0 || fail "agent a's host is still alive"

command -v setpriv >/dev/null || { echo "PASS (no setpriv: 2 and 3 skipped)"; exit 0; }
note "2. an agent run as daemon with CAP_SETUID, CAP_SETGID and CAP_KILL"
mkdir -m 0700 "$WORK/agent-d"
cp "$WORK/token" "$WORK/token-d"
chown daemon: "$WORK/agent-d" "$WORK/token-d"
caps=+setuid,+setgid,+kill
KOLO_AGENT="$KOLO"
KOLO=(setpriv --reuid=daemon --regid=daemon --init-groups --inh-caps=$caps --ambient-caps=$caps "$KOLO_AGENT")
"${KOLO[@]}" agent --coordinator "$RPC" --slots 2 --name d --state-dir "$WORK/agent-d" \
  --token-file "$WORK/token-d" --job-user nobody >"$WORK/agent-d.out" 2>"$WORK/agent-d.log" &
PIDS+=($!)
KOLO=$KOLO_AGENT
wait_for 10 grep -q "registered with" "$WORK/agent-d.log" || fail "the agent as daemon did not register: $(cat "$WORK/agent-d.log")"
check_job "capable agent"

note "3. the same agent without the capabilities refuses to start"
if setpriv --reuid=daemon --regid=daemon --init-groups "$KOLO" agent --coordinator "$RPC" \
   --state-dir "$WORK/agent-d" --token-file "$WORK/token-d" --job-user nobody \
   >"$WORK/agent-n.out" 2>"$WORK/agent-n.log"; then
  fail "an agent without CAP_SETUID started with --job-user"
fi
grep -q "CAP_SETUID" "$WORK/agent-n.log" || fail "no reason given: $(cat "$WORK/agent-n.log")"
echo PASS
