/*
 * reduce_bench.c - throughput of the reduction kernels against memcpy.
 *
 * Not a test and not part of the CMake build; build it with the flags
 * the worker library uses:
 *
 *   gcc -std=c11 -O3 -march=native -I include -I worker/coll \
 *       bench/reduce_bench.c worker/coll/reduce.c -o /tmp/reduce_bench -lm
 *
 * (add -DKOLO_REDUCE_PORTABLE to time the float16 fallback that does not
 * use F16C). GB/s is the size of one buffer divided by the time, so a
 * reduce_into moves three times that through memory (two reads, one
 * write) and memcpy twice. Each figure is the best of several rounds of
 * at least 50 ms, on buffers already touched, from one thread.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reduce.h"

/* The bench links only reduce.c, not errors_api.c's kolo_dtype_size. */
static size_t elem_size(kolo_dtype t)
{
    return t == KOLO_FLOAT32 || t == KOLO_INT32 ? 4 : 2;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { KIND_MEMCPY, KIND_INTO, KIND_TWO };

static void run_once(int kind, kolo_dtype t, void *dst, const void *a, const void *b, size_t bytes,
                     size_t count)
{
    switch (kind) {
    case KIND_MEMCPY:
        memcpy(dst, a, bytes);
        break;
    case KIND_INTO:
        reduce_into(t, KOLO_SUM, dst, a, count);
        break;
    default:
        reduce_two(t, KOLO_SUM, dst, a, b, count);
        break;
    }
}

/* Best GB/s over a few rounds, each repeating the call for >= 50 ms. */
static double measure(int kind, kolo_dtype t, void *dst, const void *a, const void *b, size_t bytes)
{
    size_t count = bytes / elem_size(t);
    double best = 0;
    for (int round = 0; round < 5; round++) {
        long reps = 0;
        double t0 = now(), elapsed;
        do {
            run_once(kind, t, dst, a, b, bytes, count);
            reps++;
            elapsed = now() - t0;
        } while (elapsed < 0.05);
        double gbs = (double)bytes * (double)reps / elapsed / 1e9;
        if (gbs > best)
            best = gbs;
    }
    return best;
}

/* Small values that stay finite however often they are summed into dst
 * (float16 saturates at 65504, so dst is reset between sizes). */
static void fill(kolo_dtype t, void *p, size_t bytes)
{
    size_t n = bytes / elem_size(t);
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case KOLO_FLOAT16:
            ((uint16_t *)p)[i] = f32_to_f16((float)(i % 7) * 0.001f);
            break;
        case KOLO_BFLOAT16:
            ((uint16_t *)p)[i] = f32_to_bf16((float)(i % 7) * 0.001f);
            break;
        case KOLO_FLOAT32:
            ((float *)p)[i] = (float)(i % 7) * 0.001f;
            break;
        default:
            ((int32_t *)p)[i] = (int32_t)(i % 7);
            break;
        }
    }
}

int main(void)
{
    static const size_t sizes[] = {64u << 10, 1u << 20, 64u << 20};
    static const kolo_dtype types[] = {KOLO_FLOAT32, KOLO_FLOAT16, KOLO_BFLOAT16, KOLO_INT32};
    static const char *names[] = {"float32", "float16", "bfloat16", "int32"};
    size_t max = sizes[sizeof sizes / sizeof sizes[0] - 1];
    unsigned char *a = aligned_alloc(64, max), *b = aligned_alloc(64, max);
    unsigned char *dst = aligned_alloc(64, max);
    if (!a || !b || !dst)
        return 1;
    memset(dst, 0, max);

    printf("%-9s %-12s %10s %10s %10s   (GB/s of one buffer)\n", "size", "", "memcpy", "into",
           "two");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t bytes = sizes[s];
        for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
            fill(types[k], a, bytes);
            fill(types[k], b, bytes);
            fill(types[k], dst, bytes);
            double cp = measure(KIND_MEMCPY, types[k], dst, a, b, bytes);
            double into = measure(KIND_INTO, types[k], dst, a, b, bytes);
            double two = measure(KIND_TWO, types[k], dst, a, b, bytes);
            printf("%6zu KiB %-12s %10.1f %10.1f %10.1f\n", bytes >> 10, names[k], cp, into, two);
        }
    }
    free(a);
    free(b);
    free(dst);
    return 0;
}
