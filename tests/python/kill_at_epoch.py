"""Runs a training script in this process and SIGKILLs it at a known
point: worker 2 (rank 1 of the first generation) dies at its 40th
--step-delay sleep, in epoch 3 of elastic_digits.py. That is how
test_examples.py kills a worker of the example without changing it."""
import os
import runpy
import signal
import sys
import time

script = sys.argv[1]
sys.argv = sys.argv[1:]
if os.environ.get("KOLO_WORKER_ID") == "2":
    real_sleep = time.sleep
    calls = [0]

    def counting_sleep(seconds):
        if seconds == 0.01:
            calls[0] += 1
            if calls[0] == 40:
                print("killing worker 2 at batch sleep 40", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        real_sleep(seconds)

    time.sleep = counting_sleep
runpy.run_path(script, run_name="__main__")
