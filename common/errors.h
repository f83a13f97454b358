/*
 * errors.h - kolo's error codes, from one table.
 *
 * Every function that can fail returns an int: 0 is success, errors are
 * positive and stable (they are part of the wire protocol and of libkolo's
 * ABI, so a code is never renumbered or reused). The table below is the
 * only place they are defined; kolo_errname() and kolo_strerror() are
 * generated from it and return string literals.
 */
#ifndef KOLO_COMMON_ERRORS_H
#define KOLO_COMMON_ERRORS_H

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

enum kolo_err {
#define KOLO_ERR_ENUM(name, code, text) KOLO_##name = code,
    KOLO_ERRORS(KOLO_ERR_ENUM)
#undef KOLO_ERR_ENUM
};

/* kolo_errname returns the symbolic name of code ("KOLO_ETIMEDOUT"), or
 * "KOLO_E?" for a code not in the table. */
const char *kolo_errname(int code);

/* kolo_strerror returns a short English description of code, never NULL. */
const char *kolo_strerror(int code);

#endif
