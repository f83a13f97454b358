#!/usr/bin/env bash
# A full disk under the coordinator's database (issue 15, F8): the database
# on a small tmpfs, filled to the last byte while a job prints lines and
# reports epochs. The coordinator keeps serving, says it is degraded
# (/healthz 503 with the reason, kolo_store_degraded 1), refuses what it
# cannot store (a new job: 507) instead of acknowledging it, and recovers
# by itself once space returns; afterwards every output line and every
# epoch report is there: nothing acknowledged was lost.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "SKIP: mounting a tmpfs needs root"; exit 77; }
use_python
mkdir "$WORK/db"
mount -t tmpfs -o size=16m tmpfs "$WORK/db"
trap 'rc=$?; umount -l "$WORK/db" 2>/dev/null; set +e; (exit $rc); cleanup' EXIT

make_token
start_coordinator db/coord --token-file "$WORK/token"
start_agent a 2 --token-file "$WORK/token"
wait_hosts 1
EPOCHS=40
"$KOLO" run -np 2 --coordinator "$RPC" --token-file "$WORK/token" -- /usr/bin/python3 \
  "$ROOT/tests/integration/data/epochs_and_lines.py" $EPOCHS 0.25 >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 30 grep -q "line 4 of" "$WORK/run.out" || fail "the job did not start: $(cat "$WORK/run.err")"

note "the disk fills up"
dd if=/dev/zero of="$WORK/db/filler" bs=64k 2>/dev/null || true
degraded() { curl -s "$HTTP/metrics" | grep -x 'kolo_store_degraded 1' >/dev/null; }
wait_for 20 degraded || fail "not degraded on a full disk: $(curl -s "$HTTP/metrics" | grep degraded)"
code=$(curl -s -o "$WORK/hz.json" -w '%{http_code}' "$HTTP/healthz")
[ "$code" = 503 ] && has '"degraded"' <"$WORK/hz.json" || fail "healthz on a full disk: $code $(cat "$WORK/hz.json")"
code=$(curl -s -o "$WORK/sub.json" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
  -d '{"argv":["true"],"np":1}' "$HTTP/api/v1/jobs")
[ "$code" = 507 ] || fail "a job accepted on a full disk: $code $(cat "$WORK/sub.json")"
sleep 3 # lines and epochs keep coming meanwhile

note "space returns"
rm -f "$WORK/db/filler"
healthy() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$HTTP/healthz")" = 200 ]; }
wait_for 20 healthy || fail "did not recover: $(curl -s "$HTTP/healthz")"
curl -s "$HTTP/metrics" | grep -x 'kolo_store_degraded 0' >/dev/null || fail "still degraded"
wait_for 60 sh -c "! kill -0 $RUN_PID 2>/dev/null" || fail "the job did not finish"
wait "$RUN_PID" || fail "the job failed: $(tail -5 "$WORK/run.err")"

note "nothing acknowledged was lost"
lines_stored() {
  curl -sf -H "Authorization: Bearer $TOKEN" "$HTTP/api/v1/jobs/1/output?limit=10000" | grep -o 'line [0-9]* of rank [01]' | sort -u | wc -l
}
wait_for 30 sh -c "[ \$(curl -sf -H 'Authorization: Bearer $TOKEN' '$HTTP/api/v1/jobs/1/output?limit=10000' | grep -o 'line [0-9]* of rank [01]' | sort -u | wc -l) -eq $((2 * EPOCHS)) ]" ||
  fail "output lines lost: $(lines_stored) of $((2 * EPOCHS)) stored"
epochs=$(curl -sf "$HTTP/api/v1/jobs/1/epochs" | grep -o '"epoch":[0-9]*' | sort -u | wc -l)
[ "$epochs" -eq "$EPOCHS" ] || fail "epoch reports lost: $epochs of $EPOCHS: $(curl -sf "$HTTP/api/v1/jobs/1/epochs" | head -c 600)"
echo PASS
