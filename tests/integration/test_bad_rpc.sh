#!/usr/bin/env bash
# Garbage on the RPC port (raw TCP, not even the SP handshake) and on the
# HTTP port: the coordinator keeps serving and does not grow.
. "$(dirname "$0")/lib.sh"

start_coordinator coord
port=${RPC##*:}
hport=${HTTP##*:}
rss() { awk '/VmRSS/ {print $2}' "/proc/$COORD_PID/status"; }
curl -sf "$HTTP/healthz" >/dev/null
before=$(rss)
for i in $(seq 1 200); do
  head -c $((RANDOM % 4096 + 1)) /dev/urandom >"/dev/tcp/127.0.0.1/$port" 2>/dev/null || true
  head -c $((RANDOM % 2048 + 1)) /dev/urandom >"/dev/tcp/127.0.0.1/$hport" 2>/dev/null || true
done
sleep 0.5
curl -sf "$HTTP/healthz" >/dev/null || fail "HTTP stopped answering"
"$KOLO" status --coordinator "$RPC" >/dev/null || fail "RPC stopped answering"
after=$(rss)
note "RSS before $before kB, after $after kB"
[ $after -lt $((before + 20000)) ] || fail "RSS grew from $before to $after kB"
kill -0 "$COORD_PID" || fail "coordinator died"
echo PASS
