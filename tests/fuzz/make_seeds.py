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
