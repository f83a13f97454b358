"""Every route of the REST API (docs/api.md) against a real cluster: a
coordinator with a cluster token, one agent with 2 slots, and a 2-rank
kolo.torch job submitted with POST /api/v1/jobs that trains two short
epochs (report_epoch, DistributedOptimizer steps), commits two snapshots,
stalls one allreduce on purpose (rank 1 waits for a file) so /stalls and
the straggler fields have something to show, and writes a timeline.

For each route: the JSON shape (keys and types), 404 for unknown jobs and
routes, 400 with a message for bad parameters, 405 with Allow for wrong
methods, and the token on the routes that change state. Then a restarted
coordinator serves the timeline file of the finished job, which the test
tears, truncates, replaces and grows to check the repair and the limits.

Every wait has a deadline; every process is stopped at the end, failed or
not (the workers die with the agent: their exec shim asks for SIGTERM when
it does).
"""
import hashlib
import glob
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYDIR = os.path.join(ROOT, "python")
KOLO = os.environ.get("KOLO") or os.path.join(ROOT, "build", "bin", "kolo")

NOJOB = 987654  # a job id that does not exist
JOB_SUBS = ["", "/generations", "/output", "/events", "/snapshots", "/epochs", "/steps",
            "/ranks", "/stalls", "/timeline"]

WORKER = r'''
import os
import sys
import time

import torch
import kolo.torch as hvd
from kolo import _snapshot

hvd.init()
r = hvd.rank()
gate = sys.argv[1]


def wait_for(name):
    deadline = time.time() + 50
    while not os.path.exists(os.path.join(gate, name)):
        if time.time() > deadline:
            print("rank %d: no %s" % (r, name), flush=True)
            sys.exit(5)
        time.sleep(0.02)


model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for epoch in range(2):
    for step in range(5):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        time.sleep(0.02)
    hvd.report_epoch(epoch, samples=40, metrics={"loss": float(loss)})
    if r == 0:
        _snapshot.put(b"snapshot %d " % epoch * 50, {"epoch": epoch})
    print("rank %d epoch %d" % (r, epoch), flush=True)
    time.sleep(0.05)
# rank 0 asks first; the others wait for it until the test says go
if r == 1:
    wait_for("go1")
hvd.allreduce(torch.ones(2), name="rest.stall")
hvd.allreduce(torch.ones(2), name="rest.after")
hvd.stop_timeline()
print("rank %d past the stall" % r, flush=True)
wait_for("go2")
print("rank %d done" % r, flush=True)
'''


# ------------------------------------------------------------------ helpers

def request(base, method, path, body=None, token=None, timeout=10):
    """(status, headers, body bytes) of one request; never raises for HTTP
    errors."""
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(base + path, data=data, method=method)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def call(base, method, path, body=None, token=None):
    """(status, JSON body) of one request that must answer JSON."""
    st, hd, raw = request(base, method, path, body, token)
    assert hd.get("Content-Type", "").startswith("application/json"), (path, hd)
    assert hd.get("Cache-Control") == "no-store", (path, hd)
    return st, json.loads(raw.decode())


# The reader's key for GETs: a job's argv, cwd and output are its owner's
# (issue 28), so the suite reads as the token holder; test_reads_need_owner
# checks what others see.
READ_TOKEN = None


def get(base, path):
    return call(base, "GET", path, token=READ_TOKEN)


def is_int(v):
    return type(v) is int


def is_num(v):
    return type(v) in (int, float)


def check_shape(obj, spec, where):
    """spec: key -> predicate (or a type); every key must be there."""
    assert isinstance(obj, dict), (where, obj)
    for key, want in spec.items():
        assert key in obj, "%s: no %r in %r" % (where, key, obj)
        ok = want(obj[key]) if callable(want) and not isinstance(want, type) else \
            type(obj[key]) is want
        assert ok, "%s: %r is %r" % (where, key, obj[key])


def expect_error(base, method, path, status, body=None, token=None, allow=None, text=None):
    if token is None and method == "GET":
        token = READ_TOKEN
    st, hd, raw = request(base, method, path, body, token)
    assert st == status, (method, path, st, raw)
    if method != "HEAD":
        err = json.loads(raw.decode())
        assert err.get("status") == status and isinstance(err.get("error"), str) and err["error"], \
            (method, path, err)
        if text:
            assert re.search(text, err["error"]), (path, err)
    if allow is not None:
        assert hd.get("Allow") == allow, (method, path, hd.get("Allow"))
    return hd


def wait_until(what, fn, timeout=30, interval=0.05):
    """Polls fn until it returns something true; fails after timeout s."""
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(interval)


EVENT = {"id": is_int, "ts_ms": is_int, "kind": str, "message": str}
JOB_SUMMARY = {
    "id": is_int, "name": str, "state": str, "np": is_int,
    "exit_code": lambda v: v is None or is_int(v), "reason": str,
    "argv": lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
    "cwd": str, "hosts": str, "generation": is_int, "submitted_ms": is_int,
    "started_ms": is_int, "ended_ms": is_int, "ranks_alive": is_int, "output_lines": is_int,
    "elastic": bool, "metadata": dict,
}
HOST = {
    "id": str, "name": str, "hostname": str, "addr": str,
    "state": lambda v: v in ("alive", "lost", "drained"), "slots": is_int,
    "slots_used": is_int, "cpus": is_int, "gpus": is_int, "mem_bytes": is_int,
    "lease_age_ms": is_int, "lease_ms": is_int, "registered_ms": is_int,
    "last_seen_ms": is_int, "running_ranks": list,
}


