#!/usr/bin/python3
"""The no-communication ceiling of examples/pytorch/synthetic_benchmark.py.

    solo_synthetic.py --np N [--lockstep] [benchmark options]

Starts N processes on this host that each train the example's model on
its batch exactly as a data-parallel worker does (the same model, batch,
seed, SGD and thread count), but alone: no gradient is exchanged and no
process waits for another. What they make together is what N workers of
any data-parallel library could make at most on this machine, since one
can only add communication, synchronisation and waiting to it. A
library's img/s over this figure is how close it comes; DDP's ceiling
over DDP's img/s is the most any library could beat DDP by.

The processes warm up, meet at a barrier, and then each runs the
example's num_iters x num_batches_per_iter steps, noting when each step
ends. The window is from the barrier to the moment the first process
finishes: every process computes through all of it, so the CPUs are
shared the same way throughout (counting past it would hand the last
ones the CPUs of those that stopped). Total img/s = the steps all
processes completed inside the window x batch size / window.

A synchronous data-parallel job cannot use all of that: every step ends
when its slowest worker's does, so where the CPUs are not equally fast (a
VM's vCPUs seldom are: one takes the device interrupts, another guest
shares a core) its workers all move at the slowest one's pace. The
lockstep ceiling is N x the slowest process's steps in the window x batch
size / window: what N workers in lockstep could make if exchanging
gradients took no time at all.

--lockstep measures that instead of estimating it: the processes meet at a
barrier after every step (a multiprocessing.Barrier, exchanging nothing),
as the workers of a synchronous job do, and a worker that waits gives up
its CPU to the others, which matters where workers outnumber CPUs. Every
process then makes every step, and the window ends with the last return
from the last barrier.

It prints the example's "Total img/sec on N worker(s)" line, a "Lockstep
img/sec" line and, with --json, a JSON line with "impl": "solo" (or
"solo_lockstep") and both figures.

Run it with /usr/bin/python3 (Debian's python3-torch).
"""

import argparse
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_synthetic import load_example  # noqa: E402  (the example's model, batch and loop)


def worker(args, np_, barrier, results):
    import torch

    bench = load_example()
    model, data, target = bench.build(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * np_)
    step = bench.make_step(model, optimizer, data, target)

    for _ in range(args.num_warmup_batches):
        step()
    barrier.wait(timeout=600)
    t0 = time.monotonic()
    ends = []
    for _ in range(args.num_iters * args.num_batches_per_iter):
        step()
        if args.lockstep:
            barrier.wait(timeout=600)
        ends.append(time.monotonic() - t0)
    results.put(ends)


def main():
    p = argparse.ArgumentParser(description="PyTorch synthetic benchmark without communication")
    p.add_argument("--np", type=int, default=1, help="processes to start (default 1)")
    p.add_argument("--lockstep", action="store_true",
                   help="the processes meet at a barrier after every step, exchanging nothing")
    bench = load_example()
    bench.add_arguments(p)
    args = p.parse_args()
    if args.np < 1:
        sys.exit("--np must be at least 1")

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(args.np), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(args, args.np, barrier, results)) for _ in range(args.np)]
    for proc in procs:
        proc.start()
    ends = [results.get(timeout=1800) for _ in procs]
    for proc in procs:
        proc.join()
    if any(proc.exitcode for proc in procs):
        sys.exit("a solo process failed")

    # in lockstep the last barrier ends every process's run at once: the
    # window is the latest return from it, and every step counts
    window = max(e[-1] for e in ends) if args.lockstep else min(e[-1] for e in ends)
    steps = [sum(1 for t in e if t <= window) for e in ends]
    total = sum(steps) * args.batch_size / window
    lockstep = args.np * min(steps) * args.batch_size / window
    per_worker = total / args.np
    bench.log_line("Model: %s" % args.model)
    bench.log_line("Batch size: %d" % args.batch_size)
    bench.log_line("Number of workers: %d (no communication%s)" % (args.np, ", a barrier after every step" if args.lockstep else ""))
    bench.log_line("Window: %.2f s, steps per process: %s" % (window, " ".join(map(str, steps))))
    bench.log_line("Img/sec per worker: %.1f" % per_worker)
    bench.log_line("Total img/sec on %d worker(s): %.1f" % (args.np, total))
    bench.log_line("Lockstep img/sec on %d worker(s): %.1f" % (args.np, lockstep))
    if args.json:
        impl = "solo_lockstep" if args.lockstep else "solo"
        bench.log_line(json.dumps({"impl": impl, "model": args.model, "np": args.np,
                                   "batch_size": args.batch_size, "num_iters": args.num_iters,
                                   "num_batches_per_iter": args.num_batches_per_iter,
                                   "fp16_allreduce": args.fp16_allreduce, "threads": args.threads,
                                   "img_sec_per_worker": per_worker, "img_sec_total": total,
                                   "img_sec_lockstep": lockstep,
                                   "window_s": window, "steps": steps}))


if __name__ == "__main__":
    main()
