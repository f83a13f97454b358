#!/usr/bin/env bash
# Busy means retry, and no caller takes the coordinator (issue 28): beside
# a training job, one admin client holding the cluster token keeps 960
# StreamOutput long polls outstanding over 16 connections for 20 s (the
# old coordinator gave them all 960 unreserved contexts and the job's
# ranks got KOLO_EBUSY, which libkolo treated as fatal). Now one caller
# parks at most a quarter of the contexts (256 of 1024), the rest of its
# calls are refused busy, and the job finishes every step with every
# allreduce right; libkolo would retry a busy refusal within its
# deadlines (kolo.common.rpc_trust tests that directly).
. "$(dirname "$0")/lib.sh"
use_python
DATA="$ROOT/tests/integration/data"

# the coordinator's former default capacity, which the figures above assume
# (the default is 4096 since issue 29: a 1,024-rank job parks two calls a rank)
make_token
start_coordinator coord --token-file "$WORK/token" --rpc-contexts 1024
start_agent a 2 --token-file "$WORK/token"
wait_hosts 1
start_steps 2 300 0.05 --token-file "$WORK/token"
RPORT=${RPC##*:}
note "parking 960 StreamOutput calls of job 1 beside it"
timeout 60 /usr/bin/python3 "$DATA/parked_flood.py" 127.0.0.1 "$RPORT" "$WORK/token" 1 16 60 20 \
  >"$WORK/flood.out" 2>&1 &
FLOOD=$!
PIDS+=("$FLOOD")
wait_for 90 sh -c "! kill -0 $RUN_PID 2>/dev/null" || fail "the job did not finish under the flood"
wait "$RUN_PID" || fail "the job failed under the flood: $(tail -5 "$WORK/run.out") $(tail -5 "$WORK/run.err")"
grep -q "done 300" "$WORK/run.out" || fail "the job did not finish its steps: $(tail -3 "$WORK/run.out")"
wait "$FLOOD" || true
note "flood: $(cat "$WORK/flood.out")"
busy=$(metric 'kolo_rpc_rejected_frames_total{reason="busy"}')
[ "${busy:-0}" -ge 500 ] || fail "the flood was not refused busy (${busy:-0} refusals): $(cat "$WORK/flood.out")"
grep -q "busy [1-9]" "$WORK/flood.out" || fail "the flooder saw no busy refusal: $(cat "$WORK/flood.out")"
echo PASS
