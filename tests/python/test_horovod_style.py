"""Horovod-style test modules (tests/python/horovod_style/), run the way
Horovod's own suites run: the same unittest module on every rank of a
job, each test calling hvd.init() and its tearDown hvd.barrier() and
hvd.shutdown() - so every process initializes and shuts down once per
test, and hundreds of times in the cycle test. This file: the lifecycle;
test_horovod_style_ops.py and test_horovod_style_sets.py the rest."""
import os
import subprocess
import sys

import pytest

from conftest import HOROVOD_SUITE, PYDIR, run_horovod_style


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_lifecycle_module(np_):
    run_horovod_style("test_lifecycle.py", np_, timeout=280)


def test_lifecycle_module_started_alone(tmp_path):
    """A script started without kolo run: one rank, every test the same."""
    env = dict(os.environ, PYTHONPATH=PYDIR)
    for k in [k for k in env if k.startswith("KOLO_") and k not in ("KOLO_LIBRARY",)]:
        del env[k]
    p = subprocess.run([sys.executable, HOROVOD_SUITE, "test_lifecycle.py"], cwd=str(tmp_path),
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=120)
    assert p.returncode == 0 and "SUITE rank 0: ran" in p.stdout, p.stdout
