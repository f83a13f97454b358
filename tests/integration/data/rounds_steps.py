"""Training-like steps for the readiness-round test: each step submits
TENSORS named gradients (mixed dtypes, non-blocking, like a backward pass),
a barrier every 10 steps, and checks every sum. --slow-rank R sleeps
--slow-s before each of R's steps (a straggler); --progress FILE: rank 0
keeps its last step there (its output reaches kolo run through the
coordinator, which a test may stop). Prints "step N t T" every
step and "done N" at the end; exits 1 at the first wrong value."""
import argparse
import os
import sys
import time

import numpy as np

import kolo

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--tensors", type=int, default=12)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-s", type=float, default=0.05)
p.add_argument("--pause", type=float, default=0.0)
p.add_argument("--progress", default="", help="rank 0 writes its step here (output goes through the coordinator)")
a = p.parse_args()

kolo.init()
r, n = kolo.rank(), kolo.size()
dtypes = [np.float32, np.float64, np.int32, np.int64]
for step in range(a.steps):
    if r == a.slow_rank:
        time.sleep(a.slow_s)
    hs = []
    for t in range(a.tensors):
        dt = dtypes[t % len(dtypes)]
        x = np.full(16 + 7 * t, r + step + t, dtype=dt)
        hs.append((t, kolo.allreduce_async(x, op=kolo.Sum, name="grad.%d" % t)))
    for t, h in hs:
        got = kolo.synchronize(h)
        want = n * (step + t) + n * (n - 1) // 2
        if not np.all(got == want):
            print("WRONG step %d tensor %d: %r != %r" % (step, t, got[0], want), flush=True)
            sys.exit(1)
    if step % 10 == 9:
        kolo.barrier()
    print("step %d t %.3f" % (step, time.time()), flush=True)
    if a.progress and r == 0:
        with open(a.progress + ".tmp", "w") as f:
            f.write("%d\n" % step)
        os.replace(a.progress + ".tmp", a.progress)
    if a.pause:
        time.sleep(a.pause)
print("done %d" % a.steps, flush=True)
kolo.shutdown()
