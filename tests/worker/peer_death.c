/*
 * peer_death.c - a worker for the dead-peer integration test: allreduces
 * in a loop; the rank named by KOLO_TEST_VICTIM kills itself with SIGKILL
 * in the middle; every survivor must see its pending operation fail (not
 * hang) and prints how long that took.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "kolo.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int main(void)
{
    kolo_ctx *ctx;
    if (kolo_init(&ctx, NULL) != 0)
        return 2;
    int rank = kolo_rank(ctx);
    int victim = atoi(getenv("KOLO_TEST_VICTIM") ? getenv("KOLO_TEST_VICTIM") : "1");
    size_t n = 1 << 20;
    float *buf = calloc(n, sizeof(float));
    for (int step = 0;; step++) {
        if (rank == victim && step == 20) {
            printf("rank %d: dying now\n", rank);
            fflush(stdout);
            kill(getpid(), SIGKILL);
        }
        kolo_handle h;
        double t0 = now_ms();
        int rv = kolo_allreduce_async(ctx, "x", buf, buf, n, KOLO_FLOAT32, KOLO_SUM, &h);
        if (rv == 0)
            rv = kolo_wait(ctx, h, 60000);
        if (rv) {
            printf("rank %d: step %d failed after %.1f ms: %s: %s\n", rank, step, now_ms() - t0,
                   kolo_errname(rv), kolo_last_error(ctx));
            fflush(stdout);
            kolo_fini(ctx);
            return 3;
        }
    }
}
