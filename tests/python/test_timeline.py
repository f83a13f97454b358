"""The coordinator's timeline (issue 6): a 2-worker job run with
--timeline-filename writes Horovod's Chrome-trace JSON, with a process
per tensor, NEGOTIATE_ALLREDUCE begin and end, one tick per rank, and the
ALLREDUCE phase with its dtype and shape; a relative path lands in the
job's cwd; hvd.start_timeline()/stop_timeline() start and stop it at run
time."""
import json
import os

from conftest import kolo_run

WORKER = r'''
import torch
import kolo.torch as hvd

hvd.init()
for step in range(3):
    out = hvd.allreduce(torch.ones(4) * (hvd.rank() + 1), name="tl.grad", op=hvd.Sum)
    assert out.tolist() == [3.0] * 4, out
hvd.allreduce(torch.zeros(2, 3, dtype=torch.float64), name="tl.other")
print("done", flush=True)
'''

# The same job through kolo's numpy API, for the tests of where the file
# goes: the same ops reach the coordinator, without a torch import per rank.
WORKER_NUMPY = r'''
import numpy as np
import kolo

kolo.init()
for step in range(3):
    out = kolo.allreduce(np.ones(4, dtype=np.float32) * (kolo.rank() + 1), name="tl.grad", op=kolo.Sum)
    assert out.tolist() == [3.0] * 4, out
kolo.allreduce(np.zeros((2, 3), dtype=np.float64), name="tl.other")
print("done", flush=True)
'''

RUNTIME = r'''
import sys
import torch
import kolo.torch as hvd

hvd.init()
hvd.allreduce(torch.ones(3), name="before")
hvd.allreduce(torch.ones(3), name="cached")  # agreed by the ranks' rounds from now on
hvd.barrier()
hvd.start_timeline(sys.argv[1])  # every rank, as Horovod scripts do
hvd.allreduce(torch.ones(3), name="cached")  # at once: in the timeline all the same
hvd.allreduce(torch.ones(3), name="during")
hvd.barrier()
hvd.stop_timeline()
hvd.barrier()
hvd.allreduce(torch.ones(3), name="after")
print("done", flush=True)
'''


def test_start_and_stop_at_run_time(tmp_path):
    path = str(tmp_path / "run.json")
    job = kolo_run(2, RUNTIME, args=(path,))
    assert job.rc == 0, job
    evs = load(path)
    names = {e["args"]["name"] for e in evs if e.get("name") == "process_name" and e["ph"] == "M"}
    assert "during" in names, names
    assert "cached" in names, names  # the op right after start_timeline
    assert "before" not in names and "after" not in names, names
    ticks = [e for e in events_of(evs, "during") if e["ph"] == "X"]
    assert sorted(e["name"] for e in ticks) == ["0", "1"], ticks


def load(path):
    with open(path) as f:
        text = f.read().rstrip()
    if not text.endswith("]"):  # a coordinator that died leaves it open
        text = text.rstrip(",") + "]"
    return json.loads(text)


def events_of(evs, tensor):
    pids = [e["pid"] for e in evs if e.get("name") == "process_name" and e["ph"] == "M"
            and e["args"].get("name") == tensor]
    assert len(pids) == 1, (tensor, pids)
    return [e for e in evs if e["pid"] == pids[0] and e["ph"] != "M"]


def check(evs, tensor, steps, dtype, shape):
    mine = events_of(evs, tensor)
    begins = [e for e in mine if e["ph"] == "B" and e["name"] == "NEGOTIATE_ALLREDUCE"]
    ops = [e for e in mine if e["ph"] == "B" and e["name"] == "ALLREDUCE"]
    ends = [e for e in mine if e["ph"] == "E"]
    ticks = [e for e in mine if e["ph"] == "X"]
    assert len(begins) == steps and len(ops) == steps, mine
    assert len(ends) == 2 * steps, mine  # NEGOTIATE and ALLREDUCE each end
    assert sorted(e["name"] for e in ticks) == sorted(["0", "1"] * steps), ticks
    assert all(e["dur"] == 0 for e in ticks)
    done = [e for e in ends if "dtype" in e.get("args", {})]
    assert len(done) == steps, ends
    assert done[0]["args"]["dtype"] == dtype and done[0]["args"]["shape"] == shape, done
    ts = [e["ts"] for e in mine]
    assert ts == sorted(ts), ts  # per tensor, in order
    # each negotiation: begin, ticks, end, then the op, then its end
    first = mine[:6]
    assert [e["ph"] for e in first] == ["B", "X", "X", "E", "B", "E"], first


