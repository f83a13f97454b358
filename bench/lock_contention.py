"""What the coordinator's one lock costs first-time negotiation (issue 17,
item 2): a 2-rank job whose every allreduce has a new name, so each one is
negotiated by the coordinator, timed per operation on rank 0: quiet, and
while 20 clients poll the dashboard's REST routes and another job prints
about 10,000 lines a second (stored by the coordinator, with fsync).
Interleaved, REPS rounds; prints each run, the medians over rounds of p50
and p99, and writes a Markdown table with --out. The figures to compare
before and after moving HTTP reads and output appends off the lock.

  /usr/bin/python3 bench/lock_contention.py [--reps 3] [--ops 400] [--heavy] [--out FILE]

--heavy: the pollers read the printing job's last 10,000 output lines and
the last 10,000 events (REST's biggest reads) instead of the dashboard's
usual routes.

Needs a build (scripts/build.sh).
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import KOLO, ROOT, local_cluster  # noqa: E402
from rest_polling import pollers  # noqa: E402

PROBE = r'''
import json, sys, time
import numpy as np
import kolo

ops = int(sys.argv[1])
kolo.init()
x = np.ones(4, dtype=np.float32)
kolo.allreduce(x, name="warm")
lat = []
for i in range(ops):
    t0 = time.perf_counter()
    kolo.allreduce(x, name="fresh.%d" % i)  # a new name: the coordinator negotiates it
    lat.append((time.perf_counter() - t0) * 1e6)
if kolo.rank() == 0:
    lat.sort()
    print("LAT " + json.dumps({"p50": lat[len(lat) // 2], "p99": lat[int(len(lat) * 0.99)]}),
          flush=True)
kolo.shutdown()
'''

PRINTER = r'''
import sys, time
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for i in range(100):
        print("log line %d of a chatty training job, padded to a typical length" % n)
        n += 1
    sys.stdout.flush()
    time.sleep(0.01)
'''


def kolo_run(rpc, np_, script, args, env, capture=True):
    cmd = [KOLO, "run", "-np", str(np_), "--coordinator", rpc, "--", "/usr/bin/python3", script]
    cmd += [str(a) for a in args]
    if capture:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def newest_job(hport):
    conn = http.client.HTTPConnection("127.0.0.1", hport, timeout=10)
    conn.request("GET", "/api/v1/jobs")
    jobs = json.loads(conn.getresponse().read())["jobs"]
    conn.close()
    return max(j["id"] for j in jobs)


def probe(rpc, work, ops, env):
    out = kolo_run(rpc, 2, os.path.join(work, "probe.py"), [ops], env)
    for line in out.stdout.splitlines():
        if "LAT " in line:
            return json.loads(line.split("LAT ", 1)[1])
    sys.exit("probe failed: %s %s" % (out.stdout[-500:], out.stderr[-500:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ops", type=int, default=400)
    ap.add_argument("--pollers", type=int, default=20)
    ap.add_argument("--period", type=float, default=0.05)
    ap.add_argument("--no-printer", action="store_true", help="the pollers only")
    ap.add_argument("--heavy", action="store_true",
                    help="the pollers read the printing job's last 10,000 lines and the last "
                         "10,000 events instead of the dashboard's routes")
    ap.add_argument("--out")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    with local_cluster(slots=3, prefix="kolo-lockbench.") as (work, rpc, hport):
        for name, text in (("probe.py", PROBE), ("printer.py", PRINTER)):
            with open(os.path.join(work, name), "w") as f:
                f.write(text)
        probe(rpc, work, 20, env)  # job 1 exists for the pollers' job routes
        paths = ["/api/v1/jobs", "/api/v1/jobs/1", "/api/v1/jobs/1/epochs",
                 "/api/v1/jobs/1/output?limit=50", "/api/v1/events", "/metrics",
                 "/api/v1/hosts"]
        res = {"quiet": [], "loaded": []}
        rates = []
        for rep in range(a.reps):
            for mode in ("quiet", "loaded"):
                stop = threading.Event()
                printer = None
                count = [0]
                if mode == "loaded":
                    if not a.no_printer:
                        printer = kolo_run(rpc, 1, os.path.join(work, "printer.py"), [600], env,
                                           capture=False)
                    time.sleep(2)
                    asked = paths
                    if a.heavy:
                        job = newest_job(hport)
                        asked = ["/api/v1/jobs/%d/output?limit=10000" % job,
                                 "/api/v1/events?limit=10000"]
                    _, count = pollers("127.0.0.1", hport, asked, a.pollers, a.period, stop)
                    time.sleep(1)
                c0, t0 = count[0], time.monotonic()
                lat = probe(rpc, work, a.ops, env)
                if mode == "loaded":
                    rates.append((count[0] - c0) / (time.monotonic() - t0))
                stop.set()
                if printer:
                    printer.terminate()
                    printer.wait(30)
                res[mode].append(lat)
                print(json.dumps({"rep": rep, "mode": mode, **{k: round(v, 1)
                                                               for k, v in lat.items()}}),
                      flush=True)
                time.sleep(1)
        med = {m: {k: statistics.median(r[k] for r in v) for k in ("p50", "p99")}
               for m, v in res.items()}
        print(json.dumps({"median": med, "req_per_s": statistics.median(rates) if rates else 0}),
              flush=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write("# First-time negotiation under REST polling and job output (%s)\n\n" %
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                f.write("`/usr/bin/python3 bench/lock_contention.py --reps %d --ops %d` on this "
                        "2-vCPU VM: a 2-rank job of %d allreduces of 4 floats, each under a new "
                        "name (negotiated by the coordinator), timed on rank 0; quiet, and "
                        "with %d REST pollers (%.0f requests/s: %s) and a job printing about "
                        "10,000 lines/s. Medians over rounds of each run's p50 and p99, µs.\n\n"
                        % (a.reps, a.ops, a.ops, a.pollers, statistics.median(rates),
                           ", ".join(paths)))
                f.write("| load | p50 µs | p99 µs |\n|---|---:|---:|\n")
                for m in ("quiet", "loaded"):
                    f.write("| %s | %.0f | %.0f |\n" % (m, med[m]["p50"], med[m]["p99"]))
                f.write("\nloaded / quiet: p50 **%.2f×**, p99 **%.2f×**.\n" % (
                    med["loaded"]["p50"] / med["quiet"]["p50"],
                    med["loaded"]["p99"] / med["quiet"]["p99"]))

if __name__ == "__main__":
    main()
