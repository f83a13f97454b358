#!/usr/bin/env bash
# kolo run without a token (issue 15, F1): the embedded coordinator gets a
# secret of the run, in a 0600 file next to its database, so only the
# launching user reaches it: another local user (nobody) can neither read
# the secret nor submit a job or read the job list over the RPC; the user
# can with --token-file while the run lasts; the file goes with the run.
# A coordinator started by hand on loopback without a token serves only
# the user who started it (and root): nobody is refused there too.
. "$(dirname "$0")/lib.sh"
export XDG_STATE_HOME="$WORK/state"
chmod 755 "$WORK"

"$KOLO" run -np 1 -- sleep "$SLEEP" >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 10 marked_exactly 1 || fail "the worker did not start: $(cat "$WORK/run.err")"
URL=$(sed -n 's/.*embedded coordinator \(tcp:[^,]*\),.*/\1/p' "$WORK/run.err")
TOKEN_FILE=$(sed -n 's/.*, token \([^)]*\)).*/\1/p' "$WORK/run.err")
[ -n "$URL" ] && [ -n "$TOKEN_FILE" ] || fail "no coordinator or token file: $(cat "$WORK/run.err")"
[ "$(stat -c %a "$TOKEN_FILE")" = 600 ] || fail "token file mode $(stat -c %a "$TOKEN_FILE")"
[ "$(wc -c <"$TOKEN_FILE")" -eq 65 ] || fail "token file of $(wc -c <"$TOKEN_FILE") bytes"
RUN_LINK=$(sed -n 's/.*job 1 on the dashboard: \(http[^ ]*\)/\1/p' "$WORK/run.err")
case "$RUN_LINK" in http://127.0.0.1:*/\?key=*#/jobs/1) ;; *) fail "printed link: $RUN_LINK" ;; esac
RUN_HTTP=${RUN_LINK%%/\?key=*}
code=$(curl -s -o /dev/null -w '%{http_code}' "$RUN_HTTP/api/v1/jobs/1/output")
[ "$code" = 401 ] || fail "an embedded run's output without its key: $code"
RUN_KEY=${RUN_LINK##*key=}; RUN_KEY=${RUN_KEY%%#*}
curl -sf -H "Authorization: Bearer $RUN_KEY" "$RUN_HTTP/api/v1/jobs/1" | has '"argv":\["sleep"' ||
  fail "the printed key does not open the job"

note "without the token: refused"
if "$KOLO" status --coordinator "$URL" >"$WORK/st.out" 2>&1; then
  fail "kolo status without the token was answered: $(cat "$WORK/st.out")"
fi
has "token" <"$WORK/st.out" || fail "no authentication error: $(cat "$WORK/st.out")"
if "$KOLO" run --coordinator "$URL" -np 1 -- touch "$WORK/stranger" >"$WORK/sub.out" 2>&1; then
  fail "a job was submitted without the token"
fi
sleep 1
[ ! -e "$WORK/stranger" ] || fail "a job submitted without the token ran"

if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
  note "another user (nobody)"
  as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
  if as_nobody cat "$TOKEN_FILE" >/dev/null 2>&1; then fail "nobody can read the token"; fi
  if as_nobody "$KOLO" run --coordinator "$URL" -np 1 -- id >"$WORK/nobody.out" 2>&1; then
    fail "nobody submitted a job: $(cat "$WORK/nobody.out")"
  fi
  has "token" <"$WORK/nobody.out" || fail "nobody's submission: $(cat "$WORK/nobody.out")"
else
  note "not root or no setpriv: the other-user part is skipped"
fi

note "with the token: answered"
"$KOLO" status --coordinator "$URL" --token-file "$TOKEN_FILE" >"$WORK/st.out" 2>&1 ||
  fail "kolo status with the token: $(cat "$WORK/st.out")"
has "running" <"$WORK/st.out" || fail "the job is not listed: $(cat "$WORK/st.out")"

kill -INT "$RUN_PID"
wait "$RUN_PID" || true
[ ! -e "$TOKEN_FILE" ] || fail "the token file outlived the run"

note "a coordinator started by hand on loopback without a token"
start_coordinator open
"$KOLO" status --coordinator "$RPC" >"$WORK/own.out" 2>&1 ||
  fail "its own user was refused: $(cat "$WORK/own.out")"
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
  if as_nobody "$KOLO" run --coordinator "$RPC" -np 1 -- id >"$WORK/nobody2.out" 2>&1; then
    fail "nobody submitted a job to a coordinator without a token"
  fi
  has "only the user who started it" <"$WORK/nobody2.out" ||
    fail "nobody's submission: $(cat "$WORK/nobody2.out")"
  if as_nobody "$KOLO" status --coordinator "$RPC" >"$WORK/nobody3.out" 2>&1; then
    fail "nobody listed the jobs of a coordinator without a token"
  fi
  curl -sf "$HTTP/metrics" | has "kolo_rpc_admin_refused_total 2" ||
    fail "refusals not counted: $(curl -sf "$HTTP/metrics" | grep admin_refused)"

  note "nobody may not make agent or worker calls either (issue 28)"
  # An agent of nobody's would run the owner's next job as nobody.
  mkdir -p "$WORK/evil" && chown nobody "$WORK/evil"
  timeout 5 setpriv --reuid=nobody --regid=nogroup --clear-groups "$KOLO" agent \
    --coordinator "$RPC" --slots 2 --name evil --state-dir "$WORK/evil" \
    >"$WORK/evil.out" 2>&1 || true
  has "only the user who started it" <"$WORK/evil.out" ||
    fail "nobody's agent was not refused: $(cat "$WORK/evil.out")"
  curl -sf "$HTTP/api/v1/hosts" | has '"evil"' && fail "nobody registered an agent"
  # The owner's job, then nobody with that job's worker environment: its
  # rendezvous (and so its snapshots and negotiation) is refused.
  start_agent own 1
  wait_hosts 1
  "$KOLO" run --coordinator "$RPC" -np 1 -- sh -c "echo own-secret-line; env >$WORK/job.env; chmod 644 $WORK/job.env; sleep $SLEEP" \
    >"$WORK/own-run.out" 2>&1 &
  PIDS+=("$!")
  wait_for 20 test -s "$WORK/job.env" || fail "the owner's job did not start: $(cat "$WORK/own-run.out")"
  use_python
  (cd "$WORK" && env -i $(grep -E '^(KOLO|HOROVOD|OMPI)[A-Z_]*=' "$WORK/job.env" | tr '\n' ' ') \
    PYTHONPATH="$PYTHONPATH" ${KOLO_LIBRARY:+KOLO_LIBRARY=$KOLO_LIBRARY} \
    setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 -c \
    'import kolo; kolo.init(); print("JOINED")' >"$WORK/evil-worker.out" 2>&1) || true
  has JOINED <"$WORK/evil-worker.out" && fail "nobody joined the owner's job"
  has "only the user who started it" <"$WORK/evil-worker.out" ||
    fail "nobody's worker was not refused with the reason: $(tail -5 "$WORK/evil-worker.out")"

  note "HTTP on loopback: a job's argv, cwd and output need the view key (issue 28)"
  wait_for 10 sh -c "grep -q own-secret-line '$WORK/own-run.out'" || fail "no output line"
  sleep 1 # the line reaches the database
  as_nobody curl -s "$HTTP/api/v1/jobs/1" >"$WORK/nb-job.json"
  has '"argv":null' <"$WORK/nb-job.json" && has '"redacted":true' <"$WORK/nb-job.json" ||
    fail "nobody read the job's argv: $(cat "$WORK/nb-job.json")"
  code=$(as_nobody curl -s -o /dev/null -w '%{http_code}' "$HTTP/api/v1/jobs/1/output" || true)
  [ "$code" = 401 ] || fail "nobody read the output: $code"
  as_nobody cat "$WORK/open.db.dashboard" >/dev/null 2>&1 && fail "nobody reads the dashboard link"
  [ "$(stat -c %a "$WORK/open.db.dashboard")" = 600 ] || fail "the dashboard link is not 0600"
  LINK=$(cat "$WORK/open.db.dashboard")
  case "$LINK" in "$HTTP/?key="*) ;; *) fail "dashboard link: $LINK" ;; esac
  # the printed link, opened once, leaves a cookie that opens the reads
  curl -s -c "$WORK/jar" -o /dev/null "$LINK" || fail "the link does not open"
  grep -q "kolo_view_${HTTP##*:}" "$WORK/jar" || fail "no cookie: $(cat "$WORK/jar")"
  curl -sf -b "$WORK/jar" "$HTTP/api/v1/jobs/1/output" | has own-secret-line ||
    fail "the owner's browser cannot read the output"
  curl -sf -b "$WORK/jar" "$HTTP/api/v1/jobs/1" | has '"argv":\["sh"' || fail "argv with the cookie"
  curl -sf -H "Authorization: Bearer ${LINK##*key=}" "$HTTP/api/v1/jobs/1/output" | has own-secret-line ||
    fail "the key as a bearer token"
  code=$(curl -s -o /dev/null -w '%{http_code}' "$HTTP/api/v1/jobs/1/output?key=0123456789abcdef0123456789abcdef")
  [ "$code" = 401 ] || fail "a wrong key opened the output: $code"
fi
echo PASS
