/*
 * kolo_allreduce.c - kolo's side of the allreduce benchmark.
 *
 * Run under `kolo run -np N`. Method (the same as the peer programs, see
 * bench/README.md): float32 SUM, in place; each iteration is
 * barrier; t0; allreduce; t1; an iteration's time is the maximum over
 * ranks; the result is the median over iterations after a warm-up.
 * Negotiation with the coordinator is inside the timed region: this is
 * what a user's allreduce costs end to end.
 *
 *   kolo-bench-allreduce sizes [BYTES...]   one line of JSON per size
 *   kolo-bench-allreduce resnet FILE [STEPS] 161 named tensors submitted
 *                                           asynchronously, then waited
 *   kolo-bench-allreduce resnet-toggle FILE STEPS BLOCK TIMELINE
 *       the same step, the job's timeline switched on (kolo_timeline,
 *       writing TIMELINE) and off by rank 0 every BLOCK steps, in the
 *       order off, on, on, off (STEPS rounded up to a multiple of
 *       4 x BLOCK); one line for the steps without it (resnet50_step_tl_off)
 *       and one for those with it (resnet50_step_tl_on). The switch is a
 *       round trip before the step's barrier, outside the timed region.
 *       bench/timeline_overhead.sh uses it.
 *   kolo-bench-allreduce resnet-telemetry FILE STEPS BLOCK
 *       the same step with libkolo's telemetry (KOLO_TELEMETRY) off and
 *       on in the same processes, a new session (kolo_fini, kolo_init)
 *       every BLOCK steps in the order off, on, on, off; lines
 *       resnet50_step_telemetry_off and _on.
 *       bench/observability_overhead.sh uses it.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kolo.h"
#include "bench_clock.h"

static void check(kolo_ctx *ctx, int rv, const char *what)
{
    if (rv) {
        fprintf(stderr, "rank %d: %s: %s: %s\n", kolo_rank(ctx), what, kolo_strerror(rv),
                kolo_last_error(ctx));
        exit(1);
    }
}

static void barrier(kolo_ctx *ctx)
{
    kolo_handle h;
    check(ctx, kolo_barrier_async(ctx, &h), "barrier");
    check(ctx, kolo_wait(ctx, h, 60000), "barrier");
}

/* Context switches of this process so far, every thread, voluntary or not. */
static long ctx_switches(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_nvcsw + ru.ru_nivcsw : 0;
}

/* Per-iteration maxima over ranks, then the median and spread on rank 0;
 * csw >= 0: rank 0's context switches per iteration (a barrier and the
 * op), as "ctxsw_per_iter". */
static void report(kolo_ctx *ctx, const char *kind, size_t bytes, double *t, int iters,
                   double csw)
{
    kolo_handle h;
    check(ctx, kolo_allreduce_async(ctx, "bench.times", t, t, (size_t)iters, KOLO_FLOAT64,
                                    KOLO_MAX, &h),
          "times");
    check(ctx, kolo_wait(ctx, h, 60000), "times");
    if (kolo_rank(ctx) != 0)
        return;
    qsort(t, (size_t)iters, sizeof(double), cmp_double);
    int n = kolo_size(ctx);
    double med = t[iters / 2];
    double algbw = (double)bytes / med / 1e3; /* GB/s */
    /* a sealed data plane reports as its own implementation */
    const char *impl = getenv("KOLO_DATA_ENCRYPT") && atoi(getenv("KOLO_DATA_ENCRYPT")) ? "kolo-sealed"
                                                                                      : "kolo";
    printf("{\"impl\":\"%s\",\"kind\":\"%s\",\"np\":%d,\"bytes\":%zu,\"iters\":%d,"
           "\"median_us\":%.2f,\"min_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,"
           "\"algbw_gbs\":%.3f,\"busbw_gbs\":%.3f",
           impl, kind, n, bytes, iters, med, t[0], t[(iters * 9) / 10], t[(iters * 99) / 100], algbw,
           algbw * 2.0 * (n - 1) / n);
    if (csw >= 0)
        printf(",\"ctxsw_per_iter\":%.2f", csw);
    printf("}\n");
    fflush(stdout);
}

static int iters_for(size_t bytes)
{
    if (bytes <= 4096)
        return 1000;
    if (bytes <= 65536)
        return 500;
    if (bytes <= (1 << 20))
        return 100;
    if (bytes <= (16 << 20))
        return 20;
    if (bytes <= (64 << 20))
        return 10;
    return 5;
}

