#!/usr/bin/env bash
# kolo run takes horovodrun's flags: the variables they set reach the
# workers, --hostfile and --output-filename work, ignored flags say so and
# the run goes on, --config-file applies under the flags, bad values exit 2.
. "$(dirname "$0")/lib.sh"
export XDG_STATE_HOME="$WORK/state"
cd "$WORK"
# Variables the flags could set; the test's own environment must not.
for v in HOROVOD_FUSION_THRESHOLD KOLO_FUSION_THRESHOLD HOROVOD_CYCLE_TIME HOROVOD_CACHE_CAPACITY \
         HOROVOD_STALL_CHECK_DISABLE HOROVOD_STALL_CHECK_TIME_SECONDS \
         HOROVOD_STALL_SHUTDOWN_TIME_SECONDS HOROVOD_TIMELINE HOROVOD_LOG_LEVEL KOLO_LOG_LEVEL \
         HOROVOD_START_TIMEOUT KOLO_CONFIG; do
  unset "$v"
done
SHOW_ENV='env | grep -E "^(HOROVOD_|KOLO_FUSION|KOLO_LOG)" | sort'

# run NAME ARGS...: kolo run that must succeed, output in NAME.out/.err.
run() {
  local name=$1; shift
  "$KOLO" run "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" \
    || fail "kolo run $*: exit $?: $(cat "$WORK/$name.err")"
}
# usage NAME MESSAGE ARGS...: kolo run that must exit 2 saying MESSAGE.
usage() {
  local name=$1 msg=$2 rc=0; shift 2
  "$KOLO" run "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  [ $rc -eq 2 ] || fail "kolo run $*: exit $rc, want 2: $(cat "$WORK/$name.err")"
  grep -qF -- "$msg" "$WORK/$name.err" || fail "kolo run $*: no '$msg' in: $(cat "$WORK/$name.err")"
}
# sees FILE RANK LINE: the rank printed exactly LINE on stdout.
sees() { grep -qxF "[$2]<stdout>:$3" "$WORK/$1.out" || fail "$1: rank $2 lacks '$3': $(cat "$WORK/$1.out")"; }
lacks() { ! grep -qF "$2" "$WORK/$1.out" || fail "$1: has '$2'"; }

note "flags become the job's environment, over inherited values"
HOROVOD_FUSION_THRESHOLD=1 KOLO_FUSION_THRESHOLD=1 HOROVOD_CACHE_CAPACITY=99 \
run env -np 2 --fusion-threshold-mb 32 --cycle-time-ms 2.5 --cache-capacity 512 --no-stall-check \
  --stall-check-warning-time-seconds 7 --stall-check-shutdown-time-seconds 9 \
  --timeline-filename "$WORK/tl.json" --log-level WARNING -- sh -c "$SHOW_ENV"
for r in 0 1; do
  sees env $r HOROVOD_FUSION_THRESHOLD=33554432
  sees env $r KOLO_FUSION_THRESHOLD=33554432
  sees env $r HOROVOD_CYCLE_TIME=2.5
  sees env $r HOROVOD_CACHE_CAPACITY=512
  sees env $r HOROVOD_STALL_CHECK_DISABLE=1
  sees env $r HOROVOD_STALL_CHECK_TIME_SECONDS=7
  sees env $r HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=9
  sees env $r "HOROVOD_TIMELINE=$WORK/tl.json"
  sees env $r HOROVOD_LOG_LEVEL=WARNING
  sees env $r KOLO_LOG_LEVEL=warn
done
[ "$(grep -c 'CAPACITY' "$WORK/env.out")" -eq 2 ] || fail "a variable appears twice: $(cat "$WORK/env.out")"
! grep -q "does not write a timeline" "$WORK/env.err" || fail "a stale timeline note"

note "without flags nothing is added and inherited values pass"
HOROVOD_CYCLE_TIME=3 run plain -np 1 --log-level error -- sh -c "$SHOW_ENV"
sees plain 0 HOROVOD_CYCLE_TIME=3
lacks plain FUSION
lacks plain STALL
sees plain 0 HOROVOD_LOG_LEVEL=ERROR
run fatal -np 1 --log-level Fatal --stall-check --num-proc 1 -- sh -c "$SHOW_ENV"
sees fatal 0 HOROVOD_LOG_LEVEL=FATAL
sees fatal 0 KOLO_LOG_LEVEL=error
sees fatal 0 HOROVOD_STALL_CHECK_DISABLE=0

