#!/usr/bin/env bash
# Durable elastic-state snapshots across coordinator crashes. A real job
# (kolo run -np 2, kolo-test-snap-writer) commits 4-16 MiB snapshots back
# to back from rank 0 while rank 1 keeps reading the latest; the
# coordinator is killed with SIGKILL five times in the middle of that and
# restarted on the same database. Then: no acknowledged snapshot is lost
# (each one is read back through the coordinator by the writer and
# checked in the database file by kolo-test-store-check), the database
# passes PRAGMA integrity_check, and retention is honoured (the job asks
# for 3 at the end; the coordinator's default here is 4).
. "$(dirname "$0")/lib.sh"
WRITER="${KOLO_SNAP_WRITER:?set KOLO_SNAP_WRITER to kolo-test-snap-writer}"
CHECK="${KOLO_STORE_CHECK:?set KOLO_STORE_CHECK to kolo-test-store-check}"
KILLS=${KILLS:-5}

start_coordinator coord --snapshot-keep 4
port=${RPC##*:}
restart_coordinator() {
  kill -9 "$COORD_PID"
  wait "$COORD_PID" 2>/dev/null || true
  cat "$WORK/coord.err" >>"$WORK/coord-all.log"
  rm -f "$WORK/coord.out"
  LISTEN="tcp://127.0.0.1:$port" start_coordinator coord --snapshot-keep 4
}
start_agent a 2
wait_hosts 1

acked() { local c; c=$(grep -c '^acked' "$WORK/acks.log" 2>/dev/null); echo "${c:-0}"; }
acks_at_least() { [ "$(acked)" -ge "$1" ]; }

# Phase 1 keeps every snapshot (the job's own retention), so that every
# acknowledged one can be checked afterwards.
# (the largest chunk: a chunk and its meta fit in one 1 MiB request, issue 28)
export KOLO_SNAPSHOT_KEEP=100000 KOLO_SNAPSHOT_CHUNK_BYTES=917504 KOLO_LOG_LEVEL=info
"$KOLO" run -np 2 --coordinator "$RPC" -- \
  "$WRITER" "$WORK/acks.log" "$WORK/stop" "$WORK/go" >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
unset KOLO_SNAPSHOT_KEEP KOLO_SNAPSHOT_CHUNK_BYTES KOLO_LOG_LEVEL

# uploading: the coordinator holds a partial upload of the job right now.
uploading() { curl -sf "$HTTP/api/v1/jobs/1/snapshots" 2>/dev/null | has '"chunks_received"'; }

wait_for 60 acks_at_least 2 || fail "no snapshot acknowledged"
for k in $(seq 1 "$KILLS"); do
  n=$(acked)
  wait_for 60 acks_at_least $((n + 1)) || fail "no snapshot acknowledged before kill $k"
  if [ $((k % 2)) -eq 1 ]; then
    # in the middle of an upload
    for _ in $(seq 1 300); do uploading && break; sleep 0.01; done
    when="during an upload"
  else
    # 50-650 ms after an acknowledgement: the next commit is being made,
    # hashed, uploaded or written
    sleep "0.$(printf '%03d' $((RANDOM % 600 + 50)))"
    when="at a random moment"
  fi
  note "kill -9 the coordinator ($k/$KILLS) $when, $(acked) snapshot(s) acknowledged"
  restart_coordinator
  wait_hosts 1
done
n=$(acked)
wait_for 60 acks_at_least $((n + 2)) || fail "no snapshot acknowledged after the last restart"
touch "$WORK/stop"
wait_for 120 grep -q '^phase1' "$WORK/acks.log" || fail "the writer did not finish phase 1: $(cat "$WORK/run.out")"
grep -q "read back intact" "$WORK/run.out" || fail "no read-back report: $(cat "$WORK/run.out")"
total=$(acked)
verified=$(sed -n 's/^phase1 //p' "$WORK/acks.log")
[ "$verified" -eq "$total" ] || fail "$total snapshots acknowledged, $verified read back intact"

note "check the database while the coordinator runs"
"$CHECK" "$WORK/coord.db" --acks "$WORK/acks.log" >"$WORK/check1.log" 2>&1 || fail "$(cat "$WORK/check1.log")"
cat "$WORK/check1.log"

touch "$WORK/go"
set +e
wait "$RUN_PID"
rc=$?
set -e
[ $rc -eq 0 ] || fail "the job failed ($rc): $(tail -20 "$WORK/run.out") $(tail -20 "$WORK/run.err")"
grep -q "all intact" "$WORK/run.out" || fail "rank 1's reads: $(grep 'rank 1' "$WORK/run.out")"
restarts=$(cat "$WORK/run.out" "$WORK/run.err" | grep -c "sending it again" || true)
note "$total snapshots acknowledged across $KILLS kills; $restarts upload(s) restarted from chunk 0"

note "retention: the job asked for 3"
list=$(curl -sf "$HTTP/api/v1/jobs/1/snapshots")
count=$(echo "$list" | grep -o '"id":[0-9]*' | wc -l)
[ "$count" -eq 3 ] || fail "the job holds $count snapshots, not 3: $list"
newest=$(grep '^acked' "$WORK/acks.log" | tail -n 3 | awk '{print $2}' | sort -n | tr '\n' ' ')
listed=$(echo "$list" | grep -o '"id":[0-9]*' | cut -d: -f2 | sort -n | tr '\n' ' ')
[ "$newest" = "$listed" ] || fail "the job holds snapshots $listed, not the newest: $newest"
curl -sf "$HTTP/metrics" | has '^kolo_snapshots_committed_total [1-9]' || fail "no commits in /metrics"

note "integrity after a clean stop"
kill "$COORD_PID"
wait "$COORD_PID" 2>/dev/null || true
grep '^acked' "$WORK/acks.log" | tail -n 3 >"$WORK/acks-kept.log"
"$CHECK" "$WORK/coord.db" --acks "$WORK/acks-kept.log" --job 1 --count 3 >"$WORK/check2.log" 2>&1 ||
  fail "$(cat "$WORK/check2.log")"
cat "$WORK/check2.log"
echo PASS