static void bench_sizes(kolo_ctx *ctx, int argc, char **argv)
{
    static const size_t defaults[] = {4, 4096, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20};
    size_t nsizes = argc > 0 ? (size_t)argc : sizeof(defaults) / sizeof(defaults[0]);
    for (size_t s = 0; s < nsizes; s++) {
        size_t bytes = argc > 0 ? strtoull(argv[s], NULL, 10) : defaults[s];
        size_t count = bytes / sizeof(float);
        float *buf = malloc(bytes + 4);
        for (size_t i = 0; i < count; i++)
            buf[i] = 1.0f;
        int iters = iters_for(bytes), warm = iters / 10 + 2;
        double *t = malloc(sizeof(double) * (size_t)iters);
        char name[64];
        snprintf(name, sizeof(name), "bench.%zu", bytes);
        /* One checked allreduce first: every element must be the exact sum
         * of the ranks' (rank + 1). */
        int rank = kolo_rank(ctx), n = kolo_size(ctx);
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)(rank + 1);
        kolo_handle hc;
        check(ctx, kolo_allreduce_async(ctx, name, buf, buf, count, KOLO_FLOAT32, KOLO_SUM, &hc),
              "allreduce");
        check(ctx, kolo_wait(ctx, hc, 120000), "allreduce");
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++)
            wrong += buf[i] != (float)(n * (n + 1) / 2);
        if (wrong) {
            fprintf(stderr, "rank %d: %zu of %zu elements wrong at %zu bytes\n", rank, wrong,
                    count, bytes);
            exit(1);
        }
        for (size_t i = 0; i < count; i++)
            buf[i] = 1.0f;
        long csw0 = 0;
        for (int i = -warm; i < iters; i++) {
            if (i == 0)
                csw0 = ctx_switches();
            barrier(ctx);
            kolo_handle h;
            double t0 = now_us();
            check(ctx, kolo_allreduce_async(ctx, name, buf, buf, count, KOLO_FLOAT32, KOLO_SUM, &h),
                  "allreduce");
            check(ctx, kolo_wait(ctx, h, 120000), "allreduce");
            double t1 = now_us();
            if (i >= 0)
                t[i] = t1 - t0;
        }
        double csw = (double)(ctx_switches() - csw0) / iters;
        report(ctx, "allreduce", bytes, t, iters, csw);
        free(t);
        free(buf);
    }
}

/* Reads FILE's "name count" lines into the tensors of one ResNet-50 step,
 * every element 1.0. Returns the number of tensors. */
static int load_resnet(const char *file, char names[][96], size_t *counts, float **bufs,
                       size_t *total)
{
    FILE *f = fopen(file, "r");
    if (!f) {
        perror(file);
        exit(1);
    }
    int n = 0;
    *total = 0;
    while (n < 200 && fscanf(f, "%95s %zu", names[n], &counts[n]) == 2)
        *total += counts[n++] * sizeof(float);
    fclose(f);
    for (int i = 0; i < n; i++) {
        bufs[i] = malloc(counts[i] * sizeof(float) + 4);
        for (size_t k = 0; k < counts[i]; k++)
            bufs[i][k] = 1.0f;
    }
    return n;
}

/* One step: barrier, then the n tensors submitted and waited; returns the
 * time from the first submission to the last completion, µs. */
static double resnet_step(kolo_ctx *ctx, int n, char names[][96], const size_t *counts,
                          float **bufs)
{
    kolo_handle h[200];
    barrier(ctx);
    double t0 = now_us();
    for (int i = 0; i < n; i++)
        check(ctx, kolo_allreduce_async(ctx, names[i], bufs[i], bufs[i], counts[i], KOLO_FLOAT32,
                                        KOLO_SUM, &h[i]),
              "allreduce");
    for (int i = 0; i < n; i++)
        check(ctx, kolo_wait(ctx, h[i], 120000), "allreduce");
    return now_us() - t0;
}

