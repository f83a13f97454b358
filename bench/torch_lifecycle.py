#!/usr/bin/python3
"""Horovod-habit costs, kolo.torch against torch.distributed over Gloo, in
one run (issue 14):

  cycle       init -> one 4 B allreduce -> barrier -> shutdown, repeated
              (what a Horovod-style test suite or an HPO loop does); time per
              cycle, max over ranks;
  set_4B      a 4 B allreduce inside a process set of 2 ranks while the
              other 2 ranks run theirs in their own set (kolo: hvd.ProcessSet;
              Gloo: dist.new_group); each iteration barrier, t0, allreduce,
              t1 in the set, max over the set.

Run with Debian's python (torch):

  /usr/bin/python3 bench/torch_lifecycle.py [--kolo build/bin/kolo] [--cycles 100]
      [--iters 1000]

prints one JSON line per (impl, kind) with p50/p99 in microseconds and a
summary of kolo/Gloo ratios (below 1: kolo is faster).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------- one rank

def timed(n, before, op):
    """n timings of op (seconds), each after before(), past a warm-up of
    n / 10 + 2."""
    times = []
    for i in range(n + n // 10 + 2):
        before()
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
    return times[n // 10 + 2:]


def rank_kolo(kind, n):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import kolo.torch as hvd
    times = []
    if kind == "cycle":
        for i in range(n):
            t0 = time.perf_counter()
            hvd.init()
            hvd.allreduce(torch.ones(1), name="c", op=hvd.Sum)
            hvd.barrier()
            hvd.shutdown()
            times.append(time.perf_counter() - t0)
        hvd.init()
    else:
        hvd.init(process_sets="dynamic")
        r, size = hvd.rank(), hvd.size()
        sets = [hvd.add_process_set([k for k in range(size) if k % 2 == p]) for p in (0, 1)]
        mine = sets[r % 2]
        x = torch.ones(1)
        times = timed(n, lambda: hvd.barrier(process_set=mine),
                      lambda: hvd.allreduce_(x, name="s", op=hvd.Sum, process_set=mine))
    # max over ranks of each iteration
    every = hvd.allgather_object(times)
    if hvd.rank() == 0:
        print("TIMES " + json.dumps([max(v) for v in zip(*every)]), flush=True)
    hvd.shutdown()


def rank_gloo(kind, n, port):
    import torch
    import torch.distributed as dist
    r, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    times = []
    if kind == "cycle":
        for i in range(n):
            t0 = time.perf_counter()
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % (port + 1 + i),
                                    rank=r, world_size=size)
            dist.all_reduce(torch.ones(1))
            dist.barrier()
            dist.destroy_process_group()
            times.append(time.perf_counter() - t0)
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=r,
                                world_size=size)
    else:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=r,
                                world_size=size)
        groups = [dist.new_group([k for k in range(size) if k % 2 == p]) for p in (0, 1)]
        mine = groups[r % 2]
        x = torch.ones(1)
        times = timed(n, lambda: dist.barrier(group=mine), lambda: dist.all_reduce(x, group=mine))
    every = [None] * size
    dist.all_gather_object(every, times)
    if r == 0:
        print("TIMES " + json.dumps([max(v) for v in zip(*every)]), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------- driver

def run_kolo(kolo, np_, kind, n):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    out = subprocess.run([kolo, "run", "-np", str(np_), "--", sys.executable,
                          os.path.abspath(__file__), "--rank", "kolo", kind, str(n)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True, timeout=900)
    return parse(out.stdout, out.stderr)


def run_gloo(np_, kind, n):
    port = free_port() if kind != "cycle" else 20000 + os.getpid() % 20000
    procs = []
    for r in range(np_):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(np_), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank",
                                       "gloo", kind, str(n), str(port)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      universal_newlines=True))
    outs = [p.communicate(timeout=900) for p in procs]
    return parse("".join(o[0] for o in outs), "".join(o[1] for o in outs))


def parse(out, err):
    for line in out.splitlines():
        if "TIMES " in line:
            return json.loads(line.split("TIMES ", 1)[1])
    raise SystemExit("no result:\n" + out[-2000:] + err[-2000:])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        impl, kind, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        if impl == "kolo":
            rank_kolo(kind, n)
        else:
            rank_gloo(kind, n, int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--kolo", default=os.path.join(ROOT, "build", "bin", "kolo"))
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--iters", type=int, default=1000)
    a = ap.parse_args()
    res = {}
    for kind, np_, n in (("cycle", 2, a.cycles), ("set_4B", 4, a.iters)):
        for impl in ("kolo", "gloo"):
            t = run_kolo(a.kolo, np_, kind, n) if impl == "kolo" else run_gloo(np_, kind, n)
            us = [x * 1e6 for x in t]
            res[(impl, kind)] = (statistics.median(us), pct(us, 0.99))
            print(json.dumps({"impl": impl, "kind": kind, "np": np_, "n": len(us),
                              "p50_us": round(res[(impl, kind)][0], 1),
                              "p99_us": round(res[(impl, kind)][1], 1)}), flush=True)
    for kind in ("cycle", "set_4B"):
        k, g = res[("kolo", kind)], res[("gloo", kind)]
        print("%-7s kolo/Gloo p50 %.2fx  p99 %.2fx" % (kind, k[0] / g[0], k[1] / g[1]))


if __name__ == "__main__":
    main()
