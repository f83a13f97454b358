/*
 * nccl_allreduce.c - kolo's NCCL allreduce against a bare ncclAllReduce
 * loop on the same GPU buffers.
 *
 * Run under `kolo run -np N` on a host with N GPUs (rank r uses GPU
 * local_rank % count); with N = 1 both sides are one-rank communicators.
 * float32 SUM, sizes 4 B .. 256 MiB, in place and out of place (a
 * one-rank NCCL allreduce in place moves no data; out of place it copies,
 * so that column shows what kolo adds to real GPU work). One iteration is
 * one operation from issue to completion seen by the host:
 *   bare: ncclAllReduce on a stream, cudaStreamSynchronize;
 *   kolo: kolo_submit_stream on the same stream, kolo_wait - negotiation
 *         with the coordinator, the producer-event wait, the finaliser;
 *   kolo_cpu (sizes up to 1 MiB): kolo's allreduce of a host buffer, the
 *         negotiation cost without the GPU backend, for comparison.
 * Both sides are negotiated once and then cached: with readiness rounds
 * (the default) kolo's steady state never reaches the coordinator.
 * The bare communicator is built here: rank 0's ncclUniqueId travels by
 * kolo's CPU broadcast. Reported per size (rank 0, one JSON line): the
 * medians over iterations after a warm-up, and kolo's overhead.
 *
 *   kolo-bench-nccl [MAX_BYTES]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kolo.h"

#if KOLO_HAVE_NCCL
#include "cuda_api.h"
#include "bench_clock.h"

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2];
}

/* p99 of t[0..n), which median() sorted */
static double p99_sorted(const double *t, int n)
{
    return t[(n * 99 + 99) / 100 - 1];
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "kolo-bench-nccl: %s: %s\n", what, why);
    exit(1);
}

static void kcheck(kolo_ctx *ctx, int rv, const char *what)
{
    if (rv)
        die(what, kolo_last_error(ctx)[0] ? kolo_last_error(ctx) : kolo_strerror(rv));
}

