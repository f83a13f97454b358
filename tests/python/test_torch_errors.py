"""Errors, as Horovod raises them: mismatches fail on every rank with
Horovod's message, a name in flight twice is a ValueError, calls before
init() are ValueErrors, unsupported tensors are refused up front."""
import os
import subprocess
import sys

import pytest

from conftest import PYDIR

WORKER = r'''
import sys
import torch
import kolo.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
results = []


def expect(fn, exc, text, tag):
    try:
        fn()
    except exc as e:
        ok = text in str(e)
        results.append((tag, ok, str(e)))
        return
    except Exception as e:
        results.append((tag, False, "wrong exception %s: %s" % (type(e).__name__, e)))
        return
    results.append((tag, False, "no exception"))


expect(lambda: hvd.allreduce(torch.ones(3) if r == 0 else torch.ones(3, dtype=torch.int32),
                             name="dtype"),
       hvd.HorovodInternalError, "Mismatched data types", "dtype")
expect(lambda: hvd.allreduce(torch.ones(3 + r), name="shape"),
       hvd.HorovodInternalError, "Mismatched ALLREDUCE tensor shapes", "shape")
expect(lambda: hvd.allreduce(torch.ones(3), name="op", op=hvd.Sum if r == 0 else hvd.Max),
       hvd.HorovodInternalError, "Mismatched reduction operation", "op")
expect(lambda: hvd.broadcast(torch.ones(3), root_rank=r, name="root"),
       hvd.HorovodInternalError, "Mismatched BROADCAST root ranks", "root")
expect(lambda: hvd.allreduce(torch.ones(3), name="scale", prescale_factor=1.0 + r),
       hvd.HorovodInternalError, "Mismatched prescale and/or postscale factors", "scale")
expect(lambda: (hvd.allreduce(torch.ones(2), name="kind") if r == 0 else
                hvd.allgather(torch.ones(2), name="kind")),
       hvd.HorovodInternalError, "Mismatched operations", "kind")
expect(lambda: hvd.allgather(torch.ones(2, 3 + r), name="agshape"),
       hvd.HorovodInternalError, "Mismatched ALLGATHER tensor shapes", "allgather dims")

# a mismatch is an error like any RuntimeError (Horovod's type hierarchy)
assert issubclass(hvd.HorovodInternalError, RuntimeError)

# after the errors, collectives work again
assert torch.allclose(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.ones(2) * n)

# the same name twice in flight: ValueError on the caller, nothing enqueued.
# The other ranks submit the name only after a barrier that the tester
# reaches after its check, so the first operation is surely still in flight.
for tester in range(n):
    name = "twice.%d" % tester
    if r == tester:
        h = hvd.allreduce_async(torch.ones(2), name=name)
        expect(lambda: hvd.allreduce_async(torch.ones(2), name=name), ValueError,
               "same name as another tensor that is currently being processed", "duplicate name")
        hvd.barrier()
    else:
        hvd.barrier()
        h = hvd.allreduce_async(torch.ones(2), name=name)
    hvd.synchronize(h)

# done but not yet seen by the caller: the name stays taken until
# synchronize (Horovod's own duplicate-name tests submit again right after
# the matching op; its loop completes nothing within a millisecond, kolo a
# small op in microseconds), then it is free again
import time
name = "seen.late"
if r == 0:
    h = hvd.allreduce_async(torch.ones(2), name=name, op=hvd.Sum)
hvd.barrier()
if r != 0:
    h = hvd.allreduce_async(torch.ones(2), name=name, op=hvd.Sum)
time.sleep(0.2)  # done by now on every rank, and not yet synchronized
expect(lambda: hvd.allreduce_async(torch.ones(2), name=name), ValueError,
       "same name as another tensor that is currently being processed", "done unseen")
assert hvd.synchronize(h).tolist() == [float(n)] * 2
assert hvd.allreduce(torch.ones(2), name=name, op=hvd.Sum).tolist() == [float(n)] * 2

# refused up front, on this rank alone
expect(lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool)), ValueError,
       "Tensor type torch.BoolTensor is not supported.", "bool")
expect(lambda: hvd.allreduce(torch.ones(4, 4).t()), ValueError,
       "Tensor is required to be contiguous.", "non-contiguous")
if n & (n - 1):
    expect(lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), NotImplementedError,
           "Running Adasum with non-power of 2 ranks is not supported yet.", "adasum")
expect(lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum, average=True), ValueError,
       "supersedes average", "op and average")
for bad in (hvd.Max, hvd.Adasum):
    expect(lambda: hvd.reducescatter(torch.ones(2), op=bad), hvd.HorovodInternalError,
           "Reducescatter currently only supports SUM.", "reducescatter op %d" % bad)
expect(lambda: hvd.allgather(torch.tensor(1.0)), ValueError, "rank-zero tensor", "rank 0 ag")
expect(lambda: hvd.broadcast(torch.ones(2), root_rank=n), ValueError, "out of range", "root range")
expect(lambda: hvd.alltoall(torch.ones(n + 1) if n > 1 else torch.ones(3), splits=[5] * n),
       ValueError, "splits add up", "splits")
if torch.cuda.is_available():
    pass  # the GPU backend is a later issue
else:
    fake = torch.ones(2).to("meta")
    expect(lambda: hvd.allreduce(fake), ValueError, "not supported", "non-cpu device")

bad = [x for x in results if not x[1]]
for tag, ok, msg in results:
    print("%s %s: %s" % ("ok" if ok else "FAIL", tag, msg.splitlines()[0] if msg else ""))
hvd.shutdown()
sys.exit(1 if bad else 0)
'''


