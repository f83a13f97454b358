#!/usr/bin/env bash
# Held-open connections cannot take the coordinator down (issue 15, F4 F5):
# while a job trains, 1,100 silent connections to the RPC port, 1,100 to
# the RPC port that greet and then say nothing, and 1,100 to the HTTP
# port; /healthz, kolo status and a new agent keep working, the job
# finishes with every allreduce right, the coordinator closes the silent
# RPC connections (kolo_rpc_connections_closed_total), shuts down the
# HTTP connections beyond 64 from one address
# (kolo_http_connections_closed_total) and its memory stays bounded.
. "$(dirname "$0")/lib.sh"
use_python
DATA="$ROOT/tests/integration/data"

token_cluster 2
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$COORD_PID/status"; }
rss0=$(rss_kb)

start_steps 2 400 0.05 --token-file "$WORK/token"

RPORT=${RPC##*:}
HPORT=${HTTP##*:}
HPORT=${HPORT%/}
note "flooding: 1100 silent + 1100 greeting RPC connections, 1100 HTTP connections"
for spec in "$RPORT silent" "$RPORT --greet" "$HPORT silent"; do
  set -- $spec
  /usr/bin/python3 "$DATA/flood.py" 127.0.0.1 "$1" 1100 25 $2 >"$WORK/flood-$1-${2#--}.out" 2>&1 &
  PIDS+=($!)
done
held_all() { [ "$(cat "$WORK"/flood-*.out 2>/dev/null | grep -c '^held 1100')" -eq 3 ]; }
wait_for 30 held_all || fail "flood did not hold: $(cat "$WORK"/flood-*.out)"

note "the coordinator keeps serving"
for i in 1 2 3; do
  curl -sf -m 5 "$HTTP/healthz" | has '"ok"' || fail "healthz failed under the flood"
  "$KOLO" status --coordinator "$RPC" --token-file "$WORK/token" >"$WORK/st.out" 2>&1 ||
    fail "kolo status failed under the flood: $(cat "$WORK/st.out")"
  sleep 1
done
start_agent b 1 --token-file "$WORK/token"
wait_hosts 2
wait_for 60 sh -c "! kill -0 $RUN_PID 2>/dev/null" || fail "the job did not finish under the flood"
wait "$RUN_PID" || fail "the job failed: $(tail -5 "$WORK/run.out") $(cat "$WORK/run.err")"
grep -q "done 400" "$WORK/run.out" || fail "the job did not finish its steps: $(tail -3 "$WORK/run.out")"
closed() { curl -sf "$HTTP/metrics" | has 'kolo_rpc_connections_closed_total{reason="[a-z_]*"} [1-9]'; }
wait_for 20 closed || fail "silent RPC connections were not closed: $(curl -sf "$HTTP/metrics" | grep connections_closed)"
# one address may hold 64 HTTP connections (coord_http_guard.c): the rest
# of the 1100 are shut down within seconds
http_capped() {
  curl -sf "$HTTP/metrics" | awk '$1 == "kolo_http_connections_closed_total{reason=\"per_source\"}" { exit !($2 >= 1000) }'
}
wait_for 10 http_capped || fail "HTTP connections over the per-address cap stayed: $(curl -sf "$HTTP/metrics" | grep kolo_http_conn)"
rss1=$(rss_kb)
note "coordinator RSS ${rss0} kB before, ${rss1} kB under the flood"
[ "$rss1" -lt $(( rss0 + 200000 )) ] || fail "coordinator memory grew by $(( rss1 - rss0 )) kB"
echo PASS
