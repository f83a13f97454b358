"""Horovod-style modules (see test_horovod_style.py): autograd exactly as
Horovod, sparse gradients, SyncBatchNorm."""
import pytest

from conftest import run_horovod_style


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("module", ["test_autograd.py", "test_sparse.py",
                                    "test_sync_batch_norm.py"])
def test_module(module, np_):
    run_horovod_style(module, np_)
