#!/usr/bin/env bash
# TLS on the RPC and HTTP ports (issue 15, item 2), between two "hosts"
# (network namespaces joined by a veth pair), with a token and files made
# by scripts/tls-certs.sh:
#  - the coordinator listens on tls+tcp:// and https:// with --tls-dir;
#    agents in both namespaces register over TLS, and a 2-rank job
#    submitted with `kolo run --tls-dir` trains across them, every sum
#    checked; its workers reach the coordinator with the agent's files
#    (KOLO_TLS_*) and never see the CA's key;
#  - REST answers over HTTPS to a client that trusts the CA, and not to
#    plain HTTP;
#  - without TLS files, with another CA's files or with no client
#    certificate, `kolo status` and agents are refused, with a reason where
#    kolo can give one; the coordinator serves on;
#  - bad TLS flags are refused at start with the reason.
# Needs root, `ip netns`, veth and openssl; skipped (77) otherwise.
. "$(dirname "$0")/lib.sh"

/usr/bin/python3 -c "import numpy" 2>/dev/null || skip "no /usr/bin/python3 with numpy"
command -v openssl >/dev/null || { [ -n "${CI:-}" ] && fail "openssl missing"; skip "no openssl"; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$ROOT/python"
trap 'rc=$?; for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
      pkill -9 -f "allreduce_steps.py 30 0.05 $MARK" 2>/dev/null || true
      two_hosts_del; set +e; (exit $rc); cleanup' EXIT
two_hosts t 10.215.0
"$ROOT/scripts/tls-certs.sh" "$WORK/tls" localhost 127.0.0.1 "$ADDR0" >/dev/null
"$ROOT/scripts/tls-certs.sh" "$WORK/other" localhost 127.0.0.1 "$ADDR0" >/dev/null
make_token
CA="$WORK/tls/ca.pem"
in0() { ip netns exec "$NS0" "$@"; }
curl() { ip netns exec "$NS0" curl --cacert "$CA" "$@"; }

note "bad TLS flags are refused at start"
"$KOLO" coordinator --tls-cert "$WORK/tls/cert.pem" --db "$WORK/x.db" >"$WORK/bad.out" 2>&1 &&
  fail "a coordinator started with a certificate and no key or CA"
grep -q -- "--tls-ca" "$WORK/bad.out" || fail "no reason: $(cat "$WORK/bad.out")"
cp "$WORK/tls/key.pem" "$WORK/open-key.pem"
chmod 644 "$WORK/open-key.pem"
"$KOLO" coordinator --tls-dir "$WORK/tls" --tls-key "$WORK/open-key.pem" --db "$WORK/x.db" \
  >"$WORK/bad.out" 2>&1 && fail "a coordinator started with a key others can read"
grep -q "chmod 600" "$WORK/bad.out" || fail "no reason: $(cat "$WORK/bad.out")"

note "a coordinator and two agents over TLS"
KOLO="$WORK/kolo-ns0"
LISTEN="tcp://$ADDR0:0" LEASE=30s start_coordinator coord --token-file "$WORK/token" \
  --http "$ADDR0:0" --tls-dir "$WORK/tls"
case "$RPC" in tls+tcp://$ADDR0:*) ;; *) fail "RPC not on TLS: $RPC" ;; esac
case "$HTTP" in https://$ADDR0:*) ;; *) fail "HTTP not on TLS: $HTTP" ;; esac
start_agent a 1 --token-file "$WORK/token" --addr "$ADDR0" --tls-dir "$WORK/tls"
wait_hosts 1
KOLO="$WORK/kolo-ns1" start_agent b 1 --token-file "$WORK/token" --addr "$ADDR1" \
  --tls-dir "$WORK/tls"
wait_for 15 hosts_at_least 2 || fail "agent b did not register over TLS: $(tail -n 5 "$WORK/agent-b.log")"

note "REST over HTTPS only"
curl -sf "$HTTP/healthz" | has ok || fail "no /healthz over HTTPS"
plain="http://${HTTP#https://}"
command curl -sf --max-time 3 "$plain/healthz" >/dev/null 2>&1 &&
  fail "plain HTTP answered on the HTTPS port"
in0 env curl -sf --max-time 3 "$HTTP/healthz" >/dev/null 2>&1 &&
  fail "HTTPS was trusted by a client without the CA"
true

note "a 2-rank job across the namespaces, submitted over TLS"
"$WORK/kolo-ns1" run -np 2 -H a:1,b:1 --coordinator "$RPC" --token-file "$WORK/token" \
  --tls-dir "$WORK/tls" -- /usr/bin/python3 "$ROOT/tests/integration/data/allreduce_steps.py" \
  30 0.05 "$MARK" >"$WORK/run.out" 2>"$WORK/run.err" ||
  fail "the job failed: $(tail -n 20 "$WORK/run.err")"
[ "$(grep -c '<stdout>:done 30' "$WORK/run.out")" -eq 2 ] || fail "not every rank finished: $(cat "$WORK/run.out")"
! grep -q WRONG "$WORK/run.out" || fail "a wrong sum"
curl -sf "$HTTP/api/v1/jobs/1" | /usr/bin/python3 -c '
import json, sys
names = {r["host_name"] for r in json.load(sys.stdin)["ranks"]}
sys.exit(0 if names == {"a", "b"} else 1)' || fail "the job did not span both namespaces"

note "the workers' environment: the agent's files, not the CA's key"
"$WORK/kolo-ns1" run -np 1 -H a:1 --coordinator "$RPC" --token-file "$WORK/token" \
  --tls-dir "$WORK/tls" -- env >"$WORK/env.out" 2>&1 || fail "env job failed: $(cat "$WORK/env.out")"
grep -q ":KOLO_TLS_CA=$WORK/tls/ca.pem$" "$WORK/env.out" || fail "no KOLO_TLS_CA: $(cat "$WORK/env.out")"
grep -q ":KOLO_TLS_KEY=$WORK/tls/key.pem$" "$WORK/env.out" || fail "no KOLO_TLS_KEY"
! grep -q "ca-key" "$WORK/env.out" || fail "the CA's key reached the job"

note "clients without the cluster's TLS files are refused"
st() { timeout 20 "$WORK/kolo-ns1" status --coordinator "$1" --token-file "$WORK/token" --timeout 2s "${@:2}"; }
st "$RPC" --tls-dir "$WORK/tls" >"$WORK/st.out" 2>&1 || fail "status over TLS failed: $(cat "$WORK/st.out")"
grep -q "^coordinator tls+tcp://" "$WORK/st.out" || fail "status: $(cat "$WORK/st.out")"
st "$RPC" >"$WORK/st.out" 2>&1 && fail "status without TLS files worked"
grep -q -- "--tls-ca" "$WORK/st.out" || fail "no reason: $(cat "$WORK/st.out")"
st "tcp://${RPC#tls+tcp://}" >"$WORK/st.out" 2>&1 && fail "plain TCP reached the TLS port"
st "$RPC" --tls-dir "$WORK/other" >"$WORK/st.out" 2>&1 && fail "another CA's client was let in"
st "$RPC" --tls-ca "$CA" >"$WORK/st.out" 2>&1 && fail "a client without a certificate was let in"
KOLO="$WORK/kolo-ns1" start_agent c 1 --token-file "$WORK/token" --addr "$ADDR1" \
  --tls-dir "$WORK/other"
sleep 3
hosts_exactly 2 || fail "an agent of another CA registered"
curl -sf "$HTTP/healthz" | has ok || fail "the coordinator stopped serving"
note "ok"
