"""Gradients and argument checks exactly as horovod.torch 0.28 defines them,
run on every rank (suite.py), each test with init and Horovod's tearDown."""
import torch

import kolo.torch as hvd
from suite import HvdTestCase


def _rows(n, r, per=2):
    return torch.arange(per * n, dtype=torch.float64).reshape(n, per) + 100 * r


class AutogradTests(HvdTestCase):

    def _rs_grad(self, op, pre, post, grouped):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        w = torch.ones(2 * n, 3, dtype=torch.float64, requires_grad=True)
        if grouped:
            out = hvd.grouped_reducescatter([w, w * 2], op=op, prescale_factor=pre,
                                            postscale_factor=post)
            loss = (out[0] * (r + 1)).sum() + (out[1] * (r + 2)).sum()
        else:
            out = hvd.reducescatter(w, op=op, prescale_factor=pre, postscale_factor=post)
            loss = (out * (r + 1)).sum()
        loss.backward()
        # Horovod: grad * size for Sum (as is for Average), * pre * post, allgathered
        scale = (n if op == hvd.Sum else 1) * pre * post
        own = [torch.full((2, 3), float(k + 1), dtype=torch.float64) for k in range(n)]
        want = torch.cat(own) * scale
        if grouped:
            want = want + 2 * torch.cat([torch.full((2, 3), float(k + 2), dtype=torch.float64)
                                         for k in range(n)]) * scale
        self.assertTrue(torch.allclose(w.grad, want), "%s vs %s" % (w.grad, want))

    def test_reducescatter_sum_grad(self):
        self._rs_grad(hvd.Sum, 1.0, 1.0, False)

    def test_reducescatter_average_scaled_grad(self):
        self._rs_grad(hvd.Average, 2.0, 0.25, False)

    def test_grouped_reducescatter_grad(self):
        self._rs_grad(hvd.Sum, 1.0, 3.0, True)

    def test_grouped_allgather_grad(self):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        a = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
        b = torch.ones(r + 2, 3, dtype=torch.float64, requires_grad=True)
        ga, gb = hvd.grouped_allgather([a, b], name="gag")
        self.assertEqual(ga.shape[0], n * (n + 1) // 2)
        ((ga * torch.arange(ga.shape[0]).reshape(-1, 1)).sum() + (gb * 3).sum()).backward()
        lo = r * (r + 1) // 2
        want_a = torch.arange(lo, lo + r + 1, dtype=torch.float64).reshape(-1, 1).expand(r + 1, 2)
        self.assertTrue(torch.allclose(a.grad, want_a), a.grad)
        self.assertTrue(torch.allclose(b.grad, torch.full_like(b, 3.0)), b.grad)

    def test_grouped_allgather_matches_allgather_grad(self):
        hvd.init()
        r = hvd.rank()
        x = torch.randn(r + 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(r))
        w1 = x.clone().requires_grad_()
        w2 = x.clone().requires_grad_()
        (hvd.allgather(w1) ** 2).sum().backward()
        (hvd.grouped_allgather([w2])[0] ** 2).sum().backward()
        self.assertTrue(torch.allclose(w1.grad, w2.grad))

    def test_grouped_allreduce_grad(self):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        a = torch.ones(3, dtype=torch.float64, requires_grad=True)
        b = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
        for op, scale in ((hvd.Sum, n), (hvd.Average, 1)):
            a.grad = b.grad = None
            outs = hvd.grouped_allreduce([a * (r + 1), b * 2], op=op, name="gar.%d" % op)
            (outs[0].sum() + 3 * outs[1].sum()).backward()
            # the same reduction of the output's gradient, as Horovod
            self.assertTrue(torch.allclose(a.grad, torch.full_like(a, (r + 1) * scale)), a.grad)
            self.assertTrue(torch.allclose(b.grad, torch.full_like(b, 6.0 * scale)), b.grad)

    def test_alltoall_splits_type_error(self):
        hvd.init()
        n = hvd.size()
        with self.assertRaises(ValueError) as cm:
            hvd.alltoall(torch.ones(n, 2), torch.ones(n, dtype=torch.float32))
        self.assertIn("alltoall expects splits to contain 32-bit integer elements.",
                      str(cm.exception))
        with self.assertRaises(ValueError):
            hvd.alltoall(torch.ones(n, 2), torch.ones(n, dtype=torch.int64))

    def test_alltoall_splits_shape_error(self):
        hvd.init()
        n = hvd.size()
        with self.assertRaises(ValueError) as cm:
            hvd.alltoall(torch.ones(n, 2), torch.ones(1, n, dtype=torch.int32))
        self.assertIn("alltoall expects a 1D splits tensor", str(cm.exception))

    def test_alltoall_grad_with_splits(self):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        splits = torch.tensor([k + 1 for k in range(n)], dtype=torch.int32)
        w = torch.ones(int(splits.sum()), 2, dtype=torch.float64, requires_grad=True)
        out, recv = hvd.alltoall(w * (r + 1), splits)
        self.assertEqual(recv.tolist(), [r + 1] * n)
        (out * 5).sum().backward()
        self.assertTrue(torch.allclose(w.grad, torch.full_like(w, 5.0 * (r + 1))))
