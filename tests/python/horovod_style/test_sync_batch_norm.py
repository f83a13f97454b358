"""hvd.SyncBatchNorm against one process running nn.BatchNorm on the
concatenated global batch: outputs, running statistics, input gradients,
and weight/bias gradients (summed over ranks, as DistributedOptimizer's
allreduce would), for 1d/2d/3d inputs, train and eval, momentum 0.1 and
None (cumulative), affine on and off. Ranks get batches of different
sizes."""
import torch

import kolo.torch as hvd
from suite import HvdTestCase

# one sample's shape (C, ...) for each kind of input
SHAPES = {"1d": (5,), "1d_seq": (5, 7), "2d": (5, 4, 3), "3d": (5, 4, 3, 2)}
BN = {"1d": torch.nn.BatchNorm1d, "1d_seq": torch.nn.BatchNorm1d, "2d": torch.nn.BatchNorm2d,
      "3d": torch.nn.BatchNorm3d}


def _batch(rank, kind, steps):
    g = torch.Generator().manual_seed(1000 * len(SHAPES[kind]) + rank)
    n = 2 + rank  # uneven batches
    return [torch.randn((n,) + SHAPES[kind], generator=g, dtype=torch.float64) * 3 + 5
            for _ in range(steps)]


class SyncBatchNormTests(HvdTestCase):

    def _check(self, dims, affine, momentum):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        c = SHAPES[dims][0]
        sync = hvd.SyncBatchNorm(c, momentum=momentum, affine=affine).double()
        ref = BN[dims](c, momentum=momentum, affine=affine).double()
        if affine:
            with torch.no_grad():
                w = torch.linspace(0.5, 1.5, c, dtype=torch.float64)
                sync.weight.copy_(w)
                ref.weight.copy_(w)
                sync.bias.fill_(0.25)
                ref.bias.fill_(0.25)
        mine = _batch(r, dims, 3)
        every = [_batch(k, dims, 3) for k in range(n)]
        lo = sum(2 + k for k in range(r))
        for step in range(3):
            x = mine[step].clone().requires_grad_()
            xs = torch.cat([every[k][step] for k in range(n)]).requires_grad_()
            out = sync(x)
            want = ref(xs)
            self.assertTrue(torch.allclose(out, want[lo:lo + x.shape[0]], atol=1e-9),
                            (out - want[lo:lo + x.shape[0]]).abs().max())
            # a loss that weighs every element differently
            wts = torch.arange(xs.numel(), dtype=torch.float64).reshape(xs.shape) % 7
            (out * wts[lo:lo + x.shape[0]]).sum().backward()
            (want * wts).sum().backward()
            self.assertTrue(torch.allclose(x.grad, xs.grad[lo:lo + x.shape[0]], atol=1e-9),
                            (x.grad - xs.grad[lo:lo + x.shape[0]]).abs().max())
            self.assertTrue(torch.allclose(sync.running_mean, ref.running_mean, atol=1e-10))
            self.assertTrue(torch.allclose(sync.running_var, ref.running_var, atol=1e-10))
            if affine:
                gw = hvd.allreduce(sync.weight.grad, op=hvd.Sum, name="gw")
                gb = hvd.allreduce(sync.bias.grad, op=hvd.Sum, name="gb")
                self.assertTrue(torch.allclose(gw, ref.weight.grad, atol=1e-8))
                self.assertTrue(torch.allclose(gb, ref.bias.grad, atol=1e-8))
                sync.zero_grad()
                ref.zero_grad()
        # evaluation: running statistics, local
        sync.eval()
        ref.eval()
        x = mine[0]
        self.assertTrue(torch.allclose(sync(x), ref(x), atol=1e-10))

    def test_1d(self):
        self._check("1d", True, 0.1)

    def test_1d_sequence_no_affine(self):
        self._check("1d_seq", False, 0.1)

    def test_2d(self):
        self._check("2d", True, 0.1)

    def test_2d_cumulative_momentum_no_affine(self):
        self._check("2d", False, None)

    def test_3d(self):
        self._check("3d", True, 0.3)

    def test_input_dim_error(self):
        hvd.init()
        with self.assertRaises(ValueError):
            hvd.SyncBatchNorm(3)(torch.ones(3))
