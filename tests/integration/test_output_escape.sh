#!/usr/bin/env bash
# A job's terminal escape sequences do not reach an operator's terminal
# raw (issue 28). A job prints a line with a colour (CSI), a window-title
# OSC ended by BEL, a C1 CSI in UTF-8 (\xc2\x9b), a lone \x9b (not UTF-8),
# a carriage return, a tab and valid UTF-8 text (é, 日本):
#   - on a terminal (script(1) gives kolo a pty), `kolo run`, `kolo logs`
#     and `kolo attach` print every control byte as \xNN and keep the tab
#     and the UTF-8 text;
#   - with --raw on a terminal, and into a pipe or file, the bytes pass
#     through exactly as the job wrote them.
. "$(dirname "$0")/lib.sh"
command -v script >/dev/null || skip "no script(1) to make a terminal"
start_coordinator coord
start_agent a 1
wait_hosts 1
printf 'x\033[31mred\033]0;owned\007 c1=\302\233 lone=\233 cr=\rtab=\tend é 日本\n' >"$WORK/line"
JOBCMD=(cat "$WORK/line")
ESC='x\x1b[31mred\x1b]0;owned\x07 c1=\xc2\x9b lone=\x9b cr=\x0dtab=	end é 日本'

# on_tty OUT CMD...: runs CMD with a terminal as stdout and stderr, its
# output (CRLF made LF by the terminal, back to LF) in OUT.
on_tty() {
  local out=$1; shift
  script -qec "$(printf '%q ' "$@")" /dev/null </dev/null | sed 's/\r$//' >"$out"
}
# no_controls FILE: no ESC, BEL, CR, C1 or lone \x9b byte in FILE
no_controls() { ! LC_ALL=C grep -q "$(printf '[\033\007\r\233]')" "$1"; }

note "kolo run: a terminal gets visible escapes"
on_tty "$WORK/run.tty" "$KOLO" run -np 1 --coordinator "$RPC" -- "${JOBCMD[@]}"
no_controls "$WORK/run.tty" || fail "control bytes reached the terminal: $(od -c "$WORK/run.tty" | head)"
grep -qF -- "[0]<stdout>:$ESC" "$WORK/run.tty" || fail "not escaped as expected: $(cat -A "$WORK/run.tty")"
JOB=$(curl -sf "$HTTP/api/v1/jobs" | grep -o '"id":[0-9]*' | head -n 1 | cut -d: -f2)

note "kolo run into a file: the exact bytes"
"$KOLO" run -np 1 --coordinator "$RPC" -- "${JOBCMD[@]}" >"$WORK/run.file" 2>/dev/null
{ printf '[0]<stdout>:'; cat "$WORK/line"; } | cmp - "$WORK/run.file" ||
  fail "the bytes were changed in a file: $(cat -A "$WORK/run.file")"

note "kolo run --raw on a terminal: the exact bytes"
on_tty "$WORK/raw.tty" "$KOLO" run --raw -np 1 --coordinator "$RPC" -- "${JOBCMD[@]}"
grep -qF "$(printf '\033]0;owned\007')" "$WORK/raw.tty" || fail "--raw escaped: $(cat -A "$WORK/raw.tty")"

note "kolo logs: escaped on a terminal, exact into a pipe, exact with --raw"
on_tty "$WORK/logs.tty" "$KOLO" logs --coordinator "$RPC" "$JOB"
no_controls "$WORK/logs.tty" || fail "kolo logs let control bytes through: $(od -c "$WORK/logs.tty" | head)"
grep -qF -- "[0]<stdout>:$ESC" "$WORK/logs.tty" || fail "kolo logs: $(cat -A "$WORK/logs.tty")"
on_tty "$WORK/logs-rank.tty" "$KOLO" logs --rank 0 --coordinator "$RPC" "$JOB"
grep -qxF -- "$ESC" "$WORK/logs-rank.tty" || fail "kolo logs --rank: $(cat -A "$WORK/logs-rank.tty")"
"$KOLO" logs --coordinator "$RPC" "$JOB" | cat >"$WORK/logs.pipe"
{ printf '[0]<stdout>:'; cat "$WORK/line"; } | cmp - "$WORK/logs.pipe" ||
  fail "kolo logs changed the bytes in a pipe: $(cat -A "$WORK/logs.pipe")"
on_tty "$WORK/logs-raw.tty" "$KOLO" logs --raw --coordinator "$RPC" "$JOB"
grep -qF "$(printf '\033[31mred')" "$WORK/logs-raw.tty" || fail "logs --raw escaped: $(cat -A "$WORK/logs-raw.tty")"

note "kolo attach: escaped on a terminal"
on_tty "$WORK/attach.tty" "$KOLO" attach --coordinator "$RPC" "$JOB"
no_controls "$WORK/attach.tty" || fail "kolo attach let control bytes through: $(od -c "$WORK/attach.tty" | head)"
echo PASS
