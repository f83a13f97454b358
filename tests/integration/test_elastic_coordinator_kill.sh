#!/usr/bin/env bash
# kill -9 of the coordinator five times while an elastic job trains and
# commits a state of ~9 MB every 10 steps (rank 0 ships each commit to the
# coordinator, so several kills land in the middle of an upload):
#   - training finishes, in generation 1: no reset, no lost step;
#   - no acknowledged snapshot is lost: the newest three acknowledged ones
#     (retention 3) are stored, with the checksums the worker logged;
#   - PRAGMA integrity_check is ok.
# The kills' instants are drawn from KOLO_SEED (printed; it replays a run).
. "$(dirname "$0")/lib.sh"
seed_random
CHECK="${KOLO_STORE_CHECK:?set KOLO_STORE_CHECK to kolo-test-store-check}"
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "SKIP: no torch for /usr/bin/python3"; exit 77; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$ROOT/python"

start_coordinator coord
port=${RPC##*:}
start_agent a 2
start_agent b 2
wait_hosts 2

"$KOLO" run -np 4 --min-np 2 --max-np 4 --coordinator "$RPC" -- /usr/bin/python3 \
  "$ROOT/tests/integration/data/elastic_commit.py" 400 >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
acks() { grep -c '<stdout>:acked' "$WORK/run.out" 2>/dev/null || true; }
acks_at_least() { [ "$(acks)" -ge "$1" ]; }
wait_for 60 acks_at_least 1 || fail "no commit acknowledged: $(tail -5 "$WORK/run.err")"

for i in 1 2 3 4 5; do
  before=$(acks)
  sleep 0.$(( RANDOM % 6 + 2 ))
  kill -9 "$COORD_PID"
  note "kill $i at $(now_ms) ms, after $before acknowledged commit(s)"
  sleep 0.2
  mv "$WORK/coord.err" "$WORK/coord.$i.err"
  LISTEN="tcp://127.0.0.1:$port" start_coordinator coord
  wait_for 30 acks_at_least $((before + 1)) || fail "kill $i: no commit acknowledged since"
done

set +e
wait "$RUN_PID"
rc=$?
set -e
[ $rc -eq 0 ] || fail "the job failed ($rc): $(tail -20 "$WORK/run.err")"
[ "$(grep -c '<stdout>:FINAL 400' "$WORK/run.out")" -eq 4 ] || fail "not every rank finished"
job=$(curl -sf "$HTTP/api/v1/jobs/1") || fail "GET /api/v1/jobs/1 failed"
echo "$job" | has '"generation":1,' || fail "the job was reset: $job"
grep '<stdout>:acked' "$WORK/run.out" | sed 's/^.*<stdout>://' >"$WORK/acks.log"
note "$(wc -l <"$WORK/acks.log") commit(s) acknowledged across 5 coordinator kills"
kill "$COORD_PID"
wait "$COORD_PID" 2>/dev/null || true
tail -n 3 "$WORK/acks.log" >"$WORK/acks-kept.log"
"$CHECK" "$WORK/coord.db" --acks "$WORK/acks-kept.log" --job 1 --count 3 >"$WORK/check.log" 2>&1 ||
  fail "$(cat "$WORK/check.log")"
cat "$WORK/check.log"
echo PASS
