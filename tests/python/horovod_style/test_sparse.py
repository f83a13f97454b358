"""Sparse gradients as horovod.torch reduces them: sparse_allreduce_async
(allgather of indices and values) and DistributedOptimizer passing an
nn.Embedding(sparse=True) gradient to torch.optim.SparseAdam."""
import torch

import kolo.torch as hvd
from suite import HvdTestCase


def _sparse(r, size=(10, 3)):
    idx = torch.tensor([[r % size[0], (r + 3) % size[0], 7]])
    val = torch.arange(9, dtype=torch.float32).reshape(3, 3) + 10 * r
    return torch.sparse_coo_tensor(idx, val, size)


class SparseTests(HvdTestCase):

    def _reference(self, n, op):
        dense = sum(_sparse(k).to_dense() for k in range(n))
        return dense / n if op == hvd.Average else dense

    def test_sparse_allreduce_sum_and_average(self):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        for op in (hvd.Sum, hvd.Average):
            handle = hvd.sparse_allreduce_async(_sparse(r), name="sp.%d" % op, op=op)
            self.assertTrue(callable(handle))
            out = handle()
            self.assertTrue(out.is_sparse and out.is_coalesced())
            self.assertEqual(out.size(), (10, 3))
            self.assertTrue(torch.allclose(out.to_dense(), self._reference(n, op)))

    def test_sparse_allreduce_other_op_is_refused(self):
        hvd.init()
        with self.assertRaises(ValueError):
            hvd.sparse_allreduce_async(_sparse(0), name="sp.min", op=hvd.Min)

    def _train(self, sparse_as_dense):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        torch.manual_seed(0)
        emb = torch.nn.Embedding(20, 4, sparse=True)
        ref = torch.nn.Embedding(20, 4, sparse=True)
        ref.load_state_dict(emb.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.1)
        batches = [torch.tensor([(3 * k + s) % 20 for s in range(5)]) for k in range(n)]
        for step in range(3):
            opt.zero_grad()
            emb(batches[r] + step).pow(2).sum().backward()
            self.assertTrue(emb.weight.grad.is_sparse)
            opt.step()
            self.assertTrue(emb.weight.grad.is_sparse)
            # the same step in one process: the average of every rank's gradient
            ref_opt.zero_grad()
            grads = []
            for k in range(n):
                ref.zero_grad()
                ref(batches[k] + step).pow(2).sum().backward()
                grads.append(ref.weight.grad.to_dense().clone())
            ref.weight.grad = (sum(grads) / n).to_sparse()
            ref_opt.step()
        self.assertTrue(torch.allclose(emb.weight, ref.weight, atol=1e-6),
                        (emb.weight - ref.weight).abs().max())

    def test_distributed_optimizer_sparse_gradients(self):
        self._train(sparse_as_dense=False)

    def test_distributed_optimizer_sparse_as_dense(self):
        self._train(sparse_as_dense=True)