static void bench_resnet_toggle(kolo_ctx *ctx, const char *file, int steps, int block,
                                const char *timeline)
{
    static char names[200][96];
    size_t counts[200], total;
    float *bufs[200];
    int n = load_resnet(file, names, counts, bufs, &total);
    if (block < 1)
        block = 1;
    steps = (steps + 4 * block - 1) / (4 * block) * (4 * block);
    double *t_off = malloc(sizeof(double) * (size_t)steps / 2);
    double *t_on = malloc(sizeof(double) * (size_t)steps / 2);
    int n_off = 0, n_on = 0;
    bool on = false;
    for (int s = -3; s < steps; s++) {
        int phase = s < 0 ? 0 : (s / block) % 4;
        bool want = phase == 1 || phase == 2;
        if (want != on && kolo_rank(ctx) == 0)
            check(ctx, kolo_timeline(ctx, want ? timeline : NULL), "timeline");
        on = want;
        double t = resnet_step(ctx, n, names, counts, bufs);
        if (s < 0)
            continue;
        if (on)
            t_on[n_on++] = t;
        else
            t_off[n_off++] = t;
    }
    /* both halves are steps / 2 long: "bench.times" keeps one shape */
    report(ctx, "resnet50_step_tl_off", total, t_off, n_off, -1);
    report(ctx, "resnet50_step_tl_on", total, t_on, n_on, -1);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(t_off);
    free(t_on);
}

/* resnet-telemetry: the same step with libkolo's telemetry (the time
 * split and the rounds' waits, KOLO_TELEMETRY) off and on in the same
 * processes: a new session (kolo_fini, the knob set, kolo_init: Horovod's
 * shutdown and init) every BLOCK steps, in the order off, on, on, off, two
 * untimed steps after each init. Returns the context of the last session. */
static kolo_ctx *bench_resnet_telemetry(kolo_ctx *ctx, const char *file, int steps, int block)
{
    static char names[200][96];
    size_t counts[200], total;
    float *bufs[200];
    int n = load_resnet(file, names, counts, bufs, &total);
    if (block < 1)
        block = 1;
    int blocks = (steps + 4 * block - 1) / (4 * block) * 4;
    double *t_off = malloc(sizeof(double) * (size_t)(blocks / 2 * block));
    double *t_on = malloc(sizeof(double) * (size_t)(blocks / 2 * block));
    int n_off = 0, n_on = 0;
    for (int b = 0; b < blocks; b++) {
        bool on = b % 4 == 1 || b % 4 == 2;
        check(ctx, kolo_fini(ctx), "kolo_fini");
        setenv("KOLO_TELEMETRY", on ? "1" : "0", 1);
        check(NULL, kolo_init(&ctx, NULL), "kolo_init");
        for (int s = -2; s < block; s++) {
            double t = resnet_step(ctx, n, names, counts, bufs);
            if (s >= 0 && on)
                t_on[n_on++] = t;
            else if (s >= 0)
                t_off[n_off++] = t;
        }
    }
    report(ctx, "resnet50_step_telemetry_off", total, t_off, n_off, -1);
    report(ctx, "resnet50_step_telemetry_on", total, t_on, n_on, -1);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(t_off);
    free(t_on);
    return ctx;
}

static void bench_resnet(kolo_ctx *ctx, const char *file, int steps)
{
    static char names[200][96];
    size_t counts[200], total;
    float *bufs[200];
    int n = load_resnet(file, names, counts, bufs, &total);
    double *t = malloc(sizeof(double) * (size_t)steps);
    for (int s = -3; s < steps; s++) {
        double dt = resnet_step(ctx, n, names, counts, bufs);
        if (s >= 0)
            t[s] = dt;
    }
    report(ctx, "resnet50_step", total, t, steps, -1);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(t);
}

int main(int argc, char **argv)
{
    kolo_ctx *ctx;
    int rv = kolo_init(&ctx, NULL);
    if (rv) {
        fprintf(stderr, "kolo_init: %s\n", kolo_strerror(rv));
        return 1;
    }
    if (argc >= 5 && strcmp(argv[1], "resnet-telemetry") == 0)
        ctx = bench_resnet_telemetry(ctx, argv[2], atoi(argv[3]), atoi(argv[4]));
    else if (argc >= 6 && strcmp(argv[1], "resnet-toggle") == 0)
        bench_resnet_toggle(ctx, argv[2], atoi(argv[3]), atoi(argv[4]), argv[5]);
    else if (argc >= 3 && strcmp(argv[1], "resnet") == 0)
        bench_resnet(ctx, argv[2], argc >= 4 ? atoi(argv[3]) : 20);
    else
        bench_sizes(ctx, argc - 2, argv + 2);
    kolo_fini(ctx);
    return 0;
}
