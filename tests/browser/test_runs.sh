#!/usr/bin/env bash
# kolo dashboard in a real browser: a short local run (kolo run with its
# embedded coordinator, 2 workers, 3 epochs of the digits job) ends, then
# `kolo dashboard` serves its kept database and test_runs.mjs checks the
# list of runs and the finished job's pages at 1280 and 390 px. The
# database must come out of it byte for byte as it went in.
#
# Skips (77) without chromium, node or playwright-core, unless CI is set.
. "$(cd "$(dirname "$0")" && pwd)/browser_lib.sh" runs torch sklearn
STATE="$WORK/state"
"$KOLO" run -np 2 --http 127.0.0.1:0 --state-dir "$STATE" -- \
    "$PY" "$HERE/train_job.py" --stop-file "$WORK/never" --max-epochs 3 --tag "$SLEEP" \
    >"$WORK/run.out" 2>"$WORK/run.err" || fail "kolo run: $(tail -n 5 "$WORK/run.err")"
# the link kolo run prints dies with it: it says how to see the run after
line=$(grep "this run's dashboard after it ends: kolo dashboard --state-dir $STATE run-" "$WORK/run.err") ||
  fail "kolo run did not say how to see the run afterwards: $(cat "$WORK/run.err")"
RUN=${line##* }
DB="$STATE/runs/$RUN.db"
[ -f "$DB" ] && [ ! -e "$DB-wal" ] || fail "no finished database $DB"
before=$(sha256sum <"$DB")

"$KOLO" dashboard --state-dir "$STATE" --http 127.0.0.1:0 "$RUN" >"$WORK/dash.out" 2>&1 &
DASH_PID=$!
PIDS+=("$DASH_PID")
wait_for 10 grep -q "the runs in" "$WORK/dash.out" || fail "kolo dashboard: $(cat "$WORK/dash.out")"
URL=$(sed -n 's/.* at \(http:[^ ]*\)\/runs\/?key=.*/\1/p' "$WORK/dash.out")
KEY=$(sed -n 's/.*\/runs\/?key=\([0-9a-f]*\).*/\1/p' "$WORK/dash.out")
grep -q "run $RUN at $URL/runs/$RUN/?key=$KEY" "$WORK/dash.out" || fail "no link to the run: $(cat "$WORK/dash.out")"
note "kolo dashboard at $URL"

# nothing can change: a state-changing route is refused
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$URL/runs/$RUN/api/v1/jobs/1/stop")
[ "$code" = 403 ] || fail "POST stop answered $code, want 403"

rc=0
node "$HERE/test_runs.mjs" "$URL" "$RUN" "$KEY" "$ARTIFACTS" || rc=$?
[ $rc -eq 0 ] || fail "the browser checks failed (screenshots in $ARTIFACTS)"

kill "$DASH_PID"
wait "$DASH_PID" || fail "kolo dashboard exited $? on SIGTERM"
[ "$(sha256sum <"$DB")" = "$before" ] || fail "kolo dashboard changed $DB"
[ ! -e "$DB-wal" ] && [ ! -e "$DB-shm" ] || fail "kolo dashboard made -wal/-shm files"
note "the database is as it was; screenshots in $ARTIFACTS"
