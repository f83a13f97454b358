/*
 * errors.c - names and descriptions for kolo's error codes.
 *
 * Both functions are generated from the KOLO_ERRORS table in errors.h and
 * return string literals only, so they are safe from any thread and the
 * caller never frees or copies anything.
 */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

const char *kolo_errname(int code)
{
    switch (code) {
#define KOLO_ERR_NAME(name, num, text)                                                             \
    case num:                                                                                      \
        return "KOLO_" #name;
        KOLO_ERRORS(KOLO_ERR_NAME)
#undef KOLO_ERR_NAME
    default:
        return "KOLO_E?";
    }
}

const char *kolo_strerror(int code)
{
    switch (code) {
#define KOLO_ERR_TEXT(name, num, text)                                                             \
    case num:                                                                                      \
        return text;
        KOLO_ERRORS(KOLO_ERR_TEXT)
#undef KOLO_ERR_TEXT
    default:
        return "unknown error";
    }
}

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
