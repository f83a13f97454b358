"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/<name>/): frames and
files shaped like real traffic, so fuzzing starts past the first checks.
Run from the repository root: /usr/bin/python3 tests/fuzz/make_seeds.py"""
import hashlib
import hmac
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
TOKEN = b"fuzz-token-0123456789abcdef"


def put(name, fname, data):
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, fname), "wb") as f:
        f.write(data)


def frame(kind, method, identity, body, job=0, gen=0, rank=0, status=0, key=None, flags=0):
    """common/rpc.h's layout, big-endian, MAC over the frame with it zeroed."""
    m, i = method.encode(), identity.encode()
    head = b"KOLO" + struct.pack(">HBB", 1, kind, (1 | flags) if key else 0)
    rest = struct.pack(">Q", 1795690000000) + bytes(range(16)) + struct.pack(
        ">QQiiHHI", job, gen, rank, status, len(m), len(i), len(body))
    whole = head + bytes(32) + rest + m + i + body
    if key:
        mac = hmac.new(key, whole, hashlib.sha256).digest()
        whole = head + mac + rest + m + i + body
    return whole


def job_cred(job):
    msg = b"kolo-job-credential\0" + struct.pack("<Q", job)
    return hmac.new(TOKEN, msg, hashlib.sha256).hexdigest().encode()


put("rpc_frame", "plain", frame(1, "AdminService.ListJobs", "kolo-cli", b""))
put("rpc_frame", "mac", frame(1, "AgentService.Heartbeat", "host-a", b"\x0a\x04abcd", key=TOKEN))
put("rpc_frame", "job_key", frame(1, "WorkerService.Negotiate", "job3-rank1", b"\x08\x01",
                                  job=3, gen=1, rank=1, key=job_cred(3), flags=2))
put("rpc_frame", "reply", frame(2, "", "", b"no such job", status=10))

put("json", "submit", b'{"argv":["python3","train.py","--lr","0.1"],"np":4,"env":["A=1"],'
                      b'"cwd":"/tmp","elastic":{"min_np":2,"max_np":8}}')
put("json", "metrics", b'{"loss":0.25,"acc":[1,2.5e-3,-0.0],"nested":{"a":null,"b":true}}')
put("json", "escapes", b'["\\u00e9\\n\\t\\"\\\\", "\\ud83d\\ude00", 1e308, -1E-308]')

put("run_flags", "yaml_and_flags",
    b"fusion_threshold_mb: 32\ncycle_time_ms: 5\ntimeline:\n  filename: tl.json\n"
    b"stall_check:\n  warning_time_seconds: 30\n\0-np\n4\n-H\nlocalhost:4\n--verbose\n")
put("run_flags", "flags_only", b"\0--num-proc\n2\n--start-timeout\n30\n--elastic-timeout\n5m\n"
                               b"--min-np\n1\n--max-np\n4\n")

