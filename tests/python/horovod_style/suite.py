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

Every test has a deadline (HvdTestCase.TIMEOUT seconds, SIGALRM): a hang
fails that test on that rank instead of stalling the run. The last line
is "SUITE rank R: ran N, failures F, errors E, skipped S"; the exit code
is 0 only when nothing failed.
"""
import importlib.util
import os
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


def main(argv):
    sys.path.insert(0, HERE)
    loader = unittest.TestLoader()
    groups = []  # [module file, test names...] per module on the command line
    for arg in argv:
        if arg.endswith(".py") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    ran = failures = errors = skipped = 0
    for name, *tests in groups:
        mod = load_module(name)
        if tests:
            suite = loader.loadTestsFromNames(tests, mod)
        else:
            suite = loader.loadTestsFromModule(mod)
        res = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
        ran += res.testsRun
        failures += len(res.failures)
        errors += len(res.errors)
        skipped += len(res.skipped)
    rank = os.environ.get("KOLO_RANK", os.environ.get("HOROVOD_RANK", "0"))
    print("SUITE rank %s: ran %d, failures %d, errors %d, skipped %d"
          % (rank, ran, failures, errors, skipped), flush=True)
    return 0 if failures == 0 and errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
