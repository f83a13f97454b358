/*
 * allreduce.c - the smallest libkolo program: every rank contributes a
 * vector, all ranks get the average, and rank 0 checks and prints it.
 *
 *   kolo run -np 4 -- build/bin/kolo-example-allreduce
 */
#include <stdio.h>
#include <stdlib.h>

#include "kolo.h"

int main(void)
{
    kolo_ctx *ctx;
    int rv = kolo_init(&ctx, NULL); /* from the environment kolo run sets */
    if (rv) {
        fprintf(stderr, "kolo_init: %s\n", kolo_strerror(rv));
        return 1;
    }
    int rank = kolo_rank(ctx), size = kolo_size(ctx);
    enum { N = 1 << 20 };
    float *grad = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
        grad[i] = (float)rank; /* pretend gradient */

    kolo_handle h;
    rv = kolo_allreduce_async(ctx, "grad", grad, grad, N, KOLO_FLOAT32, KOLO_AVERAGE, &h);
    if (rv == 0)
        rv = kolo_wait(ctx, h, 30000);
    if (rv) {
        fprintf(stderr, "rank %d: allreduce failed: %s: %s\n", rank, kolo_strerror(rv),
                kolo_last_error(ctx));
        kolo_fini(ctx);
        return 1;
    }
    float want = (float)(size - 1) / 2.0f;
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += grad[i] != want;
    printf("rank %d of %d: average of %d floats = %g (%s)\n", rank, size, N, grad[0],
           bad ? "WRONG" : "correct");
    free(grad);
    kolo_fini(ctx);
    return bad ? 1 : 0;
}
