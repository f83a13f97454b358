/*
 * test_gpu_collectives.c - every collective on GPU tensors, checked
 * against the same collective run by kolo on host memory (the CPU
 * backend is the reference), for every dtype and reduction, with
 * scaling, fusion, uneven shapes and in-place buffers.
 *
 * Phases (threads as ranks, all on GPU 0 of this host):
 *   nccl     1 rank: the NCCL backend;
 *   hier     1 rank, KOLO_HIERARCHICAL_ALLREDUCE=force: the hierarchical
 *            allreduce's reduce-scatter / allreduce / allgather path;
 *   staged   2 and 3 ranks on one GPU: NCCL refuses duplicate GPUs in a
 *            communicator, so the backend stages through the CPU ring;
 *            then a join on the GPU (ranks 1 and 2 contribute zeros);
 *   refused  2 ranks on one GPU with KOLO_GPU_STAGING=0: NCCL is tried
 *            anyway; the operation must fail cleanly (no hang, no crash)
 *            or succeed - the outcome is printed.
 * Exit 77 (skipped) without a GPU or without the GPU backend.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#if KOLO_HAVE_NCCL
#include "cuda_api.h"
#include "dtype_values.h"
#include "gpu_job.h"

static const struct gpu_libs *g;
static int checks, mismatches;
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *phase = "";

/* ---------------------------------------------------------------- data */

/* Small values, different per rank and position; non-negative for
 * unsigned types, with halves for floating ones. */
static void fill(kolo_dtype dt, void *buf, size_t n, int rank, int salt)
{
    bool fl = dt >= KOLO_FLOAT16;
    for (size_t i = 0; i < n; i++) {
        double v = (double)((i * 7 + (size_t)rank * 3 + (size_t)salt) % 11);
        if (dt != KOLO_UINT8)
            v -= 3;
        if (fl)
            v += 0.5;
        dtype_put(dt, buf, i, v);
    }
}

/* GPU result vs CPU result: bits for integers, a tolerance for floats
 * (NCCL may fold scaling into the reduction, rounding differently). */
static void compare(const char *what, kolo_dtype dt, const void *gpu, const void *cpu, size_t n)
{
    double tol = dt == KOLO_FLOAT16    ? 2e-2
                 : dt == KOLO_BFLOAT16 ? 3e-2
                 : dt == KOLO_FLOAT32  ? 1e-5
                 : dt == KOLO_FLOAT64  ? 1e-12
                                       : 0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double a = dtype_get(dt, gpu, i), b = dtype_get(dt, cpu, i);
        bool ok = tol == 0 ? a == b : fabs(a - b) <= tol * fmax(1.0, fabs(b));
        if (!ok && !bad++)
            first = i;
    }
    pthread_mutex_lock(&count_mu);
    checks++;
    if (bad) {
        mismatches++;
        fprintf(stderr, "[%s] MISMATCH %s %s: %zu of %zu, first at %zu: gpu %g cpu %g\n", phase,
                what, kolo_dtype_name(dt), bad, n, first, dtype_get(dt, gpu, first),
                dtype_get(dt, cpu, first));
    }
    pthread_mutex_unlock(&count_mu);
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    REQUIRE(g->rt.Malloc(&p, bytes + 16) == cudaSuccess);
    return p;
}

static void to_dev(void *d, const void *h, size_t bytes)
{
    REQUIRE(g->rt.MemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, 0) == cudaSuccess);
    REQUIRE(g->rt.StreamSynchronize(0) == cudaSuccess);
}

static void to_host(void *h, const void *d, size_t bytes)
{
    REQUIRE(g->rt.MemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, 0) == cudaSuccess);
    REQUIRE(g->rt.StreamSynchronize(0) == cudaSuccess);
}

/* Submits and waits; 0 or the error (printed). */
static int run(kolo_ctx *ctx, kolo_request *reqs, int n, kolo_handle *h)
{
    int rv = kolo_submit_stream(ctx, reqs, n, NULL, h);
    if (rv) {
        fprintf(stderr, "[%s] submit %s: %s\n", phase, reqs[0].name, kolo_last_error(ctx));
        return rv;
    }
    int first = 0;
    for (int i = 0; i < n; i++) {
        int w = kolo_wait(ctx, h[i], 60000);
        if (w && !first) {
            first = w;
            fprintf(stderr, "[%s] wait %s: %s (%s)\n", phase, reqs[i].name, kolo_errname(w),
                    kolo_last_error(ctx));
        }
    }
    return first;
}

