#!/usr/bin/python3
"""How fast kolo tells a user what is wrong (issue 31), seeded runs:

  frozen   an elastic job (-np 2, --min-np 1) whose rank 1 stops itself
           (SIGSTOP) at a seeded step, RUNS times in one job (the host
           comes back after a 1 s cooldown, the job grows back, the next
           stop waits for 2 workers): from the stop to `kolo run`'s line
           naming the stopped rank (detected), and to the first step of the
           job without it (goes on);
  straggler a job (-np 2) whose rank 1 sleeps 4x as long per step, RUNS
           launches: from the wall-clock second of its first reported
           steps (/ranks last_step_ms: up to 1 s early) to /ranks flagging
           rank 1 a straggler;
  stacks   `kolo stacks JOB -o json` on a running job of 4 and 16 ranks
           (one line of Python each, blocked in an allreduce), RUNS calls
           each: wall time per call.

    bench/detection_times.py                RUNS=20, ~10 min on 2 vCPUs
    RUNS=5 bench/detection_times.py --only frozen,stacks

Writes bench/results/<UTC>-detection-times.{json,md} and prints the table
(p50, p90, p99 and max of each). A coordinator and one agent on loopback
(bench/local_cluster.py); `kolo run`'s stderr is read line by line, each
line stamped as it arrives. Seeds: RUNS, SEED (1).
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import KOLO, ROOT, local_cluster  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "python", "elastic_worker.py")
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), PYTHONUNBUFFERED="1",
           OMP_NUM_THREADS="1")
for k in ("KOLO_TELEMETRY", "KOLO_COORDINATOR", "KOLO_RUN_COORDINATOR", "KOLO_TOKEN"):
    ENV.pop(k, None)

STRAGGLER = r'''
import time, torch
import kolo.torch as hvd
hvd.init()
model = torch.nn.Linear(8, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
while True:
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    time.sleep(0.08 if hvd.rank() == 1 else 0.02)
    opt.step()
'''

BLOCKED = r'''
import time, torch
import kolo.torch as hvd
hvd.init()
if hvd.rank() == 0:
    time.sleep(3600)                   # rank 0 never comes: the others block
hvd.allreduce(torch.ones(4), name="grad")
'''


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def summary(xs):
    if not xs:
        return None
    return {"n": len(xs), "p50": statistics.median(xs), "p90": pct(xs, 0.9), "p99": pct(xs, 0.99),
            "max": max(xs), "min": min(xs)}


class Lines:
    """A process's stdout and stderr, each line stamped as it arrives."""

    def __init__(self, proc):
        self.lines = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read, args=(f,), daemon=True)
                        for f in (proc.stdout, proc.stderr)]
        for t in self.threads:
            t.start()

    def _read(self, f):
        for ln in f:
            with self.lock:
                self.lines.append((time.time(), ln.rstrip("\n")))

    def snapshot(self):
        with self.lock:
            return list(self.lines)


def get(http_port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (http_port, path), timeout=10) as r:
        return json.loads(r.read().decode())


def frozen(runs, seed, rpc, work):
    rnd = random.Random(seed)
    kills = [[rnd.randint(5, 25), 1, "stop"] for _ in range(runs)]
    marks = os.path.join(work, "marks")
    os.makedirs(marks, exist_ok=True)
    cmd = [KOLO, "run", "--coordinator", rpc, "-np", "2", "--min-np", "1", "--max-np", "2",
           "--blacklist-cooldown-range", "1", "1", "--", sys.executable, WORKER,
           "--steps", "1000000", "--commit", "5", "--delay", "0.02", "--kill-min-size", "2",
           "--kills", json.dumps(kills), "--marks", marks]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                         cwd=work)
    out = Lines(p)
    detected, goes_on = [], []
    deadline = time.time() + 60 * runs
    try:
        while time.time() < deadline:
            lines = out.snapshot()
            stops = [(float(m.group(1)), t) for t, ln in lines
                     for m in [re.search(r"<stdout>:KILL \d+ step \d+ rank \d+ wid \S+ t ([0-9.]+)", ln)] if m]
            if len(stops) >= runs and len(detected) >= runs and len(goes_on) >= runs:
                break
            detected, goes_on = [], []
            for i, (t_stop, _) in enumerate(stops):
                nxt = stops[i + 1][0] if i + 1 < len(stops) else float("inf")
                said = [t for t, ln in lines if t >= t_stop and t < nxt + 30 and
                        re.match(r"\[kolo\] rank \d+ \(pid \d+\) on host \S+ has been stopped by a "
                                 r"signal", ln)]
                step1 = [float(m.group(1)) for _, ln in lines
                         for m in [re.search(r"<stdout>:STEP \d+ size 1 gen \d+ .* t ([0-9.]+)$", ln)]
                         if m and float(m.group(1)) > t_stop and float(m.group(1)) < nxt]
                if said:
                    detected.append(said[0] - t_stop)
                if step1:
                    goes_on.append(step1[0] - t_stop)
            if p.poll() is not None:
                break
            time.sleep(0.5)
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    print("frozen: %d stops, detected %s, goes on %s" % (
        len(detected), ["%.1f" % x for x in detected], ["%.1f" % x for x in goes_on]), flush=True)
    return {"detected_s": summary(detected), "goes_on_s": summary(goes_on),
            "raw": {"detected_s": detected, "goes_on_s": goes_on}, "kills": kills}


