#!/usr/bin/env bash
# The data plane proves membership and workers hold only their job's
# credential (issue 15, F2, F3 and F6), on a coordinator with a token:
# - strangers on rank 0's data port while it waits for rank 1 (garbage,
#   an idle socket, a guessed hello followed by floats) change nothing:
#   the allreduce is exact, nothing waits for the idle socket, the
#   refusals are logged and counted in kolo_dataplane_rejected_total;
# - the data port listens on the advertised address only;
# - with --encrypt-data the same job runs sealed (AES-256-GCM records),
#   and a rank configured otherwise is refused, the reason in its exception;
# - a job's environment holds KOLO_JOB_TOKEN, never the cluster token,
#   even when the submitter exported it; that credential is no cluster
#   token;
# - a shared-memory segment is 0600, and one left by a rank that died
#   before the others attached is removed by the agent.
. "$(dirname "$0")/lib.sh"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$ROOT/python"
DATA="$ROOT/tests/integration/data"

token_cluster 2
export KOLO_DISABLE_SHM=1 # for the jobs kolo run submits (TCP); not the agent's

note "strangers on rank 0's data port during the mesh set-up"
DELAY=4
t0=$(now_ms)
KOLO_LOG_LEVEL=warn "$KOLO" run -np 2 --coordinator "$RPC" --token-file "$WORK/token" -- /usr/bin/python3 \
  "$DATA/late_rank.py" $DELAY >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