/* ---------------------------------------------------------------- cases */

static const size_t counts[] = {0, 1, 7, 4099, 1 << 18};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

/* One allreduce (or a group of ntensors fused) on GPU and on CPU. */
static void ar_case(kolo_ctx *ctx, int rank, kolo_dtype dt, kolo_op op, double pre, double post,
                    const size_t *ns, int ntensors, bool in_place)
{
    size_t es = kolo_dtype_size(dt);
    kolo_request rg[8], rc[8];
    void *hin[8], *hcpu[8], *hgpu[8], *din[8], *dout[8];
    int64_t shapes[8][1];
    char names[16][96];
    for (int t = 0; t < ntensors; t++) {
        size_t n = ns[t];
        hin[t] = malloc(n * es + 8);
        hcpu[t] = malloc(n * es + 8);
        hgpu[t] = malloc(n * es + 8);
        fill(dt, hin[t], n, rank, t);
        din[t] = dev_alloc(n * es);
        dout[t] = in_place ? din[t] : dev_alloc(n * es);
        to_dev(din[t], hin[t], n * es);
        shapes[t][0] = (int64_t)n;
        /* same names on every rank: built from the case, not a counter */
        snprintf(names[2 * t], 96, "g.%d.%d.%g.%g.%zu.%d.%d.%d", dt, op, pre, post, n, t, ntensors,
                 in_place);
        snprintf(names[2 * t + 1], 96, "c.%d.%d.%g.%g.%zu.%d.%d.%d", dt, op, pre, post, n, t,
                 ntensors, in_place);
        rg[t] = (kolo_request){.coll = KOLO_COLL_ALLREDUCE,
                               .name = names[2 * t],
                               .sendbuf = din[t],
                               .recvbuf = dout[t],
                               .dtype = dt,
                               .ndim = 1,
                               .shape = shapes[t],
                               .op = op,
                               .prescale = pre,
                               .postscale = post,
                               .device = 0};
        rc[t] = rg[t];
        rc[t].name = names[2 * t + 1];
        rc[t].sendbuf = hin[t];
        rc[t].recvbuf = hcpu[t];
        rc[t].device = -1;
    }
    kolo_handle h[8];
    int a = run(ctx, rg, ntensors, h), b = run(ctx, rc, ntensors, h);
    CHECK_EQ_INT(a, 0);
    CHECK_EQ_INT(b, 0);
    for (int t = 0; t < ntensors; t++) {
        if (!a && !b) {
            to_host(hgpu[t], dout[t], ns[t] * es);
            char what[160];
            snprintf(what, sizeof(what), "allreduce op %d pre %g post %g n %zu (%d of %d)%s", op,
                     pre, post, ns[t], t, ntensors, in_place ? " in place" : "");
            compare(what, dt, hgpu[t], hcpu[t], ns[t]);
        }
        g->rt.Free(din[t]);
        if (!in_place)
            g->rt.Free(dout[t]);
        free(hin[t]);
        free(hcpu[t]);
        free(hgpu[t]);
    }
}

static void t_allreduce(kolo_ctx *ctx, int rank, int size)
{
    (void)size;
    for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
        for (int op = 0; op < KOLO_OP_COUNT; op++)
            for (size_t ci = 0; ci < NCOUNTS; ci++)
                ar_case(ctx, rank, (kolo_dtype)dt, (kolo_op)op, 1.0, 1.0, &counts[ci], 1,
                        ci % 2 == 0);
        /* scaling: folded into NCCL where it can be, kernels otherwise */
        bool fl = dt >= KOLO_FLOAT16;
        size_t n = 4099;
        ar_case(ctx, rank, (kolo_dtype)dt, KOLO_SUM, fl ? 0.5 : 2.0, fl ? 3.0 : 1.0, &n, 1, false);
        ar_case(ctx, rank, (kolo_dtype)dt, KOLO_AVERAGE, fl ? 0.25 : 1.0, fl ? 2.0 : 3.0, &n, 1,
                false);
        ar_case(ctx, rank, (kolo_dtype)dt, KOLO_MAX, 2.0, 0.5, &n, 1, false);
        /* fusion: a group of tensors in the device fusion buffer */
        size_t group[5] = {1, 7, 0, 4099, 300};
        ar_case(ctx, rank, (kolo_dtype)dt, KOLO_SUM, 1.0, 1.0, group, 5, false);
        ar_case(ctx, rank, (kolo_dtype)dt, KOLO_AVERAGE, 1.0, 1.0, group, 5, true);
        ar_case(ctx, rank, (kolo_dtype)dt, KOLO_MIN, fl ? 2.0 : 1.0, 1.0, group, 5, false);
    }
}

