"""Horovod habits that used to go wrong in a module run (issue 30).

An async op a test never synchronizes: Horovod keeps its tensors alive
(its handle map) for as long as the process runs; kolo dropped them at
shutdown before libkolo stopped, and an op whose response arrived then
still reduced into the freed tensor (heap corruption, seen as "malloc():
unaligned tcache chunk detected" a few tests later)."""

import os

WORKER = r'''
import gc
import sys
import torch
import kolo.torch as hvd
from kolo import _engine

fails = []

# 1. white box: the tensor of an op still pending at shutdown is alive
# while kolo_fini runs
hvd.init()
r, n = hvd.rank(), hvd.size()
t = torch.ones(4)
ptr = t.data_ptr()
if r == 0:
    h = hvd.allreduce_async(t, name="never.everywhere")  # the others never submit it
del t
gc.collect()
lib = _engine._lib.load()
real_fini = lib.kolo_fini
seen = []


def fini(ctx):
    # the op holds a view of t's memory (a detached tensor): some tensor
    # on that memory must still be alive
    seen.append(any(isinstance(o, torch.Tensor) and o.data_ptr() == ptr
                    for o in gc.get_objects()))
    return real_fini(ctx)


lib.kolo_fini = fini
try:
    hvd.shutdown()
finally:
    lib.kolo_fini = real_fini
if r == 0 and seen != [True]:
    fails.append("the pending op's memory was freed before kolo_fini (%s)" % seen)

# 2. the module pattern: rank 0 submits "x" before a barrier, the others
# after it, nobody synchronizes, then tearDown's barrier and shutdown,
# over and over with fresh tensors
for it in range(12):
    hvd.init()
    t = torch.ones(5) * (it + 1)
    if hvd.rank() == 0:
        h = hvd.allreduce_async(t, name="x")
    hvd.barrier()
    if hvd.rank() != 0:
        h = hvd.allreduce_async(t, name="x")
    hvd.barrier()
    junk = [torch.randn(5) for _ in range(64)]  # reuse what was freed
    hvd.barrier()
    hvd.shutdown()
    del junk

for f in fails:
    print("FAIL", f)
print("dropin checks done, %d failures" % len(fails))
sys.exit(1 if fails else 0)
'''


def test_unsynchronized_ops_across_shutdown(run_job):
    for np_ in (2, 4):
        job = run_job(np_, WORKER, timeout=180)
        assert job.rc == 0, job
        for k in range(np_):
            assert "dropin checks done, 0 failures" in job.lines(k), job


JOIN_BARRIER = r'''
import torch
import kolo.torch as hvd

# each rank in turn joins while the others pass a barrier, then join too
# (Horovod: the barrier completes among the ranks that did not join); the
# joined rank skipped a barrier, and its next one must still meet theirs
hvd.init()
r, n = hvd.rank(), hvd.size()
for it in range(2):
    for joiner in range(n):
        if r != joiner:
            hvd.barrier()
        last = hvd.join()
        assert hvd.allgather_object(last) == [last] * n
    hvd.barrier()
    x = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.%d" % it)
    assert x.tolist() == [float(n)] * 2, x
print("join with barrier done")
'''


def test_join_while_the_others_pass_a_barrier(run_job):
    # unnamed barriers are numbered per rank: the one that joined skipped
    # a number and waited forever at its next barrier (np 3 and 4)
    for np_ in (3, 4):
        job = run_job(np_, JOIN_BARRIER, timeout=90)
        assert job.rc == 0, job
        assert len([l for l in job.lines() if l == "join with barrier done"]) == np_, job


ENDED_SESSION = r'''
import torch
import kolo.torch as hvd

# Horovod's tearDown is `hvd.barrier(); hvd.shutdown()`: when the barrier
# raises because a peer already left (that peer's test failed), shutdown()
# is never called and the next test starts with hvd.init(). That init must
# give a working session, not keep the dead one for every later test.
hvd.init()
r, n = hvd.rank(), hvd.size()
hvd.allreduce(torch.ones(1), name="warm")
hvd.barrier()
if r == n - 1:
    hvd.shutdown()           # leaves while the others wait in a barrier
else:
    try:
        hvd.barrier()
        raise SystemExit("the barrier passed without rank %d" % (n - 1))
    except hvd.HorovodInternalError as e:
        assert "rank %d left the job" % (n - 1) in str(e), e
    assert hvd.is_initialized()
hvd.init()                   # the next test: no shutdown() before it
x = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="warm")
assert x.tolist() == [float(n)] * 3, x
hvd.barrier()
hvd.shutdown()
print("new session after an ended one")
'''


