"""Training-like steps for the readiness-round test: each step submits
TENSORS named gradients (mixed dtypes, non-blocking, like a backward pass),
a barrier every 10 steps, and checks every sum. --slow-rank R sleeps
--slow-s before each of R's steps (a straggler); --progress FILE: rank 0
keeps its last step there (its output reaches kolo run through the
coordinator, which a test may stop); --timeline FILE --timeline-steps A,B:
every rank starts the job's timeline before step A and stops it before
step B (the rounds go on; the ranks report their spans); --jitter S: each
rank sleeps up to S before each tensor, so ranks submit on different
sides of a round; --end-file FILE: once FILE exists it holds a step
count, where the job ends if that comes before --steps (every rank reads
it before each step, and a test writes a count well past rank 0's step,
so both ranks end at the same one). Prints "step N t T" every step and
"done N" (the steps made) at the end; exits 1 at the first wrong value."""
import argparse
import os
import random
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
p.add_argument("--timeline", default="")
p.add_argument("--timeline-steps", default="-1,-1")
p.add_argument("--jitter", type=float, default=0.0)
p.add_argument("--end-file", default="")
p.add_argument("--tag", default="", help="not used: marks the command line for a test")
a = p.parse_args()
tl_on, tl_off = (int(x) for x in a.timeline_steps.split(","))


def timeline(path):
    """kolo_timeline on this rank (the C API: the numpy module has no
    wrapper; kolo.torch's start_timeline calls the same)."""
    with kolo._eng().borrow() as (lib, ctx):
        rc = lib.kolo_timeline(ctx, path.encode() if path else None)
        if rc:
            print("TIMELINE FAILED %d" % rc, flush=True)
            sys.exit(1)


kolo.init()
r, n = kolo.rank(), kolo.size()
random.seed(r)
dtypes = [np.float32, np.float64, np.int32, np.int64]
steps, step = a.steps, 0
while step < steps:
    if a.end_file and steps == a.steps and os.path.exists(a.end_file):
        with open(a.end_file) as f:
            steps = min(steps, int(f.read()))
        if step >= steps:
            break
    if r == a.slow_rank:
        time.sleep(a.slow_s)
    if step in (tl_on, tl_off):  # as Horovod scripts do: switch, then a barrier
        timeline(a.timeline if step == tl_on else None)
        kolo.barrier()
    hs = []
    for t in range(a.tensors):
        if a.jitter:
            time.sleep(random.uniform(0, a.jitter))
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
    step += 1
print("done %d" % step, flush=True)
kolo.shutdown()
