#!/usr/bin/env bash
# An ended job keeps its record, not its working state (issue 15, F12): the
# coordinator's memory stops growing with finished jobs. 60 jobs of real
# ranks (the C allreduce example, np 2) warm it up (SQLite's page cache
# fills), 60 more may add only a few kB each (it was ~90 kB a job, 5 MB
# over 60). The waits allow for a machine busy with other tests: a job
# takes 0.2 s alone and several times that under load.
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
submit 60
wait_for 150 succeeded 60 || fail "the first 60 jobs did not all succeed"
sleep 1
rss1=$(rss_kb)
submit 60
wait_for 150 succeeded 120 || fail "the next 60 jobs did not all succeed"
sleep 1
rss2=$(rss_kb)
per_job=$(( (rss2 - rss1) / 60 ))
note "coordinator RSS ${rss1} kB after 60 jobs, ${rss2} kB after 120: ${per_job} kB a job"
[ "$per_job" -lt 10 ] || fail "memory grows by ${per_job} kB per finished job"
echo PASS