def test_errors_on_every_rank(run_job):
    job = run_job(2, WORKER)
    assert job.rc == 0, job
    for k in range(2):
        lines = job.lines(k)
        for tag in ("dtype", "shape", "op", "root", "scale", "kind", "duplicate name",
                    "done unseen", "bool"):
            assert any(line.startswith("ok %s:" % tag) for line in lines), (tag, job)


BEFORE_INIT = r'''
import torch
import kolo.torch as hvd
for fn in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank, hvd.cross_size,
           lambda: hvd.allreduce(torch.ones(2)), lambda: hvd.broadcast(torch.ones(2), 0)):
    try:
        fn()
    except ValueError as e:
        assert "not been initialized" in str(e), e
    else:
        raise SystemExit("no ValueError before init")
assert not hvd.is_initialized()
hvd.init()
assert hvd.is_initialized()
hvd.shutdown()
assert not hvd.is_initialized()
print("before-init ok")
'''


def test_calls_before_init_raise_value_error(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(BEFORE_INIT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_COORDINATOR")}
    env["PYTHONPATH"] = PYDIR
    p = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=env, timeout=120, universal_newlines=True)
    assert p.returncode == 0 and "before-init ok" in p.stdout, p.stdout


def test_library_override_is_reported(tmp_path):
    """KOLO_LIBRARY pointing nowhere gives an ImportError naming it."""
    script = tmp_path / "w.py"
    script.write_text("import kolo._lib as l\nl.load()\n")
    env = dict(os.environ, PYTHONPATH=PYDIR, KOLO_LIBRARY=str(tmp_path / "nope.so"))
    p = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=env, timeout=60, universal_newlines=True)
    assert p.returncode != 0 and "nope.so" in p.stdout and "KOLO_LIBRARY" in p.stdout, p.stdout


def test_dead_peer_fails_survivor(run_job):
    """A rank that dies mid-training makes the survivor's collective raise
    HorovodInternalError quickly (the job then fails with the dead rank's code)."""
    job = run_job(2, r'''
import os, signal, sys, time
import torch
import kolo.torch as hvd
# the job stops the survivor once rank 1 failed; ignoring SIGTERM leaves it
# the stop grace (5 s, then SIGKILL) to report what it saw
signal.signal(signal.SIGTERM, signal.SIG_IGN)
hvd.init()
hvd.allreduce(torch.ones(2), name="warm")
if hvd.rank() == 1:
    os._exit(7)
t0 = time.time()
try:
    hvd.allreduce(torch.ones(1 << 20), name="after-death")
    print("no error")
except hvd.HorovodInternalError as e:
    print("survivor error after %.2f s: %s" % (time.time() - t0, str(e).splitlines()[0]))
    sys.stdout.flush()
    time.sleep(30)  # the job is stopped for us: rank 1 failed
''', timeout=60)
    assert job.rc == 7, job
    errs = [line for line in job.lines(0) if line.startswith("survivor error after ")]
    assert errs, job
    assert float(errs[0].split()[3]) < 10.0, errs
