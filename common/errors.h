/*
 * errors.h - kolo's error codes for every component.
 *
 * The table itself lives in include/kolo/abi.h (KOLO_ERRORS), because
 * libkolo hands these codes to users; the daemons use the same table, so a
 * code means the same thing in a log line, on the wire and in Python.
 * abi_errname and abi_strerror (abi.h) name them.
 */
#ifndef KOLO_COMMON_ERRORS_H
#define KOLO_COMMON_ERRORS_H

#include <stddef.h>

#include "abi.h"

/* errf writes a message into err (when err and errlen allow) and returns
 * code, so a failing function reads `return errf(err, errlen, KOLO_EINVAL,
 * "...", ...)`. */
int errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