def straggler(runs, rpc, http_port, work):
    path = os.path.join(work, "straggler.py")
    with open(path, "w") as f:
        f.write(STRAGGLER)
    took = []
    for i in range(runs):
        r = subprocess.run([KOLO, "run", "--coordinator", rpc, "-d", "-np", "2", "--", sys.executable,
                            path], capture_output=True, text=True, env=ENV, cwd=work, timeout=60)
        job = int(re.search(r"(\d+)", r.stdout).group(1))
        try:
            first = None
            deadline = time.time() + 90
            while time.time() < deadline:
                body = get(http_port, "/api/v1/jobs/%d/ranks" % job)
                now = time.time()
                stepped = [x["last_step_ms"] for x in body["ranks"] if x["last_step_s"] is not None]
                if first is None and stepped:
                    # the wall-clock second of the first steps reported
                    # (one machine: the coordinator's clock is ours)
                    first = min(stepped) / 1000.0
                if first is not None and body["ranks"][1]["straggler"]:
                    took.append(now - first)
                    break
                time.sleep(0.1)
        finally:
            subprocess.run([KOLO, "stop", "--coordinator", rpc, str(job)], capture_output=True,
                           timeout=60)
        print("straggler %d: %s" % (i, "%.1f s" % took[-1] if len(took) == i + 1 else "not flagged"),
              flush=True)
    return {"flagged_s": summary(took), "raw": took}


def stacks(runs, ranks, rpc, work):
    path = os.path.join(work, "blocked.py")
    with open(path, "w") as f:
        f.write(BLOCKED)
    r = subprocess.run([KOLO, "run", "--coordinator", rpc, "-d", "-np", str(ranks), "--",
                        sys.executable, path], capture_output=True, text=True, env=ENV, cwd=work,
                       timeout=60)
    job = int(re.search(r"(\d+)", r.stdout).group(1))
    took = []
    try:
        # every rank running and the others blocked in the allreduce
        deadline = time.time() + 120
        while time.time() < deadline:
            s = subprocess.run([KOLO, "stacks", "--coordinator", rpc, "-o", "json", str(job)],
                               capture_output=True, text=True, timeout=30)
            if s.returncode == 0 and s.stdout.count("allreduce") >= ranks - 1:
                break
            time.sleep(1)
        for _ in range(runs):
            t0 = time.time()
            s = subprocess.run([KOLO, "stacks", "--coordinator", rpc, "-o", "json", str(job)],
                               capture_output=True, text=True, timeout=30)
            if s.returncode == 0:
                took.append(time.time() - t0)
    finally:
        subprocess.run([KOLO, "stop", "--coordinator", rpc, str(job)], capture_output=True,
                       timeout=60)
    print("stacks at %d ranks: %s" % (ranks, ["%.2f" % x for x in took]), flush=True)
    return {"ranks": ranks, "call_s": summary(took), "raw": took}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="frozen,straggler,stacks")
    a = ap.parse_args()
    runs = int(os.environ.get("RUNS", "20"))
    seed = int(os.environ.get("SEED", "1"))
    only = a.only.split(",")
    res = {"runs": runs, "seed": seed, "nproc": os.cpu_count(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with local_cluster(slots=16, prefix="kolo-detect.") as (work, rpc, http_port):
        if "frozen" in only:
            res["frozen"] = frozen(runs, seed, rpc, work)
        if "straggler" in only:
            res["straggler"] = straggler(runs, rpc, http_port, work)
        if "stacks" in only:
            res["stacks"] = [stacks(runs, n, rpc, work) for n in (4, 16)]
    res["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    rows = []

    def row(what, s, bound):
        if s:
            rows.append("| %s | %d | %.2f | %.2f | %.2f | %.2f | %s |" % (
                what, s["n"], s["p50"], s["p90"], s["p99"], s["max"], bound))

    if "frozen" in res:
        row("frozen rank (SIGSTOP) named by `kolo run`", res["frozen"]["detected_s"], "10 s")
        row("frozen rank: the job goes on without it", res["frozen"]["goes_on_s"], "15 s")
    if "straggler" in res:
        row("straggler flagged (/ranks), from the second of its first steps", res["straggler"]["flagged_s"], "-")
    for s in res.get("stacks", []):
        row("`kolo stacks`, %d ranks" % s["ranks"], s["call_s"], "-")
    ts = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    md = ["# Detection times, %d seeded run(s) each (seed %d), %s" % (runs, seed, res["date"]), "",
          "| what | n | p50 s | p90 s | p99 s | max s | issue 31's bound |", "|---|---|---|---|---|---|---|"]
    md += rows + ["", "%d CPUs, load at the end %s." % (res["nproc"], " ".join(res["loadavg_end"]))]
    out = os.path.join(ROOT, "bench", "results", ts + "-detection-times")
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
