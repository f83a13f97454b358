#!/usr/bin/env bash
# A kolo tune study on the dashboard in a real browser: a coordinator with
# a token, one agent of 4 slots, and `kolo tune` on that cluster (8 trials
# of a small script, 2 at once, the median pruner; some values of x are
# hopeless, so trials get pruned); test_study.mjs drives Debian's chromium
# through the studies list, the study page while the search runs and after,
# and a trial's job page. Screenshots land in $KOLO_ARTIFACTS.
#
# Skips (77) without chromium, node, playwright-core or optuna, unless CI
# is set: CI installs them, so there it fails.
. "$(cd "$(dirname "$0")" && pwd)/browser_lib.sh" study optuna
token_cluster 4

# loss = (x - 0.3)^2 + 1/(epoch + 1) over 4 epochs; the marker makes the
# trials this test's own (lib.sh reaps what is left)
cat >"$WORK/quad.py" <<PY
import sys, time
import kolo
x = float(sys.argv[1])
kolo.init()
for epoch in range(4):
    time.sleep(0.4)
    kolo.report_epoch(epoch, samples=10, metrics={"loss": (x - 0.3) ** 2 + 1.0 / (epoch + 1)})
kolo.shutdown()
PY
printf 'x: [choice, 0.25, 0.3, 0.4, 3.0, 4.0]\n' >"$WORK/space.yaml"
STUDY="web study é"
"$KOLO" tune --coordinator "$RPC" --http "$HTTP" --token-file "$WORK/token" --study "$STUDY" \
    --dir "$WORK/study" --trials 8 --np 1 --max-concurrent 2 --space "$WORK/space.yaml" \
    --metric loss --mode min --sampler random --pruner median --seed 4 -- \
    "$PY" "$WORK/quad.py" "{x}" "$SLEEP" >"$WORK/tune.out" 2>"$WORK/tune.err" &
TUNE_PID=$!
PIDS+=("$TUNE_PID")
study_listed() { curl -sf "$HTTP/api/v1/studies" | has '"trial_count"'; }
wait_for 30 study_listed || fail "the study did not appear: $(cat "$WORK/tune.err")"
note "study running, dashboard $HTTP/#/studies"

rc=0
node "$HERE/test_study.mjs" "$HTTP" "$STUDY" "$ARTIFACTS" "$WORK/tune.done" &
NODE_PID=$!
gone() { ! kill -0 "$1" 2>/dev/null; }
wait_for 120 gone "$TUNE_PID" || fail "kolo tune did not finish"
wait "$TUNE_PID" || fail "kolo tune exited $?: $(tail -n 5 "$WORK/tune.err")"
touch "$WORK/tune.done"  # the page's final checks wait for it
wait "$NODE_PID" || rc=$?
[ $rc -eq 0 ] || fail "the browser checks failed (screenshots in $ARTIFACTS)"
grep -q "pruned" "$WORK/tune.out" || fail "no trial was pruned: $(cat "$WORK/tune.out")"
cat "$WORK/tune.out"
note "screenshots in $ARTIFACTS"
