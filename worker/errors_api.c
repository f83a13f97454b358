/*
 * errors_api.c - libkolo's names for its vocabulary (include/kolo/abi.h):
 * the public face of common/abi.c.
 */
#include "kolo.h"

#include "abi.h"

const char *kolo_errname(int code)
{
    return abi_errname(code);
}

const char *kolo_strerror(int code)
{
    return abi_strerror(code);
}

size_t kolo_dtype_size(kolo_dtype dtype)
{
    return abi_dtype_size(dtype);
}

static const char *or_invalid(const char *name)
{
    return name ? name : "invalid";
}

const char *kolo_dtype_name(kolo_dtype dtype)
{
    return or_invalid(abi_dtype_name(dtype));
}

const char *kolo_op_name(kolo_op op)
{
    return or_invalid(abi_op_name(op));
}

const char *kolo_coll_name(kolo_coll coll)
{
    return or_invalid(abi_coll_name(coll));
}
