#!/usr/bin/env bash
# A real Prometheus (Debian's prometheus package) scrapes a coordinator's
# /metrics while a 2-rank job trains (data/prom_worker.py: its last rank is
# slowed down on purpose), with deploy/prometheus/kolo-alerts.yml loaded;
# the PromQL queries docs/observability.md gives for step time, samples/s,
# the straggler rank, resets and store health return kolo's series,
# asked through Prometheus's HTTP API.
#
# Skips (77) when prometheus or promtool is not installed
# (scripts/install-deps.sh --test installs them).
. "$(dirname "$0")/lib.sh"
use_python
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
RULES="$ROOT/deploy/prometheus/kolo-alerts.yml"
PROM=${PROMETHEUS:-$(command -v prometheus || true)}
PROMTOOL=${PROMTOOL:-$(command -v promtool || true)}
if [ -z "$PROM" ] || [ -z "$PROMTOOL" ]; then
  echo "skipped: no prometheus/promtool binary (apt-get install prometheus, or scripts/install-deps.sh --test)"
  exit 77
fi

"$PROMTOOL" check rules "$RULES" >"$WORK/promtool.out" 2>&1 ||
  fail "promtool check rules $RULES: $(cat "$WORK/promtool.out")"
note "$(grep -o 'SUCCESS.*' "$WORK/promtool.out")"

start_coordinator coord
start_agent a 2
wait_hosts 1
"$KOLO" run -np 2 --coordinator "$RPC" -- /usr/bin/python3 \
    "$ROOT/tests/integration/data/prom_worker.py" "$WORK/stop" "$SLEEP" \
    >"$WORK/run.out" 2>"$WORK/run.err" &
RUN_PID=$!
PIDS+=("$RUN_PID")

# a free port for Prometheus (it cannot report the one it got for :0)
PORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$WORK/prometheus.yml" <<CONF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["$RULES"]
scrape_configs:
  - job_name: kolo
    static_configs: [{targets: ["${HTTP#http://}"]}]
CONF
"$PROM" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$PORT" --log.level=warn >"$WORK/prom.log" 2>&1 &
PIDS+=("$!")
PROM_URL="http://127.0.0.1:$PORT"
wait_for 30 curl -sf "$PROM_URL/-/ready" || fail "prometheus did not start: $(tail -n 5 "$WORK/prom.log")"

# query PROMQL: the instant query's result as JSON lines "labels value"
query() {
  curl -sf --get "$PROM_URL/api/v1/query" --data-urlencode "query=$1" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"] == "success", d
for r in d["data"]["result"]:
    print(json.dumps(r["metric"], sort_keys=True), r["value"][1])'
}
# expect SECONDS WHAT PROMQL AWK_CONDITION: waits until a result line's
# value passes the condition (on $NF), e.g. '$NF > 0'
expect() {
  local secs=$1 what=$2 q=$3 cond=$4
  ok() { query "$q" | awk "$cond { found = 1 } END { exit !found }"; }
  wait_for "$secs" ok || fail "$what: '$q' gave: $(query "$q" 2>&1 | head -n 5)"
  note "$what: $q -> $(query "$q" | head -n 2 | tr '\n' ' ')"
}

expect 30 "coordinator scraped" 'up{job="kolo"}' '$NF == 1'
expect 30 "step time per host" 'kolo_step_duration_seconds' '/"host": "a"/ && $NF > 0'
expect 30 "samples/s of the last epoch" 'kolo_job_samples_per_second' '/"job_name": "prom_worker.py"/ && $NF > 0'
expect 40 "the straggler is the slowed rank" 'kolo_job_straggler_rank' '$NF == 1'
expect 10 "resets (generations)" 'kolo_job_generation' '/"job_id": "1"/ && $NF == 1'
expect 10 "membership changes" 'sum(increase(kolo_membership_changes_total[5m]))' '$NF >= 0'
expect 10 "store health" 'kolo_store_degraded' '$NF == 0'
expect 10 "job progress age" 'kolo_job_last_step_age_seconds' '$NF >= 0 && $NF < 60'
expect 10 "stalled ops" 'kolo_job_stall_seconds' '$NF >= 0'

# the rules loaded, evaluated, and none fires on a healthy cluster
rules=$(curl -sf "$PROM_URL/api/v1/rules")
/usr/bin/python3 -c '
import json, sys
d = json.loads(sys.argv[1])
rules = [r for g in d["data"]["groups"] for r in g["rules"]]
names = {r["name"] for r in rules}
want = {"KoloCoordinatorDown", "KoloJobStalled", "KoloRankFrozen", "KoloStoreDegraded"}
assert want <= names, names
bad = [r["name"] for r in rules if r["health"] == "err"]
assert not bad, bad
firing = [r["name"] for r in rules if r["state"] != "inactive"]
assert not firing, firing
' "$rules" || fail "the alerting rules: $rules"
note "alerting rules loaded and quiet"

touch "$WORK/stop"
gone() { ! kill -0 "$1" 2>/dev/null; }
wait_for 30 gone "$RUN_PID" || fail "the job did not end at the stop file"
wait "$RUN_PID" || fail "kolo run exited $?: $(tail -n 5 "$WORK/run.err")"
