"""Horovod-style modules (see test_horovod_style.py): process sets (shared
memory and TCP) and Adasum (np 3: Horovod's error for a size that is not
a power of 2)."""
import pytest

from conftest import run_horovod_style


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_process_sets_module(np_):
    run_horovod_style("test_process_sets.py", np_)


def test_process_sets_module_over_tcp():
    run_horovod_style("test_process_sets.py", 4, env={"KOLO_DISABLE_SHM": "1"})


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_adasum_module(np_):
    run_horovod_style("test_adasum.py", np_)
