"""The engine under every frontend (kolo, kolo.torch).

One libkolo context per process, created by init() from the environment
that `kolo run` (or a kolo agent) gives each worker. A program started
without kolo runs alone, as rank 0 of 1, as Horovod does: libkolo's
one-rank context (kolo_solo) runs its collectives, through the same calls
as a job's.

Frontends describe an operation as a list of Req (raw addresses, a dtype
code, a shape) plus a `finish(results)` callback that builds the output
once the operation completed; the engine hands back a Horovod-style integer
handle for poll() and synchronize().
"""
import atexit
import contextlib
import ctypes
import itertools
import os
import threading
import warnings

from . import _lib
from .exceptions import HorovodInternalError

# the vocabulary (include/kolo/abi.h): collective kinds (ALLREDUCE, ...),
# dtypes (UINT8 ... FLOAT64, DTYPE_SIZE, FLOATING), kolo's reductions
# (K_SUM, ...) and error codes (E_INVAL, ...)
from ._abi import *  # noqa: F401,F403 (bound from tables: see _abi)

# Horovod's reduce-op values (horovod/common/basics: Average=0, Sum=1, ...)
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_KOLO_OP = {Average: K_AVERAGE, Sum: K_SUM, Min: K_MIN, Max: K_MAX, Product: K_PRODUCT}

WAIT_SLICE_MS = 200  # waits are sliced so that Ctrl-C reaches Python


def resolve_op(op, average, default=Average, adasum=False):
    """Horovod's reading of (op, average): `average` is the deprecated form.
    adasum: the frontend implements op=Adasum (kolo.torch's allreduces)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return default
    if op == Adasum and adasum:
        return op
    if op == Adasum:
        raise NotImplementedError("kolo implements Adasum for kolo.torch's allreduce only; use "
                                  "op=Average or op=Sum")
    if op not in _KOLO_OP:
        raise ValueError("Unknown reduction op %r: use Average, Sum, Min, Max or Product" % (op,))
    return op


def kolo_op(op):
    return _KOLO_OP[op]


def group_name(name, i, n):
    """Horovod's name of member i of a group of n: "<name>_<i+1>of<n>"."""
    return "%s_%dof%d" % (name, i + 1, n) if name else None


def scatter_rows(rows, n, r):
    """Rank r's share of `rows` split over n ranks (the first rows % n get one more)."""
    return rows // n + (1 if r < rows % n else 0)


class Req:
    """One collective operation, described by addresses (see kolo_request)."""

    __slots__ = ("coll", "name", "send", "recv", "dtype", "shape", "op", "prescale",
                 "postscale", "root", "splits", "device", "stream")

    def __init__(self, coll, name=None, send=0, recv=0, dtype=UINT8, shape=(), op=K_SUM,
                 prescale=1.0, postscale=1.0, root=0, splits=None, device=-1, stream=0):
        self.coll = coll
        self.name = name
        self.send = send
        self.recv = recv
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        self.op = op
        self.prescale = float(prescale)
        self.postscale = float(postscale)
        self.root = int(root)
        self.splits = None if splits is None else [int(s) for s in splits]
        self.device = device
        self.stream = stream  # GPU requests: the cudaStream_t (an int) the tensor was made on


class Result:
    """The output of one finished request: rows of the first dimension,
    received splits (alltoall), value (join) and the bytes, copied out with
    copy_to(address) while the engine still holds them."""

    __slots__ = ("rows", "recv_splits", "value", "nbytes", "_ptr", "_copy")

    def __init__(self, rows=0, recv_splits=None, value=0, nbytes=0, ptr=None, copy=None):
        self.rows = rows
        self.recv_splits = recv_splits
        self.value = value
        self.nbytes = nbytes
        self._ptr = ptr
        self._copy = copy  # GPU results: copies device memory (kolo_result_copy)

    def copy_to(self, address):
        if not self.nbytes:
            return
        if self._copy is not None:
            self._copy(address)
        else:
            ctypes.memmove(address, self._ptr, self.nbytes)


class _Pending:
    __slots__ = ("handles", "reqs", "keep", "finish", "output", "error", "done")

    def __init__(self, handles, reqs, keep, finish):
        self.handles = handles
        self.reqs = reqs
        self.keep = keep
        self.finish = finish
        self.output = None
        self.error = None
        self.done = False