def check_job(j, where):
    check_shape(j, JOB_SUMMARY, where)
    check_shape(j, {"ranks": list, "hosts_used": list, "events": list}, where)
    for rk in j["ranks"]:
        check_shape(rk, {"rank": is_int, "worker_id": is_int, "host": str, "host_name": str,
                         "local_rank": is_int, "local_size": is_int, "cross_rank": is_int,
                         "cross_size": is_int, "state": str}, where + " rank")
        if rk["state"] == "exited":
            check_shape(rk, {"exit_code": is_int, "signal": is_int}, where + " rank")
    for h in j["hosts_used"]:
        check_shape(h, {"id": str, "name": str, "ranks": is_int}, where + " hosts_used")
    for ev in j["events"]:
        check_shape(ev, EVENT, where + " event")


# ------------------------------------------------------------------ cluster

class Cluster:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="kolo-rest-")
        self.procs = []
        self.token = "rest-test-" + os.urandom(12).hex()
        global READ_TOKEN
        READ_TOKEN = self.token
        self.token_file = os.path.join(self.tmp, "token")
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (self.token + "\n").encode())
        os.close(fd)
        self.db = os.path.join(self.tmp, "coord.db")
        self.coord = None
        self.rpc = self.http = None
        self.job = None  # the main job's id, once it ran
        self.timeline = os.path.join(self.tmp, "timeline.json")

    def start_coordinator(self, token=True, db=None):
        args = [KOLO, "coordinator", "--listen", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0",
                "--db", db or self.db, "--lease", "3s", "--heartbeat", "300ms",
                "--stop-grace", "2s"]
        if token:
            args += ["--token-file", self.token_file]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True)
        self.procs.append(p)
        # its "ready" line comes whole, so a readline after select returns
        line, deadline = "", time.time() + 15
        while "ready" not in line and p.poll() is None:
            left = deadline - time.time()
            if left <= 0 or not select.select([p.stdout], [], [], left)[0]:
                break
            line = p.stdout.readline()
        m = re.search(r"rpc=(\S+) http=(\S+)", line)
        assert m, "the coordinator did not start: %r" % line
        return p, m.group(1), m.group(2)

    def start(self):
        self.coord, self.rpc, self.http = self.start_coordinator()
        agent = subprocess.Popen([KOLO, "agent", "--coordinator", self.rpc, "--slots", "2",
                                  "--name", "ha", "--state-dir", os.path.join(self.tmp, "agent"),
                                  "--token-file", self.token_file],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(agent)
        self.agent = agent
        self.wait_host_alive()

    def wait_host_alive(self):
        def alive():
            st, body = get(self.http, "/api/v1/hosts")
            return st == 200 and any(h["state"] == "alive" for h in body["hosts"])
        wait_until("the agent to register", alive, timeout=15)

    def restart_coordinator(self):
        self.stop_proc(self.coord)
        self.coord, self.rpc, self.http = self.start_coordinator()

    def stop_proc(self, p):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p.stdout:
            p.stdout.close()

    def close(self):
        for name in ("go1", "go2"):  # lets waiting workers finish
            open(os.path.join(self.tmp, name), "w").close()
        for p in reversed(self.procs):
            self.stop_proc(p)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def post(self, path, body=None, token=True):
        return call(self.http, "POST", path, body, self.token if token else None)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


# ------------------------------------------------------------------ tests

def test_health_hosts_metrics_static(cluster):
    http = cluster.http
    st, body = get(http, "/healthz")
    assert st == 200
    check_shape(body, {"status": str, "version": str, "instance": str, "uptime_ms": is_int},
                "healthz")
    assert body["status"] == "ok" and body["instance"]

    st, body = get(http, "/api/v1/hosts")
    assert st == 200 and len(body["hosts"]) == 1
    h = body["hosts"][0]
    check_shape(h, HOST, "host")
    assert h["name"] == "ha" and h["slots"] == 2 and h["state"] == "alive"

    st, hd, raw = request(http, "GET", "/metrics")
    assert st == 200
    assert hd["Content-Type"].startswith("text/plain; version=0.0.4"), hd["Content-Type"]
    text = raw.decode()
    assert re.search(r"^kolo_hosts\{state=\"alive\"\} 1$", text, re.M), text[:400]
    assert "# TYPE kolo_snapshot_commit_seconds histogram" in text

    # the dashboard
    for path in ["/", "/index.html"]:
        st, hd, raw = request(http, "GET", path)
        assert st == 200 and hd["Content-Type"].startswith("text/html"), (path, hd)
        assert b"<html" in raw.lower() or b"<!doctype" in raw.lower()
    st, hd, raw = request(http, "HEAD", "/healthz")
    assert st == 200 and raw == b""

    # unknown routes, wrong methods
    for path in ["/api/v1/nothing", "/api/v2/jobs", "/api", "/api/v1/jobs/1/bogus",
                 "/api/v1/hosts/ha", "/api/v1/hosts/ha/bogus", "/nothing.html",
                 "/../etc/passwd", "/api/v1/jobs/%s/stop/again" % NOJOB]:
        expect_error(http, "GET", path, 404)
    expect_error(http, "POST", "/healthz", 405, allow="GET")
    expect_error(http, "PUT", "/metrics", 405, allow="GET")
    expect_error(http, "DELETE", "/api/v1/hosts", 405, allow="GET")
    expect_error(http, "DELETE", "/api/v1/jobs", 405, allow="GET, POST")
    expect_error(http, "POST", "/api/v1/events", 405, allow="GET")
    expect_error(http, "POST", "/", 405, allow="GET")
    expect_error(http, "GET", "/api/v1/hosts/ha/drain", 405, allow="POST")
    expect_error(http, "GET", "/api/v1/jobs/%d/stop" % NOJOB, 405, allow="POST")
    for sub in JOB_SUBS:
        expect_error(http, "POST", "/api/v1/jobs/1%s" % sub, 405, allow="GET")
        # an unknown job, also when its id is not a number
        for jid in [str(NOJOB), "abc", "0", "-1", "1x"]:
            expect_error(http, "GET", "/api/v1/jobs/%s%s" % (jid, sub), 404, text="no such job")
    expect_error(http, "GET", "/x" * 600, 414)


def test_submit_validation(cluster):
    http, good = cluster.http, '{"argv":["true"],"np":1}'
    hd = expect_error(http, "POST", "/api/v1/jobs", 401, body=good)
    assert hd.get("WWW-Authenticate", "").startswith("Bearer")
    expect_error(http, "POST", "/api/v1/jobs", 401, body=good, token="wrong-" + cluster.token)
    for body, field in [("{not json", "malformed JSON"), ("[1,2]", "object"),
                        ('{"np":1}', "argv"), ('{"argv":[],"np":1}', "argv"),
                        ('{"argv":[1],"np":1}', "argv"), ('{"argv":"true","np":1}', "argv"),
                        ('{"argv":["true"]}', "np"), ('{"argv":["true"],"np":0}', "np"),
                        ('{"argv":["true"],"np":"2"}', "np"),
                        ('{"argv":["true"],"np":70000}', "np"),
                        ('{"argv":["true"],"np":1,"env":[]}', "env"),
                        ('{"argv":["true"],"np":1,"env":{"A":1}}', "env"),
                        ('{"argv":["true"],"np":1,"cwd":5}', "cwd"),
                        ('{"argv":["true"],"np":1,"start_timeout_ms":-1}', "start_timeout_ms"),
                        ('{"argv":["true"],"np":1,"min_np":-2}', "min_np"),
                        ('{"argv":["true"],"np":1,"elastic":"yes"}', "elastic"),
                        ('{"argv":["true"],"np":1,"blacklist_cooldown_range":[1]}',
                         "blacklist_cooldown_range"),
                        ('{"argv":["true"],"np":1,"metadata":["a=b"]}', "\"metadata\" must be"),
                        ('{"argv":["true"],"np":1,"metadata":{"a":1}}', "\"metadata\" values"),
                        ('{"argv":["true"],"np":1,"metadata":{"a b":"c"}}', "metadata key 'a b'"),
                        ('{"argv":["true"],"np":1,"metadata":{"":"c"}}', "key of 1 to 64"),
                        ('{"argv":["true"],"np":1,"metadata":{"k":"%s"}}' % ("v" * 8193),
                         "longer than 8192"),
                        (json.dumps({"argv": ["true"], "np": 1,
                                     "metadata": {"k%d" % i: "v" for i in range(33)}}),
                         "at most 32")]:
        expect_error(http, "POST", "/api/v1/jobs", 400, body=body, token=cluster.token,
                     text=re.escape(field))
    # nothing was submitted by any of them
    st, body = get(http, "/api/v1/jobs")
    assert st == 200 and body["jobs"] == []


def snapshot_hist(http):
    """(count, sum in ms) of kolo_snapshot_commit_seconds."""
    st, hd, raw = request(http, "GET", "/metrics")
    text = raw.decode()
    count = int(re.search(r"^kolo_snapshot_commit_seconds_count (\d+)$", text, re.M).group(1))
    total = float(re.search(r"^kolo_snapshot_commit_seconds_sum (\S+)$", text, re.M).group(1))
    return count, total * 1000


def test_job_routes(cluster):
    http = cluster.http
    path = os.path.join(cluster.tmp, "worker.py")
    with open(path, "w") as f:
        f.write(WORKER)
    env = {"PYTHONPATH": PYDIR, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "HOROVOD_TIMELINE": cluster.timeline}
    if os.environ.get("KOLO_LIBRARY"):
        env["KOLO_LIBRARY"] = os.environ["KOLO_LIBRARY"]
    st, job = cluster.post("/api/v1/jobs", json.dumps(
        {"argv": [sys.executable, path, cluster.tmp], "np": 2, "env": env, "cwd": cluster.tmp,
         "name": "rest"}))
    assert st == 201, job
    check_job(job, "submitted job")
    jid = cluster.job = job["id"]
    assert job["name"] == "rest" and job["np"] == 2 and job["exit_code"] is None
    base = "/api/v1/jobs/%d" % jid

    # ---- while rank 1 holds up "rest.stall"
    def stalled(min_age):
        st, body = get(http, "%s/stalls?min_age_ms=%d" % (base, min_age))
        assert st == 200, body
        names = [s for s in body["stalls"] if s["name"] == "rest.stall"]
        return body if names else None

    def failed_early():
        st, j = get(http, base)
        if j["state"] not in ("pending", "running"):
            st, out = get(http, base + "/output?limit=10000")
            raise AssertionError("the job ended early: %r\n%s" % (
                j, "\n".join(ln["text"] for ln in out["lines"])))
    body = wait_until("the stalled allreduce", lambda: failed_early() or stalled(0), timeout=40)
    check_shape(body, {"generation": is_int, "stalls": list}, "stalls")
    s = [s for s in body["stalls"] if s["name"] == "rest.stall"][0]
    check_shape(s, {"name": str, "waiting_ms": is_int, "submitted": is_int,
                    "missing_ranks": list}, "stall")
    assert s["submitted"] == 1 and s["missing_ranks"] == [1], s
    st, body = get(http, "%s/stalls?min_age_ms=1000000000" % base)
    assert st == 200 and body["stalls"] == [], body
    for q in ["min_age_ms=abc", "min_age_ms=-5", "min_age_ms=", "min_age_ms=1.5",
              "min_age_ms=99999999999999999999"]:
        expect_error(http, "GET", "%s/stalls?%s" % (base, q), 400, text="min_age_ms")

    st, j = get(http, base)
    assert st == 200 and j["state"] == "running" and j["ranks_alive"] == 2, j
    check_job(j, "running job")
    assert all(rk["state"] == "running" and rk["pid"] > 0 for rk in j["ranks"]), j["ranks"]
    assert j["hosts_used"] == [{"id": j["ranks"][0]["host"], "name": "ha", "ranks": 2}]
    st, body = get(http, "/api/v1/hosts")
    assert sorted((x["job"], x["rank"]) for x in body["hosts"][0]["running_ranks"]) == \
        [(jid, 0), (jid, 1)]
    assert body["hosts"][0]["slots_used"] == 2

    # the timeline while it is open: the file has no "]" yet, REST closes it
    with open(cluster.timeline) as f:
        assert not f.read().rstrip().endswith("]")
    st, tl = get(http, base + "/timeline")
    assert st == 200 and isinstance(tl, list), tl
    assert get(http, base)[1]["timeline"] is True
    procs = {e["args"]["name"] for e in tl if e.get("name") == "process_name"}
    assert "job %d" % jid in procs and "rest.stall" in procs, procs

    # held up for at least a second: rank 1 becomes the straggler
    wait_until("a stall of 1 s", lambda: stalled(1000), timeout=10)
    open(os.path.join(cluster.tmp, "go1"), "w").close()

    def past_stall():
        st, body = get(http, base + "/output?limit=10000")
        return sum("past the stall" in ln["text"] for ln in body["lines"]) == 2
    wait_until("both ranks past the stall", past_stall, timeout=20)

    st, body = get(http, base + "/ranks")
    assert st == 200, body
    check_shape(body, {"job": is_int, "generation": is_int, "ranks": list}, "ranks")
    assert [r["rank"] for r in body["ranks"]] == [0, 1]
    for r in body["ranks"]:
        check_shape(r, {"rank": is_int, "host_id": str, "host": str, "state": str,
                        "pid": is_int, "last_step_s": lambda v: v is None or is_num(v),
                        "last_step_ms": is_int, "last_epoch": lambda v: v is None or is_int(v),
                        "lag_s": lambda v: v is None or is_num(v), "straggler": bool}, "rank")
        assert r["host"] == "ha" and r["state"] == "running" and r["last_epoch"] == 1
    r0, r1 = body["ranks"]
    assert is_num(r1["lag_s"]) and r1["lag_s"] >= 0.02 and r1["straggler"], body
    assert not r0["straggler"] and r0["lag_s"] < r1["lag_s"], body

    st, body = get(http, base + "/steps?downsample=1")
    assert st == 200, body
    check_shape(body, {"job": is_int, "bucket_s": is_int, "hosts": list, "truncated": bool},
                "steps")
    assert body["bucket_s"] == 1 and not body["truncated"] and len(body["hosts"]) == 1
    h = body["hosts"][0]
    check_shape(h, {"host_id": str, "host": str, "lag_s": lambda v: v is None or is_num(v),
                    "straggler": bool, "straggler_ranks": list, "buckets": list}, "steps host")
    assert h["host"] == "ha" and h["straggler"] and h["straggler_ranks"] == [1], h
    assert h["lag_s"] == pytest.approx(r1["lag_s"], rel=1e-3), (h, r1)  # its slowest rank
    assert all(is_int(x) for x in h["straggler_ranks"])
    assert h["buckets"] and sum(b["steps"] for b in h["buckets"]) == 2 * 9, h  # no step before the first
    for b in h["buckets"]:
        check_shape(b, {"ts_ms": is_int, "steps": is_int, "mean_s": is_num, "p50_s": is_num,
                        "max_s": is_num}, "bucket")
        assert b["ts_ms"] % 1000 == 0 and b["max_s"] >= b["p50_s"] > 0
    st, body = get(http, base + "/steps")
    assert st == 200 and body["bucket_s"] == 10
    assert all(b["ts_ms"] % 10000 == 0 for b in body["hosts"][0]["buckets"])
    last = max(b["ts_ms"] for b in h["buckets"])
    st, body = get(http, base + "/steps?downsample=1&since_ms=%d" % last)
    assert st == 200 and [b["ts_ms"] for b in body["hosts"][0]["buckets"]] == [last], body
    st, body = get(http, base + "/steps?since_ms=%d" % (last + 10 ** 9))
    assert st == 200 and body["hosts"] == [], body
    for q in ["downsample=0", "downsample=abc", "downsample=86401", "downsample=", "since_ms=-1",
              "since_ms=x", "since_ms=99999999999999999999"]:
        expect_error(http, "GET", "%s/steps?%s" % (base, q), 400, text=q.split("=")[0])

    # the timeline was stopped at run time: once closed (under readiness
    # rounds it takes the ranks' last spans for 1.5 s first), the closed
    # file is served
    def closed():
        with open(cluster.timeline) as f:
            return f.read().rstrip().endswith("]")
    wait_until("the stopped timeline to close", closed, timeout=10)
    with open(cluster.timeline) as f:
        on_disk = json.load(f)
    st, tl = get(http, base + "/timeline")
    assert st == 200 and tl == on_disk
    assert "rest.after" in {e["args"]["name"] for e in tl if e.get("name") == "process_name"}

    # ---- the job ends
    open(os.path.join(cluster.tmp, "go2"), "w").close()

    def ended():
        st, j = get(http, base)
        return j if j["state"] not in ("pending", "running") else None
    j = wait_until("the job to end", ended, timeout=30)
    assert j["state"] == "succeeded" and j["exit_code"] == 0 and j["ended_ms"] > 0, j
    check_job(j, "ended job")
    assert all(rk["state"] == "exited" and rk["exit_code"] == 0 for rk in j["ranks"])
    kinds = [e["kind"] for e in j["events"]]
    for kind in ["job.submitted", "job.started", "snapshot.committed", "job.succeeded"]:
        assert kind in kinds, kinds

    st, body = get(http, "/api/v1/jobs")
    assert st == 200 and [x["id"] for x in body["jobs"]] == [jid]
    check_shape(body["jobs"][0], JOB_SUMMARY, "jobs[0]")
    assert "ranks" not in body["jobs"][0]

    st, body = get(http, base + "/generations")
    assert st == 200, body
    check_shape(body, {"current": is_int, "generations": list}, "generations")
    assert body["current"] == 1 and len(body["generations"]) == 1
    g = body["generations"][0]
    check_shape(g, {"generation": is_int, "size": is_int, "cause": str, "ts_ms": is_int}, "gen")
    assert g["generation"] == 1 and g["size"] == 2

    # output, a page at a time
    total = j["output_lines"]
    assert total >= 8
    seen, after, pages = [], 0, 0
    while True:
        st, page = get(http, "%s/output?after=%d&limit=3" % (base, after))
        assert st == 200, page
        check_shape(page, {"lines": list, "next": is_int}, "output")
        assert len(page["lines"]) <= 3
        if not page["lines"]:
            assert page["next"] == after
            break
        for ln in page["lines"]:
            check_shape(ln, {"seq": is_int, "rank": is_int, "ts_ms": is_int, "text": str,
                             "stream": lambda v: v in ("stdout", "stderr")}, "line")
        assert page["next"] == page["lines"][-1]["seq"]
        seen += page["lines"]
        after = page["next"]
        pages += 1
        assert pages < 100
    assert [ln["seq"] for ln in seen] == list(range(1, total + 1))
    texts = [ln["text"] for ln in seen]
    for r in (0, 1):
        for want in ["rank %d epoch 0" % r, "rank %d epoch 1" % r, "rank %d done" % r]:
            assert any(want in t for t in texts), (want, texts)
    st, page = get(http, base + "/output")
    assert st == 200 and len(page["lines"]) == total and page["next"] == total
    st, page = get(http, base + "/output?after=%d" % total)
    assert st == 200 and page["lines"] == [] and page["next"] == total
    for q in ["after=-1", "after=abc", "limit=0", "limit=10001", "limit=x", "after="]:
        expect_error(http, "GET", "%s/output?%s" % (base, q), 400, text=q.split("=")[0])

    # events: the job's, and the global log filtered by job
    st, body = get(http, base + "/events")
    assert st == 200, body
    for ev in body["events"]:
        check_shape(ev, EVENT, "job event")
        assert ev["job"] == jid
    ids = [ev["id"] for ev in body["events"]]
    assert ids == sorted(ids) and len(ids) >= 5
    st, two = get(http, base + "/events?limit=2")
    assert st == 200 and [ev["id"] for ev in two["events"]] == ids[-2:]
    st, body = get(http, "/api/v1/events")
    assert st == 200 and body["events"]
    for ev in body["events"]:
        check_shape(ev, EVENT, "event")
    assert "host.registered" in [ev["kind"] for ev in body["events"]]
    st, body = get(http, "/api/v1/events?job=%d&limit=3" % jid)
    assert st == 200 and [ev["id"] for ev in body["events"]] == ids[-3:], body
    st, body = get(http, "/api/v1/events?limit=1")
    assert st == 200 and len(body["events"]) == 1
    for q in ["limit=0", "limit=10001", "limit=abc", "job=abc", "job=0", "job=-1", "job="]:
        expect_error(http, "GET", "/api/v1/events?" + q, 400, text=q.split("=")[0])
    for q in ["limit=0", "limit=10001", "limit=abc"]:
        expect_error(http, "GET", "%s/events?%s" % (base, q), 400, text="limit")
    expect_error(http, "GET", "/api/v1/events?job=%d" % NOJOB, 404, text="no such job")

    # snapshots: newest first, with the commit's duration and the interval
    st, body = get(http, base + "/snapshots")
    assert st == 200, body
    check_shape(body, {"job": is_int, "keep": is_int, "snapshots": list, "uploads": list},
                "snapshots")
    assert body["keep"] == 3 and body["uploads"] == [] and len(body["snapshots"]) == 2
    new, old = body["snapshots"]
    for s in (new, old):
        check_shape(s, {"id": is_int, "generation": is_int, "rank": is_int, "bytes": is_int,
                        "chunks": is_int, "sha256": str, "created_ms": is_int,
                        "duration_ms": is_int, "interval_ms": lambda v: v is None or is_int(v),
                        "meta": dict}, "snapshot")
        data = b"snapshot %d " % s["meta"]["epoch"] * 50
        assert s["bytes"] == len(data) and s["chunks"] == 1 and s["rank"] == 0
        assert s["sha256"] == hashlib.sha256(data).hexdigest()
        assert 0 <= s["duration_ms"] < 30000
    assert new["id"] > old["id"] and new["meta"] == {"epoch": 1} and old["meta"] == {"epoch": 0}
    assert new["interval_ms"] == new["created_ms"] - old["created_ms"] and new["interval_ms"] > 0
    assert old["interval_ms"] is None
    # the stored durations are what kolo_snapshot_commit_seconds observed
    count, total_ms = snapshot_hist(http)
    assert count == 2 and abs(total_ms - new["duration_ms"] - old["duration_ms"]) <= 1.01

    st, body = get(http, base + "/epochs")
    assert st == 200, body
    check_shape(body, {"job": is_int, "generation": is_int, "epochs": list,
                       "baseline_job": lambda v: v is None or is_int(v),
                       "baseline_samples_per_s": lambda v: v is None or is_num(v)}, "epochs")
    assert [e["epoch"] for e in body["epochs"]] == [0, 1]
    for e in body["epochs"]:
        check_shape(e, {"epoch": is_int, "generation": is_int, "start_ms": is_int,
                        "end_ms": is_int, "wall_s": is_num, "samples": is_int,
                        "samples_per_s": is_num, "ranks_reported": is_int,
                        "ranks_expected": is_int, "complete": bool,
                        "scaling_efficiency": lambda v: v is None or is_num(v),
                        "metrics": dict, "metrics_mean": dict}, "epoch")
        assert e["complete"] and e["ranks_reported"] == 2 and e["samples"] == 80
        assert is_num(e["metrics"]["loss"])

    # ended: the ranks stay listed
    st, body = get(http, base + "/ranks")
    assert st == 200 and [r["state"] for r in body["ranks"]] == ["exited", "exited"]
    for r in body["ranks"]:
        assert r["lag_s"] is None or is_num(r["lag_s"])
        assert isinstance(r["straggler"], bool)
    st, body = get(http, base + "/stalls")
    assert st == 200 and body["stalls"] == []

    # the timeline is served as written
    with open(cluster.timeline) as f:
        on_disk = json.load(f)
    st, tl = get(http, base + "/timeline")
    assert st == 200 and tl == on_disk

    st, hd, raw = request(http, "GET", "/metrics")
    assert re.search(r"^kolo_snapshots_committed_total 2$", raw.decode(), re.M)
    m = re.search(r"^kolo_report_epochs_total (\d+)$", raw.decode(), re.M)
    assert m and int(m.group(1)) >= 4


def test_drain_undrain(cluster):
    http = cluster.http
    for action in ["drain", "undrain"]:
        expect_error(http, "POST", "/api/v1/hosts/ha/" + action, 401)
        expect_error(http, "POST", "/api/v1/hosts/nohost/" + action, 404, token=cluster.token,
                     text="no such host")
    st, h = cluster.post("/api/v1/hosts/ha/drain")
    assert st == 200 and h["state"] == "drained", h
    check_shape(h, HOST, "drained host")
    st, body = get(http, "/api/v1/hosts")
    assert body["hosts"][0]["state"] == "drained"
    # by id as well as by name
    st, h = cluster.post("/api/v1/hosts/%s/undrain" % h["id"])
    assert st == 200 and h["state"] == "alive", h
    st, body = get(http, "/api/v1/events?limit=10")
    kinds = [ev["kind"] for ev in body["events"]]
    assert "host.drained" in kinds and "host.undrained" in kinds, kinds


def test_stop(cluster):
    http = cluster.http
    st, job = cluster.post("/api/v1/jobs", '{"argv":["sleep","30"],"np":1,"name":"sleeper"}')
    assert st == 201, job
    jid = job["id"]
    base = "/api/v1/jobs/%d" % jid

    def running():
        st, j = get(http, base)
        assert j["state"] in ("pending", "running"), j
        return j["state"] == "running" and j["ranks_alive"] == 1
    wait_until("the sleeper to run", running, timeout=15)
    expect_error(http, "GET", base + "/timeline", 404, text="no timeline")
    assert get(http, base)[1]["timeline"] is False
    st, body = get(http, base + "/snapshots")
    assert st == 200 and body["snapshots"] == []
    st, body = get(http, base + "/epochs")
    assert st == 200 and body["epochs"] == []
    st, body = get(http, base + "/steps")
    assert st == 200 and body["hosts"] == []

    expect_error(http, "POST", base + "/stop", 401)
    expect_error(http, "POST", "/api/v1/jobs/%d/stop" % NOJOB, 404, token=cluster.token)
    st, j = cluster.post(base + "/stop")
    assert st == 200, j
    check_job(j, "stopped job")

    def stopped():
        st, j = get(http, base)
        return j if j["state"] == "stopped" else None
    j = wait_until("the sleeper to stop", stopped, timeout=15)
    assert j["exit_code"] == 143, j
    expect_error(http, "POST", base + "/stop", 409, token=cluster.token)


STUDY_WORKER = r"""
import sys
import time

import kolo

kolo.init()
for epoch, v in enumerate(float(x) for x in sys.argv[1].split(",") if x):
    kolo.report_epoch(epoch, samples=10, metrics={"loss": v + 0.01 * kolo.rank(), "note": "x"})
    time.sleep(0.05)
if sys.argv[2] == "hang":
    time.sleep(60)
kolo.shutdown()
sys.exit(int(sys.argv[3]))
"""
TRIAL = {"number": lambda v: v is None or is_int(v), "job": is_int, "job_name": str,
         "state": str, "params": lambda v: v is None or isinstance(v, dict), "np": is_int,
         "workers": is_int, "value": lambda v: v is None or is_num(v),
         "best": lambda v: v is None or is_num(v), "epochs": is_int, "submitted_ms": is_int,
         "started_ms": is_int, "ended_ms": is_int, "reason": str, "curve": list}
STUDY = {"name": str, "metric": str, "mode": str, "trial_count": is_int, "states": dict,
         "best_value": lambda v: v is None or is_num(v),
         "best_trial": lambda v: v is None or is_int(v),
         "best_job": lambda v: v is None or is_int(v), "first_ms": is_int, "last_ms": is_int}


def test_studies(cluster):
    """Jobs labelled as kolo tune labels its trials make a study: REST
    derives each trial's state and metric curve from the job and its epoch
    reports (the mean over the ranks), the best trial and the best-so-far
    curve; a name with a space and a non-ASCII letter is found URL-encoded."""
    http = cluster.http
    path = os.path.join(cluster.tmp, "study_worker.py")
    with open(path, "w") as f:
        f.write(STUDY_WORKER)
    env = {"PYTHONPATH": PYDIR, "PYTHONUNBUFFERED": "1"}
    if os.environ.get("KOLO_LIBRARY"):
        env["KOLO_LIBRARY"] = os.environ["KOLO_LIBRARY"]
    name = "rest study \u00e9"

    def trial(number, np_, values, how="end", code=0, extra=None):
        meta = {"kolo.study": name, "kolo.metric": "loss", "kolo.mode": "min",
                "kolo.params": json.dumps({"lr": 0.1 * (number or 0), "batch": 32})}
        if number is not None:
            meta["kolo.trial"] = str(number)
        meta.update(extra or {})
        st, job = cluster.post("/api/v1/jobs", json.dumps(
            {"argv": [sys.executable, path, ",".join(map(str, values)), how, str(code)],
             "np": np_, "env": env, "cwd": cluster.tmp, "name": "%s/trial-%s" % (name, number),
             "metadata": meta}))
        assert st == 201, job
        assert job["metadata"] == meta, job
        return job["id"]

    def ended(jid):
        def done():
            st, j = get(http, "/api/v1/jobs/%d" % jid)
            return j if j["state"] not in ("pending", "running") else None
        return wait_until("job %d to end" % jid, done, timeout=60)

    j0 = trial(0, 2, [0.5, 0.3])
    assert ended(j0)["state"] == "succeeded"
    j1 = trial(1, 1, [0.4, 0.2])
    assert ended(j1)["state"] == "succeeded"
    j2 = trial(2, 1, [0.9], how="hang")

    def reported():
        st, ep = get(http, "/api/v1/jobs/%d/epochs" % j2)
        return ep["epochs"] and ep["epochs"][0]["complete"]
    wait_until("trial 2's first epoch", reported, timeout=60)
    expect_error(http, "POST", "/api/v1/jobs/%d/stop" % j2, 400, body="[1]",
                 token=cluster.token, text="JSON object")
    expect_error(http, "POST", "/api/v1/jobs/%d/stop" % j2, 400, body='{"reason": 5}',
                 token=cluster.token, text="reason")
    st, j = cluster.post("/api/v1/jobs/%d/stop" % j2, '{"reason": "pruned at epoch 0"}')
    assert st == 200 and j["reason"] == "pruned at epoch 0", j
    ended(j2)
    j3 = trial(3, 1, [0.1], code=3)  # reports the best value, then fails
    assert ended(j3)["state"] == "failed"
    j4 = trial(None, 1, [])  # succeeds without a value, and without a number
    ended(j4)
    j5 = trial(5, 1, [0.25])  # a later end that does not beat the best

    ended(j5)
    # another study (mode max) and a job of no study
    st, other = cluster.post("/api/v1/jobs", json.dumps(
        {"argv": [sys.executable, path, "0.5", "end", "0"], "np": 1, "env": env,
         "cwd": cluster.tmp, "metadata": {"kolo.study": "other", "kolo.metric": "loss",
                                          "kolo.mode": "max", "kolo.trial": "0"}}))
    assert st == 201
    ended(other["id"])

    st, body = get(http, "/api/v1/studies")
    assert st == 200, body
    names = [x["name"] for x in body["studies"]]
    assert names == ["other", name], names  # newest first; jobs of no study are not one
    for x in body["studies"]:
        check_shape(x, STUDY, "study summary")
    o = body["studies"][0]
    assert o["mode"] == "max" and o["best_value"] == 0.5 and o["best_trial"] == 0, o

    enc = urllib.request.quote(name)
    st, s = get(http, "/api/v1/studies/" + enc)
    assert st == 200, s
    check_shape(s, dict(STUDY, trials=list, best_so_far=list), "study")
    assert s["name"] == name and s["metric"] == "loss" and s["mode"] == "min", s
    assert s["trial_count"] == 6, s
    assert s["states"] == {"pending": 0, "running": 0, "complete": 3, "pruned": 1,
                           "failed": 2, "stopped": 0}, s["states"]
    by_job = {t["job"]: t for t in s["trials"]}
    for t in s["trials"]:
        check_shape(t, TRIAL, "trial")
    # sorted by number (no number first), values are the mean over the ranks
    assert [t["number"] for t in s["trials"]] == [None, 0, 1, 2, 3, 5], s["trials"]
    t0 = by_job[j0]
    assert t0["state"] == "complete" and t0["np"] == 2 and t0["epochs"] == 2, t0
    assert [c["epoch"] for c in t0["curve"]] == [0, 1], t0
    assert abs(t0["curve"][0]["value"] - 0.505) < 1e-9 and abs(t0["value"] - 0.305) < 1e-9, t0
    assert t0["params"] == {"lr": 0.0, "batch": 32}, t0
    assert by_job[j1]["value"] == 0.2 and by_job[j1]["state"] == "complete"
    assert by_job[j2]["state"] == "pruned" and by_job[j2]["value"] == 0.9, by_job[j2]
    assert by_job[j3]["state"] == "failed" and by_job[j3]["value"] == 0.1, by_job[j3]
    assert by_job[j4]["state"] == "failed" and by_job[j4]["value"] is None, by_job[j4]
    # the best is the best complete trial; a failed trial's lower value does not count
    assert s["best_value"] == 0.2 and s["best_trial"] == 1 and s["best_job"] == j1, s
    assert [(b["trial"], b["value"]) for b in s["best_so_far"]] == [(0, t0["value"]), (1, 0.2)]
    assert s["best_so_far"][0]["ts_ms"] <= s["best_so_far"][1]["ts_ms"]
    assert s["first_ms"] > 0 and s["last_ms"] >= s["first_ms"], s

    expect_error(http, "GET", "/api/v1/studies/nope", 404, text="no such study")
    expect_error(http, "GET", "/api/v1/studies/" + "x" * 400, 404, text="no such study")
    # a name longer than any study's (128 bytes) is not cut down to one
    expect_error(http, "GET", "/api/v1/studies/" + enc + "x" * 200, 404, text="no such study")
    expect_error(http, "POST", "/api/v1/studies", 405, allow="GET")


def test_timeline_after_restart(cluster):
    """A restarted coordinator serves the finished job's timeline file (its
    HOROVOD_TIMELINE), closing what a writer left open and leaving out a
    torn last event."""
    cluster.restart_coordinator()
    http, base = cluster.http, "/api/v1/jobs/%d/timeline" % cluster.job
    # The coordinator's own file (issue 28: never at a path a job names);
    # rank 0's copy at the job's path holds what it had when rank 0 left.
    [own] = glob.glob("%s.timelines/job-%d-*.json" % (cluster.db, cluster.job))
    with open(own) as f:
        text = f.read()
    events = json.loads(text)
    st, tl = get(http, base)
    assert st == 200 and tl == events
    with open(cluster.timeline) as f:
        copy = json.load(f)
    assert copy and all(e in events for e in copy), copy
    cluster.timeline = own  # what REST reads, below

    body = text.rstrip()
    assert body.endswith("\n]")
    body = body[:-2]  # as a killed writer leaves it
    last = body.rfind("\n")
    torn = [
        (body, events),
        (body + ",\n", events),
        (body + "\n", events),
        (body[:last + 12], events[:-1]),  # the last event cut short
        (body + ',\n{"ph":"E","ts":1,"pid":1,"args":{"shape":"[4]', events),
        ("[", []),
        ("[\n", []),
        ('[\n{"name":"proc', []),
    ]
    for content, want in torn:
        with open(cluster.timeline, "w") as f:
            f.write(content)
        st, hd, raw = request(http, "GET", base)
        assert st == 200, (content[-60:], raw)
        assert json.loads(raw.decode()) == want, content[-60:]

    with open(cluster.timeline, "w") as f:
        f.write("this is not a trace")
    expect_error(http, "GET", base, 500, text="not a JSON array")
    with open(cluster.timeline, "w") as f:
        f.truncate(64 * 1024 * 1024 + 1)  # sparse: over the limit, nothing written
    expect_error(http, "GET", base, 413, text="more than")
    os.unlink(cluster.timeline)
    expect_error(http, "GET", base, 404, text="cannot read")


def test_no_token_means_no_changes(cluster):
    p, rpc, http = cluster.start_coordinator(token=False,
                                             db=os.path.join(cluster.tmp, "open.db"))
    try:
        for path in ["/api/v1/jobs", "/api/v1/jobs/1/stop", "/api/v1/hosts/ha/drain"]:
            expect_error(http, "POST", path, 403, body='{"argv":["true"],"np":1}',
                         token="anything", text="token")
        st, body = get(http, "/api/v1/jobs")
        assert st == 200 and body["jobs"] == []
    finally:
        cluster.stop_proc(p)