def test_timeline_file(tmp_path):
    path = str(tmp_path / "timeline.json")
    job = kolo_run(2, WORKER, kolo_args=("--timeline-filename", path))
    assert job.rc == 0, job.err
    assert len([l for l in job.lines() if l == "done"]) == 2
    with open(path) as f:
        assert f.read().rstrip().endswith("]"), "the file was not closed"
    evs = load(path)
    header = [e for e in evs if e.get("pid") == 0 and e["name"] == "process_name"]
    assert header and "start_time_since_epoch_in_micros" in header[0]["args"]
    check(evs, "tl.grad", 3, "HOROVOD_FLOAT32", "[4]")
    check(evs, "tl.other", 1, "HOROVOD_FLOAT64", "[2, 3]")


def test_never_overwrites_what_is_not_a_timeline(tmp_path):
    """Issue 15, F11: the coordinator may run as another user than the job,
    so a timeline path must not make it clobber another file (a secret of
    0600, a symbolic link to one); a timeline it made is 0600 and may be
    replaced by the next run's."""
    secret = tmp_path / "secret"
    secret.write_text("-----BEGIN KEY-----\n")
    secret.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(secret)
    for target in (secret, link):
        job = kolo_run(2, WORKER_NUMPY, kolo_args=("--timeline-filename", str(target)))
        assert job.rc == 0, job.err  # the job runs without its timeline
        assert secret.read_text() == "-----BEGIN KEY-----\n"
    fresh = str(tmp_path / "t.json")
    for _ in range(2):  # the second run replaces the first's timeline
        job = kolo_run(2, WORKER_NUMPY, kolo_args=("--timeline-filename", fresh))
        assert job.rc == 0, job.err
        check(load(fresh), "tl.grad", 3, "HOROVOD_FLOAT32", "[4]")
        assert os.stat(fresh).st_mode & 0o777 == 0o600


def test_relative_path_is_in_the_jobs_cwd():
    job = kolo_run(2, WORKER_NUMPY.replace('print("done"', 'import os; print("cwd", os.getcwd()); print("done"'),
                   kolo_args=("--timeline-filename", "rel.json"))
    assert job.rc == 0, job.err
    cwd = [l.split(" ", 1)[1] for l in job.lines(0) if l.startswith("cwd ")][0]
    check(load(os.path.join(cwd, "rel.json")), "tl.grad", 3, "HOROVOD_FLOAT32", "[4]")


def test_dynamic_writes_nothing_until_started(tmp_path):
    """HOROVOD_TIMELINE=DYNAMIC is Horovod's "timeline API on, no file
    yet" (its own test_torch.py sets it at import): no file called DYNAMIC
    appears, whether the job's environment or the script sets it, and
    start_timeline then writes the named file."""
    path = str(tmp_path / "dyn.json")
    script = ('import os\nos.environ["HOROVOD_TIMELINE"] = "DYNAMIC"\n' +
              RUNTIME.replace('print("done"', 'print("cwd", os.getcwd()); print("done"'))
    job = kolo_run(2, script, args=(path,), env={"HOROVOD_TIMELINE": "DYNAMIC"})
    assert job.rc == 0, job.err
    cwd = [l.split(" ", 1)[1] for l in job.lines(0) if l.startswith("cwd ")][0]
    assert not os.path.exists(os.path.join(cwd, "DYNAMIC")), os.listdir(cwd)
    names = {e["args"]["name"] for e in load(path)
             if e.get("name") == "process_name" and e["ph"] == "M"}
    assert "during" in names and "before" not in names, names