/* allgather (uneven rows), broadcast, alltoall (splits), reducescatter. */
static void t_others(kolo_ctx *ctx, int rank, int size)
{
    for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
        size_t es = kolo_dtype_size((kolo_dtype)dt);
        char ng[64], nc[64];
        kolo_handle h[1];
        /* allgather: rank r gives r + 1 rows of 3 */
        {
            size_t n = (size_t)(rank + 1) * 3;
            int64_t shape[2] = {rank + 1, 3};
            void *hin = malloc(n * es), *din = dev_alloc(n * es);
            fill((kolo_dtype)dt, hin, n, rank, 1);
            to_dev(din, hin, n * es);
            snprintf(ng, sizeof(ng), "g.ag.%d", dt);
            snprintf(nc, sizeof(nc), "c.ag.%d", dt);
            kolo_request rg = {.coll = KOLO_COLL_ALLGATHER,
                               .name = ng,
                               .sendbuf = din,
                               .dtype = (kolo_dtype)dt,
                               .ndim = 2,
                               .shape = shape,
                               .device = 0};
            kolo_request rc = rg;
            rc.name = nc;
            rc.sendbuf = hin;
            rc.device = -1;
            kolo_handle hg, hc;
            int a = run(ctx, &rg, 1, &hg), b = run(ctx, &rc, 1, &hc);
            CHECK_EQ_INT(a, 0);
            CHECK_EQ_INT(b, 0);
            if (!a && !b) {
                const void *gd, *cd;
                size_t gb, cb;
                int64_t grows, crows;
                CHECK_EQ_INT(kolo_result(ctx, hg, &gd, &gb, &grows, NULL, NULL), 0);
                CHECK_EQ_INT(kolo_result(ctx, hc, &cd, &cb, &crows, NULL, NULL), 0);
                CHECK_EQ_INT(gb, cb);
                CHECK_EQ_INT(grows, crows);
                void *back = malloc(gb + 1);
                CHECK_EQ_INT(kolo_result_copy(ctx, hg, back, NULL), 0);
                g->rt.StreamSynchronize(0);
                if (gb == cb)
                    compare("allgather", (kolo_dtype)dt, back, cd, gb / es);
                free(back);
                kolo_release(ctx, hg);
                kolo_release(ctx, hc);
            }
            g->rt.Free(din);
            free(hin);
        }
        /* broadcast from the last rank, 4099 elements, in place */
        {
            size_t n = 4099;
            int64_t shape[1] = {(int64_t)n};
            void *hin = malloc(n * es), *hout = malloc(n * es), *din = dev_alloc(n * es);
            fill((kolo_dtype)dt, hin, n, rank, 2);
            to_dev(din, hin, n * es);
            snprintf(ng, sizeof(ng), "g.bc.%d", dt);
            snprintf(nc, sizeof(nc), "c.bc.%d", dt);
            kolo_request rg = {.coll = KOLO_COLL_BROADCAST,
                               .name = ng,
                               .sendbuf = din,
                               .recvbuf = din,
                               .dtype = (kolo_dtype)dt,
                               .ndim = 1,
                               .shape = shape,
                               .root = size - 1,
                               .device = 0};
            kolo_request rc = rg;
            rc.name = nc;
            rc.sendbuf = rc.recvbuf = hin;
            rc.device = -1;
            int a = run(ctx, &rg, 1, h), b = run(ctx, &rc, 1, h);
            CHECK_EQ_INT(a, 0);
            CHECK_EQ_INT(b, 0);
            if (!a && !b) {
                to_host(hout, din, n * es);
                compare("broadcast", (kolo_dtype)dt, hout, hin, n);
            }
            g->rt.Free(din);
            free(hin);
            free(hout);
        }
        /* alltoall: (rank + d) % 3 rows of 2 to rank d */
        {
            int32_t splits[8];
            int64_t rows = 0;
            for (int d = 0; d < size; d++) {
                splits[d] = (rank + d) % 3;
                rows += splits[d];
            }
            int64_t shape[2] = {rows, 2};
            size_t n = (size_t)rows * 2;
            void *hin = malloc(n * es + 8), *din = dev_alloc(n * es);
            fill((kolo_dtype)dt, hin, n, rank, 3);
            to_dev(din, hin, n * es);
            snprintf(ng, sizeof(ng), "g.a2a.%d", dt);
            snprintf(nc, sizeof(nc), "c.a2a.%d", dt);
            kolo_request rg = {.coll = KOLO_COLL_ALLTOALL,
                               .name = ng,
                               .sendbuf = din,
                               .dtype = (kolo_dtype)dt,
                               .ndim = 2,
                               .shape = shape,
                               .splits = splits,
                               .nsplits = size,
                               .device = 0};
            kolo_request rc = rg;
            rc.name = nc;
            rc.sendbuf = hin;
            rc.device = -1;
            kolo_handle hg, hc;
            int a = run(ctx, &rg, 1, &hg), b = run(ctx, &rc, 1, &hc);
            CHECK_EQ_INT(a, 0);
            CHECK_EQ_INT(b, 0);
            if (!a && !b) {
                const void *cd;
                size_t gb, cb;
                const int32_t *gs, *cs;
                CHECK_EQ_INT(kolo_result(ctx, hg, NULL, &gb, NULL, &gs, NULL), 0);
                CHECK_EQ_INT(kolo_result(ctx, hc, &cd, &cb, NULL, &cs, NULL), 0);
                CHECK_EQ_INT(gb, cb);
                for (int d = 0; d < size; d++)
                    CHECK_EQ_INT(gs[d], cs[d]);
                void *back = malloc(gb + 1);
                CHECK_EQ_INT(kolo_result_copy(ctx, hg, back, NULL), 0);
                g->rt.StreamSynchronize(0);
                if (gb == cb)
                    compare("alltoall", (kolo_dtype)dt, back, cd, gb / es);
                free(back);
                kolo_release(ctx, hg);
                kolo_release(ctx, hc);
            }
            g->rt.Free(din);
            free(hin);
        }
        /* reducescatter: 7 rows of 3 (uneven), SUM, and AVERAGE scaled */
        for (int v = 0; v < 2; v++) {
            int64_t shape[2] = {7, 3};
            size_t n = 21, mine = (size_t)(7 / size + (rank < 7 % size ? 1 : 0)) * 3;
            void *hin = malloc(n * es), *hout = malloc(mine * es + 8),
                 *hgpu = malloc(mine * es + 8);
            void *din = dev_alloc(n * es), *dout = dev_alloc(mine * es);
            fill((kolo_dtype)dt, hin, n, rank, 4);
            to_dev(din, hin, n * es);
            snprintf(ng, sizeof(ng), "g.rs.%d.%d", dt, v);
            snprintf(nc, sizeof(nc), "c.rs.%d.%d", dt, v);
            bool fl = dt >= KOLO_FLOAT16;
            kolo_request rg = {.coll = KOLO_COLL_REDUCESCATTER,
                               .name = ng,
                               .sendbuf = din,
                               .recvbuf = dout,
                               .dtype = (kolo_dtype)dt,
                               .ndim = 2,
                               .shape = shape,
                               .op = v ? KOLO_AVERAGE : KOLO_SUM,
                               .prescale = v && fl ? 0.5 : 1.0,
                               .postscale = v ? 3.0 : 1.0,
                               .device = 0};
            kolo_request rc = rg;
            rc.name = nc;
            rc.sendbuf = hin;
            rc.recvbuf = hout;
            rc.device = -1;
            int a = run(ctx, &rg, 1, h), b = run(ctx, &rc, 1, h);
            CHECK_EQ_INT(a, 0);
            CHECK_EQ_INT(b, 0);
            if (!a && !b) {
                to_host(hgpu, dout, mine * es);
                compare(v ? "reducescatter average" : "reducescatter sum", (kolo_dtype)dt, hgpu,
                        hout, mine);
            }
            g->rt.Free(din);
            g->rt.Free(dout);
            free(hin);
            free(hout);
            free(hgpu);
        }
    }
}

