#!/usr/bin/env bash
# soak.sh - a long elastic job under faults, watching the daemons' memory
# and descriptors: a coordinator and three agents (one slot each), an
# elastic job (tests/python/elastic_worker.py, a commit every 5 steps), a
# worker SIGKILLed every KILL_EVERY seconds (seeded; each kill excludes its
# host for 1-2 s, the job shrinks and grows back), for SOAK_MIN minutes.
# Every 30 s it samples RSS and open descriptors of the coordinator and
# the agents, and the coordinator's SQLite cache (kolo_store_cache_bytes:
# it fills as the database grows, up to SQLite's cap of 2 MB). Passes
# when every reset was survived, no kill lost more steps than the commit
# interval, no worker is left behind, and neither the descriptors nor the
# RSS (less that cache) of any daemon grew more than 5% from the first
# sample after warm-up to the mean of the last three.
#
#   KOLO=build/bin/kolo SOAK_MIN=30 bash tests/faults/soak.sh
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/../integration/elastic_lib.sh"
SOAK_MIN=${SOAK_MIN:-30}
KILL_EVERY=${KILL_EVERY:-20}
COMMIT=5

start_coordinator coord
AGENTS=()
for h in a b c; do start_agent $h 1; AGENTS+=("$AGENT_PID"); done
wait_for 10 hosts_at_least 3 || fail "3 agents did not register"
start_job -np 3 --min-np 2 --max-np 3 --blacklist-cooldown-range 1 2 --elastic-timeout 60 -- \
    --steps 100000000 --commit $COMMIT --delay 0.05
wait_for 60 progressed 10 || fail "the job did not start training"

sample() { # pid [cache_kb] -> "rss_kb fds cache_kb"
  echo "$(awk '/VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0) $(ls "/proc/$1/fd" 2>/dev/null | wc -l) ${2:-0}"
}
store_cache_kb() {
  curl -sf "$HTTP/metrics" | awk '$1 == "kolo_store_cache_bytes" { printf "%d", $2 / 1024 }'
}
heap_kb() { # the coordinator's allocator: "in-use-kB held-free-kB"
  curl -sf "$HTTP/metrics" | awk '$1 == "kolo_heap_in_use_bytes" { u = $2 }
    $1 == "kolo_heap_free_bytes" { f = $2 } END { printf "%d %d", u / 1024, f / 1024 }'
}
: >"$WORK/samples"
t_end=$(( $(date +%s) + SOAK_MIN * 60 ))
next_kill=$(( $(date +%s) + KILL_EVERY ))
next_sample=$(date +%s)
kills=0
while [ "$(date +%s)" -lt "$t_end" ]; do
  now=$(date +%s)
  if [ "$now" -ge "$next_sample" ]; then
    line="$now coord $(sample "$COORD_PID" "$(store_cache_kb)")"
    for i in "${!AGENTS[@]}"; do line="$line agent$i $(sample "${AGENTS[$i]}")"; done
    echo "$line" >>"$WORK/samples"
    echo "$now $(heap_kb)" >>"$WORK/heap"
    next_sample=$(( now + 30 ))
  fi
  if [ "$now" -ge "$next_kill" ] && gen_size_is 3; then
    pids=($(worker_pids))
    if [ ${#pids[@]} -gt 0 ]; then
      victim=${pids[$(( RANDOM % ${#pids[@]} ))]}
      fault worker_kill "pid $victim"
      kill -9 "$victim" 2>/dev/null || true
      kills=$(( kills + 1 ))
    fi
    next_kill=$(( now + KILL_EVERY ))
  fi
  gone "$RUN_PID" && fail "the job ended during the soak: $(tail -n 5 "$WORK/run.err")"
  sleep 1
done
note "$kills kills in $SOAK_MIN min; step $(last_step)"
note "samples (unix time, then name RSS-kB fds SQLite-cache-kB per daemon):"
sed 's/^/  sample /' "$WORK/samples"
note "the coordinator's heap (unix time, in-use kB, freed-but-held kB):"
sed 's/^/  heap /' "$WORK/heap"
finish_job 120
report soak --commit $COMMIT --max-lost $COMMIT
"$PY" - "$WORK/samples" <<'PY' || fail "a daemon grew"
import json, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
# after warm-up: the second sample on (the first is taken before any kill)
base, tail = rows[1] if len(rows) > 1 else rows[0], rows[-3:]
out, bad = {}, []
mean = lambda k: sum(int(r[k]) for r in tail) / len(tail)
for k in range(1, len(base), 4):
    name = base[k]
    b_rss, b_fd, b_cache = int(base[k + 1]), int(base[k + 2]), int(base[k + 3])
    e_rss, e_fd, e_cache = mean(k + 1), mean(k + 2), mean(k + 3)
    g_raw = (e_rss - b_rss) / b_rss * 100
    b_own, e_own = b_rss - b_cache, e_rss - e_cache  # RSS less the SQLite cache
    g_rss, g_fd = (e_own - b_own) / b_own * 100, (e_fd - b_fd) / b_fd * 100
    out[name] = {"rss_kb": [b_rss, round(e_rss)], "rss_growth_pct": round(g_raw, 1),
                 "sqlite_cache_kb": [b_cache, round(e_cache)],
                 "rss_less_cache_growth_pct": round(g_rss, 1),
                 "fds": [b_fd, round(e_fd, 1)], "fd_growth_pct": round(g_fd, 1)}
    print("  %-7s RSS %6d -> %6.0f kB (%+.1f%%; SQLite cache %d -> %.0f kB, the rest %+.1f%%), "
          "fds %3d -> %5.1f (%+.1f%%)"
          % (name, b_rss, e_rss, g_raw, b_cache, e_cache, g_rss, b_fd, e_fd, g_fd))
    if g_rss > 5 or g_fd > 5:
        bad.append(name)
print("SOAK " + json.dumps({"samples": len(rows), "daemons": out}))
sys.exit(1 if bad else 0)
PY
echo PASS
