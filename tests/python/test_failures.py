"""What `kolo run` says when one rank's code fails (issue 32, item 4): the
rank that raised, with its exception, never a rank that failed in
consequence; the others' HorovodInternalError tracebacks without kolo's
own frames. Horovod's way of testing it: one rank raises while the
others wait in a collective, many times (which rank's exit the agents
report first is a race: Python's teardown of the rank that raised takes
a moment)."""
import random
import re

from conftest import kolo_run

WORKER = r'''
import sys, time, numpy as np, kolo
kolo.init()
culprit = int(sys.argv[1])
if kolo.rank() == culprit:
    time.sleep(0.05)
    raise ValueError("bad batch 17 on rank %d" % culprit)
kolo.allreduce(np.ones(2), name="grad")
kolo.barrier()
'''


def test_the_rank_that_raised_is_named_every_time():
    rng = random.Random(32)
    for np_ in (2, 4):
        for _ in range(10):
            culprit = rng.randrange(np_)
            job = kolo_run(np_, WORKER, args=(culprit,), timeout=60)
            assert job.rc == 1, job
            want = (r"\[kolo\] job \d+ failed: rank %d on host \S+ exited with code 1: "
                    r"ValueError: bad batch 17 on rank %d" % (culprit, culprit))
            assert re.search(want, job.err), job.err
            # the others' consequences: the user's line, not kolo's plumbing
            assert "HorovodInternalError" in job.err, job.err
            assert "kolo/_engine.py" not in job.err and "kolo/__init__.py" not in job.err, job.err
            assert "inside kolo left out; KOLO_FULL_TRACEBACK=1 shows them" in job.err, job.err


def test_full_traceback_on_request():
    job = kolo_run(2, WORKER, args=(1,), timeout=60, env={"KOLO_FULL_TRACEBACK": "1"})
    assert job.rc == 1, job
    assert "kolo/_engine.py" in job.err, job.err
    assert "left out" not in job.err, job.err
