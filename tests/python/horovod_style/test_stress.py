"""A Horovod user's test module at its roughest (issue 30, item 2), run on
every rank by tests/python/stress_dropin.py in a seeded random order,
back to back in one launch: async ops left unsynchronized, duplicate names
refused, errors raised on some ranks only, join with every collective,
process sets added and removed, init/shutdown/init. Every test calls
hvd.init() and tearDown calls hvd.barrier(); hvd.shutdown() (suite.py),
as Horovod's own suites do; no test may fail because an earlier one failed
or raced, whatever the order.

Tests that pick a rank ("one rank sends another shape") pick it from the
order's seed (STRESS_SEED), the same on every rank."""
import os
import random

import torch

import kolo.torch as hvd
from suite import HvdTestCase

os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"


def _pick(salt):
    """A rank of the job chosen by the run's seed and `salt`, the same on
    every rank."""
    rng = random.Random("%s/%s" % (os.environ.get("STRESS_SEED", "0"), salt))
    return rng.randrange(hvd.size())


class StressTests(HvdTestCase):
    TIMEOUT = 60

    def _need_two(self):
        if hvd.size() < 2:
            self.skipTest("needs two ranks")

    # ------------------------------------------------------------ async ops never synchronized

    def test_async_before_and_after_a_barrier(self):
        # issue 30: one rank submits "x" before a barrier, the others after
        # it; nobody synchronizes it
        hvd.init()
        first = _pick("async.first")
        t = torch.ones(5) * (hvd.rank() + 1)
        if hvd.rank() == first:
            hvd.allreduce_async(t, name="x")
        hvd.barrier()
        if hvd.rank() != first:
            hvd.allreduce_async(t, name="x")
        hvd.barrier()

    def test_every_collective_async_never_synchronized(self):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        hvd.allreduce_async(torch.ones(3), name="u.ar")
        hvd.allreduce_async_(torch.ones(1000), name="u.ar_")
        hvd.grouped_allreduce_async([torch.ones(2), torch.ones(7)], name="u.gar")
        hvd.allgather_async(torch.ones(r + 1, 2), name="u.ag")
        hvd.broadcast_async(torch.ones(4) * r, root_rank=n - 1, name="u.bc")
        hvd.alltoall_async(torch.arange(2 * n, dtype=torch.float32), name="u.a2a")
        hvd.reducescatter_async(torch.ones(n, 3), name="u.rs", op=hvd.Sum)
        hvd.allreduce_async(torch.ones(2))  # unnamed
        # a synchronous op after them sees its own result
        x = hvd.allreduce(torch.full((3,), float(r)), name="u.after", op=hvd.Sum)
        self.assertEqual(x.tolist(), [n * (n - 1) / 2.0] * 3)

    def test_op_only_one_rank_submits_is_pending_at_shutdown(self):
        # the others never submit it: still pending at tearDown's shutdown
        hvd.init()
        lone = _pick("lone")
        h = None
        if hvd.rank() == lone:
            h = hvd.allreduce_async(torch.ones(6), name="lonely")
        x = hvd.allreduce(torch.ones(2), name="beside.lonely", op=hvd.Sum)
        self.assertEqual(x.tolist(), [float(hvd.size())] * 2)
        if h is not None and hvd.size() > 1:
            self.assertFalse(hvd.poll(h))

    def test_synchronize_out_of_order(self):
        hvd.init()
        n = hvd.size()
        hs = [hvd.allreduce_async(torch.full((4,), float(i)), name="ooo.%d" % i, op=hvd.Sum)
              for i in range(8)]
        for i in reversed(range(8)):
            self.assertEqual(hvd.synchronize(hs[i]).tolist(), [float(i * n)] * 4)
        self.assertIsNone(hvd.synchronize(hs[0]))  # already synchronized: unknown

    # ------------------------------------------------------------ duplicate names

    def test_duplicate_name_refused(self):
        # Horovod's test_horovod_allreduce_duplicate_name_error, for each
        # collective: a name still in flight is refused on the rank that
        # submits it again, with nothing left behind. Horovod's test has
        # the ranks after the barrier submit the name twice too; but the
        # last of them completes the op with its first submission, and a
        # loaded machine can let it finish before the second (then nothing
        # is in flight to refuse, in Horovod as in kolo). They repeat a
        # name only they submit instead (in flight until shutdown).
        hvd.init()
        self._need_two()
        r, n = hvd.rank(), hvd.size()
        first = _pick("dup.first")
        ops = {
            "allreduce": lambda name: hvd.allreduce_async(torch.ones(17, 17), name=name),
            "allgather": lambda name: hvd.allgather_async(torch.ones(2, 3), name=name),
            "broadcast": lambda name: hvd.broadcast_async(torch.ones(3), 0, name=name),
            "alltoall": lambda name: hvd.alltoall_async(torch.ones(n, 2), name=name),
        }
        handles = []
        for what, submit in ops.items():
            name = "dup." + what
            if r == first:
                handles.append(submit(name))
                with self.assertRaises(ValueError):
                    submit(name)
            hvd.barrier()
            if r != first:
                handles.append(submit(name))
                mine = "%s.only.%d" % (name, r)
                submit(mine)
                with self.assertRaises(ValueError):
                    submit(mine)
            hvd.barrier()
        for h in handles[::2]:  # some synchronized, the others never
            hvd.synchronize(h)

    def test_duplicate_refused_then_name_reused(self):
        # refused while in flight (the others submit it only after the
        # barrier), then the name works as ever
        hvd.init()
        self._need_two()
        r, n = hvd.rank(), hvd.size()
        first = _pick("dup.reuse")
        h = None
        if r == first:
            h = hvd.allreduce_async(torch.ones(3), name="dup.reuse", op=hvd.Sum)
            with self.assertRaises(ValueError):
                hvd.allreduce_async(torch.ones(3), name="dup.reuse", op=hvd.Sum)
        hvd.barrier()
        if r != first:
            h = hvd.allreduce_async(torch.ones(3), name="dup.reuse", op=hvd.Sum)
        self.assertEqual(hvd.synchronize(h).tolist(), [float(n)] * 3)
        for _ in range(3):
            x = hvd.allreduce(torch.ones(3), name="dup.reuse", op=hvd.Sum)
            self.assertEqual(x.tolist(), [float(n)] * 3)

    # ------------------------------------------------------------ errors on some ranks only

    def _mismatch(self, submit, good, text):
        """`submit(odd)`: the odd rank (picked by the seed) submits
        something the others do not; every rank gets the same
        HorovodInternalError; then the same name agrees again."""
        self._need_two()
        odd = _pick(text)
        with self.assertRaises(hvd.HorovodInternalError) as cm:
            submit(hvd.rank() == odd)
        self.assertIn(text, str(cm.exception))
        good()

    def test_mismatched_shape_on_one_rank(self):
        hvd.init()
        n = hvd.size()
        self._mismatch(
            lambda odd: hvd.allreduce(torch.ones(4 if odd else 5), name="mm.shape"),
            lambda: self.assertEqual(
                hvd.allreduce(torch.ones(5), name="mm.shape", op=hvd.Sum).tolist(),
                [float(n)] * 5),
            "Mismatched ALLREDUCE tensor shapes")

    def test_mismatched_dtype_on_one_rank(self):
        hvd.init()
        self._mismatch(
            lambda odd: hvd.allreduce(torch.ones(3, dtype=torch.int32 if odd else torch.float32),
                                      name="mm.dtype"),
            lambda: hvd.allreduce(torch.ones(3), name="mm.dtype"),
            "Mismatched data types")

    def test_mismatched_allgather_shape_on_one_rank(self):
        hvd.init()
        self._mismatch(
            lambda odd: hvd.allgather(torch.ones(2, 3 if odd else 4), name="mm.ag"),
            lambda: hvd.allgather(torch.ones(hvd.rank() + 1, 4), name="mm.ag"),
            "Mismatched ALLGATHER tensor shapes")

    def test_mismatched_broadcast_root_on_one_rank(self):
        hvd.init()
        self._mismatch(
            lambda odd: hvd.broadcast(torch.ones(3), root_rank=1 if odd else 0, name="mm.root"),
            lambda: hvd.broadcast(torch.ones(3), root_rank=0, name="mm.root"),
            "Mismatched BROADCAST root ranks")

    def test_mismatched_collective_on_one_rank(self):
        hvd.init()
        self._mismatch(
            lambda odd: (hvd.allgather(torch.ones(2), name="mm.coll") if odd
                         else hvd.allreduce(torch.ones(2), name="mm.coll")),
            lambda: hvd.allreduce(torch.ones(2), name="mm.coll"),
            "Mismatched")

    def test_mismatch_in_a_group_on_one_rank(self):
        hvd.init()
        self._mismatch(
            lambda odd: hvd.grouped_allreduce([torch.ones(2), torch.ones(3 if odd else 4)],
                                              name="mm.group"),
            lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(4)], name="mm.group"),
            "Mismatched ALLREDUCE tensor shapes")

    def test_value_error_on_one_rank_only(self):
        # refused before anything is sent, on that rank alone; the others
        # go on, and so does it
        hvd.init()
        odd = _pick("local.error")
        if hvd.rank() == odd:
            with self.assertRaises(ValueError):
                hvd.allreduce(torch.ones(4, 4).t(), name="local.bad")  # not contiguous
            with self.assertRaises(ValueError):
                hvd.allreduce(torch.ones(2, dtype=torch.bool), name="local.bad")
            with self.assertRaises(ValueError):
                hvd.alltoall(torch.ones(4), splits=torch.ones(hvd.size(), dtype=torch.int64))
        x = hvd.allreduce(torch.ones(2), name="local.after", op=hvd.Sum)
        self.assertEqual(x.tolist(), [float(hvd.size())] * 2)

    def test_async_mismatch_never_synchronized(self):
        # the error is kept on handles nobody looks at
        hvd.init()
        self._need_two()
        odd = _pick("async.mm")
        hvd.allreduce_async(torch.ones(2 if hvd.rank() == odd else 3), name="mm.async")
        x = hvd.allreduce(torch.ones(1), name="mm.async.after", op=hvd.Sum)
        self.assertEqual(x.item(), float(hvd.size()))

    # ------------------------------------------------------------ join with every collective

    def _join_with(self, what, run):
        """Each rank in turn joins while the others run `run()`: Horovod's
        error for every collective but allreduce and barrier, after which
        they join too; join returns the same last rank everywhere."""
        hvd.init()
        self._need_two()
        r, n = hvd.rank(), hvd.size()
        for joiner in range(n):
            if r == joiner:
                last = hvd.join()
            else:
                if what in ("allreduce", "barrier"):
                    run(joiner)
                else:
                    with self.assertRaises(hvd.HorovodInternalError) as cm:
                        run(joiner)
                    self.assertIn("not supported with Join", str(cm.exception))
                last = hvd.join()
            self.assertEqual(hvd.allgather_object(last, name="join.%s.%d" % (what, joiner)),
                             [last] * n)

    def test_join_with_allreduce(self):
        def run(joiner):
            n = hvd.size()
            x = hvd.allreduce(torch.ones(3), name="j.ar", op=hvd.Sum)
            self.assertEqual(x.tolist(), [float(n - 1)] * 3)
            a = hvd.allreduce(torch.ones(3) * n, name="j.avg")  # Average over all n
            self.assertEqual(a.tolist(), [float(n - 1)] * 3)
        self._join_with("allreduce", run)

    def test_join_with_allgather(self):
        self._join_with("allgather", lambda j: hvd.allgather(torch.ones(2, 2), name="j.ag"))

    def test_join_with_broadcast(self):
        self._join_with("broadcast", lambda j: hvd.broadcast(torch.ones(2), root_rank=(j + 1)
                                                             % hvd.size(), name="j.bc"))

    def test_join_with_alltoall(self):
        self._join_with("alltoall", lambda j: hvd.alltoall(torch.ones(hvd.size()), name="j.a2a"))

    def test_join_with_reducescatter(self):
        self._join_with("reducescatter",
                        lambda j: hvd.reducescatter(torch.ones(hvd.size(), 2), name="j.rs"))

    def test_join_with_barrier(self):
        self._join_with("barrier", lambda j: hvd.barrier())

    # ------------------------------------------------------------ process sets

    def test_process_sets_added_and_removed(self):
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        sets = []
        try:
            evens = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
            sets.append(evens)
            if n >= 3:
                pair = hvd.add_process_set([n - 2, n - 1])
                sets.append(pair)
            if r % 2 == 0:
                x = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.x", process_set=evens)
                self.assertEqual(x.tolist(), [float(evens.size())] * 2)
            x = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.x")  # the same name, global
            self.assertEqual(x.tolist(), [float(n)] * 2)
            if n >= 3 and r >= n - 2:
                # never synchronized: the set is removed under it
                hvd.allreduce_async(torch.ones(3), name="ps.never", process_set=pair)
                hvd.barrier(process_set=pair)
        finally:
            for ps in reversed(sets):
                self.assertTrue(hvd.remove_process_set(ps))
        with self.assertRaises(ValueError):
            hvd.allreduce(torch.ones(1), process_set=evens)
        again = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
        self.assertNotEqual(again.process_set_id, evens.process_set_id)
        if r % 2 == 0:
            hvd.barrier(process_set=again)
        hvd.remove_process_set(again)

    def test_process_set_left_at_shutdown(self):
        # a set never removed: shutdown ends it; the next init has none
        hvd.init()
        n = hvd.size()
        ps = hvd.add_process_set([0] if n <= 2 else [0, n - 1])  # not the global set
        if hvd.rank() in ps.ranks:
            hvd.allgather_object(hvd.rank(), process_set=ps)
        hvd.barrier()
        hvd.shutdown()
        hvd.init()
        with self.assertRaises(ValueError):
            hvd.allreduce(torch.ones(1), process_set=ps)

    # ------------------------------------------------------------ init / shutdown / init

    def test_init_shutdown_init(self):
        hvd.init()
        n = hvd.size()
        for i in range(5):
            x = hvd.allreduce(torch.ones(2) * i, name="cycle", op=hvd.Sum)
            self.assertEqual(x.tolist(), [float(i * n)] * 2)
            if i % 2:
                hvd.allreduce_async(torch.ones(1), name="cycle.left")  # never synchronized
            # every rank past its submissions before any leaves: a rank's
            # shutdown() ends the session for the others (as in Horovod)
            hvd.barrier()
            hvd.shutdown()
            self.assertFalse(hvd.is_initialized())
            hvd.init()
            self.assertEqual(hvd.size(), n)

    def test_shutdown_on_one_rank_while_others_run(self):
        hvd.init()
        self._need_two()
        n, leaver = hvd.size(), _pick("leaver")
        hvd.allreduce(torch.ones(1), name="warm")
        hvd.barrier()
        if hvd.rank() == leaver:
            hvd.shutdown()
        else:
            with self.assertRaises(hvd.HorovodInternalError) as cm:
                hvd.allreduce(torch.ones(1), name="warm")
            self.assertIn("rank %d" % leaver, str(cm.exception))
            hvd.shutdown()
        hvd.init()
        self.assertEqual(hvd.size(), n)
        x = hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
        self.assertEqual(x.item(), float(n))

    def test_objects_and_optimizer_state(self):
        hvd.init()
        r = hvd.rank()
        torch.manual_seed(r)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for p in model.parameters():
            hvd.broadcast(p.grad, root_rank=0)  # zeros after it, as Horovod's
        self.assertEqual(hvd.broadcast_object({"r": r}, root_rank=0), {"r": 0})
        self.assertEqual(hvd.allgather_object(r), list(range(hvd.size())))
