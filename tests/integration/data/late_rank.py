"""Rank 1 joins late (argv[1] seconds), so rank 0 waits in the rendezvous
with its data port open: the window test_dataplane_auth uses to throw
strangers at it. Then one allreduce whose sum is known. argv[2], if
given, names a rank that turns the data plane's encryption off (a rank
configured unlike the others)."""
import os
import sys
import time

import numpy as np

if os.environ.get("KOLO_RANK") == "1":
    time.sleep(float(sys.argv[1]))
if len(sys.argv) > 2 and os.environ.get("KOLO_RANK") == sys.argv[2]:
    os.environ["KOLO_DATA_ENCRYPT"] = "0"
import kolo

kolo.init()
got = kolo.allreduce(np.full(4, kolo.rank() + 1.0, dtype=np.float32), op=kolo.Sum, name="x")
print("result " + " ".join("%g" % v for v in got), flush=True)
kolo.shutdown()