/* An in-place SUM allreduce of the shape[0] elements of type dtype at d on
 * GPU 0 (shape must outlive the request). */
static kolo_request gpu_sum_of(const char *name, void *d, kolo_dtype dtype, int64_t *shape)
{
    kolo_request r = {.coll = KOLO_COLL_ALLREDUCE,
                      .name = name,
                      .sendbuf = d,
                      .recvbuf = d,
                      .dtype = dtype,
                      .ndim = 1,
                      .shape = shape,
                      .op = KOLO_SUM,
                      .device = 0};
    return r;
}

/* The same for float32. */
static kolo_request gpu_sum(const char *name, float *d, int64_t *shape)
{
    return gpu_sum_of(name, d, KOLO_FLOAT32, shape);
}

/* The producer's stream: the input is written by a memset queued on a
 * stream of ours, not synchronised; the allreduce must see it. */
static void t_stream_order(kolo_ctx *ctx, int rank, int size)
{
    (void)rank;
    cudaStream_t s;
    REQUIRE(g->rt.StreamCreateWithPriority(&s, cudaStreamNonBlocking, 0) == cudaSuccess);
    size_t n = 8 << 20;
    uint8_t *d = dev_alloc(n), *h = malloc(n);
    int64_t shape[1] = {(int64_t)n};
    for (int round = 1; round <= 3; round++) {
        REQUIRE(g->rt.MemsetAsync(d, round, n, s) == cudaSuccess);
        kolo_request r = gpu_sum_of("order", d, KOLO_UINT8, shape);
        kolo_handle hd;
        REQUIRE(kolo_submit_stream(ctx, &r, 1, s, &hd) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, hd, 60000), 0);
        to_host(h, d, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += h[i] != (uint8_t)(round * size);
        CHECK_EQ_INT(bad, 0);
    }
    g->rt.Free(d);
    free(h);
    g->rt.StreamDestroy(s);
}


