/*
 * abi.c - see abi.h. Every function is a switch generated from one table,
 * so a value added to include/kolo/abi.h is named everywhere at once.
 */
#include "abi.h"

/* Each table runs from 0 without gaps: its values are unique (else the
 * switches below do not compile) and all below its COUNT. */
#define BELOW_(count, value) _Static_assert((value) < (count), #value " exceeds its table's count");
#define ERR_BELOW_(sym, code, text) BELOW_(64, code)
#define DTYPE_BELOW_(sym, value, bytes, name) BELOW_(KOLO_DTYPE_COUNT, value)
#define OP_BELOW_(sym, value, name) BELOW_(KOLO_OP_COUNT, value)
#define COLL_BELOW_(sym, value, name) BELOW_(KOLO_COLL_COUNT, value)
KOLO_ERRORS(ERR_BELOW_)
KOLO_DTYPES(DTYPE_BELOW_)
KOLO_OPS(OP_BELOW_)
KOLO_COLLS(COLL_BELOW_)

const char *abi_errname(int code)
{
    switch (code) {
#define CASE_(sym, num, text)                                                                      \
    case num:                                                                                      \
        return "KOLO_" #sym;
        KOLO_ERRORS(CASE_)
#undef CASE_
    default:
        return "KOLO_E?";
    }
}

const char *abi_strerror(int code)
{
    switch (code) {
#define CASE_(sym, num, text)                                                                      \
    case num:                                                                                      \
        return text;
        KOLO_ERRORS(CASE_)
#undef CASE_
    default:
        return "unknown error";
    }
}

size_t abi_dtype_size(int dtype)
{
    switch (dtype) {
#define CASE_(sym, value, bytes, name)                                                             \
    case value:                                                                                    \
        return bytes;
        KOLO_DTYPES(CASE_)
#undef CASE_
    default:
        return 0;
    }
}

const char *abi_dtype_name(int dtype)
{
    switch (dtype) {
#define CASE_(sym, value, bytes, name)                                                             \
    case value:                                                                                    \
        return name;
        KOLO_DTYPES(CASE_)
#undef CASE_
    default:
        return NULL;
    }
}

const char *abi_dtype_symbol(int dtype)
{
    switch (dtype) {
#define CASE_(sym, value, bytes, name)                                                             \
    case value:                                                                                    \
        return #sym;
        KOLO_DTYPES(CASE_)
#undef CASE_
    default:
        return NULL;
    }
}

/* ops and collective kinds share the (SYMBOL, value, name) shape */
#define NAME_CASE_(sym, value, name)                                                               \
    case value:                                                                                    \
        return name;
#define SYMBOL_CASE_(sym, value, name)                                                             \
    case value:                                                                                    \
        return #sym;

const char *abi_op_name(int op)
{
    switch (op) {
        KOLO_OPS(NAME_CASE_)
    default:
        return NULL;
    }
}

const char *abi_op_symbol(int op)
{
    switch (op) {
        KOLO_OPS(SYMBOL_CASE_)
    default:
        return NULL;
    }
}

const char *abi_coll_name(int coll)
{
    switch (coll) {
        KOLO_COLLS(NAME_CASE_)
    default:
        return NULL;
    }
}

const char *abi_coll_symbol(int coll)
{
    switch (coll) {
        KOLO_COLLS(SYMBOL_CASE_)
    default:
        return NULL;
    }
}
