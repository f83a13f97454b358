#!/usr/bin/env bash
# The ranks' clocks against the coordinator's, and the timeline built from
# the ranks' telemetry (issue 13, item 5). Two agents on this machine, the
# second in a time namespace whose CLOCK_MONOTONIC runs 100 s ahead (as a
# host booted at another time): a 2-rank job, one rank per agent.
#  - /ranks shows each rank's clock offset from its reports' round trips:
#    ~0 for the rank beside the coordinator, ~-100 s for the other, each
#    within the round trip it was measured over;
#  - the job's timeline, started and stopped at run time, is written from
#    the ranks' telemetry while their readiness rounds go on (almost no
#    Negotiate call while it runs): the cached tensors' NEGOTIATE spans
#    have a tick from each rank, the two within a few ms of each other
#    (not 100 s apart), and every event lies within the job's run;
#  - every sum is right.
# Needs unshare(1) with time namespaces (Linux 5.6); skipped (77) otherwise.
. "$(dirname "$0")/lib.sh"
use_python
PY=/usr/bin/python3
STEPS_PY="$ROOT/tests/integration/data/rounds_steps.py"
AHEAD_S=100

out=$(unshare --time --monotonic "$AHEAD_S" --boottime "$AHEAD_S" cat /proc/uptime 2>&1) ||
  skip "no time namespaces here: $out"
printf '#!/bin/sh\nexec unshare --time --monotonic %s --boottime %s %s "$@"\n' \
  "$AHEAD_S" "$AHEAD_S" "$KOLO" >"$WORK/kolo-ahead"
chmod +x "$WORK/kolo-ahead"

LEASE=30s start_coordinator coord
start_agent a 1
wait_hosts 1
KOLO="$WORK/kolo-ahead" start_agent b 1
wait_for 10 hosts_at_least 2 || fail "agent b did not register: $(tail -n 5 "$WORK/agent-b.log")"

"$KOLO" run -np 2 -H a:1,b:1 --coordinator "$RPC" -- "$PY" "$STEPS_PY" --steps 600 \
  --pause 0.005 --timeline "$WORK/tl.json" --timeline-steps 100,450 \
  --progress "$WORK/progress" >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")
wait_for 60 eval '[ "$(progress)" -ge 30 ]' || fail "training did not start: $(tail "$WORK/run.err")"

# ---- the clocks, from /ranks (a sample needs a report and its reply)
clocks() {
  curl -sf "$HTTP/api/v1/jobs/1/ranks" | "$PY" -c '
import json, sys
for r in json.load(sys.stdin)["ranks"]:
    print(r["rank"], r["host"], r["clock_offset_ms"], r["clock_rtt_ms"])'
}
known() { [ "$(clocks | grep -vc None)" -eq 2 ]; }
wait_for 10 known || fail "no clock offsets in /ranks: $(clocks)"
clocks >"$WORK/clocks"
note "rank host offset_ms rtt_ms: $(tr '\n' ';' <"$WORK/clocks")"
"$PY" - "$WORK/clocks" "$AHEAD_S" <<'PYEOF' || fail "wrong clock offsets: $(cat "$WORK/clocks")"
import sys
ahead_ms = float(sys.argv[2]) * 1000
for line in open(sys.argv[1]):
    rank, host, off, rtt = line.split()
    off, rtt = float(off), float(rtt)
    want = -ahead_ms if host == "b" else 0.0
    # NTP's bound: off by at most half the round trip (plus the clocks' reads)
    assert abs(off - want) <= rtt / 2 + 1.0, (rank, host, off, want, rtt)
    assert rtt < 1000, (rank, rtt)
PYEOF

# ---- the rounds go on while the timeline is written
rounds_again 150 350 "with the timeline on"

rc=0
wait "$RUN_PID" || rc=$?
[ $rc -eq 0 ] || fail "the job failed ($rc): $(tail -20 "$WORK/run.err")"
[ "$(grep -c "<stdout>:done 600" "$WORK/run.out")" -eq 2 ] || fail "not every rank finished"
! grep -q WRONG "$WORK/run.out" || fail "a wrong result"

# ---- the timeline: ticks of both ranks, on one clock
"$PY" - "$WORK/tl.json" <<'PYEOF' || fail "the timeline is wrong (above)"
import json, sys
text = open(sys.argv[1]).read().rstrip()
evs = json.loads(text if text.endswith("]") else text.rstrip(",") + "]")
pids = {e["pid"]: e["args"]["name"] for e in evs if e.get("name") == "process_name" and e["pid"]}
spans, ticks, gaps, by_pid = 0, 0, [], {}
for e in evs:
    if e["ph"] != "M":
        by_pid.setdefault(e["pid"], []).append(e)
for pid, mine in by_pid.items():
    if not pids.get(pid, "").startswith("grad."):
        continue
    cur = None
    for e in mine:
        if e["ph"] == "B" and e["name"] == "NEGOTIATE_ALLREDUCE":
            cur = []
        elif e["ph"] == "X" and cur is not None:
            cur.append(e)
        elif e["ph"] == "E" and cur is not None:
            assert sorted(t["name"] for t in cur) == ["0", "1"], (pids[pid], cur)
            gaps.append(max(t["ts"] for t in cur) - min(t["ts"] for t in cur))
            spans += 1
            cur = None
    assert all(e["ts"] < 120e6 for e in mine), "an event 100 s off"
gaps.sort()
print("-- %d NEGOTIATE spans of the 12 grad tensors; gap between the ranks' ticks: median %d us, "
      "p99 %d us" % (spans, gaps[len(gaps) // 2], gaps[len(gaps) * 99 // 100]))
# ~150 steps of 12 tensors while it was on, the first ones through the coordinator
assert spans >= 12 * 100, spans
assert gaps[len(gaps) // 2] < 20000, gaps[len(gaps) // 2]
PYEOF
echo PASS