/* Join on the GPU: the other ranks joined (naming GPU 0), so rank 0's
 * allreduces get zeros from them - the joined ranks execute those
 * responses with no tensor of their own, on the device their join named. */
static void t_join(kolo_ctx *ctx, int rank, int size)
{
    (void)size;
    size_t n = 1000;
    int64_t shape[1] = {(int64_t)n};
    kolo_request join = {.coll = KOLO_COLL_JOIN, .device = 0};
    kolo_handle h;
    if (rank == 0) {
        float *hb = malloc(n * sizeof(float));
        float *d = dev_alloc(n * sizeof(float));
        for (int step = 0; step < 3; step++) {
            for (size_t i = 0; i < n; i++)
                hb[i] = (float)(i % 5 + step);
            to_dev(d, hb, n * sizeof(float));
            kolo_request r = gpu_sum("joined.sum", d, shape);
            CHECK_EQ_INT(run(ctx, &r, 1, &h), 0);
            to_host(hb, d, n * sizeof(float));
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += hb[i] != (float)(i % 5 + step);
            CHECK_EQ_INT(bad, 0);
        }
        g->rt.Free(d);
        free(hb);
    }
    REQUIRE(kolo_submit(ctx, &join, 1, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 60000), 0);
    int64_t last = -1;
    CHECK_EQ_INT(kolo_result(ctx, h, NULL, NULL, NULL, NULL, &last), 0);
    CHECK_EQ_INT(last, 0);
    kolo_release(ctx, h);
}

/* Latency of a cached GPU allreduce: agreed in the readiness rounds, run
 * by NCCL, completed by the finaliser thread, which must wake the waiter
 * at once (it slept out a 100 ms slice before: 100 ms per op). */
