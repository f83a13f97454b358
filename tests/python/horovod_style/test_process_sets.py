"""Process sets as Horovod's test suites use them (dynamic sets, every
test adds its sets after hvd.init() and removes them), run on every rank:
every collective and dtype on the even and odd ranks and on {0, 1, 2},
sets that run side by side, a set added and removed while another runs,
autograd and DistributedOptimizer over a set, and Horovod's errors."""
import os

import torch

import kolo.torch as hvd
from suite import HvdTestCase

os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16]


def _sets():
    n = hvd.size()
    even = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    odd = hvd.add_process_set([k for k in range(n) if k % 2 == 1]) if n > 1 else None
    return even, odd


class ProcessSetTests(HvdTestCase):
    TIMEOUT = 120

    def _mine(self):
        even, odd = _sets()
        self.added = [s for s in (even, odd) if s is not None]
        return even if hvd.rank() % 2 == 0 else odd

    def tearDown(self):
        for ps in getattr(self, "added", []):
            hvd.remove_process_set(ps)
        super().tearDown()

    def test_set_attributes(self):
        hvd.init()
        ps = self._mine()
        r = hvd.rank()
        self.assertTrue(ps.included())
        self.assertEqual(ps.size(), len(ps.ranks))
        self.assertEqual(ps.rank(), ps.ranks.index(r))
        self.assertGreater(ps.process_set_id, 0)
        self.assertEqual(hvd.global_process_set.process_set_id, 0)
        self.assertEqual(hvd.global_process_set.ranks, list(range(hvd.size())))
        for other in self.added:
            if other is not ps:
                self.assertFalse(other.included())
                self.assertEqual(other.rank(), -1)

    def test_every_op_and_dtype(self):
        hvd.init()
        ps = self._mine()
        r, ranks = hvd.rank(), ps.ranks
        k, m = ps.rank(), ps.size()
        for dt in DTYPES:
            t = torch.tensor([r + 1, 2 * r], dtype=dt)
            s = hvd.allreduce(t, op=hvd.Sum, name="ar.%s" % dt, process_set=ps)
            want = torch.tensor([sum(q + 1 for q in ranks), sum(2 * q for q in ranks)], dtype=dt)
            self.assertTrue(torch.equal(s, want), (dt, s, want))
            mx = hvd.allreduce(t, op=hvd.Max, name="mx.%s" % dt, process_set=ps)
            self.assertEqual(mx[0].item(), max(ranks) + 1)
            g = hvd.allgather(torch.full((r % 3 + 1, 2), r, dtype=dt), name="ag.%s" % dt,
                              process_set=ps)
            self.assertEqual(g[:, 0].tolist(), [q for q in ranks for _ in range(q % 3 + 1)])
            for root in ranks:
                b = hvd.broadcast(torch.full((3,), r, dtype=dt), root_rank=root,
                                  name="bc.%s.%d" % (dt, root), process_set=ps)
                self.assertEqual(b.tolist(), [root] * 3)
            splits = torch.tensor([q + 1 for q in range(m)], dtype=torch.int32)
            a, recv = hvd.alltoall(torch.full((int(splits.sum()),), r, dtype=dt), splits,
                                   name="a2a.%s" % dt, process_set=ps)
            self.assertEqual(recv.tolist(), [k + 1] * m)
            self.assertEqual(a.tolist(), [q for q in ranks for _ in range(k + 1)])
            if dt != torch.float16:
                rs = hvd.reducescatter(torch.ones(2 * m, dtype=dt), op=hvd.Sum,
                                       name="rs.%s" % dt, process_set=ps)
                self.assertEqual(rs.tolist(), [m, m])
        ga = hvd.grouped_allreduce([torch.ones(2), torch.ones(3)], op=hvd.Sum, name="gar",
                                   process_set=ps)
        self.assertEqual([x.sum().item() for x in ga], [2.0 * m, 3.0 * m])
        hvd.barrier(process_set=ps)
        self.assertEqual(hvd.broadcast_object({"r": r}, root_rank=ranks[0], process_set=ps),
                         {"r": ranks[0]})
        self.assertEqual(hvd.allgather_object(r, process_set=ps), ranks)

    def test_names_are_per_set(self):
        # the same name in two sets at once: two negotiations, no mismatch
        hvd.init()
        ps = self._mine()
        t = torch.full((4,), float(hvd.rank() % 2))
        x = hvd.allreduce(t, op=hvd.Sum, name="same", process_set=ps)
        self.assertEqual(x.tolist(), [float((hvd.rank() % 2) * ps.size())] * 4)

    def test_three_of_four(self):
        hvd.init()
        if hvd.size() < 4:
            self.skipTest("needs four ranks (three of three is the global set)")
        trio = hvd.add_process_set([0, 1, 2])
        self.added = [trio]
        if hvd.rank() <= 2:
            x = hvd.allreduce(torch.ones(5), op=hvd.Sum, process_set=trio, name="trio")
            self.assertEqual(x.tolist(), [3.0] * 5)
            self.assertEqual(hvd.allgather_object(hvd.rank(), process_set=trio), [0, 1, 2])
        else:
            with self.assertRaises(ValueError):
                hvd.allreduce(torch.ones(5), process_set=trio)

    def test_set_added_and_removed_while_another_runs(self):
        hvd.init()
        n, r = hvd.size(), hvd.rank()
        if n < 4:
            self.skipTest("needs four ranks")
        low = hvd.add_process_set([0, 1])
        high = hvd.add_process_set([2, 3])
        self.added = [low]
        if r <= 1:
            for i in range(30):
                x = hvd.allreduce(torch.ones(8) * i, op=hvd.Sum, name="low", process_set=low)
                self.assertEqual(x[0].item(), 2.0 * i)
        else:
            for i in range(5):
                x = hvd.allreduce(torch.ones(8) * i, op=hvd.Sum, name="high", process_set=high)
                self.assertEqual(x[0].item(), 2.0 * i)
        self.assertTrue(hvd.remove_process_set(high))
        self.assertFalse(hvd.remove_process_set(high))
        # invalidated, as Horovod's: neither id nor ranks
        self.assertIsNone(high.process_set_id)
        self.assertIsNone(high.ranks)
        with self.assertRaises(ValueError):
            hvd.allreduce(torch.ones(1), process_set=high)

    def test_autograd_over_a_set(self):
        hvd.init()
        ps = self._mine()
        w = torch.ones(3, requires_grad=True)
        hvd.allreduce(w * (hvd.rank() + 1), op=hvd.Sum, process_set=ps).sum().backward()
        want = ps.size() * (hvd.rank() + 1)
        self.assertTrue(torch.allclose(w.grad, torch.full((3,), float(want))))
        v = torch.ones(hvd.rank() % 3 + 1, 2, requires_grad=True)
        hvd.allgather(v, process_set=ps).sum().backward()
        self.assertTrue(torch.allclose(v.grad, torch.ones_like(v)))

    def test_distributed_optimizer_over_a_set(self):
        hvd.init()
        ps = self._mine()
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1, bias=False)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                       named_parameters=model.named_parameters(),
                                       process_set=ps)
        start = model.weight.detach().clone()
        x = torch.full((1, 3), float(hvd.rank() + 1))
        model(x).sum().backward()
        opt.step()
        mean = sum(q + 1 for q in ps.ranks) / ps.size()
        self.assertTrue(torch.allclose(model.weight, start - mean))

    def test_repeats_at_init_share_an_id(self):
        """init(process_sets=...) with a set given twice, in another
        order, and one equal to the global set: repeats are not made
        again but take the first one's id (the global's: 0), as Horovod's
        init() treats them, and work as that set."""
        n = int(os.environ["HOROVOD_SIZE"])  # before init(), as Horovod's suites read it
        if n < 2:
            self.skipTest("needs 2 ranks")
        sets = [hvd.ProcessSet([0]), hvd.ProcessSet(list(range(1, n))),
                hvd.ProcessSet(list(range(n - 1, -1, -1))), hvd.ProcessSet([0]),
                hvd.ProcessSet(list(reversed(range(1, n))))]
        hvd.init(process_sets=sets)
        ids = [ps.process_set_id for ps in sets]
        self.assertEqual(ids[2], 0)
        self.assertEqual(ids[3], ids[0])
        self.assertEqual(ids[4], ids[1])
        self.assertEqual(len({ids[0], ids[1], 0}), 3)
        self.assertEqual(sets[4].ranks, list(range(1, n)))
        r = hvd.rank()
        mine = (sets[0], sets[3]) if r == 0 else (sets[1], sets[4])
        for ps in mine:
            self.assertTrue(ps.included())
            got = hvd.allreduce(torch.ones(2) * (r + 1), op=hvd.Sum, name="rep", process_set=ps)
            self.assertEqual(got.tolist(), [float(sum(q + 1 for q in ps.ranks))] * 2)
        got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="all", process_set=sets[2])
        self.assertEqual(got.item(), float(n))
        # the first of the repeats removes them all
        self.assertTrue(hvd.remove_process_set(sets[0]))
        self.assertIsNone(sets[3].process_set_id)
        with self.assertRaises(ValueError):
            hvd.allreduce(torch.ones(1), process_set=sets[3])
        self.assertFalse(hvd.remove_process_set(sets[2]))  # the global set stays

    def test_errors(self):
        hvd.init()
        ps = self._mine()
        # Horovod keeps the global set and says so with False
        self.assertFalse(hvd.remove_process_set(hvd.global_process_set))
        self.assertEqual(hvd.global_process_set.ranks, list(range(hvd.size())))
        with self.assertRaises(ValueError):
            hvd.add_process_set(ps.ranks)  # the same ranks again
        with self.assertRaises(ValueError):
            hvd.add_process_set([0, hvd.size()])  # not a rank of the job
        with self.assertRaises(ValueError):
            hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0]))  # never added
        if hvd.size() > 1:
            other = [s for s in self.added if s is not ps][0]
            with self.assertRaises(ValueError):
                hvd.broadcast(torch.ones(1), root_rank=other.ranks[0], process_set=ps)
