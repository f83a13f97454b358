#!/usr/bin/python3
"""The digits MLP (digits.py) as an elastic job: workers may die and come
back, and training goes on from the last commit.

    kolo run -np 4 --min-np 2 --max-np 4 --blacklist-cooldown-range 2 10 \\
        -- /usr/bin/python3 examples/pytorch/elastic_digits.py

Kill a worker while it runs (kill -9 one of the python processes) and
watch it: the survivors roll back to the last commit, go on with three
workers, and two seconds later (the cooldown) grow back to four. The state
is committed every --commit-every batches and at the end of every epoch;
rank 0's commits are also stored on the coordinator, so a job whose
workers all died starts again from there instead of from scratch.

What differs from digits.py, line by line, is what elastic training needs:
  - the training function is wrapped in @hvd.elastic.run and takes the
    state; it starts where the state says (epoch, batch);
  - hvd.elastic.ElasticSampler instead of DistributedSampler: after a
    reset it splits what is left of the epoch among the new workers;
  - the learning rate follows hvd.size() after every reset (a reset
    callback), by the linear scaling rule;
  - state.commit() every few batches and at the end of each epoch.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.data

try:
    import kolo.torch as hvd
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import kolo.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits import MLP, load_data, evaluate, global_sums  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description="MLP on the 8x8 digits, elastic, with kolo")
    p.add_argument("--epochs", type=int, default=20, help="passes over the training set (default 20)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step on each worker (default 32)")
    p.add_argument("--lr", type=float, default=0.02, help="learning rate for one worker's batch (default 0.02)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--hidden", type=int, default=128, help="width of the hidden layers (default 128)")
    p.add_argument("--seed", type=int, default=42, help="seed of the weights and of the shuffling (default 42)")
    p.add_argument("--commit-every", type=int, default=10, help="commit every this many batches (default 10)")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="seconds to sleep after each batch, to give you time to kill a worker")
    p.add_argument("--json", action="store_true", help="rank 0 ends with one JSON line of the results")
    return p.parse_args()


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_set, test_set = load_data()
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = MLP(args.hidden)
    base = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())

    def set_lr():
        lr = args.lr * hvd.size()
        if state.epoch > args.epochs - args.epochs // 4:
            lr *= 0.1
        for group in optimizer.param_groups:
            group["lr"] = lr

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler,
                                   epoch=1, batch=0, accuracy=0.0)
    # Not part of the state: the state is rolled back and re-broadcast at a
    # reset, and this counts the resets themselves.
    resets = [0]

    def on_reset():
        resets[0] += 1
        set_lr()
        if hvd.rank() == 0:
            print("reset: %d worker(s) now, back at epoch %d batch %d"
                  % (hvd.size(), state.epoch, state.batch), flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.epoch <= args.epochs:
            set_lr()
            model.train()
            if state.batch == 0:
                sampler.set_epoch(state.epoch)
            t0 = time.perf_counter()
            loss_sum, count = 0.0, 0
            for i, (x, y) in enumerate(loader, start=state.batch):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                loss_sum += loss.item() * len(y)
                count += len(y)
                sampler.record_batch(i, args.batch_size)
                state.batch = i + 1
                if state.batch % args.commit_every == 0:
                    state.commit()
                if args.step_delay:
                    time.sleep(args.step_delay)
            mine = count  # samples this rank trained on in this (part of the) epoch
            loss_sum, count = global_sums("train_sums", loss_sum, count)
            test_loss, state.accuracy = evaluate(model, test_set)
            hvd.report_epoch(state.epoch, samples=mine,
                             metrics={"loss": loss_sum / max(count, 1), "accuracy": state.accuracy})
            if hvd.rank() == 0:
                print("epoch %d: %.2f s, %d worker(s), loss %.4f, accuracy %.4f"
                      % (state.epoch, time.perf_counter() - t0, hvd.size(),
                         loss_sum / max(count, 1), state.accuracy), flush=True)
            state.epoch += 1
            state.batch = 0
            state.commit()
        return state.accuracy

    accuracy = train(state)
    if hvd.rank() == 0:
        print("final accuracy %.4f after %d reset(s)" % (accuracy, resets[0]), flush=True)
        if args.json:
            print(json.dumps({"example": "elastic_digits", "workers": hvd.size(),
                              "accuracy": accuracy, "resets": resets[0]}), flush=True)
        state.flush()
    hvd.shutdown()


if __name__ == "__main__":
    main()
