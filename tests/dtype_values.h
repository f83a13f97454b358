/*
 * dtype_values.h - one element of a buffer of any kolo dtype, written and
 * read as a double: what the tests that check collectives over every type
 * compare with. float16 and bfloat16 go through libkolo's own conversions
 * (worker/coll/reduce.h, round to nearest even), so a test's expectation and
 * the library round alike.
 */
#ifndef KOLO_TESTS_DTYPE_VALUES_H
#define KOLO_TESTS_DTYPE_VALUES_H

#include <stddef.h>
#include <stdint.h>

#include "kolo.h"
#include "reduce.h"

/* buf[i] = v, converted to dt (integers truncate toward zero) */
static inline void dtype_put(kolo_dtype dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case KOLO_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
        break;
    case KOLO_INT8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case KOLO_INT16:
        ((int16_t *)buf)[i] = (int16_t)v;
        break;
    case KOLO_INT32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case KOLO_INT64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case KOLO_FLOAT16:
        ((uint16_t *)buf)[i] = f32_to_f16((float)v);
        break;
    case KOLO_BFLOAT16:
        ((uint16_t *)buf)[i] = f32_to_bf16((float)v);
        break;
    case KOLO_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    default:
        ((double *)buf)[i] = v;
        break;
    }
}

/* buf[i] of type dt, as a double */
static inline double dtype_get(kolo_dtype dt, const void *buf, size_t i)
{
    switch (dt) {
    case KOLO_UINT8:
        return ((const uint8_t *)buf)[i];
    case KOLO_INT8:
        return ((const int8_t *)buf)[i];
    case KOLO_INT16:
        return ((const int16_t *)buf)[i];
    case KOLO_INT32:
        return ((const int32_t *)buf)[i];
    case KOLO_INT64:
        return (double)((const int64_t *)buf)[i];
    case KOLO_FLOAT16:
        return f16_to_f32(((const uint16_t *)buf)[i]);
    case KOLO_BFLOAT16:
        return bf16_to_f32(((const uint16_t *)buf)[i]);
    case KOLO_FLOAT32:
        return ((const float *)buf)[i];
    default:
        return ((const double *)buf)[i];
    }
}

#endif
