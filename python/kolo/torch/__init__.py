"""kolo.torch: Horovod's `horovod.torch` API on kolo.

    import kolo.torch as hvd      # instead of: import horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Run with `kolo run -np 4 -- python3 train.py` (horovodrun's flags work).
docs/python.md lists every function and its status.
"""
import kolo as _kolo
from kolo import (init, shutdown, is_initialized, size, rank, local_size, local_rank,  # noqa
                  cross_size, cross_rank, is_homogeneous)
from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from kolo import report_epoch  # noqa: F401  (issue 6)

from .compression import Compression  # noqa: F401
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,  # noqa
                        broadcast_parameters)
from .mpi_ops import (Average, Sum, Adasum, Min, Max, Product,  # noqa: F401
                      ProcessSet, global_process_set, add_process_set, remove_process_set,
                      allreduce, allreduce_, allreduce_async, allreduce_async_,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                      grouped_allreduce_async_,
                      allgather, allgather_async, grouped_allgather, grouped_allgather_async,
                      broadcast, broadcast_, broadcast_async, broadcast_async_,
                      alltoall, alltoall_async,
                      reducescatter, reducescatter_async, grouped_reducescatter,
                      grouped_reducescatter_async,
                      poll, synchronize, join, barrier, sparse_allreduce_async,
                      mpi_built, mpi_enabled, mpi_threads_supported, gloo_built, gloo_enabled,
                      nccl_built, cuda_built, rocm_built, ddl_built, ccl_built, sycl_built,
                      mlsl_built, start_timeline, stop_timeline)
from .optimizer import DistributedOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401

__version__ = _kolo.__version__


# ---------------------------------------------------------------- horovod.common.util names
# that horovod.torch re-exports

def check_extension(ext_name=None, ext_env_var=None, pkg_path=None, *args):
    """Horovod raises ImportError when its framework extension was not
    built; kolo.torch has no extension to check (libkolo is loaded on first
    use and reports its own errors)."""
    return None


def gpu_available(ext_base_name=None, verbose=False):
    """True when CUDA tensors can be reduced here: a GPU is visible to
    torch and libkolo has its GPU backend."""
    import torch
    return bool(torch.cuda.is_available() and cuda_built())


def split_list(items, n):
    """`items` cut into n consecutive parts whose lengths differ by at most
    one, the longer ones first (how DistributedOptimizer's `groups=n` is
    formed)."""
    q, extra = divmod(len(items), n)
    parts, at = [], 0
    for i in range(n):
        k = q + (1 if i < extra else 0)
        parts.append(items[at:at + k])
        at += k
    return parts


from . import elastic  # noqa: E402,F401
