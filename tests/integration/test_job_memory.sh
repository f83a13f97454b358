#!/usr/bin/env bash
# An ended job keeps its record, not its working state (issue 15, F12): the
# coordinator's memory stops growing with finished jobs. 100 jobs of real
# ranks (the C allreduce example, np 2) warm it up (SQLite's page cache
# fills), 100 more may add only a few kB each (it was ~90 kB a job).
. "$(dirname "$0")/lib.sh"
EXAMPLE="${KOLO_EXAMPLE:?}"
token_cluster 4
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$COORD_PID/status"; }
submit() {
  for _ in $(seq 1 "$1"); do
    curl -sf -o /dev/null -X POST -H "Authorization: Bearer $TOKEN" \
      -d "{\"argv\":[\"$EXAMPLE\"],\"np\":2}" "$HTTP/api/v1/jobs" || fail "submit refused"
  done
}
succeeded() { [ "$(curl -sf "$HTTP/api/v1/jobs" | grep -o '"state":"succeeded"' | wc -l)" -ge "$1" ]; }
submit 100
wait_for 120 succeeded 100 || fail "the first 100 jobs did not all succeed"
sleep 1
rss1=$(rss_kb)
submit 100
wait_for 120 succeeded 200 || fail "the next 100 jobs did not all succeed"
sleep 1
rss2=$(rss_kb)
per_job=$(( (rss2 - rss1) / 100 ))
note "coordinator RSS ${rss1} kB after 100 jobs, ${rss2} kB after 200: ${per_job} kB a job"
[ "$per_job" -lt 10 ] || fail "memory grows by ${per_job} kB per finished job"
echo PASS
