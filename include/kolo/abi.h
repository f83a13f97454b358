/*
 * kolo/abi.h - kolo's shared vocabulary: error codes, element types,
 * reductions and collective kinds, each one X-macro table.
 *
 * Every component reads these tables and nothing else: libkolo's public
 * header (kolo.h includes this file), the daemons (common/abi.h names
 * them), the coordinator's checks and Horovod-worded messages, and the
 * Python package, whose own copy (python/kolo/_abi.py) a test compares
 * with libkolo entry by entry. Values travel on the wire and in the ABI:
 * append, never renumber. Each table runs from 0 without gaps, so its
 * COUNT bounds every valid value.
 *
 * Columns: X(SYMBOL, value, ...) where KOLO_<SYMBOL> is the C name.
 */
#ifndef KOLO_ABI_H
#define KOLO_ABI_H

/* X(SYMBOL, code, description) */
#define KOLO_ERRORS(X)                                                                             \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, 1, "invalid argument")                                                               \
    X(ENOMEM, 2, "out of memory")                                                                  \
    X(ETIMEDOUT, 3, "timed out")                                                                   \
    X(ECLOSED, 4, "closed")                                                                        \
    X(EPROTO, 5, "malformed message")                                                              \
    X(EVERSION, 6, "protocol version mismatch")                                                    \
    X(EAUTH, 7, "authentication failed")                                                           \
    X(ETOOBIG, 8, "message too large")                                                             \
    X(ENOMETHOD, 9, "unknown method")                                                              \
    X(ENOTFOUND, 10, "not found")                                                                  \
    X(EEXIST, 11, "already exists")                                                                \
    X(ESTALE, 12, "stale session or generation")                                                   \
    X(EBUSY, 13, "busy")                                                                           \
    X(EIO, 14, "input/output error")                                                               \
    X(ESTORE, 15, "state store error")                                                             \
    X(ESHUTDOWN, 16, "shut down")                                                                  \
    X(EPERM, 17, "permission denied")                                                              \
    X(ENOSLOTS, 18, "not enough slots")                                                            \
    X(EMISMATCH, 19, "mismatched collective arguments")                                            \
    X(EINTERNAL, 20, "internal error")                                                             \
    X(ENOTSUP, 21, "not supported")                                                                \
    X(EPEER, 22, "peer failed")                                                                    \
    X(ESYS, 23, "system call failed")                                                              \
    X(ECONNREFUSED, 24, "connection refused")                                                      \
    X(ESTATE, 25, "invalid state for this operation")

/* X(SYMBOL, value, bytes per element, name) */
#define KOLO_DTYPES(X)                                                                             \
    X(UINT8, 0, 1, "uint8")                                                                        \
    X(INT8, 1, 1, "int8")                                                                          \
    X(INT16, 2, 2, "int16")                                                                        \
    X(INT32, 3, 4, "int32")                                                                        \
    X(INT64, 4, 8, "int64")                                                                        \
    X(FLOAT16, 5, 2, "float16")                                                                    \
    X(BFLOAT16, 6, 2, "bfloat16")                                                                  \
    X(FLOAT32, 7, 4, "float32")                                                                    \
    X(FLOAT64, 8, 8, "float64")

/* X(SYMBOL, value, name). AVERAGE is SUM followed by a division by the
 * number of ranks (for integers, rounding toward zero). */
#define KOLO_OPS(X)                                                                                \
    X(SUM, 0, "sum")                                                                               \
    X(AVERAGE, 1, "average")                                                                       \
    X(MIN, 2, "min")                                                                               \
    X(MAX, 3, "max")                                                                               \
    X(PRODUCT, 4, "product")

/* X(SYMBOL, value, name): collective kinds, as named in errors and the
 * timeline (the C names are KOLO_COLL_<SYMBOL>). */
#define KOLO_COLLS(X)                                                                              \
    X(ALLREDUCE, 0, "allreduce")                                                                   \
    X(ALLGATHER, 1, "allgather")                                                                   \
    X(BROADCAST, 2, "broadcast")                                                                   \
    X(ALLTOALL, 3, "alltoall")                                                                     \
    X(REDUCESCATTER, 4, "reducescatter")                                                           \
    X(BARRIER, 5, "barrier")                                                                       \
    X(JOIN, 6, "join")

enum kolo_err {
#define KOLO_ABI_ENUM_(sym, code, text) KOLO_##sym = code,
    KOLO_ERRORS(KOLO_ABI_ENUM_)
#undef KOLO_ABI_ENUM_
};

typedef enum kolo_dtype {
#define KOLO_ABI_ENUM_(sym, value, bytes, name) KOLO_##sym = value,
    KOLO_DTYPES(KOLO_ABI_ENUM_)
#undef KOLO_ABI_ENUM_
    KOLO_DTYPE_COUNT
} kolo_dtype;

typedef enum kolo_op {
#define KOLO_ABI_ENUM_(sym, value, name) KOLO_##sym = value,
    KOLO_OPS(KOLO_ABI_ENUM_)
#undef KOLO_ABI_ENUM_
    KOLO_OP_COUNT
} kolo_op;

typedef enum kolo_coll {
#define KOLO_ABI_ENUM_(sym, value, name) KOLO_COLL_##sym = value,
    KOLO_COLLS(KOLO_ABI_ENUM_)
#undef KOLO_ABI_ENUM_
    KOLO_COLL_COUNT
} kolo_coll;

#endif
