"""Durable elastic-state snapshots, kept by the coordinator.

    from kolo import _snapshot
    sid = _snapshot.put(blob, {"epoch": 3, "batch": 120})   # returns once durable
    latest = _snapshot.get_latest()                          # (id, blob, meta) or None

A snapshot is opaque bytes (the serialized state) plus a JSON-able dict of
metadata. put() returns once the coordinator acknowledged the snapshot,
which it does only after writing it to its database: an acknowledged
snapshot survives a crash of the coordinator. The coordinator keeps the
newest few per job (`kolo coordinator --snapshot-keep`, 3 by default;
KOLO_SNAPSHOT_KEEP in the workers' environment overrides it for a job).

These calls go through libkolo's kolo_snapshot_* functions, which use a
coordinator connection of their own: they are meant to run in a background
thread while training goes on (ctypes releases the GIL during the call).
They retry across coordinator restarts until their timeout. Only the job's
current generation may put; any rank may get. The process must have joined
the job (kolo.init() / hvd.init()), and must not shut kolo down while a
call is starting; a call in flight when it does fails with SnapshotError
(KOLO_ESHUTDOWN).
"""
import contextlib
import ctypes
import json

from . import _lib
from . import _engine as _engine_mod
from ._abi import E_NOTFOUND, E_SHUTDOWN, E_STALE

DEFAULT_PUT_TIMEOUT = 300.0
DEFAULT_GET_TIMEOUT = 120.0


class SnapshotError(RuntimeError):
    """A snapshot call failed; `code` and `errname` are libkolo's error
    (e.g. 12, "KOLO_ESTALE" when this process's generation is no longer
    the job's current one)."""

    def __init__(self, message, code=0, errname=""):
        super().__init__(message)
        self.code = code
        self.errname = errname


def _declare(lib):
    if getattr(lib, "_kolo_snapshot_declared", False):
        return lib
    c_int, c_void_p, c_size_t, c_uint64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    P = ctypes.POINTER
    lib.kolo_snapshot_put.restype = c_int
    lib.kolo_snapshot_put.argtypes = [c_void_p, c_void_p, c_size_t, ctypes.c_char_p, c_int,
                                      P(c_uint64)]
    lib.kolo_snapshot_get.restype = c_int
    lib.kolo_snapshot_get.argtypes = [c_void_p, c_uint64, P(c_void_p), P(c_size_t), P(c_void_p),
                                      P(c_uint64), c_int]
    lib.kolo_snapshot_free.restype = None
    lib.kolo_snapshot_free.argtypes = [c_void_p]
    lib._kolo_snapshot_declared = True
    return lib


def _engine():
    from . import _eng  # the package's engine (kolo/__init__.py)
    return _eng()


def available():
    """True when this process joined a job run by a coordinator (snapshots
    need one); False before init() and for a program started without kolo."""
    eng = _engine()
    return eng.initialized() and not eng.solo() and eng._ctx is not None


@contextlib.contextmanager
def _context():
    """(lib, ctx) for one call; kolo.shutdown() on another thread cancels
    the call and waits for it instead of freeing ctx under it."""
    eng = _engine()
    if not eng.initialized():
        raise _engine_mod.not_initialized()
    if eng.solo():
        raise SnapshotError("kolo: snapshots need a coordinator: start the program with "
                            "`kolo run`", 0, "")
    try:
        with eng.borrow() as (lib, ctx):
            yield _declare(lib), ctx
    except ValueError as e:
        if "initialized" in str(e):
            raise
        raise SnapshotError("kolo: snapshots need a coordinator: start the program with "
                            "`kolo run`", 0, "") from None


def _timeout_ms(timeout):
    if timeout is None:
        return 0  # libkolo's default, 5 minutes
    ms = int(timeout * 1000)
    return max(ms, 1)


def _fail(lib, ctx, rc, what):
    detail = lib.kolo_last_error(ctx)
    detail = detail.decode(errors="replace") if detail else ""
    name = lib.kolo_errname(rc).decode()
    msg = detail or "%s: %s" % (what, lib.kolo_strerror(rc).decode())
    return SnapshotError("%s (%s)" % (msg, name), rc, name)


def _buffer(data):
    """(pointer, length, keepalive) for a bytes-like object, without a copy
    when the object allows it."""
    if isinstance(data, bytes):
        return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p), len(data), data
    mv = memoryview(data)
    if not mv.contiguous:
        b = mv.tobytes()
        return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p), len(b), b
    mv = mv.cast("B")
    if mv.readonly:
        b = mv.tobytes()
        return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p), len(b), b
    arr = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return ctypes.cast(arr, ctypes.c_void_p), mv.nbytes, (arr, mv)


def put(data, meta=None, timeout=DEFAULT_PUT_TIMEOUT):
    """Stores `data` (bytes-like) and `meta` (a dict, JSON-serializable) as
    this job's newest snapshot; returns its id once it is durable. Raises
    SnapshotError on failure (code KOLO_ESTALE: this generation is over;
    KOLO_ETOOBIG: larger than the coordinator accepts; KOLO_ETIMEDOUT: no
    acknowledgement within `timeout` seconds)."""
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise TypeError("snapshot meta must be a dict, not %s" % type(meta).__name__)
    meta_text = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    ptr, n, keep = _buffer(data)
    sid = ctypes.c_uint64(0)
    with _context() as (lib, ctx):
        rc = lib.kolo_snapshot_put(ctx, ptr, n, meta_text, _timeout_ms(timeout), ctypes.byref(sid))
        del keep
        if rc:
            raise _fail(lib, ctx, rc, "snapshot put failed")
    return sid.value


def get(snapshot_id=0, timeout=DEFAULT_GET_TIMEOUT):
    """Reads snapshot `snapshot_id` of this job (0: the latest) and returns
    (id, data bytes, meta dict), or None when there is none (never
    committed, or pruned). Raises SnapshotError on other failures."""
    data = ctypes.c_void_p()
    size = ctypes.c_size_t(0)
    meta = ctypes.c_void_p()
    sid = ctypes.c_uint64(0)
    with _context() as (lib, ctx):
        rc = lib.kolo_snapshot_get(ctx, int(snapshot_id), ctypes.byref(data), ctypes.byref(size),
                                   ctypes.byref(meta), ctypes.byref(sid), _timeout_ms(timeout))
        if rc == E_NOTFOUND:
            return None
        if rc:
            raise _fail(lib, ctx, rc, "snapshot get failed")
    try:
        blob = ctypes.string_at(data.value, size.value) if size.value else b""
        text = ctypes.string_at(meta.value).decode() if meta.value else "{}"
    finally:
        lib.kolo_snapshot_free(data)
        lib.kolo_snapshot_free(meta)
    try:
        meta_obj = json.loads(text) if text else {}
    except ValueError:
        meta_obj = {"_raw": text}
    return sid.value, blob, meta_obj


def get_latest(timeout=DEFAULT_GET_TIMEOUT):
    """The job's latest acknowledged snapshot as (id, data, meta), or None."""
    return get(0, timeout)
