"""Reports N epochs and prints one numbered line per epoch, every `pause`
seconds (test_full_disk checks that none is lost while the disk is full)."""
import sys
import time

import kolo

kolo.init()
n, pause = int(sys.argv[1]), float(sys.argv[2])
for epoch in range(1, n + 1):
    time.sleep(pause)
    print("line %d of rank %d" % (epoch, kolo.rank()), flush=True)
    kolo.report_epoch(epoch, samples=10, metrics={"loss": 1.0 / epoch})
kolo.shutdown()
