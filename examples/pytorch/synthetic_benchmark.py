#!/usr/bin/python3
"""Training throughput on synthetic data, data parallel with kolo.

    kolo run -np 2 -- /usr/bin/python3 examples/pytorch/synthetic_benchmark.py
    kolo run -np 4 -- /usr/bin/python3 examples/pytorch/synthetic_benchmark.py --model resnet50

Each worker trains on one random batch, over and over, so the number
measured is forward + backward + gradient allreduce + SGD step, with no
input pipeline. After --num-warmup-batches untimed steps it times
--num-iters iterations of --num-batches-per-iter steps each and prints,
on rank 0, one line per iteration and then the mean images per second of
one worker with a 95% interval (1.96 standard deviations over the
iterations), and that figure times the number of workers. Rank 0's clock
stands for all: every step ends in an allreduce that waits for the
slowest worker, so the workers move in lockstep.

The default model is a small CNN for CPUs (three 3x3 convolutions on
3x64x64 images, 1.14 M parameters, so 4.6 MB of gradients a step);
--model resnet18 or resnet50 uses torchvision's (224x224 images, 1000
classes) when torchvision is installed.

bench/ddp_synthetic.py runs the same model and loop under PyTorch's
DistributedDataParallel on Gloo, for comparison (bench/torch_synthetic.sh
runs both).
"""

import argparse
import json
import os
import sys
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def add_arguments(p):
    """The options shared with bench/ddp_synthetic.py."""
    p.add_argument("--model", default="cnn", help="cnn (default), or a torchvision model: resnet18, resnet50, ...")
    p.add_argument("--image-size", type=int, default=0, help="image side in pixels (default 64 for cnn, 224 otherwise)")
    p.add_argument("--batch-size", type=int, default=32, help="images per step on each worker (default 32)")
    p.add_argument("--num-warmup-batches", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--num-batches-per-iter", type=int, default=5, help="steps in one timed iteration (default 5)")
    p.add_argument("--num-iters", type=int, default=10, help="timed iterations (default 10)")
    p.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker (default 1)")
    p.add_argument("--seed", type=int, default=42, help="seed of the weights and the data (default 42)")
    p.add_argument("--json", action="store_true", help="rank 0 ends with one JSON line of the results")


class SmallCNN(nn.Module):
    """Three conv/ReLU/pool stages and two dense layers; 3x64x64 in, 10 classes out."""

    def __init__(self, num_classes=10, image_size=64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        side = image_size // 8
        self.fc1 = nn.Linear(128 * side * side, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def build(args):
    """The model, a synthetic batch and its labels, the same on every call with the same seed."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if args.model == "cnn":
        size = args.image_size or 64
        classes = 10
        model = SmallCNN(classes, size)
    else:
        try:
            import torchvision.models
        except ImportError:
            sys.exit("--model %s needs torchvision, which this python cannot import" % args.model)
        if not hasattr(torchvision.models, args.model):
            sys.exit("torchvision has no model %r" % args.model)
        size = args.image_size or 224
        classes = 1000
        model = getattr(torchvision.models, args.model)()
    data = torch.randn(args.batch_size, 3, size, size)
    target = torch.randint(0, classes, (args.batch_size,))
    return model, data, target


def make_step(model, optimizer, data, target):
    """One training step on the batch: forward, loss, backward, update."""
    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    return step


def run_loop(args, step, rank, size, log_line):
    """Warm-up, then the timed iterations; returns images per second per worker, one per iteration."""
    if rank == 0:
        log_line("Model: %s" % args.model)
        log_line("Batch size: %d" % args.batch_size)
        log_line("Number of workers: %d" % size)
        log_line("Running warmup...")
    timeit.timeit(step, number=args.num_warmup_batches)
    if rank == 0:
        log_line("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        rates.append(rate)
        if rank == 0:
            log_line("Iter #%d: %.1f img/sec per worker" % (i, rate))
    return rates


def report(args, impl, rates, size, log_line):
    """Rank 0's summary lines, and the JSON line when asked."""
    mean = float(np.mean(rates))
    conf = float(1.96 * np.std(rates))
    log_line("Img/sec per worker: %.1f +-%.1f" % (mean, conf))
    log_line("Total img/sec on %d worker(s): %.1f +-%.1f" % (size, size * mean, size * conf))
    if args.json:
        log_line(json.dumps({"impl": impl, "model": args.model, "np": size, "batch_size": args.batch_size,
                             "num_iters": args.num_iters, "num_batches_per_iter": args.num_batches_per_iter,
                             "fp16_allreduce": args.fp16_allreduce, "threads": args.threads,
                             "img_sec_per_worker": mean, "img_sec_per_worker_conf": conf,
                             "img_sec_total": size * mean, "iters": rates}))


def log_line(s):
    print(s, flush=True)


def main():
    p = argparse.ArgumentParser(description="PyTorch synthetic benchmark, data parallel with kolo")
    add_arguments(p)
    args = p.parse_args()

    try:
        import kolo.torch as hvd
    except ImportError:
        # Run from a checkout without PYTHONPATH: use the package next door.
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
        import kolo.torch as hvd

    hvd.init()
    model, data, target = build(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    rates = run_loop(args, make_step(model, optimizer, data, target), hvd.rank(), hvd.size(), log_line)
    if hvd.rank() == 0:
        report(args, "kolo", rates, hvd.size(), log_line)
    hvd.shutdown()


if __name__ == "__main__":
    main()
