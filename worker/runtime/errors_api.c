/*
 * errors_api.c - libkolo's names for its vocabulary (include/kolo/abi.h),
 * the public face of common/abi.c, and the layout of kolo_request for
 * bindings that cannot read kolo.h.
 */
#include "kolo.h"

#include <stddef.h>
#include <string.h>

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

size_t kolo_request_size(void)
{
    return sizeof(kolo_request);
}

long kolo_request_offset(const char *field)
{
    static const struct {
        const char *name;
        size_t offset;
    } fields[] = {
#define FIELD_(f) {#f, offsetof(kolo_request, f)}
        FIELD_(coll),  FIELD_(name),      FIELD_(sendbuf),   FIELD_(recvbuf), FIELD_(dtype),
        FIELD_(ndim),  FIELD_(shape),     FIELD_(op),        FIELD_(prescale), FIELD_(postscale),
        FIELD_(root),  FIELD_(splits),    FIELD_(nsplits),   FIELD_(device),
#undef FIELD_
    };
    for (size_t i = 0; field && i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].name, field) == 0)
            return (long)fields[i].offset;
    return -1;
}