note "--hostfile, with one dash too"
printf '# the hosts\n\nlocalhost   slots=2  # one agent\n' >hosts.txt
run hostfile -np 2 -hostfile hosts.txt -- sh -c 'echo $KOLO_RANK $HOROVOD_HOSTNAME'
sees hostfile 0 "0 localhost"
sees hostfile 1 "1 localhost"
run hostfile2 -np 1 --hostfile=hosts.txt -- true
usage both "-H/--hosts and --hostfile cannot be used together" -np 1 -H localhost:1 --hostfile hosts.txt -- true
printf 'localhost slots=two\n' >bad-hosts.txt
usage badhosts "bad-hosts.txt:1: expected '<host> slots=<n>'" -np 1 --hostfile bad-hosts.txt -- true
usage nohosts "no such file" -np 1 --hostfile missing.txt -- true
usage fewslots "has 2 slot(s) but np is 3" -np 3 --hostfile hosts.txt -- true

note "--output-filename writes rank.<N>/stdout and stderr, and output is still printed"
run output -np 11 --output-filename outdir -- sh -c 'echo "out $KOLO_RANK"; echo "err $KOLO_RANK" >&2; echo "more $KOLO_RANK"'
[ "$(ls outdir | tr '\n' ' ')" = "rank.00 rank.01 rank.02 rank.03 rank.04 rank.05 rank.06 rank.07 rank.08 rank.09 rank.10 " ] \
  || fail "rank directories: $(ls outdir)"
for r in 0 7 10; do
  d=$(printf 'outdir/rank.%02d' $r)
  [ "$(cat "$d/stdout")" = "$(printf 'out %d\nmore %d' $r $r)" ] || fail "$d/stdout: $(cat "$d/stdout")"
  [ "$(cat "$d/stderr")" = "err $r" ] || fail "$d/stderr: $(cat "$d/stderr")"
  sees output $r "out $r"
  grep -qxF "[$r]<stderr>:err $r" output.err || fail "rank $r stderr not printed"
done
run output1 -np 1 --output-filename outdir1 -- true
[ -f outdir1/rank.0/stdout ] && [ ! -s outdir1/rank.0/stdout ] && [ -f outdir1/rank.0/stderr ] \
  || fail "a silent rank's files: $(ls -R outdir1)"
[ "$(stat -c %a outdir/rank.07/stdout)" = 600 ] || fail "output file mode $(stat -c %a outdir/rank.07/stdout)"

note "ignored flags print a note, take their values, and the run goes on"
run ignored -np 1 -p 22 -i id_rsa --network-interface eth0 --network-interfaces eth0,eth1 --gloo \
  --mpi --jsrun --mpi-args="--map-by ppr:6:node" --tcp --binding-args x --mpi-threads-disable \
  --num-nccl-streams 2 --thread-affinity 1 --gloo-timeout-seconds 30 --disable-cache \
  --hierarchical-allreduce --no-hierarchical-allgather --torus-allreduce --autotune \
  --autotune-log-file at.csv --autotune-warmup-samples 3 --autotune-steps-per-sample 10 \
  --autotune-bayes-opt-max-samples 20 --autotune-gaussian-process-noise 0.8 \
  --timeline-mark-cycles --log-without-timestamp -prefix-timestamp echo ran
sees ignored 0 ran
grep -qxF "[kolo] --ssh-port is not needed by kolo (no SSH: kolo agents start the workers); ignored" ignored.err \
  || fail "no ssh note: $(cat ignored.err)"
for f in ssh-identity-file network-interfaces gloo mpi jsrun mpi-args tcp binding-args \
         mpi-threads-disable num-nccl-streams thread-affinity gloo-timeout-seconds disable-cache \
         hierarchical-allreduce hierarchical-allgather torus-allreduce autotune autotune-log-file \
         autotune-warmup-samples autotune-steps-per-sample autotune-bayes-opt-max-samples \
         autotune-gaussian-process-noise timeline-mark-cycles log-without-timestamp \
         prefix-output-with-timestamp; do
  [ "$(grep -c "^\[kolo\] --$f is not needed by kolo (.*); ignored$" ignored.err)" -eq 1 ] \
    || fail "--$f: want one note: $(cat ignored.err)"
done
usage cooldown "blacklist-cooldown-range: '5 2' is not LO HI" -np 1 --blacklist-cooldown-range 5 2 -- true
usage elastic-sizes "min-np <= np <= max-np" -np 2 --min-np 3 -- true

note "--config-file applies, flags and the environment win over it"
cat >hvd.yaml <<'EOF'
# a horovodrun config file
---
fusion_threshold_mb: 16   # MiB
cycle_time_ms: 5
verbose: true
hostfile: "hosts.txt"
params:
  cache_capacity: 256
  hierarchical_allreduce: false
stall_check:
  enabled: false
  warning_time_seconds: 30
