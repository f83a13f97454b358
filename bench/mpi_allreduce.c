/*
 * mpi_allreduce.c - Open MPI's side of the allreduce benchmark (peer
 * baseline; kolo itself never links MPI). bench/run.sh builds it with
 * mpicc and launches it with mpirun.
 *
 * Same method and JSON lines as bench/kolo_allreduce.c: float32 SUM, in
 * place; each iteration is barrier; t0; allreduce; t1; an iteration's time
 * is the maximum over ranks; a launch reports the median over iterations
 * after a warm-up of iters/10 + 2 (3 steps for the ResNet-50 step).
 *
 *   mpi_allreduce sizes [BYTES...]      kind "allreduce", one line per size
 *   mpi_allreduce isizes [BYTES...]     kind "allreduce_nb": MPI_Iallreduce +
 *       MPI_Wait, the shape of kolo's own calls (kolo_allreduce_async +
 *       kolo_wait, Horovod's allreduce_async + synchronize)
 *   mpi_allreduce resnet FILE [STEPS]   the 161 ResNet-50 gradients as
 *       "resnet50_step"        one fused buffer of the same total bytes
 *       "resnet50_step_161"    161 blocking MPI_Allreduce calls
 *       "resnet50_step_161nb"  161 MPI_Iallreduce + MPI_Waitall
 *
 * MPI_BENCH_MAX_ITERS=N (environment, > 0) caps the timed iterations of
 * every size at N (the warm-up is N/10 + 2 then); bench/run.sh sets it for
 * Open MPI's spinning mode in its hosts part, where an iteration can take
 * a fraction of a second.
 *
 * After the timed loop of every size the buffer is reset to 1.0 and
 * reduced once more; every rank checks that each element equals the world
 * size (exit 2 otherwise).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_clock.h"

#define MAX_TENSORS 256

/* The iteration counts of kolo_allreduce.c, size for size. */
static int iters_default(size_t bytes)
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

/* ... at most MPI_BENCH_MAX_ITERS of them when that is set. */
static int iters_for(size_t bytes)
{
    int n = iters_default(bytes);
    const char *cap = getenv("MPI_BENCH_MAX_ITERS");
    if (cap && atoi(cap) > 0 && atoi(cap) < n)
        n = atoi(cap);
    return n;
}

static int g_rank, g_size;

/* Maximum over ranks per iteration, then median and spread on rank 0. */
static void report(const char *kind, size_t bytes, double *t, int iters)
{
    if (g_rank == 0)
        MPI_Reduce(MPI_IN_PLACE, t, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    else
        MPI_Reduce(t, NULL, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (g_rank != 0)
        return;
    qsort(t, (size_t)iters, sizeof(double), cmp_double);
    double med = t[iters / 2];
    double algbw = (double)bytes / med / 1e3; /* GB/s */
    printf("{\"impl\":\"openmpi\",\"kind\":\"%s\",\"np\":%d,\"bytes\":%zu,\"iters\":%d,"
           "\"median_us\":%.2f,\"min_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,"
           "\"algbw_gbs\":%.3f,\"busbw_gbs\":%.3f}\n",
           kind, g_size, bytes, iters, med, t[0], t[(iters * 9) / 10], t[(iters * 99) / 100], algbw,
           algbw * 2.0 * (g_size - 1) / g_size);
    fflush(stdout);
}

static void fill(float *buf, size_t count)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f;
}

/* One more allreduce of ones: every element must be the world size. */
static void verify(float *buf, size_t count, const char *what)
{
    fill(buf, count);
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < count; i++) {
        if (buf[i] != (float)g_size) {
            fprintf(stderr, "rank %d: %s: element %zu is %g, expected %d\n", g_rank, what, i,
                    (double)buf[i], g_size);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
}

/* nonblocking: MPI_Iallreduce + MPI_Wait instead of MPI_Allreduce */
static void bench_sizes(int argc, char **argv, int nonblocking)
{
    static const size_t defaults[] = {4, 4096, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20};
    size_t nsizes = argc > 0 ? (size_t)argc : sizeof(defaults) / sizeof(defaults[0]);
    for (size_t s = 0; s < nsizes; s++) {
        size_t bytes = argc > 0 ? strtoull(argv[s], NULL, 10) : defaults[s];
        size_t count = bytes / sizeof(float);
        float *buf = malloc(bytes + 4);
        if (!buf) {
            perror("malloc");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        fill(buf, count);
        int iters = iters_for(bytes), warm = iters / 10 + 2;
        double *t = malloc(sizeof(double) * (size_t)iters);
        for (int i = -warm; i < iters; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now_us();
            if (nonblocking) {
                MPI_Request rq;
                MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                               &rq);
                MPI_Wait(&rq, MPI_STATUS_IGNORE);
            } else {
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            }
            double t1 = now_us();
            if (i >= 0)
                t[i] = t1 - t0;
        }
        report(nonblocking ? "allreduce_nb" : "allreduce", bytes, t, iters);
        verify(buf, count, "allreduce");
        free(t);
        free(buf);
    }
}

enum step_mode { STEP_FUSED, STEP_BLOCKING, STEP_NONBLOCKING };

static void bench_resnet(const char *file, int steps)
{
    FILE *f = fopen(file, "r");
    if (!f) {
        perror(file);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    static char names[MAX_TENSORS][96];
    size_t counts[MAX_TENSORS];
    int n = 0;
    size_t total = 0;
    while (n < MAX_TENSORS && fscanf(f, "%95s %zu", names[n], &counts[n]) == 2)
        total += counts[n++] * sizeof(float);
    fclose(f);
    float *bufs[MAX_TENSORS];
    for (int i = 0; i < n; i++) {
        bufs[i] = malloc(counts[i] * sizeof(float) + 4);
        fill(bufs[i], counts[i]);
    }
    float *fused = malloc(total + 4);
    fill(fused, total / sizeof(float));
    double *t = malloc(sizeof(double) * (size_t)steps);
    MPI_Request reqs[MAX_TENSORS];
    static const char *kinds[] = {"resnet50_step", "resnet50_step_161", "resnet50_step_161nb"};
    for (int mode = STEP_FUSED; mode <= STEP_NONBLOCKING; mode++) {
        for (int s = -3; s < steps; s++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now_us();
            if (mode == STEP_FUSED) {
                MPI_Allreduce(MPI_IN_PLACE, fused, (int)(total / sizeof(float)), MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
            } else if (mode == STEP_BLOCKING) {
                for (int i = 0; i < n; i++)
                    MPI_Allreduce(MPI_IN_PLACE, bufs[i], (int)counts[i], MPI_FLOAT, MPI_SUM,
                                  MPI_COMM_WORLD);
            } else {
                for (int i = 0; i < n; i++)
                    MPI_Iallreduce(MPI_IN_PLACE, bufs[i], (int)counts[i], MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD, &reqs[i]);
                MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
            }
            double t1 = now_us();
            if (s >= 0)
                t[s] = t1 - t0;
        }
        report(kinds[mode], total, t, steps);
    }
    verify(fused, total / sizeof(float), "resnet50 fused");
    for (int i = 0; i < n; i++) {
        verify(bufs[i], counts[i], names[i]);
        free(bufs[i]);
    }
    free(fused);
    free(t);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (argc >= 3 && strcmp(argv[1], "resnet") == 0)
        bench_resnet(argv[2], argc >= 4 ? atoi(argv[3]) : 20);
    else
        bench_sizes(argc - 2, argv + 2, argc >= 2 && strcmp(argv[1], "isizes") == 0);
    MPI_Finalize();
    return 0;
}
