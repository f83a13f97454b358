#!/usr/bin/env bash
# kolo dashboard without a browser: two short local runs end, then
# `kolo dashboard` serves their kept databases. Its REST answers: the runs
# newest first, each run's jobs and output (with the printed key only),
# 403 to anything that changes state, 404 to a name that is not a run's; a
# database of a newer schema is listed with the reason it cannot be shown;
# the databases come out byte for byte as they went in, with no -wal or
# -shm file made. The browser checks are in tests/browser/test_runs.sh.
. "$(dirname "$0")/lib.sh"
STATE="$WORK/state"
for word in first second; do
  "$KOLO" run -np 1 --http 127.0.0.1:0 --state-dir "$STATE" -- sh -c "echo $word" \
      >"$WORK/run-$word.out" 2>"$WORK/run-$word.err" || fail "kolo run: $(cat "$WORK/run-$word.err")"
  grep -q "^\[kolo\] this run's dashboard after it ends: kolo dashboard --state-dir $STATE run-" \
      "$WORK/run-$word.err" || fail "kolo run did not say how to see the run afterwards"
done
FIRST=$(sed -n 's/.*after it ends: .* \(run-[0-9]*-[0-9]*\)$/\1/p' "$WORK/run-first.err")
SECOND=$(sed -n 's/.*after it ends: .* \(run-[0-9]*-[0-9]*\)$/\1/p' "$WORK/run-second.err")
# a database of a kolo from the future (schema version 999)
FUTURE=run-9999999999999-1
cp "$STATE/runs/$FIRST.db" "$STATE/runs/$FUTURE.db"
/usr/bin/python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute("PRAGMA user_version = 999"); c.commit(); c.close()' \
    "$STATE/runs/$FUTURE.db"
sums() { (cd "$STATE/runs" && sha256sum ./*.db && ls -A); }
before=$(sums)

"$KOLO" dashboard --state-dir "$STATE" --http 127.0.0.1:0 >"$WORK/dash.out" 2>&1 &
DASH_PID=$!
PIDS+=("$DASH_PID")
wait_for 10 grep -q "the runs in" "$WORK/dash.out" || fail "kolo dashboard: $(cat "$WORK/dash.out")"
URL=$(sed -n 's/.* at \(http:[^ ]*\)\/runs\/?key=.*/\1/p' "$WORK/dash.out")
KEY=$(sed -n 's/.*\/runs\/?key=\([0-9a-f]*\).*/\1/p' "$WORK/dash.out")

code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
runs=$(curl -sf "$URL/api/v1/runs") || fail "GET /api/v1/runs"
/usr/bin/python3 -c '
import json, sys
runs = [r["name"] for r in json.loads(sys.argv[1])["runs"]]
assert runs == sys.argv[2:], (runs, sys.argv[2:])
' "$runs" "$FUTURE" "$SECOND" "$FIRST" || fail "the runs, newest first: $runs"
curl -sf "$URL/runs/$SECOND/api/v1/jobs" | has '"name":"sh","state":"succeeded"' ||
  fail "the second run's job: $(curl -s "$URL/runs/$SECOND/api/v1/jobs")"
[ "$(code "$URL/runs/$SECOND/api/v1/jobs/1/output")" = 401 ] || fail "output without the key"
curl -sf "$URL/runs/$SECOND/api/v1/jobs/1/output?key=$KEY" | has '"text":"second"' ||
  fail "output with the key"
curl -sf "$URL/runs/$FIRST/api/v1/jobs/1/output?key=$KEY" | has '"text":"first"' ||
  fail "the first run's output"
curl -sf "$URL/runs/$FIRST/metrics" | has '^kolo_jobs{state="succeeded"} 1' || fail "a run's /metrics"
[ "$(code -X POST "$URL/runs/$FIRST/api/v1/jobs/1/stop")" = 403 ] || fail "a POST is not refused"
[ "$(code "$URL/runs/run-1-../api/v1/jobs")" = 404 ] || fail "a name that is not a run's"
curl -s "$URL/runs/$FUTURE/api/v1/jobs" | has "newer than this kolo" ||
  fail "the newer database: $(curl -s "$URL/runs/$FUTURE/api/v1/jobs")"
[ "$(code "$URL/")" = 302 ] && [ "$(code "$URL/runs/")" = 200 ] && [ "$(code "$URL/runs/$FIRST/")" = 200 ] ||
  fail "the pages"

kill "$DASH_PID"
wait "$DASH_PID" || fail "kolo dashboard exited $? on SIGTERM"
[ "$(sums)" = "$before" ] || fail "kolo dashboard changed the run databases: $(sums)"
note "kolo dashboard served 3 runs read-only"
