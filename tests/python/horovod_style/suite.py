"""Runs Horovod-style unittest modules on every rank of a job, as
Horovod's own suites run (`horovodrun -np 2 pytest test_torch.py`): each
test method calls hvd.init() itself and tearDown calls hvd.barrier() and
hvd.shutdown(), so one process initializes and shuts down once per test.

    kolo run -np 2 -- python3 suite.py test_lifecycle.py [TestClass.test_name ...]
        [test_sparse.py [TestClass.test_name ...] ...]

Several modules run one after the other in the same processes (one
interpreter start and torch import per rank, not one per module), each
imported just before its tests run (so what a module sets up at import,
such as HOROVOD_DYNAMIC_PROCESS_SETS, is not there for the modules before
it); a test name after a module names a test of that module.

`--seed=S[,S...]` (before the modules) runs each module's tests once per
seed, each time in the order a random.Random(S) shuffle gives (the same
on every rank), back to back in the same processes; STRESS_SEED holds
the seed of the pass that runs (tests may pick ranks from it). Each
pass prints "SUITE rank R seed S: ..." with its own counts, and rank 0
the order ("SUITE order seed S: ...").

Every test has a deadline (HvdTestCase.TIMEOUT seconds, SIGALRM): a hang
fails that test on that rank instead of stalling the run. The last line
is "SUITE rank R: ran N, failures F, errors E, skipped S"; the exit code
is 0 only when nothing failed.
"""
import importlib.util
import os
import random
import signal
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


class TestTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise TestTimeout("the test ran past its deadline")


class HvdTestCase(unittest.TestCase):
    """Base of the modules here: a per-test deadline and Horovod's
    tearDown (barrier, then shutdown, when initialized)."""

    TIMEOUT = 60

    def setUp(self):
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(self.TIMEOUT)

    def tearDown(self):
        import kolo.torch as hvd
        # a deadline of its own: a test that ran out of time left its
        # peers elsewhere, and this barrier must not wait for them forever
        signal.alarm(self.TIMEOUT)
        try:
            if hvd.is_initialized():
                hvd.barrier()
                hvd.shutdown()
        finally:
            signal.alarm(0)


def load_module(name):
    """The unittest module NAME (a file here, or an absolute path)."""
    path = os.path.join(HERE, name) if not os.path.isabs(name) else name
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _PromptResult(unittest.TextTestResult):
    """Prints a failure's traceback when it happens, not at the end: a
    run that is killed later (a hang) still shows what went wrong first."""

    def _now(self, what, test, err):
        self.stream.write("%s NOW: %s\n%s\n" % (what, test.id(), self._exc_info_to_string(err, test)))
        self.stream.flush()

    def addError(self, test, err):
        self._now("ERROR", test, err)
        super().addError(test, err)

    def addFailure(self, test, err):
        self._now("FAIL", test, err)
        super().addFailure(test, err)


def _flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _flatten(t)
        else:
            yield t


def main(argv):
    sys.path.insert(0, HERE)
    seeds = [None]
    if argv and argv[0].startswith("--seed="):
        seeds = [int(s) for s in argv[0][len("--seed="):].split(",")]
        argv = argv[1:]
    loader = unittest.TestLoader()
    groups = []  # [module file, test names...] per module on the command line
    for arg in argv:
        if arg.endswith(".py") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    rank = os.environ.get("KOLO_RANK", os.environ.get("HOROVOD_RANK", "0"))
    ran = failures = errors = skipped = 0
    for seed in seeds:
        counts = [0, 0, 0, 0]
        for name, *tests in groups:
            mod = load_module(name)
            if tests:
                suite = loader.loadTestsFromNames(tests, mod)
            else:
                suite = loader.loadTestsFromModule(mod)
            if seed is not None:
                os.environ["STRESS_SEED"] = str(seed)
                cases = sorted(_flatten(suite), key=lambda t: t.id())
                random.Random(seed).shuffle(cases)
                if rank == "0":
                    print("SUITE order seed %d: %s" % (seed, " ".join(
                        t.id().rsplit(".", 1)[1] for t in cases)), flush=True)
                suite = unittest.TestSuite(cases)
            res = unittest.TextTestRunner(stream=sys.stderr, verbosity=2,
                                          resultclass=_PromptResult).run(suite)
            counts[0] += res.testsRun
            counts[1] += len(res.failures)
            counts[2] += len(res.errors)
            counts[3] += len(res.skipped)
        if seed is not None:
            print("SUITE rank %s seed %d: ran %d, failures %d, errors %d, skipped %d"
                  % ((rank, seed) + tuple(counts)), flush=True)
        ran += counts[0]
        failures += counts[1]
        errors += counts[2]
        skipped += counts[3]
    print("SUITE rank %s: ran %d, failures %d, errors %d, skipped %d"
          % (rank, ran, failures, errors, skipped), flush=True)
    return 0 if failures == 0 and errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
