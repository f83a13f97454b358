"""Loading libkolo and describing its C API to ctypes.

The library is found, in this order: $KOLO_LIBRARY; libkolo.so next to this
package or in the lib/ directory it was installed under (`make install`);
the build tree this package sits in
(<repo>/build/lib, or $KOLO_BUILD_DIR/lib); the system's library path.
"""
import ctypes
import ctypes.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("KOLO_LIBRARY")
    if env:
        return [env]
    repo = os.path.dirname(os.path.dirname(_HERE))
    paths = [os.path.join(_HERE, "libkolo.so"),
             # installed: <prefix>/lib/python3.X/dist-packages/kolo -> <prefix>/lib
             os.path.normpath(os.path.join(_HERE, "..", "..", "..", "libkolo.so"))]
    build = os.environ.get("KOLO_BUILD_DIR")
    if build:
        paths.append(os.path.join(build, "lib", "libkolo.so"))
    paths.append(os.path.join(repo, "build", "lib", "libkolo.so"))
    found = ctypes.util.find_library("kolo")
    if found:
        paths.append(found)
    return paths


class Request(ctypes.Structure):
    """struct kolo_request (include/kolo.h)."""

    _fields_ = [
        ("coll", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("sendbuf", ctypes.c_void_p),
        ("recvbuf", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("op", ctypes.c_int),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("root", ctypes.c_int),
        ("splits", ctypes.POINTER(ctypes.c_int32)),
        ("nsplits", ctypes.c_int),
        ("device", ctypes.c_int),
    ]


def check_layout(lib):
    """Request must be libkolo's struct kolo_request, field by field: a
    package and a library of different versions would otherwise pass
    garbage to every collective."""
    bad = []
    if ctypes.sizeof(Request) != lib.kolo_request_size():
        bad.append("size %d, the library's %d" % (ctypes.sizeof(Request), lib.kolo_request_size()))
    for name, _ in Request._fields_:
        theirs = lib.kolo_request_offset(name.encode())
        if getattr(Request, name).offset != theirs:
            bad.append("%s at %d, the library's at %d" % (name, getattr(Request, name).offset, theirs))
    if bad:
        raise ImportError("built for another version of this package (struct kolo_request: "
                          "%s); install matching versions or set KOLO_LIBRARY" % "; ".join(bad))


def _declare(lib):
    c_int, c_void_p, c_char_p = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    ctx = c_void_p
    sig = {
        "kolo_init": (c_int, [ctypes.POINTER(c_void_p), c_void_p]),
        "kolo_fini": (c_int, [ctx]),
        "kolo_abort": (c_int, [ctx, c_char_p]),
        "kolo_rank": (c_int, [ctx]),
        "kolo_size": (c_int, [ctx]),
        "kolo_local_rank": (c_int, [ctx]),
        "kolo_local_size": (c_int, [ctx]),
        "kolo_cross_rank": (c_int, [ctx]),
        "kolo_cross_size": (c_int, [ctx]),
        "kolo_generation": (ctypes.c_uint64, [ctx]),
        "kolo_process_set_init": (c_int, [ctx, c_int, ctypes.POINTER(c_int), c_int,
                                          ctypes.POINTER(ctx)]),
        "kolo_process_set_id": (c_int, [ctx]),
        "kolo_solo": (c_int, [ctx]),
        "kolo_timeline": (c_int, [ctx, c_char_p]),
        "kolo_snapshot_cancel": (c_int, [ctx]),
        "kolo_hosts_updated": (c_int, [ctx, ctypes.POINTER(ctypes.c_uint64),
                                       ctypes.POINTER(c_int)]),
        "kolo_last_error": (c_char_p, [ctx]),
        "kolo_errname": (c_char_p, [c_int]),
        "kolo_strerror": (c_char_p, [c_int]),
        "kolo_request_size": (ctypes.c_size_t, []),
        "kolo_request_offset": (ctypes.c_long, [c_char_p]),
        "kolo_dtype_size": (ctypes.c_size_t, [c_int]),
        "kolo_dtype_name": (c_char_p, [c_int]),
        "kolo_op_name": (c_char_p, [c_int]),
        "kolo_coll_name": (c_char_p, [c_int]),
        "kolo_submit": (c_int, [ctx, ctypes.POINTER(Request), c_int, ctypes.POINTER(ctypes.c_int64)]),
        "kolo_poll": (c_int, [ctx, ctypes.c_int64, ctypes.POINTER(c_int)]),
        "kolo_wait": (c_int, [ctx, ctypes.c_int64, c_int]),
        "kolo_result": (c_int, [ctx, ctypes.c_int64, ctypes.POINTER(c_void_p),
                                ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int64),
                                ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)),
                                ctypes.POINTER(ctypes.c_int64)]),
        "kolo_release": (c_int, [ctx, ctypes.c_int64]),
        # issue 6: epoch and step reports (python/kolo/_report.py)
        "kolo_report_epoch": (c_int, [ctx, ctypes.c_int64, c_int, ctypes.c_int64, c_char_p]),
        "kolo_report_epoch_span": (c_int, [ctx, ctypes.c_int64, ctypes.c_uint64,
                                           ctypes.c_uint64, ctypes.c_int64, c_char_p]),
        "kolo_report_step": (c_int, [ctx, ctypes.c_double]),
        "kolo_report_dropped": (ctypes.c_uint64, [ctx]),
        # issue 32: how a rank came back from a reset (kolo.torch.elastic.run)
        "kolo_report_recovery": (c_int, [ctx, ctypes.c_uint32, ctypes.c_uint32,
                                         ctypes.c_uint32]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


_lib = None
_lib_path = None


def load():
    """Returns the loaded libkolo (ctypes.CDLL; calls release the GIL)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        try:
            declared = _declare(lib)
            check_layout(declared)
        except (AttributeError, ImportError) as e:  # another version's library
            tried.append("%s (%s)" % (path, e))
            continue
        _lib = declared
        _lib_path = path
        return _lib
    raise ImportError("kolo: cannot load libkolo.so; build it (scripts/build.sh) or set "
                      "KOLO_LIBRARY=/path/to/libkolo.so. Tried: " + "; ".join(tried))


def path():
    """The file libkolo was loaded from (None before the first load)."""
    return _lib_path
