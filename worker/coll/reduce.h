/*
 * reduce.h - element types as (size, reduction functions), not one copy
 * of every algorithm per type.
 *
 * The loops are written so the compiler vectorises them (restrict
 * pointers, no aliasing, no branches inside); float16 and bfloat16 are
 * reduced in float32 and rounded back to nearest-even. Integer sums wrap
 * like C unsigned arithmetic (no undefined behaviour on overflow).
 *
 * Floating MIN/MAX follow IEEE 754-2019 minimum/maximum: a NaN wins and
 * -0 < +0, so both are commutative and every rank gets the same bits
 * whatever the order of reduction. Integer reduce_scale saturates to the
 * type's range (a NaN result becomes 0). float16 uses F16C when the build
 * targets it (KOLO_NATIVE), a portable conversion otherwise.
 */
#ifndef KOLO_WORKER_REDUCE_H
#define KOLO_WORKER_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "kolo.h"

/* reduce_into: dst[i] = dst[i] OP src[i], i < count. AVERAGE reduces as
 * SUM (the division is a separate scale step). dst and src must not
 * overlap unless equal. */
void reduce_into(kolo_dtype dtype, kolo_op op, void *dst, const void *src, size_t count);

/* reduce_two: dst[i] = a[i] OP b[i]; dst may equal a or b. Saves the copy
 * a "copy then reduce_into" pair would make. */
void reduce_two(kolo_dtype dtype, kolo_op op, void *dst, const void *a, const void *b,
                size_t count);

/* scale: buf[i] *= factor. Floating types multiply (in float32 for
 * float16/bfloat16, in the type otherwise); integer types multiply in
 * double and truncate toward zero. factor 1.0 returns at once. */
void reduce_scale(kolo_dtype dtype, void *buf, size_t count, double factor);

/* reduce_divide: buf[i] /= n, the AVERAGE step. Integers divide exactly
 * (toward zero); floating types multiply by 1/n. */
void reduce_divide(kolo_dtype dtype, void *buf, size_t count, int n);

/* float16 and bfloat16 <-> float32, round to nearest even; NaN stays NaN,
 * overflow becomes infinity. */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

#endif
