#!/usr/bin/env bash
# The operator's commands (cli/ops.c) against a real coordinator with a
# token and one agent, while a 2-rank job runs:
# - kolo jobs / kolo hosts, as tables and as JSON (-o json) a script parses;
# - kolo logs JOB: the output so far; --rank N: that rank's lines alone,
#   without prefixes; -f follows until the job ends;
# - kolo stop JOB: the job stops (state "stopped", the reason kept), the
#   following kolo logs -f and the submitting kolo run both end;
# - kolo run --detach prints the job id; kolo attach follows the job and
#   exits with its code;
# - kolo drain HOST: no job is placed there; kolo undrain: jobs run again;
# - exit codes: 2 for usage errors, 3 for an unknown job or host, 1
#   without the token.
. "$(dirname "$0")/lib.sh"
token_cluster 2
T=(--coordinator "$RPC" --token-file "$WORK/token")
PY=/usr/bin/python3
code() { set +e; "$@" >"$WORK/code.out" 2>&1; echo $?; set -e; }

note "a 2-rank job that counts"
"$KOLO" run -np 2 "${T[@]}" --name counter -- sh -c \
  'i=0; while :; do echo "tick $KOLO_RANK $i"; i=$((i+1)); sleep 0.1; done' \
  >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
ticks() { grep -c '<stdout>:tick' "$WORK/run.out" 2>/dev/null || true; }
ticks_at_least() { [ "$(ticks)" -ge "$1" ]; }
wait_for 20 ticks_at_least 6 || fail "the job did not start: $(cat "$WORK/run.err")"

