#!/usr/bin/python3
"""Commit overhead of elastic training: a small model trains for a fixed
number of steps per epoch (about --epoch-seconds on this machine) and the
state also holds --state-mb of tensors, committed at the end of every
epoch. Run under kolo run; rank 0 prints one JSON line with the epoch
times. bench/elastic_commit.sh runs it three ways (no commit, in-memory
commit only as Horovod does, durable commit shipped to the coordinator)
and reports the cost of a commit as a share of a 30 s epoch."""
import argparse
import json
import os
import time

import torch

import kolo.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--state-mb", type=int, default=100)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--steps", type=int, default=0, help="steps per epoch (0: calibrate)")
p.add_argument("--epoch-seconds", type=float, default=8.0)
p.add_argument("--mode", choices=["none", "memory", "durable"], default="durable")
a = p.parse_args()
if a.mode != "durable":
    os.environ["KOLO_DURABLE_COMMIT"] = "0"

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
extra = torch.randn(a.state_mb * (1 << 20) // 4)
state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, extra=extra)
x = torch.randn(64, 512)
y = torch.randint(0, 10, (64,))


def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


steps = a.steps
if not steps:
    for _ in range(5):
        step()
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    per = (time.perf_counter() - t0) / 20
    steps = int(hvd.broadcast_object(max(10, int(a.epoch_seconds / per)), 0))

times, commits = [], []


@hvd.elastic.run
def train(state):
    while state.epoch < a.epochs:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        c0 = time.perf_counter()
        if a.mode != "none":
            state.commit()
        commits.append(time.perf_counter() - c0)
        hvd.barrier()
        times.append(time.perf_counter() - t0)
        state.epoch += 1


train(state)
acked = state.flush(120) if a.mode == "durable" and hvd.rank() == 0 else 0
if hvd.rank() == 0:
    print(json.dumps({"mode": a.mode, "state_mb": a.state_mb, "steps": steps, "epoch_s": times,
                      "commit_call_s": commits, "acked": acked,
                      "durable": state.durable_status()}), flush=True)