int main(int argc, char **argv)
{
    size_t max_bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)256 << 20;
    char why[512];
    const struct gpu_libs *g = gpu_libs_load(why, sizeof(why));
    if (!g)
        die("GPU", why);
    kolo_ctx *ctx;
    kcheck(NULL, kolo_init(&ctx, NULL), "kolo_init");
    int rank = kolo_rank(ctx), size = kolo_size(ctx);
    int dev = kolo_local_rank(ctx) % g->device_count;
    if (g->rt.SetDevice(dev) != cudaSuccess)
        die("cudaSetDevice", "failed");
    cudaStream_t s;
    if (g->rt.StreamCreateWithPriority(&s, cudaStreamNonBlocking, 0) != cudaSuccess)
        die("stream", "failed");

    /* the bare communicator: the id by kolo's CPU broadcast */
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (rank == 0 && g->nccl.GetUniqueId(&id) != ncclSuccess)
        die("ncclGetUniqueId", "failed");
    kolo_handle h;
    kcheck(ctx, kolo_broadcast_async(ctx, "bench.id", &id, sizeof(id), KOLO_UINT8, 0, &h),
           "broadcast");
    kcheck(ctx, kolo_wait(ctx, h, 60000), "broadcast");
    ncclComm_t comm;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    if (g->nccl.CommInitRankConfig(&comm, size, id, rank, &cfg) != ncclSuccess)
        die("ncclCommInitRank", "failed");

    void *buf, *out;
    if (g->rt.Malloc(&buf, max_bytes + 16) != cudaSuccess ||
        g->rt.Malloc(&out, max_bytes + 16) != cudaSuccess)
        die("cudaMalloc", "failed");
    if (g->rt.MemsetAsync(buf, 0, max_bytes, s) != cudaSuccess)
        die("cudaMemset", "failed");
    float *host = calloc(1 << 18, sizeof(float));
    g->rt.StreamSynchronize(s);
    if (rank == 0)
        printf("# kolo-bench-nccl: %d rank(s), GPU %d, NCCL %d, float32 SUM\n", size, dev,
               g->nccl_version);

    double *t[5];
    for (int i = 0; i < 5; i++)
        t[i] = malloc(1000 * sizeof(double));
    for (size_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
        size_t count = bytes / 4;
        int iters = bytes <= (1 << 20) ? 300 : bytes <= (16 << 20) ? 100 : 30;
        int warm = iters / 10 + 2;
        int64_t shape[1] = {(int64_t)count};
        char name[64];
        snprintf(name, sizeof(name), "bench.%zu", bytes);
        kolo_request req = {.coll = KOLO_COLL_ALLREDUCE,
                            .name = name,
                            .sendbuf = buf,
                            .recvbuf = buf,
                            .dtype = KOLO_FLOAT32,
                            .ndim = 1,
                            .shape = shape,
                            .op = KOLO_SUM,
                            .device = dev};
        kolo_request oop = req, cpu = req;
        char name2[64], name3[64];
        snprintf(name2, sizeof(name2), "bench.oop.%zu", bytes);
        snprintf(name3, sizeof(name3), "bench.cpu.%zu", bytes);
        oop.name = name2;
        oop.recvbuf = out;
        cpu.name = name3;
        cpu.sendbuf = cpu.recvbuf = host;
        cpu.device = -1;
        bool with_cpu = bytes <= (1 << 20);
        /* interleaved, so that all see the same machine state */
        for (int i = 0; i < warm + iters; i++) {
            double t0 = now_us();
            if (g->nccl.AllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, s) != ncclSuccess ||
                g->rt.StreamSynchronize(s) != cudaSuccess)
                die("ncclAllReduce", "failed");
            double t1 = now_us();
            kcheck(ctx, kolo_submit_stream(ctx, &req, 1, s, &h), "submit");
            kcheck(ctx, kolo_wait(ctx, h, 60000), "wait");
            double t2 = now_us();
            if (g->nccl.AllReduce(buf, out, count, ncclFloat32, ncclSum, comm, s) != ncclSuccess ||
                g->rt.StreamSynchronize(s) != cudaSuccess)
                die("ncclAllReduce", "failed");
            double t3 = now_us();
            kcheck(ctx, kolo_submit_stream(ctx, &oop, 1, s, &h), "submit");
            kcheck(ctx, kolo_wait(ctx, h, 60000), "wait");
            double t4 = now_us();
            if (with_cpu) {
                kcheck(ctx, kolo_submit(ctx, &cpu, 1, &h), "submit");
                kcheck(ctx, kolo_wait(ctx, h, 60000), "wait");
            }
            double t5 = now_us();
            if (i >= warm) {
                t[0][i - warm] = t1 - t0;
                t[1][i - warm] = t2 - t1;
                t[2][i - warm] = t3 - t2;
                t[3][i - warm] = t4 - t3;
                t[4][i - warm] = t5 - t4;
            }
        }
        double b = median(t[0], iters), k = median(t[1], iters);
        double bo = median(t[2], iters), ko = median(t[3], iters), kc = median(t[4], iters);
        if (rank == 0) {
            printf("{\"bytes\": %zu, \"bare_us\": %.1f, \"kolo_us\": %.1f, "
                   "\"bare_oop_us\": %.1f, \"kolo_oop_us\": %.1f, \"overhead_oop_pct\": %.1f, "
                   "\"bare_p99_us\": %.1f, \"kolo_p99_us\": %.1f, \"bare_oop_p99_us\": %.1f, "
                   "\"kolo_oop_p99_us\": %.1f",
                   bytes, b, k, bo, ko, bo > 0 ? 100.0 * (ko - bo) / bo : 0.0,
                   p99_sorted(t[0], iters), p99_sorted(t[1], iters), p99_sorted(t[2], iters),
                   p99_sorted(t[3], iters));
            if (with_cpu)
                printf(", \"kolo_cpu_us\": %.1f, \"kolo_cpu_p99_us\": %.1f", kc,
                       p99_sorted(t[4], iters));
            printf("}\n");
            fflush(stdout);
        }
    }
    for (int i = 0; i < 5; i++)
        free(t[i]);
    free(host);
    g->rt.Free(out);
    g->nccl.CommAbort(comm);
    g->rt.Free(buf);
    kolo_fini(ctx);
    return 0;
}

#else

int main(void)
{
    fprintf(stderr, "kolo-bench-nccl: this build has no GPU backend\n");
    return 77;
}

#endif