hello = struct.pack("<IHHIIQQii", 0x584C4F4B, 2, 1, 0, 0, 7, 3, 1, 0) + bytes(16)
put("hello", "hello", hello)
put("hello", "hello_proof", hello + bytes(32))
put("hello", "stale", struct.pack("<IHHIIQQii", 0x584C4F4B, 2, 1, 0, 0, 7, 2, 1, 0) + bytes(16))
put("hello", "v1", struct.pack("<IHHIIQQii", 0x584C4F4B, 1, 1, 0, 0, 7, 3, 1, 0))
put("hello", "http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


# Protobuf by hand (no protobuf module in Debian's python3 here): varints
# and length-delimited fields are all these requests need.
def varint(n):
    out = b""
    n &= (1 << 64) - 1
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def vint(field, n):
    return varint(field << 3) + varint(n)


def ld(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


# fuzz_coord_rpc: the first byte picks the method, in coordinator/
# coord_model.h's COORD_METHODS order.
M = {name: i for i, name in enumerate([
    "AgentService.RegisterHost", "AgentService.Heartbeat", "AgentService.Report",
    "AdminService.SubmitJob", "AdminService.StopJob", "AdminService.GetJob",
    "AdminService.ListJobs", "AdminService.ListHosts", "AdminService.StreamOutput",
    "WorkerService.Rendezvous", "WorkerService.Negotiate", "WorkerService.PutSnapshot",
    "WorkerService.GetSnapshot", "WorkerService.Report", "WorkerService.Timeline",
    "AdminService.GetEpochs", "AdminService.DrainHost", "unknown"])}


def call(fname, method, body):
    put("coord_rpc", fname, bytes([M[method]]) + body)


call("register", "AgentService.RegisterHost",
     ld(1, "host-0123456789abcdef") + ld(2, "node-1") + ld(3, "10.0.0.2") + vint(5, 4) +
     ld(8, "0.1") + ld(9, "a1b2c3d4e5f60718"))
call("heartbeat", "AgentService.Heartbeat", ld(1, "session") + ld(2, "v1") + vint(3, 10))
call("report", "AgentService.Report",
     ld(1, "session") + ld(2, vint(1, 1) + vint(2, 1) + vint(3, 0) + vint(4, 2) + vint(6, 0)) +
     ld(3, vint(1, 1) + vint(2, 0) + vint(3, 1) + ld(4, "hello") + vint(5, 1795690000000)) +
     vint(4, 1))
call("submit", "AdminService.SubmitJob",
     ld(1, "python3") + ld(1, "train.py") + ld(2, "A=1") + ld(3, "/tmp") + vint(4, 2) +
     ld(6, "fuzz") + vint(7, 1000))
call("submit_elastic", "AdminService.SubmitJob",
     ld(1, "true") + vint(4, 2) + vint(8, 1) + vint(9, 1) + vint(10, 4) + vint(12, 1) +
     vint(13, 8) + ld(5, "node-1:2,node-2:2"))
call("stop", "AdminService.StopJob", vint(1, 1) + ld(2, "fuzz"))
call("get_job", "AdminService.GetJob", vint(1, 1))
call("list_jobs", "AdminService.ListJobs", b"")
call("stream", "AdminService.StreamOutput", vint(1, 1) + vint(2, 0) + vint(3, 10))
call("rendezvous", "WorkerService.Rendezvous",
     ld(1, "host-0123456789abcdef") + ld(2, "tcp:127.0.0.1:5000") + vint(3, 42) +
     vint(5, 10) + vint(6, 2) + vint(7, 64 << 20))
call("negotiate", "WorkerService.Negotiate",
     vint(1, 0) + ld(2, ld(1, "grad.0") + vint(2, 0) + vint(3, 7) + vint(4, 1000) + vint(5, 0)) +
     vint(3, 10) + vint(6, 3))
call("worker_report", "WorkerService.Report",
     ld(1, vint(1, 1) + vint(2, 1) + vint(3, 1795690000000) + vint(4, 128) +
        ld(5, '{"loss": 0.5}')) + vint(3, 0) + ld(5, ld(1, "auth") + vint(2, 2)))
call("get_epochs", "AdminService.GetEpochs", vint(1, 1))
call("drain", "AdminService.DrainHost", ld(1, "node-1"))
call("undrain", "AdminService.DrainHost", ld(1, "host-0123456789abcdef") + vint(2, 1))

# fuzz_coord_http: raw requests, as curl, a browser and a scanner send them.
for fname, req in [
        ("healthz", b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("jobs", b"GET /api/v1/jobs?state=running&limit=10 HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("job_output", b"GET /api/v1/jobs/1/output?since=0&rank=0&limit=100 HTTP/1.1\r\n"
                       b"Host: x\r\nAuthorization: Bearer fuzz-token-0123456789abcdef\r\n\r\n"),
        ("submit", b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Authorization: Bearer fuzz-token-0123456789abcdef\r\nContent-Length: 44\r\n"
                   b"\r\n{\"argv\":[\"true\"],\"np\":1,\"name\":\"fuzz\"}    "),
        ("stop", b"POST /api/v1/jobs/1/stop HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer x\r\n"
                 b"Content-Length: 0\r\n\r\n"),
        ("metrics", b"GET /metrics HTTP/1.0\r\n\r\n"),
        ("epochs", b"GET /api/v1/jobs/1/epochs HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("events", b"GET /api/v1/events?since=0 HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("chunked", b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                    b"\r\n5\r\nhello\r\n0\r\n\r\n"),
        ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")]:
    put("coord_http", fname, req)
