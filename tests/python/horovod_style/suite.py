"""Runs one Horovod-style unittest module on every rank of a job, as
Horovod's own suites run (`horovodrun -np 2 pytest test_torch.py`): each
test method calls hvd.init() itself and tearDown calls hvd.barrier() and
hvd.shutdown(), so one process initializes and shuts down once per test.

    kolo run -np 2 -- python3 suite.py test_lifecycle.py [TestClass.test_name ...]

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


def main(argv):
    path = os.path.join(HERE, argv[0]) if not os.path.isabs(argv[0]) else argv[0]
    sys.path.insert(0, HERE)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    loader = unittest.TestLoader()
    if len(argv) > 1:
        suite = loader.loadTestsFromNames(argv[1:], mod)
    else:
        suite = loader.loadTestsFromModule(mod)
    res = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
    rank = os.environ.get("KOLO_RANK", os.environ.get("HOROVOD_RANK", "0"))
    print("SUITE rank %s: ran %d, failures %d, errors %d, skipped %d"
          % (rank, res.testsRun, len(res.failures), len(res.errors), len(res.skipped)),
          flush=True)
    return 0 if res.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