note "kolo jobs / kolo hosts"
"$KOLO" jobs "${T[@]}" >"$WORK/jobs.txt" || fail "kolo jobs failed"
has "running" <"$WORK/jobs.txt" || fail "no running job: $(cat "$WORK/jobs.txt")"
# the table names the job and its live ranks of np
has "^  [0-9]* *counter *running *2/2 " <"$WORK/jobs.txt" || fail "kolo jobs: $(cat "$WORK/jobs.txt")"
"$KOLO" jobs "${T[@]}" -o json >"$WORK/jobs.json" || fail "kolo jobs -o json failed"
JOB=$("$PY" -c '
import json, sys
jobs = json.load(open(sys.argv[1]))
[j] = [j for j in jobs if j["name"] == "counter"]
assert j["state"] == "running" and j["np"] == 2 and j["exit_code"] is None, j
assert j["argv"][0] == "sh" and j["ranks_alive"] == 2, j
print(j["id"])' "$WORK/jobs.json") || fail "kolo jobs -o json: $(cat "$WORK/jobs.json")"
"$KOLO" hosts "${T[@]}" -o json | "$PY" -c '
import json, sys
[h] = json.load(sys.stdin)
assert h["name"] == "a" and h["state"] == "alive" and h["slots"] == 2 and h["slots_used"] == 2, h' ||
  fail "kolo hosts -o json"
"$KOLO" hosts "${T[@]}" | has " alive " || fail "kolo hosts table"
"$KOLO" status "${T[@]}" | has "counter\|sh -c" || fail "kolo status"

note "kolo logs"
"$KOLO" logs "${T[@]}" "$JOB" >"$WORK/logs.out" 2>&1 || fail "kolo logs failed"
has '^\[0\]<stdout>:tick 0 0$' <"$WORK/logs.out" || fail "rank 0's first line missing: $(head "$WORK/logs.out")"
has '^\[1\]<stdout>:tick 1 0$' <"$WORK/logs.out" || fail "rank 1's first line missing"
"$KOLO" logs "${T[@]}" --rank 1 "$JOB" >"$WORK/rank1.out" || fail "kolo logs --rank failed"
head -n 1 "$WORK/rank1.out" | has '^tick 1 0$' || fail "--rank 1: $(head -n 3 "$WORK/rank1.out")"
grep -v '^tick 1 ' "$WORK/rank1.out" | has . && fail "--rank 1 printed other lines"

"$KOLO" status "${T[@]}" -o json | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
assert d["coordinator"].startswith("tcp://") and d["hosts"][0]["name"] == "a", d
assert any(j["name"] == "counter" for j in d["jobs"]), d' || fail "kolo status -o json"
"$KOLO" logs "${T[@]}" -o json --rank 1 "$JOB" >"$WORK/logs.jsonl" || fail "kolo logs -o json"
"$PY" -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines[0] == {"rank": 1, "stream": "stdout", "text": "tick 1 0"}, lines[0]
assert all(l["rank"] == 1 for l in lines) and len(lines) >= 3, lines' "$WORK/logs.jsonl" ||
  fail "kolo logs -o json: $(head -n 3 "$WORK/logs.jsonl")"

note "kolo logs -f, then kolo stop"
"$KOLO" logs -f "${T[@]}" --rank 0 "$JOB" >"$WORK/follow.out" 2>"$WORK/follow.err" &
FOLLOW=$!
PIDS+=("$FOLLOW")
n0=$(ticks)
wait_for 10 ticks_at_least $((n0 + 10)) || fail "the job stopped ticking"
# it follows: more lines come than there were when it started (however
# many ticks the commands above took)
followed() { [ "$(wc -l <"$WORK/follow.out")" -gt 10 ]; }
wait_for 10 followed || fail "kolo logs -f followed too little: $(cat "$WORK/follow.out")"
"$KOLO" stop "${T[@]}" --reason "maintenance window" "$JOB" >"$WORK/stop.out" ||
  fail "kolo stop failed: $(cat "$WORK/stop.out")"
wait_for 20 sh -c "! kill -0 $FOLLOW 2>/dev/null" || fail "kolo logs -f did not end with the job"
wait "$FOLLOW" || fail "kolo logs -f exited $?"
last=$(tail -n 1 "$WORK/follow.out")
[ "${last%% *}" = tick ] || fail "kolo logs -f: $(tail -n 3 "$WORK/follow.out")"
[ "$(wc -l <"$WORK/follow.out")" -gt 10 ] || fail "kolo logs -f followed too little"
# and ends with the job's outcome
tail -n 1 "$WORK/follow.err" | has "^\[kolo\] job $JOB stopped: maintenance window (exit code" ||
  fail "kolo logs -f did not end with the outcome: $(cat "$WORK/follow.err")"
wait_for 20 sh -c "! kill -0 $RUN_PID 2>/dev/null" || fail "kolo run did not end"
wait "$RUN_PID" && fail "kolo run exited 0 for a stopped job"
"$KOLO" jobs "${T[@]}" -o json | "$PY" -c '
import json, sys
[j] = [j for j in json.load(sys.stdin) if j["id"] == int(sys.argv[1])]
assert j["state"] == "stopped" and "maintenance window" in j["reason"], j' "$JOB" ||
  fail "the job is not stopped with its reason"

note "kolo drain / kolo undrain"
"$KOLO" drain "${T[@]}" -o json a | "$PY" -c '
import json, sys
[h] = json.load(sys.stdin)
assert h["name"] == "a" and h["state"] == "drained", h' || fail "kolo drain a"
"$KOLO" hosts "${T[@]}" | has " drained " || fail "kolo hosts does not show the drain"
set +e
"$KOLO" run -np 1 "${T[@]}" --start-timeout 2 -- true >"$WORK/drained.out" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] || fail "a job was placed on a drained host"
has "slots" <"$WORK/drained.out" || fail "no reason: $(cat "$WORK/drained.out")"
"$KOLO" undrain "${T[@]}" a | has " alive " || fail "kolo undrain a"
"$KOLO" run -np 1 "${T[@]}" -- true >"$WORK/undrained.out" 2>&1 ||
  fail "no job runs after undrain: $(cat "$WORK/undrained.out")"
