#!/usr/bin/python3
"""Durable snapshot commits: time to acknowledgement, and what a commit in
a background thread costs the training steps that run meanwhile.

    /usr/bin/python3 bench/commit_overhead.py [--mb 100] [--reps 5] [--np 2]

Started like that, it launches itself with `kolo run -np N` (embedded
coordinator and agent on this machine, the database in a temporary state
directory) and prints a markdown report, also written with the raw numbers
to bench/results/<UTC timestamp>-commit-overhead.{md,json}.

Rank 0 commits a state of --mb MiB (random bytes, as a serialized state
dict would be) --reps times with kolo._snapshot.put and measures the time
from the call to the acknowledgement (the snapshot is then durable in the
coordinator's SQLite file): first with nothing else running, then from a
background thread, as kolo.torch.elastic's state.commit() does, while
every rank runs allreduce "training steps" (--step-kb per rank), whose
times are compared with the same steps without a commit. Last, every rank
reads the latest snapshot back (get_latest).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=100, help="snapshot size in MiB (100)")
    ap.add_argument("--reps", type=int, default=5, help="commits to time (5)")
    ap.add_argument("--np", type=int, default=2, help="ranks (2)")
    ap.add_argument("--step-kb", type=int, default=4096, help="allreduce per step, KiB (4096)")
    ap.add_argument("--steps", type=int, default=30, help="steps per measurement (30)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    return ap.parse_args()


def worker(a):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import numpy as np
    import kolo
    from kolo import _snapshot

    kolo.init()
    r = kolo.rank()
    grad = np.ones(a.step_kb * 256, np.float32)
    state = np.random.default_rng(1).integers(0, 255, a.mb << 20, dtype=np.uint8).tobytes()

    def steps(tag):
        times = []
        for s in range(a.steps):
            t0 = time.perf_counter()
            kolo.allreduce(grad, op=kolo.Sum, name="%s.%d" % (tag, s))
            times.append(time.perf_counter() - t0)
        return times

    steps("warmup")
    kolo.barrier()
    base = steps("base")
    kolo.barrier()
    # commits alone: nothing else runs meanwhile
    idle_acks = []
    for rep in range(a.reps):
        if r == 0:
            t0 = time.perf_counter()
            _snapshot.put(state, {"epoch": rep, "batch": 0, "idle": True})
            idle_acks.append(time.perf_counter() - t0)
        kolo.barrier()
    acks = []
    during = []
    for rep in range(a.reps):
        kolo.barrier()
        done = threading.Event()
        if r == 0:
            result = {}

            def commit():
                t0 = time.perf_counter()
                result["id"] = _snapshot.put(state, {"epoch": rep, "batch": 0})
                result["s"] = time.perf_counter() - t0
                done.set()

            th = threading.Thread(target=commit)
            th.start()
        # every rank trains while rank 0 commits; rank 0 keeps stepping until
        # its commit is acknowledged, then tells the others to stop
        n = 0
        while True:
            t0 = time.perf_counter()
            kolo.allreduce(grad, op=kolo.Sum, name="during.%d.%d" % (rep, n))
            during.append(time.perf_counter() - t0)
            n += 1
            flag = np.array([1 if done.is_set() else 0], np.int32)
            if kolo.allreduce(flag, op=kolo.Max, name="stop.%d.%d" % (rep, n))[0]:
                break
        if r == 0:
            th.join()
            acks.append(result["s"])
    kolo.barrier()
    t0 = time.perf_counter()
    got = _snapshot.get_latest()
    get_s = time.perf_counter() - t0
    assert got is not None and got[1] == state
    res = {"rank": r, "base_step_s": base, "during_step_s": during, "ack_s": acks,
           "idle_ack_s": idle_acks, "get_s": get_s}
    if a.out:
        with open("%s.%d" % (a.out, r), "w") as f:
            json.dump(res, f)
    kolo.shutdown()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    a = parse()
    if a.worker:
        return worker(a)
    kolo = os.environ.get("KOLO") or os.path.join(ROOT, "build", "bin", "kolo")
    tmp = tempfile.mkdtemp(prefix="kolo-commit-bench-")
    out = os.path.join(tmp, "result")
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(tmp, "state"), PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1")
    cmd = [kolo, "run", "-np", str(a.np), "--", sys.executable, os.path.abspath(__file__), "--worker",
           "--mb", str(a.mb), "--reps", str(a.reps), "--step-kb", str(a.step_kb), "--steps",
           str(a.steps), "--out", out]
    p = subprocess.run(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=1800)
    if p.returncode != 0:
        sys.stderr.write(p.stdout)
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit("commit_overhead: the job failed (%d)" % p.returncode)
    ranks = []
    for r in range(a.np):
        with open("%s.%d" % (out, r)) as f:
            ranks.append(json.load(f))
    shutil.rmtree(tmp, ignore_errors=True)  # the database holds a few snapshots
    acks = ranks[0]["ack_s"]
    idle = ranks[0]["idle_ack_s"]
    base = [x for rk in ranks for x in rk["base_step_s"]]
    during = [x for rk in ranks for x in rk["during_step_s"]]
    gets = [rk["get_s"] for rk in ranks]
    mb = a.mb
    lines = [
        "# Snapshot commit overhead (%s)" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
        "",
        "Machine: %s, %d CPUs, Python %s; np %d, kolo run with its embedded coordinator "
        "(SQLite on local disk, WAL, synchronous=FULL)." % (platform.node(), os.cpu_count(),
                                                            platform.python_version(), a.np),
        "",
        "| measure | median | min | max |",
        "|---|---|---|---|",
        "| commit of %d MiB alone: put() to acknowledgement (s), %d reps | %.3f | %.3f | %.3f |"
        % (mb, len(idle), statistics.median(idle), min(idle), max(idle)),
        "| commit throughput alone (MiB/s) | %.0f | %.0f | %.0f |"
        % (mb / statistics.median(idle), mb / max(idle), mb / min(idle)),
        "| commit of %d MiB while training: put() to acknowledgement (s) | %.3f | %.3f | %.3f |"
        % (mb, statistics.median(acks), min(acks), max(acks)),
        "| get_latest of %d MiB, per rank (s) | %.3f | %.3f | %.3f |"
        % (mb, statistics.median(gets), min(gets), max(gets)),
        "| allreduce step of %d KiB, no commit (ms) | %.2f | %.2f | %.2f |"
        % (a.step_kb, 1e3 * statistics.median(base), 1e3 * min(base), 1e3 * max(base)),
        "| same step while rank 0 commits (ms) | %.2f | %.2f | %.2f |"
        % (1e3 * statistics.median(during), 1e3 * min(during), 1e3 * max(during)),
        "| same step while committing, p90 (ms) | %.2f | | |" % (1e3 * pct(during, 0.9)),
        "",
    ]
    report = "\n".join(lines)
    print(report)
    stamp = datetime.datetime.utcnow().strftime("%Y%m%dT%H%M%SZ")
    res_dir = os.path.join(HERE, "results")
    os.makedirs(res_dir, exist_ok=True)
    with open(os.path.join(res_dir, stamp + "-commit-overhead.md"), "w") as f:
        f.write(report)
    with open(os.path.join(res_dir, stamp + "-commit-overhead.json"), "w") as f:
        json.dump({"args": vars(a), "ranks": ranks}, f)


if __name__ == "__main__":
    main()
