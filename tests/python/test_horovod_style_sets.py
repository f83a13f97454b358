"""Horovod-style modules (see test_horovod_style.py): process sets (shared
memory and TCP) and Adasum (np 3: Horovod's error for a size that is not
a power of 2). Both modules run in one job per size (one interpreter
start and torch import per rank for the two); Adasum first, since the
process sets module turns on HOROVOD_DYNAMIC_PROCESS_SETS at its import."""
import pytest

from conftest import run_horovod_style

MODULES = ["test_adasum.py", "test_process_sets.py"]


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_adasum_and_process_sets_modules(np_):
    job = run_horovod_style(MODULES, np_)
    # every module's tests ran on every rank, not only the first module's
    for module in MODULES:
        assert (job.out + job.err).count("(%s." % module[:-3]) >= np_, (module, job)


def test_process_sets_module_over_tcp():
    run_horovod_style("test_process_sets.py", 4, env={"KOLO_DISABLE_SHM": "1"})
