/*
 * abi.h - names and sizes from kolo's shared vocabulary (include/kolo/abi.h)
 * for every component: the daemons' messages, the coordinator's checks of a
 * request, libkolo's public kolo_errname/kolo_dtype_size/... (which call
 * these). Every function returns string literals or constants, so any
 * thread may call it. An unknown value gives the documented fallback.
 */
#ifndef KOLO_COMMON_ABI_H
#define KOLO_COMMON_ABI_H

#include <stddef.h>

#include "kolo/abi.h"

/* "KOLO_ETIMEDOUT"; "KOLO_E?" for a code not in the table */
const char *abi_errname(int code);
/* "timed out"; "unknown error" */
const char *abi_strerror(int code);

/* bytes per element; 0 for an invalid dtype */
size_t abi_dtype_size(int dtype);
/* "float32" / "FLOAT32"; NULL when invalid */
const char *abi_dtype_name(int dtype);
const char *abi_dtype_symbol(int dtype);

/* "sum" / "SUM"; NULL when invalid */
const char *abi_op_name(int op);
const char *abi_op_symbol(int op);

/* "allreduce" / "ALLREDUCE"; NULL when invalid */
const char *abi_coll_name(int coll);
const char *abi_coll_symbol(int coll);

#endif
