#!/usr/bin/python3
"""Data-parallel training of a small MLP on scikit-learn's 8x8 digits.

    kolo run -np 4 -- /usr/bin/python3 examples/pytorch/digits.py
    /usr/bin/python3 examples/pytorch/digits.py        # one worker, no kolo run

The data set ships with scikit-learn (1797 images of 8x8 pixels, ten
classes), so the example runs offline in a few seconds on a laptop CPU. A
fixed stratified split keeps 1500 images to train on (a number that 1 to 6
workers divide evenly) and 297 to test.

It is written so that the number of workers does not change what is
learned, only how the work is split. The DistributedSampler shuffles the
training set with the same seed on every rank and deals the permutation
out round robin, so step k of N workers with --batch-size B covers exactly
the N*B samples of step k of one worker with --batch-size N*B;
DistributedOptimizer averages the N gradients, which is the gradient of the
mean loss over those N*B samples. The model has no dropout and no batch
statistics, so nothing else depends on the split. --lr is the learning rate
for one worker's batch and is scaled by the number of workers (the linear
scaling rule; it drops to a tenth for the last quarter of the epochs), so
the one-worker twin of `-np N --batch-size B --lr L` is `--batch-size N*B
--lr N*L`: both reach the same weights up to float rounding.

Metrics are computed exactly over the whole data: each rank sums loss,
correct answers and sample counts over its disjoint shard of the test set
(and its share of the training batches), and an allreduce with op=Sum adds
the shards before the division.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
from torch.utils.data.distributed import DistributedSampler
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

try:
    import kolo.torch as hvd
except ImportError:
    # Run from a checkout without PYTHONPATH: use the package next door.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import kolo.torch as hvd

# 1 to 6 workers divide it evenly, so DistributedSampler pads nothing.
TRAIN_SIZE = 1500


def parse_args():
    p = argparse.ArgumentParser(description="MLP on the 8x8 digits, data parallel with kolo")
    p.add_argument("--epochs", type=int, default=20, help="passes over the training set (default 20)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step on each worker (default 32)")
    p.add_argument("--lr", type=float, default=0.02,
                   help="learning rate for one worker's batch; multiplied by the number of workers (default 0.02)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--hidden", type=int, default=128, help="width of the hidden layers (default 128)")
    p.add_argument("--seed", type=int, default=42, help="seed of the weights and of the shuffling (default 42)")
    p.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    p.add_argument("--json", action="store_true", help="rank 0 ends with one JSON line of the results")
    return p.parse_args()


class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def load_data():
    """The digits as float tensors in [0, 1], split the same way on every rank.

    The split is stratified and fixed (random_state=0), not by position: the
    data set is ordered by writer, so its tail is a different population.
    """
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, train_size=TRAIN_SIZE, random_state=0, stratify=y)
    train = torch.utils.data.TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test = torch.utils.data.TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test))
    return train, test


def global_sums(name, *values):
    """Adds per-rank partial sums over all ranks (float64: counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64)
    return hvd.allreduce(t, op=hvd.Sum, name=name).tolist()


def evaluate(model, test_set):
    """Loss and accuracy over the whole test set, each rank doing its shard.

    The shards are disjoint and unpadded (rank r takes samples r, r+N, ...),
    unlike DistributedSampler's, which repeats samples to even them out.
    """
    model.eval()
    x, y = test_set.tensors
    mine = torch.arange(hvd.rank(), len(y), hvd.size())
    with torch.no_grad():
        out = model(x[mine])
        loss = F.cross_entropy(out, y[mine], reduction="sum").item()
        correct = (out.argmax(dim=1) == y[mine]).sum().item()
    loss, correct, count = global_sums("test_sums", loss, correct, len(mine))
    return loss / count, correct / count


def set_learning_rate(optimizer, args, epoch):
    """Linear scaling by the number of workers; a tenth for the last quarter.

    The decay settles the weights, so the final accuracy does not depend on
    which of the last few steps the run happens to stop after.
    """
    lr = args.lr * hvd.size()
    if epoch > args.epochs - args.epochs // 4:
        lr *= 0.1
    for group in optimizer.param_groups:
        group["lr"] = lr


def train_epoch(model, optimizer, loader, sampler, epoch):
    """One pass over the training set; returns the mean training loss."""
    model.train()
    sampler.set_epoch(epoch)
    loss_sum, count = 0.0, 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(y)
        count += len(y)
    loss_sum, count = global_sums("train_sums", loss_sum, count)
    return loss_sum / count


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_set, test_set = load_data()
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = MLP(args.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)

    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    epoch_times = []
    history = []
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        set_learning_rate(optimizer, args, epoch)
        t0 = time.perf_counter()
        train_loss = train_epoch(model, optimizer, loader, sampler, epoch)
        test_loss, accuracy = evaluate(model, test_set)
        epoch_times.append(time.perf_counter() - t0)
        # Epoch timing without log scraping: the coordinator derives the
        # epoch's wall time and samples/s, kolo run prints them, REST serves
        # them (GET /api/v1/jobs/{id}/epochs). A no-op without kolo run.
        hvd.report_epoch(epoch, samples=len(sampler),
                         metrics={"loss": train_loss, "accuracy": accuracy})
        history.append({"epoch": epoch, "train_loss": train_loss, "test_loss": test_loss,
                        "accuracy": accuracy})
        if hvd.rank() == 0:
            print("epoch %d: %.2f s, loss %.4f, accuracy %.4f" % (epoch, epoch_times[-1], train_loss, accuracy),
                  flush=True)

    if hvd.rank() == 0:
        print("final accuracy %.4f" % accuracy, flush=True)
        if args.json:
            print(json.dumps({"example": "digits", "workers": hvd.size(), "batch_size": args.batch_size,
                              "lr": args.lr, "epochs": args.epochs, "seed": args.seed,
                              "accuracy": accuracy, "test_loss": history[-1]["test_loss"] if history else None,
                              "epoch_times": [round(t, 4) for t in epoch_times], "history": history}),
                  flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
