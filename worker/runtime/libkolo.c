/*
 * libkolo.c - the shared library's own translation unit. Everything lives
 * in the kolo_worker archive, linked in whole; this file only makes sure
 * the version is queryable from the .so itself.
 */
#include "kolo.h"

KOLO_API const char *kolo_version(void);

const char *kolo_version(void)
{
    return KOLO_VERSION;
}
