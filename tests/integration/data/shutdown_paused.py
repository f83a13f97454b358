"""A rank shuts down while the coordinator stands still (issue 13, the
round's SHUTDOWN flag). Both ranks cache "held" (two allreduces), then rank
0 creates --ready; the test stops the coordinator and creates --go. Rank 1
then calls kolo.shutdown() and exits; rank 0 allreduces "held" again, which
must fail at once with Horovod's shutdown text although the coordinator
cannot say a word. Rank 0 writes "<exception> <seconds> <text>" to
--result (its output reaches kolo run only through the coordinator)."""
import argparse
import os
import sys
import time

import numpy as np

import kolo

p = argparse.ArgumentParser()
p.add_argument("--ready", required=True)
p.add_argument("--go", required=True)
p.add_argument("--result", required=True)
a = p.parse_args()

kolo.init()
r = kolo.rank()
x = np.ones(4, dtype=np.float32)
for _ in range(2):
    kolo.allreduce(x, op=kolo.Sum, name="held")
kolo.barrier()
if r == 0:
    open(a.ready, "w").close()
deadline = time.time() + 60
while not os.path.exists(a.go) and time.time() < deadline:
    time.sleep(0.01)
if r == 1:
    time.sleep(0.2)  # rank 0's op is pending by now
    kolo.shutdown()
    sys.exit(0)
t0 = time.time()
try:
    kolo.allreduce(x, op=kolo.Sum, name="held")
    out = "none %.3f the allreduce succeeded" % (time.time() - t0)
except Exception as e:  # noqa: BLE001 - the test reads what it was
    out = "%s %.3f %s" % (type(e).__name__, time.time() - t0, e)
with open(a.result + ".tmp", "w") as f:
    f.write(out + "\n")
os.replace(a.result + ".tmp", a.result)
