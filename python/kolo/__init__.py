"""kolo: elastic data-parallel training, framework-free API on numpy arrays.

    import numpy as np, kolo
    kolo.init()
    total = kolo.allreduce(np.ones(4, np.float32), op=kolo.Sum)

Run the program with `kolo run -np N -- python3 prog.py`; started alone it
runs as rank 0 of 1. PyTorch users import `kolo.torch` (Horovod's
`horovod.torch` API) instead.
"""
import numpy as _np

from . import _engine
from . import _report
from . import process_sets as _process_sets
from .process_sets import (ProcessSet, global_process_set, add_process_set,  # noqa: F401
                           remove_process_set)
from ._engine import Average, Sum, Adasum, Min, Max, Product  # noqa: F401
from . import exceptions as _exceptions
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, KoloError  # noqa: F401
from ._run import run  # noqa: F401  (kolo.run(fn, np=N): horovod.run's)
from . import _stacks

_stacks.register()  # kolo stacks: every thread's stack, written when the agent asks
_exceptions.install_excepthook()  # HorovodInternalError: the user's frames only

__version__ = "0.1.0"

_engine_instance = _engine.Engine()


def _eng():
    return _engine_instance


# ---------------------------------------------------------------- lifecycle and topology

def init(comm=None, process_sets=None):
    """Joins the job this process was started in (no-op if already done).

    process_sets (Horovod's): a list of ProcessSet (or rank lists) to
    register, the same on every rank, or "dynamic" to allow
    add_process_set()/remove_process_set() later. comm: only None (or
    every rank) is accepted - a job cannot run on part of its ranks.

    After a peer ended this session (its shutdown(), or it left the job:
    operations here failed with "Horovod has been shut down: rank R left
    ..."), init() leaves the dead session and joins a new one, as
    shutdown(); init() would: a test whose tearDown barrier failed that
    way does not take every later test of the module with it (Horovod's
    init() keeps the dead session)."""
    if _eng().initialized():
        if not _eng().ended():
            return
        shutdown()
    _eng().init()
    _report.mark_init()  # issue 6: the first epoch starts now
    if comm is not None and sorted(comm) != list(range(size())):
        raise NotImplementedError("kolo runs the job on every one of its ranks; "
                                  "init(comm=...) with a subset is not supported (use "
                                  "process_sets)")
    _process_sets.setup(process_sets)


def shutdown():
    """Leaves the job; pending operations fail. init() may be called again."""
    _process_sets.teardown()
    _eng().shutdown()


def is_initialized():
    return _eng().initialized()


def rank():
    return _eng().topology()[0]


def size():
    return _eng().topology()[1]


def local_rank():
    return _eng().topology()[2]


def local_size():
    return _eng().topology()[3]


def cross_rank():
    return _eng().topology()[4]


def cross_size():
    return _eng().topology()[5]


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    _, n, _, ls, _, cs = _eng().topology()
    return ls * cs == n


def report_epoch(epoch, samples=None, metrics=None):
    """Reports the END of epoch `epoch` on this rank, for the coordinator's
    per-epoch wall time and samples/s (REST /api/v1/jobs/{id}/epochs, and
    one line per epoch in `kolo run`). Call it once per epoch on every
    rank; the epoch's start is the previous call's end (or init()).
    samples: what this rank processed; metrics: a dict such as
    {"loss": 0.23}. Never blocks; a no-op without a coordinator. See
    kolo/_report.py for the exact semantics."""
    _report.report_epoch(epoch, samples, metrics)


def poll(handle):
    """True once the asynchronous operation `handle` finished."""
    eng = _engine.owner(handle)
    if eng is None:
        raise ValueError("unknown handle %r" % (handle,))
    return eng.poll(handle)


def synchronize(handle):
    """Waits for `handle` and returns its output (None for an unknown
    handle, as Horovod)."""
    eng = _engine.owner(handle)
    return None if eng is None else eng.synchronize(handle)


# ---------------------------------------------------------------- numpy collectives

_DTYPES = {
    _np.dtype(_np.uint8): _engine.UINT8,
    _np.dtype(_np.int8): _engine.INT8,
    _np.dtype(_np.int16): _engine.INT16,
    _np.dtype(_np.int32): _engine.INT32,
    _np.dtype(_np.int64): _engine.INT64,
    _np.dtype(_np.float16): _engine.FLOAT16,
    _np.dtype(_np.float32): _engine.FLOAT32,
    _np.dtype(_np.float64): _engine.FLOAT64,
}


def _array(a):
    a = _np.asarray(a)
    code = _DTYPES.get(a.dtype)
    if code is None:
        raise ValueError("Array type %s is not supported." % a.dtype)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    return a, code


