#!/usr/bin/env bash
# Every binary prints its knob table; --dump-config round-trips.
. "$(dirname "$0")/lib.sh"
for cmd in coordinator agent run status; do
  "$KOLO" "$cmd" --help >"$WORK/$cmd.help" || fail "$cmd --help"
  grep -q -- "--" "$WORK/$cmd.help" || fail "$cmd --help prints no flags"
  "$KOLO" "$cmd" --dump-config >"$WORK/$cmd.conf" || fail "$cmd --dump-config"
done
grep -q "^lease = 5s" "$WORK/coordinator.conf" || fail "$(cat "$WORK/coordinator.conf")"
KOLO_LEASE=9s "$KOLO" coordinator --dump-config | has "^lease = 9s" || fail "env override"
"$KOLO" coordinator --config "$WORK/coordinator.conf" --dump-config | grep -v '^#' \
  | diff - <(grep -v '^#' "$WORK/coordinator.conf") \
  || fail "dump is not a fixed point"
"$KOLO" coordinator --lease 1 2>/dev/null && fail "out-of-range lease accepted"
"$KOLO" run 2>/dev/null && fail "run without -np accepted"
"$KOLO" nonsense 2>/dev/null && fail "unknown command accepted"
"$KOLO" version | has "^kolo " || fail "version"

note "usage errors say what is wrong and what was meant (issue 33)"
usage_err() { # EXPECTED ARGS...: exit 2 and EXPECTED on stderr, at once
  local want=$1 rc=0; shift
  "$KOLO" "$@" >"$WORK/usage.out" 2>&1 || rc=$?
  [ $rc -eq 2 ] || fail "kolo $*: exit $rc, not 2: $(cat "$WORK/usage.out")"
  head -n 1 "$WORK/usage.out" | has "$want" || fail "kolo $*: $(head -n 1 "$WORK/usage.out")"
}
usage_err "unknown flag -n (did you mean -np?)" run -n 2 -- true
usage_err "unknown flag --verbos (did you mean --verbose?)" run --verbos -np 1 -- true
usage_err "unknown flag --rnak (did you mean --rank?)" logs --rnak 1 7
usage_err "unknown flag --coord (did you mean --coordinator?)" jobs --coord x
usage_err "np: 0 is out of range \[1, 65536\].*needs at least one worker process" run -np 0 -- true
usage_err "-np is required" run -- true
"$KOLO" run --help >"$WORK/run.help"
grep -A1 -- '-np, ' "$WORK/run.help" | has "default" && fail "-np shows a default: $(cat "$WORK/run.help")"
grep -A2 -- '--min-np <int>' "$WORK/run.help" | has default &&
  fail "--min-np shows a default besides -np's"
has "NCCL backend yet" <"$WORK/run.help" && fail "run --help says there is no NCCL backend"
note "refused at once: a host the embedded cluster never has, a port nobody listens on"
export XDG_STATE_HOME="$WORK/state"
t0=$(now_ms)
usage_err "-H names host 'gpu-7', which a run without --coordinator never has" \
  run -np 2 -H localhost:1,gpu-7:1 -- true
[ ! -d "$WORK/state" ] || fail "-H gpu-7: something started ($(ls -R "$WORK/state"))"
# a port that was just free: nothing listens there
PORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
refused() { # CMD ARGS...: exit 1 at once, saying nobody listens
  local rc=0 cmd=$1; shift
  "$KOLO" "$cmd" --coordinator "tcp://127.0.0.1:$PORT" "$@" >"$WORK/refused.out" 2>&1 || rc=$?
  [ $rc -eq 1 ] || fail "kolo $cmd against a closed port: exit $rc: $(cat "$WORK/refused.out")"
  has "cannot connect to tcp://127.0.0.1:$PORT: Connection refused" <"$WORK/refused.out" ||
    fail "kolo $cmd: $(cat "$WORK/refused.out")"
}
refused jobs
refused logs -f 1
refused run -np 1 -- true
[ $(( $(now_ms) - t0 )) -lt 3000 ] || fail "refusals took $(( $(now_ms) - t0 )) ms"

for cmd in status jobs hosts logs stop stacks attach drain undrain; do
  # the usage line, a blank line, a sentence on what the command does
  "$KOLO" "$cmd" --help | sed -n 3p | has '^[A-Z].* ' || fail "kolo $cmd --help: no sentence"
done
echo PASS
