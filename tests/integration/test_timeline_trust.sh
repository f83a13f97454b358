#!/usr/bin/env bash
# Issue 28: a timeline path never makes the coordinator create a file. A
# root coordinator with a token, an agent (and so the job) running as
# nobody: rank 1 asks for a timeline in a directory only root may write,
# rank 0 for one in its own directory. The coordinator writes both into a
# directory of its own (<db>.timelines, 0700) under names it chooses;
# nothing appears in root's directory; rank 0's copy appears at its path,
# owned by nobody, with the ops; the text a job chose (a tensor name with
# quotes, a newline and a slash) stays inside a JSON string.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1 ||
  skip "needs root, setpriv and the user nobody"
use_python
/usr/bin/python3 -c "import torch" 2>/dev/null || skip "needs torch"
chmod 755 "$WORK"

make_token
start_coordinator coord --token-file "$WORK/token"
mkdir -p "$WORK/agent" "$WORK/job" "$WORK/rootonly"
chmod 700 "$WORK/rootonly"
cp "$WORK/token" "$WORK/agent/token"
chown -R nobody "$WORK/agent" "$WORK/job"
# setpriv itself, not a function: $! is then the agent (setpriv execs it)
setpriv --reuid=nobody --regid=nogroup --clear-groups "$KOLO" agent --coordinator "$RPC" \
  --slots 2 --name n --state-dir "$WORK/agent/state" \
  --token-file "$WORK/agent/token" >"$WORK/agent.out" 2>"$WORK/agent.log" &
PIDS+=("$!")
wait_hosts 1

cat >"$WORK/job/tl.py" <<'PY'
import sys
import torch
import kolo.torch as hvd

hvd.init()
if hvd.rank() == 1:
    hvd.start_timeline(sys.argv[1])  # a path only root may write: a label, no more
hvd.barrier()
hvd.allreduce(torch.ones(3), name="first")
hvd.barrier()
if hvd.rank() == 1:
    hvd.stop_timeline()
hvd.barrier()
hvd.start_timeline(sys.argv[2])  # every rank, as Horovod scripts do: rank 0 keeps the copy
hvd.allreduce(torch.ones(3), name='evil"\n/../x')
hvd.allreduce(torch.ones(3), name="plain")
hvd.barrier()
hvd.stop_timeline()
print("done", flush=True)
PY
(cd "$WORK/job" && "$KOLO" run --coordinator "$RPC" --token-file "$WORK/token" -np 2 -- \
  /usr/bin/python3 tl.py "$WORK/rootonly/ld.so.preload" "$WORK/job/copy.json" \
  >"$WORK/run.out" 2>"$WORK/run.err") || fail "the job failed: $(tail -20 "$WORK/run.err")"
[ "$(grep -c '<stdout>:done' "$WORK/run.out")" -eq 2 ] || fail "$(cat "$WORK/run.out")"

note "nothing in root's directory; the coordinator's own files, 0700 and 0600"
[ -z "$(ls -A "$WORK/rootonly")" ] || fail "a file appeared in root's directory: $(ls -la "$WORK/rootonly")"
dir="$WORK/coord.db.timelines"
[ -d "$dir" ] && [ "$(stat -c %a "$dir")" = 700 ] || fail "no 0700 timeline directory: $(ls -la "$WORK")"
n=$(find "$dir" -name 'job-1-*.json' -perm 600 | wc -l)
[ "$n" -eq 2 ] || fail "the coordinator wrote no timeline of its own: $(ls -la "$dir")"

note "rank 0's copy at its path, as nobody, a JSON array with the ops"
[ -f "$WORK/job/copy.json" ] || fail "no copy at rank 0's path: $(tail -5 "$WORK/run.err")"
[ "$(stat -c %U "$WORK/job/copy.json")" = nobody ] || fail "the copy is not nobody's"
/usr/bin/python3 - "$WORK/job/copy.json" <<'PY' || fail "the copy is not the trace"
import json, sys
evs = json.load(open(sys.argv[1]))
names = {e["args"]["name"] for e in evs if e.get("name") == "process_name" and e["ph"] == "M"}
assert 'evil"\n/../x' in names and "plain" in names, names
PY
echo PASS