def test_init_after_a_peer_ended_the_session(run_job):
    for np_ in (2, 3):
        job = run_job(np_, ENDED_SESSION, timeout=90)
        assert job.rc == 0, job
        assert job.lines().count("new session after an ended one") == np_, job


PRIVATE = r'''
import queue
import torch
import kolo.torch as hvd
from kolo.torch import mpi_ops

hvd.init()
n = hvd.size()
# Horovod's mpi_ops._handle_map: handle -> the tensors an op keeps alive
# until synchronize()
base = len(mpi_ops._handle_map)
t = torch.ones(3)
h = hvd.allreduce_async(t, name="hm", op=hvd.Sum)
assert h in mpi_ops._handle_map and len(mpi_ops._handle_map) == base + 1
kept = mpi_ops._handle_map[h]
assert isinstance(kept, tuple) and any(k.data_ptr() == t.data_ptr() for k in kept), kept
assert hvd.synchronize(h).tolist() == [float(n)] * 3
assert h not in mpi_ops._handle_map and len(mpi_ops._handle_map) == base
# state._host_messages: Horovod's queue of the driver's notifications
state = hvd.elastic.ObjectState(epoch=0)
assert state._host_messages.empty() and state._host_messages.qsize() == 0
try:
    state._host_messages.get_nowait()
    raise SystemExit("get_nowait on an empty queue returned")
except queue.Empty:
    pass
state.commit()                                   # nothing announced: no interrupt
state.on_hosts_updated(1234, 2)                  # what Horovod's driver calls
assert not state._host_messages.empty()
try:
    state.commit()
    raise SystemExit("no HostsUpdatedInterrupt")
except hvd.HostsUpdatedInterrupt as e:
    assert e.skip_sync is False                  # hosts added: sync again
assert state._host_messages.empty()
hvd.barrier()
hvd.shutdown()
print("private members as Horovod's")
'''


def test_horovods_private_members_used_by_scripts(run_job):
    job = run_job(2, PRIVATE, timeout=90)
    assert job.rc == 0, job
    assert job.lines().count("private members as Horovod's") == 2, job


UNMODIFIED = r'''
# a Horovod script, unchanged: its imports are horovod's
import torch
import horovod
import horovod.torch as hvd
from horovod.torch.mpi_ops import rank, size
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.common.exceptions import HorovodInternalError
from horovod.common.util import split_list

hvd.init()
assert horovod.__kolo_alias__ and (rank(), size()) == (hvd.rank(), hvd.size())
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
model(torch.ones(2, 3) * (hvd.rank() + 1)).sum().backward()
opt.step()
w = hvd.allgather(model.weight.detach())
assert torch.equal(w[0], w[-1]), w  # every rank took the same step
s = hvd.allreduce(torch.ones(2) * (hvd.rank() + 1), op=hvd.Sum)
state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0)
sampler = ElasticSampler(list(range(8)))
assert issubclass(HorovodInternalError, RuntimeError) and split_list([1, 2, 3], 2) == [[1, 2], [3]]
print("ALIAS", s.tolist(), flush=True)
hvd.shutdown()
'''


def test_unmodified_horovod_script_on_the_alias_path(run_job):
    """`import horovod.torch as hvd` runs on kolo with the alias package
    first on the path (python3 -m kolo.as_horovod --path), the script
    unchanged: code one cannot edit (a library's own Horovod support)."""
    import subprocess
    import sys
    from conftest import PYDIR
    alias = subprocess.run([sys.executable, "-m", "kolo.as_horovod", "--path"], check=True,
                           stdout=subprocess.PIPE, universal_newlines=True,
                           env=dict(os.environ, PYTHONPATH=PYDIR)).stdout.strip()
    job = run_job(2, UNMODIFIED, env={"PYTHONPATH": alias + os.pathsep + PYDIR})
    assert job.rc == 0, job
    assert job.out.count("ALIAS [3.0, 3.0]") == 2, job.out


def test_alias_leaves_a_real_horovod_alone():
    """kolo.as_horovod in a process where another horovod was imported
    first refuses (ImportError) instead of replacing it."""
    import subprocess
    import sys
    from conftest import PYDIR
    code = ("import sys, types\n"
            "sys.modules['horovod'] = types.ModuleType('horovod')\n"
            "try:\n"
            "    import kolo.as_horovod\n"
            "except ImportError as e:\n"
            "    print('REFUSED', e)\n")
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True,
                       env=dict(os.environ, PYTHONPATH=PYDIR))
    assert "REFUSED" in p.stdout and "real horovod" in p.stdout, p.stdout
