#!/usr/bin/python3
"""The training job of bench/goodput.py: the synthetic CNN of
examples/pytorch/synthetic_benchmark.py trained for ever (until the driver
stops it), made fault tolerant the way each launcher's users do it.

    kolo run -np 4 --min-np 2 --max-np 4 ... -- /usr/bin/python3 goodput_train.py --impl kolo --log F
    torchrun --standalone --nproc_per_node 4 --max_restarts 1000 goodput_train.py --impl torchrun --log F --ckpt C

--impl kolo: Horovod's elastic recipe. hvd.elastic.TorchState(model,
optimizer, step=0), state.commit() every --commit-every steps, the loop in
an @hvd.elastic.run function. A survivor of a lost worker gets
HorovodInternalError, rolls back to the last commit in memory and carries
on in a new generation; a replacement worker gets the committed state by
broadcast when it joins.

--impl torchrun: torch.distributed.elastic's recipe (the "train script"
section of its docs): load the checkpoint if there is one, then
init_process_group("gloo") from torchrun's environment, wrap the model in
DistributedDataParallel, and rank 0 saves a checkpoint every
--commit-every steps (to a temporary file, then os.replace, so a kill
never leaves half a file). A lost worker makes torchrun's agent stop every
worker and start them all again, up to --max_restarts times.

Both append JSON lines to --log (one os.write per line on an O_APPEND
descriptor, so lines of several processes never mix), each with "t", the
wall clock (time.time(); the driver's kills are on the same clock), "ev",
"pid" and "rank" (-1 before it is known):

  start      the process started (taken before torch is imported)
  init       hvd.init() / init_process_group() returned ("size")
  loaded     torchrun: the checkpoint was read ("step": the step it resumes at, 0: none)
  restored   the state is in place and the loop starts ("step" it resumes at, "size")
  step       rank 0 finished a step ("step" its number from 0, "dur" s, "size")
  detect     a collective failed on this survivor ("error": the exception's type)
  interrupt  kolo: HostsUpdatedInterrupt (workers were added), "step"
  re-formed  kolo: a reset callback ran: the new generation is up ("size")
"""
import time

T_START = time.time()  # noqa: E402 - before the imports, which take a second or more

import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "pytorch", "synthetic_benchmark.py")


class Log:
    """Appends one JSON object per line; a single write each, so concurrent writers never interleave."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.rank = -1

    def __call__(self, ev, t=None, **fields):
        rec = {"t": round(time.time() if t is None else t, 6), "ev": ev, "pid": os.getpid(), "rank": self.rank}
        rec.update(fields)
        os.write(self.fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=["kolo", "torchrun"], required=True)
    p.add_argument("--log", required=True, help="JSON lines are appended here")
    p.add_argument("--commit-every", type=int, default=10, help="commit / checkpoint every K steps (default 10)")
    p.add_argument("--ckpt", default="", help="torchrun: the checkpoint file (default: next to --log)")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (default 0: never)")
    p.add_argument("--tag", default="", help="ignored: lets the driver recognise its workers")
    spec = importlib.util.spec_from_file_location("synthetic_benchmark", EXAMPLE)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.add_arguments(p)
    p.set_defaults(image_size=16, batch_size=16)
    return p.parse_args(), bench


def run_kolo(args, bench, log):
    import torch

    try:
        import kolo.torch as hvd
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import kolo.torch as hvd
    from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    hvd.init()
    log.rank = hvd.rank()
    log("init", size=hvd.size())
    model, data, target = bench.build(args)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    step = bench.make_step(model, optimizer, data, target)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    def on_reset():
        log.rank = hvd.rank()
        log("re-formed", size=hvd.size())

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        log.rank = hvd.rank()
        log("restored", step=state.step, size=hvd.size())
        try:
            while not args.steps or state.step < args.steps:
                t0 = time.time()
                step()
                t1 = time.time()
                if hvd.rank() == 0:
                    log("step", t=t1, step=state.step, dur=round(t1 - t0, 6), size=hvd.size())
                state.step += 1
                if state.step % args.commit_every == 0:
                    state.commit()
        except HorovodInternalError as e:
            log("detect", error=type(e).__name__, step=state.step)
            raise
        except HostsUpdatedInterrupt:
            log("interrupt", step=state.step)
            raise

    train(state)
    hvd.shutdown()


def run_torchrun(args, bench, log):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    log.rank = int(os.environ.get("RANK", "-1"))
    ckpt = args.ckpt or args.log + ".ckpt"
    model, data, target = bench.build(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists(ckpt):
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = saved["step"]
    log("loaded", step=start)

    dist.init_process_group("gloo")
    log.rank = dist.get_rank()
    log("init", size=dist.get_world_size())
    # DDP broadcasts rank 0's parameters and buffers when it wraps the model.
    ddp = DistributedDataParallel(model)
    step = bench.make_step(ddp, optimizer, data, target)
    size = dist.get_world_size()
    log("restored", step=start, size=size)
    s = start
    try:
        while not args.steps or s < args.steps:
            t0 = time.time()
            step()
            t1 = time.time()
            if log.rank == 0:
                log("step", t=t1, step=s, dur=round(t1 - t0, 6), size=size)
            s += 1
            if s % args.commit_every == 0 and log.rank == 0:
                tmp = ckpt + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": s}, tmp)
                os.replace(tmp, ckpt)
    except RuntimeError as e:
        log("detect", error=type(e).__name__, step=s)
        raise
    dist.destroy_process_group()


def main():
    args, bench = parse()
    log = Log(args.log)
    log("start", t=T_START, impl=args.impl)
    (run_kolo if args.impl == "kolo" else run_torchrun)(args, bench, log)


if __name__ == "__main__":
    main()
