#!/usr/bin/python3
"""torch.distributed all_reduce over Gloo: the peer baseline for kolo.

Run with /usr/bin/python3 (Debian's python3-torch lives in its
dist-packages; a pyenv python first on PATH cannot import it).

Same method and JSON lines as bench/kolo_allreduce.c: float32 SUM, in
place; each iteration is barrier; t0; all_reduce; t1; an iteration's time
is the maximum over ranks; a launch reports the median over iterations
after a warm-up of iters/10 + 2 (3 steps for the ResNet-50 step).

Two ways to start it:

  torch_gloo.py --np N [--port P] sizes [BYTES...]
  torch_gloo.py --np N [--port P] resnet FILE [STEPS]
      starts N local ranks (env:// rendezvous on 127.0.0.1, Gloo on lo)
      and waits for them; rank 0 prints the JSON lines.

  torch_gloo.py --np N --master-addr A --ns NS:IF [--ns NS:IF...] ...
      the same, but rank r runs in network namespace NS number r % (number
      of --ns) through `ip netns exec` (root), with GLOO_SOCKET_IFNAME=IF;
      A must be the address of the first namespace.

  RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p GLOO_SOCKET_IFNAME=i \\
  torch_gloo.py sizes|resnet ...
      runs one rank (used for the network-namespace runs, one rank per
      namespace).

Kinds: "allreduce"; "resnet50_step" (161 all_reduce(async_op=True), then
wait on every handle, as DDP-like code would); "resnet50_step_fused" (one
buffer of the same total bytes). After the timed loop of every size the
tensor is reset to ones and reduced once more; every element must equal
the world size (exit 2 otherwise).
"""

import json
import os
import subprocess
import sys
import time

DEFAULT_SIZES = [4, 4096, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def iters_for(nbytes):
    """The iteration counts of kolo_allreduce.c, size for size."""
    if nbytes <= 4096:
        return 1000
    if nbytes <= 65536:
        return 500
    if nbytes <= (1 << 20):
        return 100
    if nbytes <= (16 << 20):
        return 20
    if nbytes <= (64 << 20):
        return 10
    return 5


def launch(np_, port, args, master="127.0.0.1", namespaces=()):
    """Starts np_ ranks of this script and returns the worst exit code."""
    procs = []
    for rank in range(np_):
        env = dict(os.environ)
        env.update({
            "RANK": str(rank),
            "WORLD_SIZE": str(np_),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", "lo"),
            "OMP_NUM_THREADS": "1",
        })
        prefix = []
        if namespaces:
            ns, ifname = namespaces[rank % len(namespaces)]
            env["GLOO_SOCKET_IFNAME"] = ifname
            prefix = ["ip", "netns", "exec", ns]
        cmd = prefix + [sys.executable, os.path.abspath(__file__)] + args
        procs.append(subprocess.Popen(cmd, env=env))
    rc = 0
    for p in procs:
        r = p.wait()
        if r != 0 and rc == 0:
            rc = r
    if rc != 0:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return rc


def rank_main(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()

    def report(kind, nbytes, times):
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank != 0:
            return
        v = sorted(t.tolist())
        n = len(v)
        med = v[n // 2]
        algbw = nbytes / med / 1e3  # GB/s
        print(json.dumps({
            "impl": "gloo", "kind": kind, "np": size, "bytes": nbytes, "iters": n,
            "median_us": round(med, 2), "min_us": round(v[0], 2),
            "p90_us": round(v[(n * 9) // 10], 2), "p99_us": round(v[(n * 99) // 100], 2),
            "algbw_gbs": round(algbw, 3),
            "busbw_gbs": round(algbw * 2.0 * (size - 1) / size, 3),
        }, separators=(",", ":")), flush=True)

    def verify(tensors, what):
        for x in tensors:
            x.fill_(1.0)
        works = [dist.all_reduce(x, async_op=True) for x in tensors]
        for w in works:
            w.wait()
        for x in tensors:
            if not bool((x == float(size)).all()):
                bad = x[x != float(size)][0].item()
                print(f"rank {rank}: {what}: found {bad}, expected {size}", file=sys.stderr)
                sys.exit(2)

    now = time.perf_counter
    if args[0] == "resnet":
        steps = int(args[2]) if len(args) > 2 else 20
        tensors = []
        with open(args[1]) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    tensors.append(torch.ones(int(parts[1]), dtype=torch.float32))
        total = sum(x.numel() for x in tensors) * 4
        fused = torch.ones(total // 4, dtype=torch.float32)
        for kind in ("resnet50_step", "resnet50_step_fused"):
            times = []
            for s in range(-3, steps):
                dist.barrier()
                t0 = now()
                if kind == "resnet50_step":
                    works = [dist.all_reduce(x, async_op=True) for x in tensors]
                    for w in works:
                        w.wait()
                else:
                    dist.all_reduce(fused)
                t1 = now()
                if s >= 0:
                    times.append((t1 - t0) * 1e6)
            report(kind, total, times)
        verify(tensors + [fused], "resnet50")
    else:
        sizes = [int(a) for a in args[1:]] or DEFAULT_SIZES
        for nbytes in sizes:
            x = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
            iters = iters_for(nbytes)
            warm = iters // 10 + 2
            times = []
            for i in range(-warm, iters):
                dist.barrier()
                t0 = now()
                dist.all_reduce(x)
                t1 = now()
                if i >= 0:
                    times.append((t1 - t0) * 1e6)
            report("allreduce", nbytes, times)
            verify([x], f"allreduce {nbytes} B")
            del x
    dist.barrier()
    dist.destroy_process_group()


def main():
    argv = sys.argv[1:]
    np_, port, master, namespaces = None, None, "127.0.0.1", []
    while argv and argv[0].startswith("--"):
        if argv[0] == "--np":
            np_ = int(argv[1])
        elif argv[0] == "--port":
            port = int(argv[1])
        elif argv[0] == "--master-addr":
            master = argv[1]
        elif argv[0] == "--ns":
            ns, _, ifname = argv[1].partition(":")
            namespaces.append((ns, ifname))
        else:
            sys.exit(f"unknown option {argv[0]}")
        argv = argv[2:]
    if not argv or argv[0] not in ("sizes", "resnet"):
        sys.exit(__doc__)
    if np_ is not None:
        if port is None:
            if namespaces:
                import random
                port = random.randint(29500, 31499)
            else:
                import socket
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
        sys.exit(launch(np_, port, argv, master, namespaces))
    rank_main(argv)


if __name__ == "__main__":
    main()