rank0_pid() {
  for p in $(pgrep -f "^/usr/bin/python3 .*late_rank.py $DELAY"); do
    env_of=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null || true)
    grep -qx 'KOLO_RANK=0' <<<"$env_of" && { echo "$p"; return 0; }
  done
  return 1
}
listening() { P=$(rank0_pid) && ss -Htlnp | grep "pid=$P," >/dev/null; }
wait_for 15 listening || fail "rank 0 never listened: $(cat "$WORK/run.err")"
P=$(rank0_pid)
LADDR=$(ss -Htlnp | grep "pid=$P," | awk '{print $4}' | head -1)
LHOST=${LADDR%:*}
LPORT=${LADDR##*:}
note "rank 0 listens on $LADDR"
[ "$LHOST" != "0.0.0.0" ] && [ "$LHOST" != "*" ] || fail "data port bound to every address: $LADDR"
JOB=$(tr '\0' '\n' <"/proc/$P/environ" | sed -n 's/^KOLO_JOB=//p')
GEN=$(tr '\0' '\n' <"/proc/$P/environ" | sed -n 's/^KOLO_GENERATION=//p')
/usr/bin/python3 "$DATA/stranger.py" "$LHOST" "$LPORT" "$JOB" "$GEN" >"$WORK/stranger.out" 2>&1 &
STRANGER=$!
PIDS+=("$STRANGER")
wait_for 5 grep -q "connected 3 times" "$WORK/stranger.out" || fail "stranger: $(cat "$WORK/stranger.out")"
wait_for 60 sh -c "! kill -0 $RUN_PID 2>/dev/null" || fail "job hangs: $(cat "$WORK/run.err")"
wait "$RUN_PID" || fail "job failed: $(cat "$WORK/run.out" "$WORK/run.err")"
took=$(( $(now_ms) - t0 ))
kill "$STRANGER" 2>/dev/null || true
cat "$WORK/run.out" "$WORK/run.err"
[ "$(grep -c 'result 3 3 3 3$' "$WORK/run.out")" -eq 2 ] || fail "wrong sums: $(cat "$WORK/run.out")"
note "job took $took ms (rank 1 started after ${DELAY}s)"
[ "$took" -lt $(( DELAY * 1000 + 15000 )) ] || fail "the idle stranger delayed the job: $took ms"
grep -q "refused a data-plane connection" "$WORK/run.out" "$WORK/run.err" ||
  fail "no refusal logged: $(cat "$WORK/run.err")"
wait_for 10 sh -c "curl -sf '$HTTP/api/v1/events' | grep -q 'dataplane.refused'" ||
  fail "no dataplane.refused event: $(curl -sf "$HTTP/api/v1/events")"
metric_at_least() { curl -sf "$HTTP/metrics" | has "kolo_dataplane_rejected_total{reason=\"$1\"} [1-9]"; }
wait_for 10 metric_at_least auth || fail "forged proof not counted: $(curl -sf "$HTTP/metrics" | grep dataplane)"
metric_at_least malformed || fail "garbage not counted: $(curl -sf "$HTTP/metrics" | grep dataplane)"

note "a sealed data plane (--encrypt-data): the same sums; a rank set otherwise is refused"
KOLO_LOG_LEVEL=info "$KOLO" run -np 2 --encrypt-data --coordinator "$RPC" --token-file "$WORK/token" \
  -- /usr/bin/python3 "$DATA/late_rank.py" 0 >"$WORK/seal.out" 2>"$WORK/seal.err" ||
  fail "sealed job failed: $(cat "$WORK/seal.out" "$WORK/seal.err")"
[ "$(grep -c 'result 3 3 3 3$' "$WORK/seal.out")" -eq 2 ] || fail "wrong sealed sums: $(cat "$WORK/seal.out")"
[ "$(grep -c 'TCP sealed with AES-256-GCM' "$WORK/seal.out" "$WORK/seal.err" | awk -F: '{s+=$2} END {print s}')" -eq 2 ] ||
  fail "ranks did not say they seal: $(cat "$WORK/seal.err")"
# 16 MiB allreduces, each followed by a barrier: the peer's next round
# message arrives with the last record and is read ahead, where a poll on
# the socket cannot see it (the idle wait must ask the transport)
KOLO_DISABLE_SHM=1 "$KOLO" run -np 2 --encrypt-data --coordinator "$RPC" --token-file "$WORK/token" \
  -- "$(dirname "$KOLO")/kolo-bench-allreduce" sizes 16777216 >"$WORK/seal-big.out" 2>&1 ||
  fail "sealed 16 MiB allreduces failed: $(tail -n 5 "$WORK/seal-big.out")"
grep -q '"impl":"kolo-sealed".*"bytes":16777216' "$WORK/seal-big.out" ||
  fail "no sealed 16 MiB result: $(cat "$WORK/seal-big.out")"
"$KOLO" run -np 2 --encrypt-data --start-timeout 20 --coordinator "$RPC" --token-file "$WORK/token" \
  -- /usr/bin/python3 "$DATA/late_rank.py" 0 1 >"$WORK/mixed.out" 2>&1 &&
  fail "a job whose ranks disagree about sealing succeeded: $(cat "$WORK/mixed.out")"
# the reason is in the exception itself, without asking for logs
grep -q "init failed: .*KOLO_DATA_ENCRYPT" "$WORK/mixed.out" ||
  fail "the refusal gave no reason: $(cat "$WORK/mixed.out")"

note "a job's environment: its own credential, not the cluster token"
KOLO_TOKEN="$TOKEN" "$KOLO" run -np 1 --coordinator "$RPC" --token-file "$WORK/token" -- env \
  >"$WORK/env.out" 2>&1 || fail "env job failed: $(cat "$WORK/env.out")"
grep -q "$TOKEN" "$WORK/env.out" && fail "the cluster token reached the job"
grep -q ':KOLO_TOKEN=' "$WORK/env.out" && fail "KOLO_TOKEN set in the job"
CRED=$(sed -n 's/.*:KOLO_JOB_TOKEN=\([0-9a-f]*\)$/\1/p' "$WORK/env.out" | head -1)
[ ${#CRED} -eq 64 ] || fail "no job credential: $(cat "$WORK/env.out")"
curl -sf "$HTTP/api/v1/jobs/2/output" | has "$TOKEN" && fail "token in the output route"
printf '%s\n' "$CRED" >"$WORK/cred"
chmod 600 "$WORK/cred"
"$KOLO" status --coordinator "$RPC" --token-file "$WORK/cred" >"$WORK/st.out" 2>&1 &&
  fail "a job credential worked as the cluster token"
grep -qi "token" "$WORK/st.out" || fail "no reason given: $(cat "$WORK/st.out")"
note "a shared-memory leader killed before the others attached leaves no segment"
unset KOLO_DISABLE_SHM
"$KOLO" run -np 2 --coordinator "$RPC" --token-file "$WORK/token" -- /usr/bin/python3 \
  "$DATA/late_rank.py" $DELAY >"$WORK/shm.out" 2>&1 &
RUN_PID=$!
PIDS+=("$RUN_PID")
segment_there() { P=$(rank0_pid) && ls /dev/shm | grep -q "^kolo-[0-9]*-[0-9]*-$P-"; }
wait_for 15 segment_there || fail "rank 0 made no segment: $(cat "$WORK/shm.out")"
P=$(rank0_pid)
SEG=$(ls /dev/shm | grep "^kolo-[0-9]*-[0-9]*-$P-")
[ "$(stat -c %a "/dev/shm/$SEG")" = 600 ] || fail "segment mode $(stat -c %a "/dev/shm/$SEG")"
kill -9 "$P"
wait_for 30 sh -c "! kill -0 $RUN_PID 2>/dev/null" || fail "job did not end after its leader died"
wait "$RUN_PID" && fail "the job succeeded without its rank 0"
wait_for 10 sh -c "[ ! -e /dev/shm/$SEG ]" || fail "segment $SEG left in /dev/shm"
echo PASS
