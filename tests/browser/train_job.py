#!/usr/bin/python3
"""The job the dashboard's browser test watches: the digits MLP
(examples/pytorch/digits.py) under hvd.elastic.run, reporting every epoch,
with one worker slowed down on purpose and a stop file to end it.

    --slow-rank R --slow-s S   the worker that is rank R when it starts
                               sleeps S seconds in each step, before its
                               gradients are reduced: the others wait for
                               it, so the coordinator must name it the
                               straggler
    --stop-file F              finish (successfully) at the end of the
                               first epoch after F appears
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.data

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples", "pytorch"))
import kolo.torch as hvd  # noqa: E402
from digits import MLP, load_data, evaluate, global_sums  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-s", type=float, default=0.0)
p.add_argument("--stop-file", required=True)
p.add_argument("--max-epochs", type=int, default=200)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--tag", default="", help="ignored: marks the test's processes")
args = p.parse_args()

hvd.init()
torch.manual_seed(1)
torch.set_num_threads(1)
slow = hvd.rank() == args.slow_rank  # decided once: this process stays slow
train_set, test_set = load_data()
sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=1)
loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
model = MLP(64)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=1, batch=0)


@hvd.elastic.run
def train(state):
    while state.epoch <= args.max_epochs:
        if state.batch == 0:
            sampler.set_epoch(state.epoch)
        loss_sum, count = 0.0, 0
        for i, (x, y) in enumerate(loader, start=state.batch):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if slow:
                time.sleep(args.slow_s)
            optimizer.step()
            loss_sum += loss.item() * len(y)
            count += len(y)
            sampler.record_batch(i, args.batch_size)
            state.batch = i + 1
        mine = count
        loss_sum, count = global_sums("train_sums", loss_sum, count)
        _, accuracy = evaluate(model, test_set)
        hvd.report_epoch(state.epoch, samples=mine,
                         metrics={"loss": loss_sum / max(count, 1), "accuracy": accuracy})
        if hvd.rank() == 0:
            print("epoch %d done, %d workers" % (state.epoch, hvd.size()), flush=True)
        state.epoch += 1
        state.batch = 0
        state.commit()
        # rank 0 decides, so that every rank stops after the same epoch
        if hvd.broadcast_object(os.path.exists(args.stop_file), root_rank=0, name="stop"):
            break


train(state)
hvd.shutdown()
