"""Horovod-style modules (see test_horovod_style.py): autograd exactly as
Horovod, sparse gradients, SyncBatchNorm. The three run in one job per
size (one interpreter start and torch import per rank for all three)."""
import pytest

from conftest import run_horovod_style

MODULES = ["test_autograd.py", "test_sparse.py", "test_sync_batch_norm.py"]


@pytest.mark.parametrize("np_", [2, 4])
def test_modules(np_):
    job = run_horovod_style(MODULES, np_)
    # every module's tests ran on every rank, not only the first module's
    for module in MODULES:
        assert (job.out + job.err).count("(%s." % module[:-3]) >= np_, (module, job)