# Handles are unique across engines (the job's and its process sets'), so
# poll() and synchronize() find the engine that owns one.
_handles_lock = threading.Lock()
_handle_owner = {}
_handle_counter = itertools.count(1)


def _new_handle(engine):
    with _handles_lock:
        h = next(_handle_counter)
        _handle_owner[h] = engine
        return h


def owner(handle):
    """The engine a handle belongs to, or None."""
    with _handles_lock:
        return _handle_owner.get(handle)


def live_handles():
    """Every handle not synchronized yet, of every engine (in order)."""
    with _handles_lock:
        return sorted(_handle_owner)


def _forget_handles(engine, handles):
    with _handles_lock:
        for h in handles:
            if _handle_owner.get(h) is engine:
                del _handle_owner[h]


def not_initialized():
    return ValueError("Horovod has not been initialized; use hvd.init().")


class Engine:
    def __init__(self):
        self._lock = threading.RLock()
        self._lib = None
        self._ctx = None
        self._solo = False
        self._pending = {}
        self._topo = None
        self._ended = False   # a peer ended this session (KOLO_ESHUTDOWN seen)
        self._atexit = False
        self._borrowers = 0   # threads inside a call that uses the context
        self._idle = threading.Condition(self._lock)

    # ------------------------------------------------------------ lifecycle

    def initialized(self):
        return self._topo is not None

    def ended(self):
        """True once an operation of this session failed because a peer
        ended it (it called shutdown() or left the job): init() then
        starts a new session instead of keeping this one."""
        return self._topo is not None and self._ended

    def init(self):
        """Joins the job this process was started in; started alone (no
        KOLO_COORDINATOR), libkolo makes it rank 0 of 1."""
        with self._lock:
            if self._topo is not None:
                return
            lib = _lib.load()
            ctx = ctypes.c_void_p()
            rc = lib.kolo_init(ctypes.byref(ctx), None)
            if rc:
                why = lib.kolo_last_error(None).decode(errors="replace")
                why = why or lib.kolo_strerror(rc).decode()
                if rc == E_INVAL and not os.environ.get("KOLO_COORDINATOR"):
                    # started alone, its environment asks for what cannot be
                    # (a size above 1, a variable that does not parse)
                    raise ValueError("kolo: %s" % why)
                raise HorovodInternalError("kolo: init failed: %s (%s)"
                                           % (why, lib.kolo_errname(rc).decode()))
            self._adopt(lib, ctx)
            if not self._atexit:
                atexit.register(self.shutdown)
                self._atexit = True

    def _adopt(self, lib, ctx):
        """Takes libkolo context ctx as this engine's (lock held)."""
        self._lib, self._ctx, self._solo = lib, ctx, lib.kolo_solo(ctx) == 1
        self._ended = False
        self._topo = (lib.kolo_rank(ctx), lib.kolo_size(ctx), lib.kolo_local_rank(ctx),
                      lib.kolo_local_size(ctx), lib.kolo_cross_rank(ctx), lib.kolo_cross_size(ctx))
        self._pending = {}

    def init_set(self, parent, set_id, ranks):
        """Joins process set set_id (ranks of parent's job) as an engine of
        its own: its own libkolo context, negotiation and data plane. False
        when this rank is not a member (nothing to join)."""
        with self._lock:
            lib = parent._lib
            arr = (ctypes.c_int * len(ranks))(*ranks)
            ctx = ctypes.c_void_p()
            rc = lib.kolo_process_set_init(parent._ctx, int(set_id), arr, len(ranks),
                                           ctypes.byref(ctx))
            if rc:
                raise HorovodInternalError(
                    "kolo: cannot join process set %d %s: %s (%s)"
                    % (set_id, list(ranks), lib.kolo_strerror(rc).decode(),
                       lib.kolo_errname(rc).decode()))
            if not ctx.value:
                return False
            self._adopt(lib, ctx)
            return True

    def shutdown(self):
        with self._lock:
            if self._topo is None:
                return
            ctx, lib = self._ctx, self._lib
            self._ctx = None
            self._topo = None
            _forget_handles(self, list(self._pending))
            # The operations never synchronized keep their tensors until
            # kolo_fini returned: until then libkolo may still run one
            # (its response arrived) into their memory.
            unsynchronized = self._pending
            self._pending = {}
        if ctx is not None:
            # Other threads (a commit being shipped) may be inside a call
            # on ctx: end theirs, and let none start, before freeing it.
            lib.kolo_snapshot_cancel(ctx)
            with self._lock:
                self._idle.wait_for(lambda: self._borrowers == 0, 60.0)
            lib.kolo_fini(ctx)
        del unsynchronized

    @contextlib.contextmanager
    def borrow(self):
        """(lib, ctx) for a call from another thread; shutdown() waits for
        the call to end (after cancelling it) before it frees ctx."""
        with self._lock:
            if self._topo is None:
                raise not_initialized()
            self._borrowers += 1
            lib, ctx = self._lib, self._ctx
        try:
            yield lib, ctx
        finally:
            with self._lock:
                self._borrowers -= 1
                self._idle.notify_all()

    def topology(self):
        t = self._topo
        if t is None:
            raise not_initialized()
        return t

    def solo(self):
        """True for a process started alone: libkolo's one-rank context,
        without a coordinator (no timeline, snapshots or reports)."""
        return self._solo

    def generation(self):
        """The job generation this process joined (0 when solo)."""
        ctx = self._ctx
        return 0 if ctx is None else int(self._lib.kolo_generation(ctx))

    def hosts_updated(self):
        """(stamp_ms, kind) of the membership update the coordinator
        announced and this generation has not acted on; (0, 0) if none."""
        ctx = self._ctx
        if ctx is None:
            return 0, 0
        stamp, kind = ctypes.c_uint64(), ctypes.c_int()
        self._lib.kolo_hosts_updated(ctx, ctypes.byref(stamp), ctypes.byref(kind))
        return int(stamp.value), int(kind.value)

    # ------------------------------------------------------------ operations

    def submit(self, reqs, keep, finish):
        """Enqueues reqs as one operation (a group when several) and returns
        its handle; `finish(results)` builds the output when it completes."""
        with self._lock:
            if self._topo is None:
                raise not_initialized()
            p = _Pending(self._submit_native(reqs), reqs, keep, finish)
            h = _new_handle(self)
            self._pending[h] = p
            return h

    def kept(self, handle):
        """What the op behind `handle` keeps alive until synchronize() (its
        tensors), or None for a handle this engine does not have."""
        with self._lock:
            p = self._pending.get(handle)
        if p is None:
            return None
        keep = p.keep if p.keep is not None else ()
        return keep if isinstance(keep, tuple) else (keep,)

    def _submit_native(self, reqs):
        n = len(reqs)
        arr = (_lib.Request * n)()
        hold = []
        for i, r in enumerate(reqs):
            c = arr[i]
            c.coll = r.coll
            c.name = r.name.encode() if r.name else None
            c.sendbuf = r.send or None
            c.recvbuf = r.recv or None
            c.dtype = r.dtype
            c.ndim = len(r.shape)
            shape = (ctypes.c_int64 * max(1, len(r.shape)))(*r.shape)
            hold.append(shape)
            c.shape = shape
            c.op = r.op
            c.prescale = r.prescale
            c.postscale = r.postscale
            c.root = r.root
            if r.splits is not None:
                sp = (ctypes.c_int32 * max(1, len(r.splits)))(*r.splits)
                hold.append(sp)
                c.splits = sp
                c.nsplits = len(r.splits)
            c.device = r.device
        out = (ctypes.c_int64 * n)()
        gpu = [r for r in reqs if r.device >= 0]
        if gpu:
            # GPU tensors: the operation waits (on the GPU) for the stream
            # that produced them.
            rc = _gpu_api(self._lib).kolo_submit_stream(self._ctx, arr, n, gpu[0].stream or None,
                                                       out)
        else:
            rc = self._lib.kolo_submit(self._ctx, arr, n, out)
        if rc:
            msg = self._error_text(rc)
            self._ended = self._ended or rc == E_SHUTDOWN
            if rc in (E_INVAL, E_EXIST, E_NOTSUP):
                raise ValueError(msg)
            raise HorovodInternalError(msg)
        return list(out)

    def _error_text(self, rc):
        detail = self._lib.kolo_last_error(self._ctx) if self._ctx else None
        detail = detail.decode(errors="replace") if detail else ""
        return detail or "%s (%s)" % (self._lib.kolo_strerror(rc).decode(),
                                      self._lib.kolo_errname(rc).decode())

    def poll(self, handle):
        with self._lock:
            p = self._pending.get(handle)
        if p is None:
            raise ValueError("unknown handle %r" % (handle,))
        if p.done:
            return True
        done = ctypes.c_int(0)
        for h in p.handles:
            rc = self._lib.kolo_poll(self._ctx, h, ctypes.byref(done))
            if rc == 0 and not done.value:
                return False
        return True

    def synchronize(self, handle):
        """Waits for the operation and returns its output (None for an
        unknown handle, as Horovod); raises HorovodInternalError if it
        failed."""
        with self._lock:
            p = self._pending.get(handle)
        if p is None:
            return None
        try:
            if not p.done:
                self._wait_native(p)
        finally:
            with self._lock:
                self._pending.pop(handle, None)
            _forget_handles(self, [handle])
        if p.error is not None:
            raise p.error
        return p.output

    def _wait_native(self, p):
        lib, ctx = self._lib, self._ctx
        first_error = None
        results = []
        for h, r in zip(p.handles, p.reqs):
            while True:
                rc = lib.kolo_wait(ctx, h, WAIT_SLICE_MS)
                if rc != E_TIMEDOUT:
                    break
            if rc:
                self._ended = self._ended or rc == E_SHUTDOWN
                if first_error is None:
                    first_error = self._error_text(rc)
                results.append(None)
                continue
            if r.coll in (ALLGATHER, ALLTOALL, JOIN):
                results.append(self._take_result(h, r))
            else:
                results.append(Result())
        try:
            if first_error is None:
                p.output = p.finish(results)
        finally:
            for h, r, res in zip(p.handles, p.reqs, results):
                if res is not None and r.coll in (ALLGATHER, ALLTOALL, JOIN):
                    lib.kolo_release(ctx, h)
            p.done = True
            p.keep = None
        if first_error is not None:
            p.error = HorovodInternalError(first_error)

    def _take_result(self, h, r):
        data = ctypes.c_void_p()
        nbytes = ctypes.c_size_t()
        rows = ctypes.c_int64()
        splits = ctypes.POINTER(ctypes.c_int32)()
        value = ctypes.c_int64()
        rc = self._lib.kolo_result(self._ctx, h, ctypes.byref(data), ctypes.byref(nbytes),
                                   ctypes.byref(rows), ctypes.byref(splits), ctypes.byref(value))
        if rc:
            raise HorovodInternalError(self._error_text(rc))
        recv = None
        if r.coll == ALLTOALL and splits:
            recv = [splits[i] for i in range(self._topo[1])]
        copy = None
        if r.device >= 0:
            lib, ctx, stream = _gpu_api(self._lib), self._ctx, r.stream or None

            def copy(address):
                rc = lib.kolo_result_copy(ctx, h, address, stream)
                if rc:
                    raise HorovodInternalError(self._error_text(rc))
        return Result(rows.value, recv, value.value, nbytes.value, data.value, copy)


def _gpu_api(lib):
    """libkolo with the GPU section of its API described to ctypes."""
    if getattr(lib, "_kolo_gpu_declared", False):
        return lib
    c_int, c_void_p = ctypes.c_int, ctypes.c_void_p
    sig = {
        "kolo_submit_stream": (c_int, [c_void_p, ctypes.POINTER(_lib.Request), c_int, c_void_p,
                                       ctypes.POINTER(ctypes.c_int64)]),
        "kolo_result_copy": (c_int, [c_void_p, ctypes.c_int64, c_void_p, c_void_p]),
        "kolo_nccl_built": (c_int, []),
        "kolo_cuda_built": (c_int, []),
        "kolo_gpu_count": (c_int, [ctypes.c_char_p, ctypes.c_size_t]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    lib._kolo_gpu_declared = True
    return lib


def gpu_build_info():
    """(NCCL version, CUDA runtime version) libkolo's GPU backend was built
    against, (0, 0) if it was not or libkolo cannot be loaded."""
    try:
        lib = _gpu_api(_lib.load())
    except (ImportError, AttributeError, OSError):
        return 0, 0
    return lib.kolo_nccl_built(), lib.kolo_cuda_built()
