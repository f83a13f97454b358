#!/usr/bin/env bash
# SIGTERM to a coordinator that holds parked calls of every kind must end
# it cleanly (status 0) within STOP_BOUND seconds, with no sanitizer report
# (issue 28: an elastic job waiting for capacity made the stop answer its
# parked place requests after the RPC server was closed, exit 139; and
# once the stop hung 50 minutes in nng_http_server_stop).
#
# Parked when the signal comes: an agent's heartbeat long poll; an
# elastic job's place request waiting for capacity (min-np 2, its host
# excluded after rank 1 failed); a rendezvous waiting for a rank that
# never comes; negotiation long polls of an idle job; `kolo logs -f`'s
# StreamOutput; and HTTP connections: idle keep-alive, half a request
# line, a body announced but not sent, a response nobody reads.
#
# ROUNDS rounds (default 4), each with a fresh coordinator on the same
# database and port: the workers and the agent come back and park again,
# the log follower and HTTP clients are started anew. KOLO_COORD runs the
# coordinator from another binary, e.g. an AddressSanitizer build
# (scripts/faults.sh does), while workers keep the normal libkolo.
. "$(dirname "$0")/lib.sh"
use_python

COORD_BIN="${KOLO_COORD:-$KOLO}"
ROUNDS="${ROUNDS:-4}"
STOP_BOUND="${STOP_BOUND:-10}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}:abort_on_error=0"