static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void t_latency(kolo_ctx *ctx, int rank, int size)
{
    (void)size;
    float *d = dev_alloc(4 * sizeof(float));
    int64_t shape[1] = {4};
    kolo_request r = gpu_sum("latency", d, shape);
    enum { N = 60 };
    uint64_t us[N];
    kolo_handle h;
    for (int i = 0; i < N + 5; i++) {
        uint64_t t0 = now_mono_us();
        CHECK_EQ_INT(run(ctx, &r, 1, &h), 0);
        if (i >= 5)
            us[i - 5] = now_mono_us() - t0;
    }
    qsort(us, N, sizeof(us[0]), cmp_u64);
    if (rank == 0)
        printf("[%s] cached GPU allreduce, 16 B: median %llu us, p99 %llu us\n", phase,
               (unsigned long long)us[N / 2], (unsigned long long)us[N - 1]);
    CHECK(us[N / 2] < 10000);
    g->rt.Free(d);
}

static void t_all(kolo_ctx *ctx, int rank, int size)
{
    t_allreduce(ctx, rank, size);
    t_others(ctx, rank, size);
    t_stream_order(ctx, rank, size);
    t_latency(ctx, rank, size);
}

/* KOLO_GPU_STAGING=0 with ranks sharing a GPU: whatever NCCL does, the
 * op must end (error or success) well within the deadline. */
static int refused_rc[8];
static char refused_msg[8][600];

static void t_refused(kolo_ctx *ctx, int rank, int size)
{
    (void)size;
    float one = 1.0f;
    float *d = dev_alloc(sizeof(float));
    to_dev(d, &one, sizeof(float));
    int64_t shape[1] = {1};
    kolo_request r = gpu_sum("dup", d, shape);
    kolo_handle h;
    uint64_t t0 = now_mono_ms();
    int rv = kolo_submit(ctx, &r, 1, &h);
    if (!rv)
        rv = kolo_wait(ctx, h, 60000);
    refused_rc[rank] = rv;
    snprintf(refused_msg[rank], sizeof(refused_msg[rank]), "%s (%llu ms)",
             rv ? kolo_last_error(ctx) : "ok", (unsigned long long)(now_mono_ms() - t0));
    CHECK(rv != KOLO_ETIMEDOUT);
    g->rt.Free(d);
}

static void report(const char *name)
{
    printf("[%s] %d comparisons, %d mismatches\n", name, checks, mismatches);
    fflush(stdout);
}

int main(void)
{
    char why[512];
    int gpus = kolo_gpu_count(why, sizeof(why));
    if (gpus <= 0) {
        printf("skipped: no GPU (%s)\n", why);
        return 77;
    }
    g = gpu_libs_load(why, sizeof(why));
    REQUIRE(g);
    REQUIRE(g->rt.SetDevice(0) == cudaSuccess);
    const char *only = getenv("KOLO_TEST_GPU_PHASE");
    job_coord_start();
    if (!only || strcmp(only, "nccl") == 0) {
        phase = "nccl";
        job_run(1, t_all);
        report(phase);
    }
    if (!only || strcmp(only, "hier") == 0) {
        phase = "hier";
        setenv("KOLO_HIERARCHICAL_ALLREDUCE", "force", 1);
        job_run(1, t_allreduce);
        unsetenv("KOLO_HIERARCHICAL_ALLREDUCE");
        report(phase);
    }
    if (!only || strcmp(only, "staged") == 0) {
        phase = "staged2";
        job_run(2, t_all);
        report(phase);
        phase = "staged3";
        job_run(3, t_others);
        report(phase);
        phase = "join";
        job_run(3, t_join);
        report(phase);
    }
    if (!only || strcmp(only, "refused") == 0) {
        phase = "refused";
        setenv("KOLO_GPU_STAGING", "0", 1);
        job_run(2, t_refused);
        unsetenv("KOLO_GPU_STAGING");
        for (int r = 0; r < 2; r++)
            printf("[refused] rank %d: %s: %s\n", r, kolo_errname(refused_rc[r]), refused_msg[r]);
    }
    job_coord_stop();
    CHECK_EQ_INT(mismatches, 0);
    TEST_DONE();
}

#else

int main(void)
{
    printf("skipped: this build has no GPU backend\n");
    return 77;
}

#endif
