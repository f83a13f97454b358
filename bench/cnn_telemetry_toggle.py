#!/usr/bin/python3
"""The synthetic CNN's training step with libkolo's telemetry off and on in
the same processes (bench/observability_overhead.sh), run under
`kolo run -np N`:

    cnn_telemetry_toggle.py [--blocks 16] [--block-steps 10] [benchmark options]

The model, batch and step are examples/pytorch/synthetic_benchmark.py's
(imported from it). Every block of --block-steps steps is a new session
(hvd.shutdown(), KOLO_TELEMETRY set, hvd.init(): Horovod's lifecycle),
in the order off, on, on, off, ..., two untimed steps after each init, so
the drift of a shared machine falls on both sides alike. Rank 0 prints a
JSON line per mode (kind cnn_step_telemetry_off / _on): the median and p99
step in µs; each step is synchronous across ranks (the optimizer waits for
its allreduces), so rank 0's step is the job's.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_synthetic import load_example  # noqa: E402  (the example, imported as DDP's side does)


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    bench = load_example()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=16, help="sessions, a multiple of 4 (default 16)")
    p.add_argument("--block-steps", type=int, default=10, help="timed steps per session (default 10)")
    bench.add_arguments(p)
    args = p.parse_args()
    import kolo.torch as hvd

    os.environ["KOLO_TELEMETRY"] = "0"
    hvd.init()
    model, data, target = bench.build(args)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    step = bench.make_step(model, opt, data, target)
    times = {"off": [], "on": []}
    blocks = (args.blocks + 3) // 4 * 4
    for b in range(blocks):
        mode = "on" if b % 4 in (1, 2) else "off"
        hvd.shutdown()
        os.environ["KOLO_TELEMETRY"] = "1" if mode == "on" else "0"
        hvd.init()
        step()
        step()
        for _ in range(args.block_steps):
            t0 = time.perf_counter()
            step()
            times[mode].append((time.perf_counter() - t0) * 1e6)
    if hvd.rank() == 0:
        for mode in ("off", "on"):
            t = times[mode]
            print(json.dumps({"impl": "kolo", "kind": "cnn_step_telemetry_" + mode, "np": hvd.size(),
                              "model": args.model, "batch_size": args.batch_size, "iters": len(t),
                              "median_us": pct(t, 0.5), "p99_us": pct(t, 0.99)}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
