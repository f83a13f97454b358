"""kolo._snapshot, the Python side of durable elastic-state snapshots, in
real jobs: rank 0 commits (a torch state dict, serialized) from a
background thread while the ranks keep running collectives, every rank
reads it back, errors come out as SnapshotError, and a program started
without kolo is told snapshots need a coordinator."""
import os
import subprocess
import sys

from conftest import PYDIR

WORKER = r'''
import io
import sys
import threading

import torch
import kolo
import kolo.torch as hvd
from kolo import _snapshot

hvd.init()
r, n = hvd.rank(), hvd.size()
ok = []
ok.append(_snapshot.available())
ok.append(_snapshot.get_latest(timeout=10) is None)
hvd.barrier()

# rank 0 commits from a thread, as state.commit() does, while every rank
# trains on
model = torch.nn.Linear(64, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
ids = []
steps = {}  # snapshot id -> the step it was taken at
errors = []

def commit(step):
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    try:
        sid = _snapshot.put(buf.getvalue(), {"epoch": 1, "batch": step, "step": step})
        ids.append(sid)
        steps[sid] = step
    except Exception as e:  # reported below
        errors.append(e)

threads = []
for step in range(6):
    x = hvd.allreduce(torch.ones(1000) * (r + 1), op=hvd.Sum, name="grad.%d" % step)
    ok.append(bool(torch.allclose(x, torch.full((1000,), n * (n + 1) / 2.0))))
    if r == 0 and step % 2 == 1:
        t = threading.Thread(target=commit, args=(step,))
        t.start()
        threads.append(t)
for t in threads:
    t.join()
ok.append(not errors)
if r == 0:
    # the three puts run in parallel threads, so which one the coordinator
    # numbers last is up to the scheduler; ids are unique and increasing
    ok.append(len(set(ids)) == 3)
    last_step = steps[max(ids)]
else:
    last_step = None
last_step = hvd.broadcast_object(last_step, root_rank=0, name="last_step")
hvd.barrier()

got = _snapshot.get_latest()
ok.append(got is not None)
sid, blob, meta = got
ok.append(meta == {"batch": last_step, "epoch": 1, "step": last_step})
state = torch.load(io.BytesIO(blob))
ok.append(sorted(state) == ["model", "optimizer"])
if r == 0:
    ok.append(sid == max(ids))
    ok.append(bool(torch.equal(state["model"]["weight"], model.state_dict()["weight"])))
    older = _snapshot.get(min(ids))
    ok.append(older is not None and older[2]["batch"] == steps[min(ids)])
ok.append(_snapshot.get(sid + 1000) is None)
hvd.barrier()  # rank 1's puts below must not become "the latest" before every rank read it

# bytes-like objects, empty snapshots, bad metadata
if r == 1:
    e = _snapshot.put(bytearray(b"abc"), {"k": [1, 2]})
    ok.append(_snapshot.get(e)[1:] == (b"abc", {"k": [1, 2]}))
    e = _snapshot.put(memoryview(b"xyz")[1:], None)
    ok.append(_snapshot.get(e)[1] == b"yz")
    e = _snapshot.put(b"")
    ok.append(_snapshot.get(e)[1:] == (b"", {}))
    try:
        _snapshot.put(b"x", ["not", "a", "dict"])
        ok.append(False)
    except TypeError:
        ok.append(True)
hvd.barrier()
print("snapshot checks", r, ok)
hvd.shutdown()
try:
    _snapshot.put(b"x", {})
    ok.append(False)
except ValueError:
    ok.append(True)
sys.exit(0 if all(ok) else 1)
'''


def test_snapshot_roundtrip(run_job):
    job = run_job(2, WORKER, env={"KOLO_SNAPSHOT_CHUNK_BYTES": "65536"})
    assert job.rc == 0, job
    assert len([line for line in job.out.splitlines() if "snapshot checks" in line]) == 2, job


SOLO = r'''
import kolo
from kolo import _snapshot
kolo.init()
assert not _snapshot.available()
try:
    _snapshot.put(b"x", {})
except _snapshot.SnapshotError as e:
    assert "kolo run" in str(e), e
    print("refused")
'''


def test_snapshot_needs_a_coordinator():
    env = dict(os.environ)
    env.pop("KOLO_COORDINATOR", None)
    env["PYTHONPATH"] = PYDIR
    p = subprocess.run([sys.executable, "-c", SOLO], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, env=env, timeout=60)
    assert p.returncode == 0 and "refused" in p.stdout, (p.stdout, p.stderr)
