/*
 * bench_clock.h - what every benchmark program here times with: the
 * monotonic clock in µs, and the comparison that sorts samples for
 * medians and percentiles. Header-only, so the programs built outside
 * CMake (mpi_allreduce.c with mpicc, tcp_rtt.c with gcc) use it too.
 */
#ifndef KOLO_BENCH_CLOCK_H
#define KOLO_BENCH_CLOCK_H

#include <time.h>

static inline double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* qsort comparison of doubles, ascending */
static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
