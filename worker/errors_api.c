/*
 * errors_api.c - libkolo's small, context-free helpers.
 */
#include "kolo.h"

size_t kolo_dtype_size(kolo_dtype dtype)
{
    static const size_t sizes[KOLO_DTYPE_COUNT] = {1, 1, 2, 4, 8, 2, 2, 4, 8};
    return (unsigned)dtype < KOLO_DTYPE_COUNT ? sizes[dtype] : 0;
}

const char *kolo_dtype_name(kolo_dtype dtype)
{
    static const char *names[KOLO_DTYPE_COUNT] = {"uint8",   "int8",     "int16",
                                                  "int32",   "int64",    "float16",
                                                  "bfloat16", "float32", "float64"};
    return (unsigned)dtype < KOLO_DTYPE_COUNT ? names[dtype] : "invalid";
}
