"""A coordinator and one agent on loopback for the Python benchmarks
(rest_polling.py, lock_contention.py):

    with local_cluster(slots=2) as (work, rpc, http_port):
        ...

`work` is a temporary folder removed afterwards; both processes are
stopped (terminate, then kill) whatever happens inside. Needs a build
(scripts/build.sh)."""
import contextlib
import os
import shutil
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KOLO = os.path.join(ROOT, "build", "bin", "kolo")


@contextlib.contextmanager
def local_cluster(slots, prefix="kolo-bench."):
    work = tempfile.mkdtemp(prefix=prefix)
    procs = []
    try:
        coord = subprocess.Popen([KOLO, "coordinator", "--listen", "tcp://127.0.0.1:0", "--http",
                                  "127.0.0.1:0", "--db", os.path.join(work, "c.db"),
                                  "--log-level", "warn"], stdout=subprocess.PIPE, text=True)
        procs.append(coord)
        ready = coord.stdout.readline()
        rpc = ready.split("rpc=")[1].split()[0]
        http_port = int(ready.split("http=")[1].split()[0].rsplit(":", 1)[1])
        procs.append(subprocess.Popen([KOLO, "agent", "--coordinator", rpc, "--slots", str(slots),
                                       "--name", "a", "--state-dir", os.path.join(work, "agent"),
                                       "--log-level", "warn"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        time.sleep(1.5)  # the agent registers
        yield work, rpc, http_port
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
