#!/usr/bin/env bash
# libkolo across real processes started by kolo run: the C example over
# shared memory and over TCP, and a peer killed mid-allreduce making every
# survivor fail fast instead of hanging.
. "$(dirname "$0")/lib.sh"
EXAMPLE="${KOLO_EXAMPLE:?}"
PEER_DEATH="${KOLO_PEER_DEATH:?}"
export XDG_STATE_HOME="$WORK/state"

for transport in shm tcp; do
  note "example, 4 ranks, $transport"
  [ $transport = tcp ] && export KOLO_DISABLE_SHM=1 || unset KOLO_DISABLE_SHM
  "$KOLO" run -np 4 -- "$EXAMPLE" >"$WORK/ex.out" 2>"$WORK/ex.err" || fail "example failed: $(cat "$WORK/ex.err")"
  [ "$(grep -c '(correct)' "$WORK/ex.out")" -eq 4 ] || fail "$(cat "$WORK/ex.out")"
done

for transport in shm tcp; do
  note "a rank dies mid-allreduce, $transport"
  [ $transport = tcp ] && export KOLO_DISABLE_SHM=1 || unset KOLO_DISABLE_SHM
  set +e
  KOLO_TEST_VICTIM=1 timeout 60 "$KOLO" run -np 3 -- "$PEER_DEATH" >"$WORK/pd.out" 2>"$WORK/pd.err"
  rc=$?
  set -e
  cat "$WORK/pd.out"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "job did not fail properly (rc $rc)"
  grep -q "rank 1: dying now" "$WORK/pd.out" || fail "the victim did not run"
  # Survivors either saw the failure themselves (printed) or were stopped
  # by the agent because the job failed; none may hang.
  for r in 0 2; do
    if grep -q "rank $r: step" "$WORK/pd.out"; then
      ms=$(sed -n "s/.*rank $r: step [0-9]* failed after \([0-9.]*\) ms.*/\1/p" "$WORK/pd.out")
      note "rank $r noticed after $ms ms"
      awk -v m="$ms" 'BEGIN { exit !(m < 10000) }' || fail "rank $r took $ms ms"
    fi
  done
done
echo PASS
