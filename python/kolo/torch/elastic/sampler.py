"""ElasticSampler: horovod.torch.elastic.sampler's, a sampler that
re-splits what is left of an epoch among the ranks after a reset."""
import math
import random

import torch

import kolo as _kolo


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset among the current ranks, and re-splits what is left
    of the epoch after a reset, so no sample is skipped or seen twice in an
    epoch (up to the padding that evens out the last batch).

    The order of an epoch is one permutation (seed + epoch) of the whole
    dataset; rank r takes positions r, r + n, r + 2n, ... of what remains.
    After k batches of b samples on each of n ranks, exactly the first
    k * b * n positions are done, which is what record_batch counts.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks one batch of batch_size samples per rank as done."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        self.processed_num += len(indices) * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        self.num_replicas = _kolo.size() if _kolo.is_initialized() else 1
        self.rank = _kolo.rank() if _kolo.is_initialized() else 0
        order = self._order()
        self.remaining_indices = order[min(self.processed_num, len(order)):]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def _order(self):
        # Horovod's order, so that a run moved from Horovod sees the same
        # samples: Python's shuffle seeded with seed + epoch
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def __iter__(self):
        idx = list(self.remaining_indices)
        if idx:
            while len(idx) < self.total_size:
                idx += idx[:self.total_size - len(idx)]
        self.indices = idx[self.rank:self.total_size:self.num_replicas]  # as Horovod's
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
