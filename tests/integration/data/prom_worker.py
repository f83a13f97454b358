"""The job test_prometheus.sh watches: every rank allreduces a small array
in a loop and reports each step's time; the last rank sleeps before each
allreduce, so the others wait for it (the straggler); every 20 steps is an
epoch with its samples and a loss. Ends at the first epoch after the stop
file appears."""
import os
import sys
import time

import numpy as np

import kolo
from kolo._report import report_step

stop_file = sys.argv[1]
kolo.init()
r, n = kolo.rank(), kolo.size()
epoch, last = 1, time.perf_counter()
while True:
    for step in range(20):
        if r == n - 1:
            time.sleep(0.03)
        kolo.allreduce(np.full(1000, float(r), dtype=np.float32), op=kolo.Sum, name="grad")
        now = time.perf_counter()
        report_step(now - last)
        last = now
    kolo.report_epoch(epoch, samples=20 * 32, metrics={"loss": 1.0 / epoch})
    # rank 0 decides, so that every rank stops after the same epoch
    flag = np.array([1.0 if r == 0 and os.path.exists(stop_file) else 0.0])
    if kolo.broadcast(flag, root_rank=0, name="stop")[0] > 0:
        break
    epoch += 1
kolo.shutdown()