logging:
  level: DEBUG
EOF
run config -np 2 --config-file hvd.yaml --cycle-time-ms 1 -- sh -c "$SHOW_ENV"
sees config 0 HOROVOD_FUSION_THRESHOLD=16777216
sees config 1 HOROVOD_CYCLE_TIME=1
sees config 0 HOROVOD_CACHE_CAPACITY=256
sees config 0 HOROVOD_STALL_CHECK_DISABLE=1
sees config 0 HOROVOD_STALL_CHECK_TIME_SECONDS=30
sees config 0 HOROVOD_LOG_LEVEL=DEBUG
grep -qF "[kolo] job 1 submitted" config.err || fail "verbose: true did not apply: $(cat config.err)"
grep -q -- "--hierarchical-allreduce is not needed" config.err || fail "no note for an ignored key"
KOLO_LOG_LEVEL=info run config2 -np 1 --config-file=hvd.yaml --no-verbose --stall-check \
  -H localhost:1 -- sh -c "$SHOW_ENV"
sees config2 0 HOROVOD_STALL_CHECK_DISABLE=0
sees config2 0 KOLO_LOG_LEVEL=info
! grep -qF "[kolo] job 1 submitted" config2.err || fail "--no-verbose lost to the config file"
printf 'fusion_threshold_mb: 8\nbogus_knob: 1\n' >bad1.yaml
usage yaml1 "config-file bad1.yaml:2: unknown setting 'bogus_knob'" -np 1 --config-file bad1.yaml -- true
printf 'fusion_threshold_mb: lots\n' >bad2.yaml
usage yaml2 "fusion-threshold-mb: 'lots' is not an integer (from config-file bad2.yaml:1)" \
  -np 1 --config-file bad2.yaml -- true
printf 'params:\n  cache_capacity: [1, 2]\n' >bad3.yaml
usage yaml3 "bad3.yaml:2: only plain values" -np 1 --config-file bad3.yaml -- true

note "--start-timeout: a plain number is seconds, units work, HOROVOD_START_TIMEOUT is the fallback"
"$KOLO" run -np 1 --start-timeout 45 --dump-config | has '^start-timeout = 45s$' || fail "45"
"$KOLO" run -np 1 --start-timeout 1500ms --dump-config | has '^start-timeout = 1500ms$' || fail "1500ms"
HOROVOD_START_TIMEOUT=12 "$KOLO" run -np 1 --dump-config | has '^start-timeout = 12s$' || fail "env"
t0=$(now_ms)
rc=0; HOROVOD_START_TIMEOUT=1 "$KOLO" run -np 2 --slots 1 -- true >late.out 2>&1 || rc=$?
t1=$(now_ms)
[ $rc -ne 0 ] || fail "np 2 on 1 slot should time out"
[ $((t1 - t0)) -ge 900 ] && [ $((t1 - t0)) -lt 5000 ] || fail "start timeout took $((t1 - t0)) ms"

note "bad values exit 2 with a message"
usage badmb "fusion-threshold-mb: 'abc' is not an integer" -np 1 --fusion-threshold-mb abc -- true
usage negmb "fusion-threshold-mb: -1 is out of range" -np 1 --fusion-threshold-mb -1 -- true
usage badlvl "log-level: 'loud' is not a level" -np 1 --log-level loud -- true
usage badto "start-timeout: 'soon' is not a duration" -np 1 --start-timeout soon -- true
usage badcyc "cycle-time-ms: 'fast' is not a number" -np 1 --cycle-time-ms fast -- true
usage badstall "stall-check-warning-time-seconds: 'x' is not an integer" -np 1 \
  --stall-check-warning-time-seconds x -- true

note "--version, --check-build, --help"
"$KOLO" run -v | has '^kolo [0-9]' || fail "-v"
"$KOLO" run --version | has '^kolo [0-9]' || fail "--version"
"$KOLO" run -cb >cb.out || fail "-cb"
grep -q '^    \[X\] PyTorch' cb.out && grep -q '^    \[X\] kolo coordinator' cb.out \
  && grep -q '^    \[X\] TCP ring' cb.out || fail "check-build: $(cat cb.out)"
"$KOLO" run --check-build | has 'NCCL' || fail "--check-build"
"$KOLO" run --help >help.out
for f in "-np, --num-proc" "-hostfile, --hostfile" "--fusion-threshold-mb" "--config-file" \
         "--output-filename" "--start-timeout <seconds>" "-cb, --check-build" \
         "Accepted for compatibility and ignored:" "-p, --ssh-port"; do
  grep -qF -- "$f" help.out || fail "--help lacks $f"
done
echo PASS
