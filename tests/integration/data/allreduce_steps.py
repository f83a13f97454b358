"""A fixed-size job that checks every allreduce result: N steps, each rank
adds rank + step, so the sum is known. Exits 1 at the first wrong value;
prints progress every 100 steps. Used by the coordinator-restart tests."""
import sys
import time

import numpy as np

import kolo

kolo.init()
r, n = kolo.rank(), kolo.size()
steps = int(sys.argv[1])
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
for step in range(steps):
    got = kolo.allreduce(np.full(1000, r + step, dtype=np.float64), op=kolo.Sum, name="grad")
    want = n * step + n * (n - 1) / 2
    if not np.all(got == want):
        print("WRONG step %d: %r != %r" % (step, got[0], want), flush=True)
        sys.exit(1)
    if step % 100 == 0:
        print("step %d t %.3f" % (step, time.time()), flush=True)
    if pause:
        time.sleep(pause)
print("done %d" % steps, flush=True)
kolo.shutdown()
