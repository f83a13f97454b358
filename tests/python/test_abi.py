"""python/kolo/_abi.py against libkolo's own tables (include/kolo/abi.h):
every error code, dtype (with its size), reduction and collective kind,
both ways, so a value added in C and not in Python (or the reverse) fails
here; and the frontends' names come from those tables."""
import ctypes

import pytest

from kolo import _abi, _engine, _lib

PROBE = 256  # well past every table's end


def test_errors_match_libkolo():
    lib = _lib.load()
    known = [c for c in range(PROBE) if lib.kolo_errname(c) != b"KOLO_E?"]
    assert known == list(range(len(_abi.ERRORS)))
    for code, sym in enumerate(_abi.ERRORS):
        assert lib.kolo_errname(code).decode() == "KOLO_" + sym
    assert lib.kolo_errname(-1) == b"KOLO_E?"


def test_dtypes_match_libkolo():
    lib = _lib.load()
    known = [d for d in range(PROBE) if lib.kolo_dtype_size(d) != 0]
    assert known == list(range(len(_abi.DTYPES)))
    for value, (sym, size) in enumerate(_abi.DTYPES):
        assert lib.kolo_dtype_size(value) == size
        assert lib.kolo_dtype_name(value).decode() == sym.lower()
    assert lib.kolo_dtype_name(len(_abi.DTYPES)) == b"invalid"


def test_ops_and_collectives_match_libkolo():
    lib = _lib.load()
    for table, fn in ((_abi.OPS, lib.kolo_op_name), (_abi.COLLS, lib.kolo_coll_name)):
        known = [v for v in range(PROBE) if fn(v) != b"invalid"]
        assert known == list(range(len(table)))
        assert [fn(v).decode() for v in known] == [sym.lower() for sym in table]


def test_bound_names():
    assert (_abi.FLOAT32, _abi.DTYPE_SIZE[_abi.FLOAT32]) == (7, 4)
    assert _abi.FLOATING == (_abi.FLOAT16, _abi.BFLOAT16, _abi.FLOAT32, _abi.FLOAT64)
    assert (_abi.E_INVAL, _abi.E_TIMEDOUT, _abi.E_STATE, _abi.OK) == (1, 3, 25, 0)
    assert (_abi.K_SUM, _abi.K_PRODUCT) == (0, 4)
    assert (_abi.ALLREDUCE, _abi.JOIN) == (0, 6)
    assert _abi.COLL_NAMES[_abi.REDUCESCATTER] == "reducescatter"
    # the engine's names are these, not copies
    assert (_engine.BARRIER, _engine.INT64, _engine.K_MAX, _engine.E_NOTSUP) == \
        (_abi.BARRIER, _abi.INT64, _abi.K_MAX, _abi.E_NOTSUP)


def test_request_layout_matches_libkolo():
    lib = _lib.load()
    _lib.check_layout(lib)  # what load() did: no error
    assert lib.kolo_request_size() == ctypes.sizeof(_lib.Request)
    assert lib.kolo_request_offset(b"device") == _lib.Request.device.offset
    assert lib.kolo_request_offset(b"no_such_field") == -1


class _OtherVersion:
    """A library whose struct kolo_request has its fields elsewhere."""

    def __init__(self, lib, moved):
        self.lib, self.moved = lib, moved

    def kolo_request_size(self):
        return self.lib.kolo_request_size() + 8

    def kolo_request_offset(self, name):
        return self.lib.kolo_request_offset(name) + (8 if name == self.moved else 0)


def test_a_library_of_another_version_is_refused():
    lib = _lib.load()
    with pytest.raises(ImportError) as e:
        _lib.check_layout(_OtherVersion(lib, b"op"))
    text = str(e.value)
    assert "another version" in text and "op at" in text and "size" in text, text
