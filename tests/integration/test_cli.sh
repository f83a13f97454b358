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
echo PASS
