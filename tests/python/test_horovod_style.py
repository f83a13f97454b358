"""Horovod-style test modules (tests/python/horovod_style/), run the way
Horovod's own suites run: the same unittest module on every rank of a
job, each test calling hvd.init() and its tearDown hvd.barrier() and
hvd.shutdown() - so every process initializes and shuts down once per
test, and hundreds of times in the cycle test."""
import os
import subprocess
import sys

import pytest

from conftest import PYDIR

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_style")
SUITE = os.path.join(HERE, "suite.py")


def _check(job, np_):
    summaries = [l for l in job.out.splitlines() if "SUITE rank" in l]
    assert job.rc == 0 and len(summaries) == np_, job
    for line in summaries:
        assert "failures 0, errors 0" in line, job


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_lifecycle_module(run_job, np_):
    _check(run_job(np_, SUITE, args=["test_lifecycle.py"], timeout=280), np_)


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("module", ["test_autograd.py", "test_sparse.py",
                                    "test_sync_batch_norm.py"])
def test_module(run_job, module, np_):
    _check(run_job(np_, SUITE, args=[module], timeout=200), np_)


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_adasum_module(run_job, np_):
    """np 3: Horovod's NotImplementedError for a size that is not a power of 2."""
    _check(run_job(np_, SUITE, args=["test_adasum.py"], timeout=200), np_)


def test_lifecycle_module_started_alone(tmp_path):
    """A script started without kolo run: one rank, every test the same."""
    env = dict(os.environ, PYTHONPATH=PYDIR)
    for k in [k for k in env if k.startswith("KOLO_") and k not in ("KOLO_LIBRARY",)]:
        del env[k]
    p = subprocess.run([sys.executable, SUITE, "test_lifecycle.py"], cwd=str(tmp_path), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=120)
    assert p.returncode == 0 and "SUITE rank 0: ran" in p.stdout, p.stdout