curl -sf "$HTTP/api/v1/events" | has "drained: no new work.*kolo drain" ||
  fail "no host.drained event naming kolo drain"

note "kolo run --detach, kolo attach"
JOB2=$("$KOLO" run --detach "${T[@]}" -np 1 -- sh -c 'echo hello; sleep 1; echo bye; exit 4') ||
  fail "kolo run --detach failed"
[ "$JOB2" -gt "$JOB" ] 2>/dev/null || fail "kolo run --detach printed '$JOB2', not a job id"
set +e
"$KOLO" attach "${T[@]}" "$JOB2" >"$WORK/attach.out" 2>"$WORK/attach.err"
rc=$?
set -e
[ $rc -eq 4 ] || fail "kolo attach exited $rc, not the job's 4: $(cat "$WORK/attach.err")"
has '^\[0\]<stdout>:hello$' <"$WORK/attach.out" || fail "attach: $(cat "$WORK/attach.out")"
has '^\[0\]<stdout>:bye$' <"$WORK/attach.out" || fail "attach missed the end"
[ "$(code "$KOLO" attach "${T[@]}" 99999)" = 3 ] || fail "attach to an unknown job"

note "kolo attach interrupted: the job goes on, and it says so"
JOB3=$("$KOLO" run -d "${T[@]}" -np 1 -- sh -c 'echo up; exec sleep 60') || fail "run -d"
"$KOLO" attach "${T[@]}" "$JOB3" >"$WORK/attach3.out" 2>"$WORK/attach3.err" &
ATTACH=$!
PIDS+=("$ATTACH")
wait_for 10 grep -q up "$WORK/attach3.out" || fail "attach: $(cat "$WORK/attach3.err")"
kill -INT "$ATTACH"
rc=0; wait "$ATTACH" || rc=$?
[ $rc -eq 130 ] || fail "kolo attach interrupted exited $rc, not 130"
has "stopped following job $JOB3; it goes on (kolo attach $JOB3 follows it again" \
  <"$WORK/attach3.err" || fail "attach interrupted: $(cat "$WORK/attach3.err")"
"$KOLO" jobs "${T[@]}" -o json | "$PY" -c '
import json, sys
[j] = [j for j in json.load(sys.stdin) if j["id"] == int(sys.argv[1])]
assert j["state"] == "running", j' "$JOB3" || fail "the job did not go on after attach ended"
"$KOLO" stop "${T[@]}" "$JOB3" >/dev/null

note "exit codes"
[ "$(code "$KOLO" logs "${T[@]}" 99999)" = 3 ] || fail "unknown job: $(cat "$WORK/code.out")"
has "99999" <"$WORK/code.out" || fail "unknown job not named: $(cat "$WORK/code.out")"
[ "$(code "$KOLO" logs "${T[@]}" abc)" = 2 ] || fail "a bad id is a usage error"
[ "$(code "$KOLO" logs "${T[@]}")" = 2 ] || fail "a missing id is a usage error"
[ "$(code "$KOLO" jobs "${T[@]}" -o yaml)" = 2 ] || fail "-o yaml is a usage error"
[ "$(code "$KOLO" jobs --coordinator "$RPC")" = 1 ] || fail "no token: $(cat "$WORK/code.out")"
has "token" <"$WORK/code.out" || fail "no token: no reason given: $(cat "$WORK/code.out")"
[ "$(code "$KOLO" stop "${T[@]}" 99999)" = 3 ] || fail "stop of an unknown job: $(cat "$WORK/code.out")"
[ "$(code "$KOLO" drain "${T[@]}" nosuchhost)" = 3 ] || fail "drain of an unknown host: $(cat "$WORK/code.out")"
has "nosuchhost" <"$WORK/code.out" || fail "the unknown host is not named"
[ "$(code "$KOLO" drain "${T[@]}")" = 2 ] || fail "drain without a host is a usage error"
"$KOLO" logs --help | has "follow" || fail "kolo logs --help"
echo PASS
