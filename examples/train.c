/*
 * train.c - a real data-parallel training with libkolo: logistic
 * regression by mini-batch SGD on a synthetic, linearly separable
 * dataset. Each rank holds its shard of the data; after every batch the
 * gradients are averaged across ranks with one fused set of allreduces
 * (weights and bias as two named tensors), so every rank keeps an
 * identical model, as in Horovod. Rank 0 prints the loss and accuracy of
 * each epoch (both averaged over all ranks' shards) and the epoch time.
 *
 *   kolo run -np 4 -- build/bin/kolo-example-train [epochs]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kolo.h"

#define FEATURES 256
#define SAMPLES 65536 /* in all, split across ranks */
#define BATCH 256     /* per rank */
#define LR 0.5f

static uint64_t rng_state;

static double rnd(void) /* xorshift64*, deterministic per seed */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void must(kolo_ctx *ctx, int rv, const char *what)
{
    if (rv) {
        fprintf(stderr, "rank %d: %s: %s: %s\n", kolo_rank(ctx), what, kolo_strerror(rv),
                kolo_last_error(ctx));
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int epochs = argc > 1 ? atoi(argv[1]) : 5;
    kolo_ctx *ctx;
    int rv = kolo_init(&ctx, NULL);
    if (rv) {
        fprintf(stderr, "kolo_init: %s\n", kolo_strerror(rv));
        return 1;
    }
    int rank = kolo_rank(ctx), size = kolo_size(ctx);

    /* The true separating hyperplane is the same on every rank (seed 1);
     * each rank draws its own shard of samples (seed 100 + rank). */
    static float truth[FEATURES];
    rng_state = 1;
    for (int f = 0; f < FEATURES; f++)
        truth[f] = (float)(rnd() * 2 - 1);
    int n = SAMPLES / size;
    float *x = malloc((size_t)n * FEATURES * sizeof(float));
    float *y = malloc((size_t)n * sizeof(float));
    rng_state = 100 + (uint64_t)rank;
    for (int i = 0; i < n; i++) {
        double dot = 0;
        for (int f = 0; f < FEATURES; f++) {
            x[(size_t)i * FEATURES + f] = (float)(rnd() * 2 - 1);
            dot += x[(size_t)i * FEATURES + f] * truth[f];
        }
        y[i] = dot > 0 ? 1.0f : 0.0f;
    }

    /* Model: start from zeros on rank 0 and broadcast, as Horovod scripts
     * do with broadcast_parameters. */
    float w[FEATURES] = {0}, b = 0, gw[FEATURES], gb;
    if (rank == 0)
        for (int f = 0; f < FEATURES; f++)
            w[f] = 0.0f;
    kolo_handle h;
    must(ctx, kolo_broadcast_async(ctx, "init.w", w, FEATURES, KOLO_FLOAT32, 0, &h), "bcast");
    must(ctx, kolo_wait(ctx, h, 30000), "bcast");

    int batches = n / BATCH;
    for (int e = 1; e <= epochs; e++) {
        double t0 = now_s(), loss = 0, correct = 0;
        for (int bi = 0; bi < batches; bi++) {
            memset(gw, 0, sizeof(gw));
            gb = 0;
            for (int i = bi * BATCH; i < (bi + 1) * BATCH; i++) {
                const float *xi = x + (size_t)i * FEATURES;
                float z = b;
                for (int f = 0; f < FEATURES; f++)
                    z += w[f] * xi[f];
                float p = 1.0f / (1.0f + expf(-z));
                float d = p - y[i];
                for (int f = 0; f < FEATURES; f++)
                    gw[f] += d * xi[f];
                gb += d;
                loss -= y[i] ? log(p + 1e-7) : log(1 - p + 1e-7);
                correct += (p > 0.5f) == (y[i] > 0.5f);
            }
            for (int f = 0; f < FEATURES; f++)
                gw[f] /= BATCH;
            gb /= BATCH;
            /* Average the gradients over ranks: two tensors, negotiated
             * together and fused into one allreduce. */
            kolo_handle hw, hb;
            must(ctx, kolo_allreduce_async(ctx, "grad.w", gw, gw, FEATURES, KOLO_FLOAT32,
                                           KOLO_AVERAGE, &hw),
                 "allreduce");
            must(ctx, kolo_allreduce_async(ctx, "grad.b", &gb, &gb, 1, KOLO_FLOAT32, KOLO_AVERAGE,
                                           &hb),
                 "allreduce");
            must(ctx, kolo_wait(ctx, hw, 30000), "allreduce");
            must(ctx, kolo_wait(ctx, hb, 30000), "allreduce");
            for (int f = 0; f < FEATURES; f++)
                w[f] -= LR * gw[f];
            b -= LR * gb;
        }
        double stats[2] = {loss / (batches * BATCH), correct / (batches * BATCH)};
        must(ctx, kolo_allreduce_async(ctx, "epoch.stats", stats, stats, 2, KOLO_FLOAT64,
                                       KOLO_AVERAGE, &h),
             "stats");
        must(ctx, kolo_wait(ctx, h, 30000), "stats");
        if (rank == 0)
            printf("epoch %d: loss %.4f, accuracy %.2f%%, %.3f s (%d ranks, %d samples/rank)\n", e,
                   stats[0], stats[1] * 100, now_s() - t0, size, n);
        fflush(stdout);
    }
    free(x);
    free(y);
    kolo_fini(ctx);
    return 0;
}