def _addr(a):
    return a.ctypes.data if a.size else 0


def allreduce_async(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0,
                    average=None):
    op = _engine.resolve_op(op, average)
    a, code = _array(array)
    out = _np.empty_like(a)
    r = _engine.Req(_engine.ALLREDUCE, name, _addr(a), _addr(out), code, a.shape,
                    _engine.kolo_op(op), prescale_factor, postscale_factor)
    return _eng().submit([r], (a, out), lambda res: out)


def allreduce(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None):
    """The reduction (default: average) of `array` over all ranks, as a new array."""
    return synchronize(allreduce_async(array, op, name, prescale_factor, postscale_factor, average))


def grouped_allreduce_async(arrays, op=None, name=None, prescale_factor=1.0,
                            postscale_factor=1.0, average=None):
    op = _engine.resolve_op(op, average)
    ins, outs, reqs = [], [], []
    n = len(arrays)
    for i, x in enumerate(arrays):
        a, code = _array(x)
        out = _np.empty_like(a)
        nm = _engine.group_name(name, i, n)
        reqs.append(_engine.Req(_engine.ALLREDUCE, nm, _addr(a), _addr(out), code, a.shape,
                                _engine.kolo_op(op), prescale_factor, postscale_factor))
        ins.append(a)
        outs.append(out)
    return _eng().submit(reqs, (ins, outs), lambda res: outs)


def grouped_allreduce(arrays, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0,
                      average=None):
    """Reduces several arrays as one negotiated, fused operation."""
    return synchronize(grouped_allreduce_async(arrays, op, name, prescale_factor,
                                               postscale_factor, average))


def _rows_output(a, res):
    out = _np.empty((res.rows,) + a.shape[1:], dtype=a.dtype)
    if out.size:
        res.copy_to(out.ctypes.data)
    return out


def allgather_async(array, name=None):
    a, code = _array(array)
    if a.ndim == 0:
        a = a.reshape(1)
    r = _engine.Req(_engine.ALLGATHER, name, _addr(a), 0, code, a.shape)
    return _eng().submit([r], a, lambda res: _rows_output(a, res[0]))


def allgather(array, name=None):
    """Every rank's array concatenated on the first dimension (which may differ)."""
    return synchronize(allgather_async(array, name))


def broadcast_async(array, root_rank, name=None):
    a, code = _array(array)
    out = a.copy()
    r = _engine.Req(_engine.BROADCAST, name, _addr(out), _addr(out), code, a.shape,
                    root=root_rank)
    return _eng().submit([r], out, lambda res: out)


def broadcast(array, root_rank, name=None):
    """root_rank's array, on every rank."""
    return synchronize(broadcast_async(array, root_rank, name))


def alltoall_async(array, splits=None, name=None):
    a, code = _array(array)
    sp = None if splits is None else [int(s) for s in _np.asarray(splits).reshape(-1)]
    r = _engine.Req(_engine.ALLTOALL, name, _addr(a), 0, code, a.shape, splits=sp)

    def finish(res):
        out = _rows_output(a, res[0])
        if splits is None:
            return out
        return out, _np.asarray(res[0].recv_splits, dtype=_np.int32)

    return _eng().submit([r], a, finish)


def alltoall(array, splits=None, name=None):
    """Sends splits[i] rows (default: an even share) to rank i; returns the
    rows received (and, when splits is given, how many came from each rank)."""
    return synchronize(alltoall_async(array, splits, name))


def reducescatter_async(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    if op not in (Average, Sum):
        raise ValueError("Reducescatter currently only supports AVERAGE and SUM.")
    a, code = _array(array)
    if a.ndim == 0:
        raise ValueError("reducescatter needs an array of rank >= 1")
    rows = _engine.scatter_rows(a.shape[0], size(), rank())
    out = _np.empty((rows,) + a.shape[1:], dtype=a.dtype)
    r = _engine.Req(_engine.REDUCESCATTER, name, _addr(a), _addr(out), code, a.shape,
                    _engine.kolo_op(op), prescale_factor, postscale_factor)
    return _eng().submit([r], (a, out), lambda res: out)


def reducescatter(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces over ranks and leaves each rank its share of the first dimension
    (the first rows % size ranks get one row more)."""
    return synchronize(reducescatter_async(array, op, name, prescale_factor, postscale_factor))


def barrier():
    """Returns once every rank called barrier()."""
    synchronize(_eng().submit([_engine.Req(_engine.BARRIER)], None, lambda res: None))


def join():
    """This rank ran out of data: it contributes zeros to the others'
    allreduces until every rank joined. Returns the last rank to join."""
    return synchronize(_eng().submit([_engine.Req(_engine.JOIN)], None,
                                     lambda res: int(res[0].value)))
