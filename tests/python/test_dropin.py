"""Horovod habits that used to go wrong in a module run (issue 30).

An async op a test never synchronizes: Horovod keeps its tensors alive
(its handle map) for as long as the process runs; kolo dropped them at
shutdown before libkolo stopped, and an op whose response arrived then
still reduced into the freed tensor (heap corruption, seen as "malloc():
unaligned tcache chunk detected" a few tests later)."""

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
