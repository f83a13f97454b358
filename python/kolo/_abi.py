"""kolo's shared vocabulary for Python: error codes, element types,
reductions and collective kinds, with their wire values.

The C tables in include/kolo/abi.h are the source; this is their one
Python copy: the frontends bind these names at import (kolo.torch's dtype
table, the Req defaults), and importing kolo does not load libkolo - init()
does, also for a program started alone. tests/python/test_abi.py compares
every entry with libkolo's kolo_errname, kolo_dtype_size, kolo_dtype_name,
kolo_op_name and kolo_coll_name, both ways, so a value added on one side
only fails it.

Each list's index is the value: DTYPES[7] is FLOAT32. The module also
binds one name per entry (UINT8 ... FLOAT64; SUM_OP ...; ALLREDUCE ...;
E_INVAL ... from EINVAL ...) for the frontends.
"""

ERRORS = ["OK", "EINVAL", "ENOMEM", "ETIMEDOUT", "ECLOSED", "EPROTO", "EVERSION", "EAUTH",
          "ETOOBIG", "ENOMETHOD", "ENOTFOUND", "EEXIST", "ESTALE", "EBUSY", "EIO", "ESTORE",
          "ESHUTDOWN", "EPERM", "ENOSLOTS", "EMISMATCH", "EINTERNAL", "ENOTSUP", "EPEER",
          "ESYS", "ECONNREFUSED", "ESTATE"]

# (symbol, bytes per element)
DTYPES = [("UINT8", 1), ("INT8", 1), ("INT16", 2), ("INT32", 4), ("INT64", 8),
          ("FLOAT16", 2), ("BFLOAT16", 2), ("FLOAT32", 4), ("FLOAT64", 8)]

OPS = ["SUM", "AVERAGE", "MIN", "MAX", "PRODUCT"]

COLLS = ["ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN"]

DTYPE_SIZE = [size for _, size in DTYPES]
COLL_NAMES = [sym.lower() for sym in COLLS]


def _bind():
    g = globals()
    for value, sym in enumerate(ERRORS):
        g["E_" + sym[1:] if sym.startswith("E") else sym] = value
    for value, (sym, _) in enumerate(DTYPES):
        g[sym] = value
    for value, sym in enumerate(OPS):
        g["K_" + sym] = value  # K_: Horovod's own Sum, Average, ... differ
    for value, sym in enumerate(COLLS):
        g[sym] = value


_bind()
FLOATING = tuple(value for value, (sym, _) in enumerate(DTYPES) if "FLOAT" in sym)
