/*
 * errors.c - errf, the one-line way to fail with a message.
 */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

int errf(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
