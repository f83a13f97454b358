#!/usr/bin/python3
"""examples/pytorch/synthetic_benchmark.py under DistributedDataParallel on Gloo.

The peer baseline for kolo's PyTorch path: the same model, batch, warm-up,
iterations and output lines (model, data, training step and timing loop are imported
from the example, so they cannot drift apart); only the data parallelism
differs. DDP allreduces gradients in buckets during backward; kolo's
DistributedOptimizer allreduces each gradient as it is ready and fuses them.

Two ways to start it:

  ddp_synthetic.py --np N [--port P] [benchmark options]
      starts N local ranks (env:// rendezvous on 127.0.0.1, Gloo on lo)
      and waits for them; rank 0 prints the results.

  RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p ddp_synthetic.py [benchmark options]
      runs one rank.

Run it with /usr/bin/python3 (Debian's python3-torch). --fp16-allreduce
registers DDP's fp16_compress_hook, the counterpart of Compression.fp16.
"""

import argparse
import importlib.util
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "pytorch", "synthetic_benchmark.py")


def load_example():
    spec = importlib.util.spec_from_file_location("synthetic_benchmark", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(np_, port, argv):
    """Starts np_ ranks of this script on 127.0.0.1; returns the worst exit code."""
    port = port or free_port()
    procs = []
    for rank in range(np_):
        env = dict(os.environ)
        env.update({
            "RANK": str(rank),
            "WORLD_SIZE": str(np_),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", "lo"),
        })
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
    rc = 0
    for p in procs:
        rc = max(rc, p.wait())
    return rc


def main():
    p = argparse.ArgumentParser(description="PyTorch synthetic benchmark, DistributedDataParallel on Gloo")
    p.add_argument("--np", type=int, default=0, help="start this many local ranks (default: run one rank from env)")
    p.add_argument("--port", type=int, default=0, help="rendezvous port with --np (default: a free one)")
    bench = load_example()
    bench.add_arguments(p)
    args = p.parse_args()

    if args.np:
        # The ranks get every option but the launcher's own two.
        argv, skip = [], False
        for a in sys.argv[1:]:
            if skip or a.startswith(("--np=", "--port=")):
                skip = False
            elif a in ("--np", "--port"):
                skip = True
            else:
                argv.append(a)
        sys.exit(launch(args.np, args.port, argv))

    dist.init_process_group("gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()
    model, data, target = bench.build(args)
    # DDP broadcasts rank 0's parameters and buffers when it wraps the model.
    model = DistributedDataParallel(model)
    if args.fp16_allreduce:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)

    rates = bench.run_loop(args, bench.make_step(model, optimizer, data, target), rank, size,
                           bench.log_line)
    if rank == 0:
        bench.report(args, "ddp_gloo", rates, size, bench.log_line)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