# The coordinator, as lib.sh's start_coordinator but from $COORD_BIN.
start_coord() {
  "$COORD_BIN" coordinator --listen "tcp://127.0.0.1:${PORT:-0}" --http "127.0.0.1:${HPORT:-0}" \
      --db "$WORK/coord.db" --lease 3s --heartbeat 300ms --stop-grace 2s \
      >"$WORK/coord.out" 2>>"$WORK/coord.err" &
  COORD_PID=$!
  PIDS+=("$COORD_PID")
  wait_for 20 grep -q "ready" "$WORK/coord.out" || fail "the coordinator did not start"
  RPC=$(sed -n 's/.*rpc=\([^ ]*\).*/\1/p' "$WORK/coord.out")
  HTTP=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$WORK/coord.out")
  PORT=${RPC##*:}
  HPORT=${HTTP##*:}
}

coord_gone() { ! kill -0 "$COORD_PID" 2>/dev/null || [ "$(cut -d' ' -f3 /proc/$COORD_PID/stat 2>/dev/null)" = Z ]; }
job_json() { curl -sf "$HTTP/api/v1/jobs/$1"; }
waiting_for_capacity() { job_json "$ELASTIC" | has '"waiting":true'; }
assigns_parked() {
  # the survivor asked for its place at least once since this coordinator started
  [ "$(metric 'kolo_rpc_requests_total{method="WorkerService.Rendezvous"}')" -ge "${1:-1}" ]
}

# HTTP clients that hold a connection open in the ways a stop must not wait for.
http_clients() {
  /usr/bin/python3 - "$HPORT" >"$WORK/http.out" 2>&1 <<'EOF' &
import socket, sys, time
port = int(sys.argv[1])
def conn():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return s
held = []
s = conn(); s.sendall(b"GET /api/v1/hosts HTTP/1.1\r\nHost: x\r\n\r\n"); held.append(s)  # keep-alive, idle
s = conn(); s.sendall(b"GET /api/v1/jo"); held.append(s)                                  # half a request line
s = conn(); s.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n{\"np\"")
held.append(s)                                                                           # a body never sent
for _ in range(8):  # responses nobody reads: the server's writes fill the socket buffers
    s = conn()
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
    held.append(s)
print("held", len(held), flush=True)
time.sleep(600)
EOF
  HTTP_PID=$!
  PIDS+=("$HTTP_PID")
  wait_for 10 grep -q held "$WORK/http.out" || fail "the HTTP clients did not connect"
}

start_coord
start_agent a 6
wait_hosts 1

note "an elastic job waiting for capacity: rank 1 fails, its host is excluded, rank 0 asks for a place"
"$KOLO" run --detach -np 2 --min-np 2 --max-np 2 --elastic-timeout 600 --coordinator "$RPC" -- \
  sh -c "if [ \"\$KOLO_RANK\" = 1 ]; then exit 3; fi; sleep 2; exec /usr/bin/python3 -c 'import kolo; kolo.init()' $MARK" \
  >"$WORK/elastic.id" 2>"$WORK/elastic.err" || fail "elastic submit: $(cat "$WORK/elastic.err")"
ELASTIC=$(grep -o '[0-9]\+' "$WORK/elastic.id" | head -n 1)
wait_for 20 waiting_for_capacity || fail "the elastic job does not wait for capacity: $(job_json "$ELASTIC")"
wait_for 20 assigns_parked || fail "no place request came"

note "a rendezvous that waits for rank 1 (which sleeps), and an idle job's negotiation long polls"
"$KOLO" run --detach -np 2 --coordinator "$RPC" -- \
  sh -c "if [ \"\$KOLO_RANK\" = 1 ]; then exec sleep $SLEEP; fi; KOLO_TIMEOUT_MS=600000 exec /usr/bin/python3 -c 'import kolo; kolo.init()' $MARK" \
  >"$WORK/rdv.id" 2>&1 || fail "rendezvous submit"
RDV=$(grep -o '[0-9]\+' "$WORK/rdv.id" | head -n 1)
# one step, then both ranks sit idle in a 1000 s pause: their negotiation
# threads long-poll the coordinator
"$KOLO" run --detach -np 2 --coordinator "$RPC" -- /usr/bin/python3 \
  "$(dirname "$0")/data/allreduce_steps.py" 2 1000 >"$WORK/idle.id" 2>&1 || fail "idle submit"
IDLE=$(grep -o '[0-9]\+' "$WORK/idle.id" | head -n 1)
stepped_once() { "$KOLO" logs --coordinator "$RPC" "$IDLE" 2>/dev/null | has 'step 0'; }
wait_for 30 stepped_once || fail "the idle job did not start"

total=0; worst=0
for round in $(seq 1 "$ROUNDS"); do
  if [ "$round" -gt 1 ]; then
    start_coord
    wait_for 20 hosts_at_least 1 || fail "round $round: the agent did not come back"
    # the survivor asks again within its place request's wait (at most 10 s)
    wait_for 20 assigns_parked || fail "round $round: no place request came"
  fi
  "$KOLO" logs -f --coordinator "$RPC" "$IDLE" >"$WORK/follow.$round" 2>&1 &
  FOLLOW_PID=$!
  PIDS+=("$FOLLOW_PID")
  http_clients
  sleep 1   # every call parked again
  t0=$(now_ms)
  kill -TERM "$COORD_PID"
  rc=0
  stopped=0
  for _ in $(seq 1 $((STOP_BOUND * 20))); do
    if coord_gone; then stopped=1; break; fi
    sleep 0.05
  done
  if [ $stopped = 0 ]; then
    command -v gdb >/dev/null && timeout 20 gdb -p "$COORD_PID" -batch -ex "thread apply all bt 20" 2>/dev/null | grep -E '^(Thread|#)' | head -n 150
    fail "round $round: the coordinator did not exit within $STOP_BOUND s of SIGTERM"
  fi
  wait "$COORD_PID" || rc=$?
  ms=$(( $(now_ms) - t0 ))
  total=$((total + ms)); [ $ms -gt $worst ] && worst=$ms
  if grep -q -E "AddressSanitizer|LeakSanitizer|runtime error|ThreadSanitizer" "$WORK/coord.err"; then
    grep -A 30 -E "AddressSanitizer|runtime error|ThreadSanitizer" "$WORK/coord.err" | head -n 60
    fail "round $round: a sanitizer report (exit $rc)"
  fi
  [ $rc -eq 0 ] || fail "round $round: the coordinator exited $rc after SIGTERM (139: SIGSEGV)"
  grep -q "stopped in" "$WORK/coord.err" || fail "round $round: no 'stopped in' line"
  note "round $round: stopped in $ms ms (exit 0)"
  kill "$HTTP_PID" "$FOLLOW_PID" 2>/dev/null || true
  wait "$HTTP_PID" "$FOLLOW_PID" 2>/dev/null || true
  rm -f "$WORK/coord.out"
done
echo "coordinator stop under parked calls: $ROUNDS rounds, worst ${worst} ms, mean $((total / ROUNDS)) ms (bound ${STOP_BOUND} s)"

# A stop that cannot finish in time (here: the discovery thread runs a
# host discovery script that sleeps 8 s, and the stop joins it) is cut
# short at --stop-timeout, and at once by a second signal: exit 1.
for mode in timeout again; do
  "$COORD_BIN" coordinator --listen tcp://127.0.0.1:0 --http "" --db "$WORK/slow-$mode.db" \
      --stop-timeout 1s >"$WORK/slow.out" 2>"$WORK/slow-$mode.err" &
  SLOW_PID=$!
  PIDS+=("$SLOW_PID")
  wait_for 20 grep -q ready "$WORK/slow.out" || fail "$mode: the coordinator did not start"
  SRPC=$(sed -n 's/.*rpc=\([^ ]*\).*/\1/p' "$WORK/slow.out")
  "$KOLO" run --detach -np 1 --min-np 1 --host-discovery-script "sleep 8.$MARK" \
      --coordinator "$SRPC" -- true >/dev/null 2>&1 || fail "$mode: submit"
  script_runs() { pgrep -f "^sleep 8.$MARK\$" >/dev/null; }
  wait_for 10 script_runs || fail "$mode: the discovery script did not run"
  t0=$(now_ms)
  kill -TERM "$SLOW_PID"
  if [ $mode = again ]; then sleep 0.2; kill -TERM "$SLOW_PID"; fi
  rc=0
  wait "$SLOW_PID" || rc=$?
  ms=$(( $(now_ms) - t0 ))
  pkill -f "^sleep 8.$MARK\$" || true
  [ $rc -eq 1 ] || fail "$mode: exit $rc, not 1"
  if [ $mode = timeout ]; then
    [ $ms -lt 4000 ] || fail "timeout: took $ms ms with --stop-timeout 1s"
    grep -q "did not finish within 1000 ms" "$WORK/slow-$mode.err" || fail "timeout: not logged"
  else
    [ $ms -lt 1000 ] || fail "again: took $ms ms after the second signal"
    grep -q "again: exiting" "$WORK/slow-$mode.err" || fail "again: not logged"
  fi
  note "a stop held by an 8 s discovery script: $mode -> exit 1 after $ms ms"
done
echo PASS
