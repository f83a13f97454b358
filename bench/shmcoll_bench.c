/*
 * shmcoll_bench.c - float32 SUM allreduce latency of the shmcoll backend,
 * measured the way shared/research/peers-bench.md measured Open MPI and
 * Gloo, so the numbers sit side by side:
 *
 *   each iteration is barrier; t0; allreduce (in place); t1, an iteration
 *   takes the longest of the ranks' t1 - t0, and a size reports the median
 *   and the p99 iteration (nearest rank); busbw = size / p50 * 2(n-1)/n.
 *
 * Ranks are forked processes. Not a test: build it by hand against the
 * objects of a build (scripts/build.sh), e.g.
 *   gcc -O3 -march=native -D_GNU_SOURCE -Iinclude -Iworker/coll -Icommon -Inegotiation \
 *       -Ibuild/proto bench/shmcoll_bench.c build/worker/libkolo_worker.a \
 *       build/common/CMakeFiles/kolo_common.dir/*.o \
 *       build/negotiation/CMakeFiles/kolo_negotiation.dir/*.o \
 *       build/CMakeFiles/kolo_proto.dir/proto/kolo.pb-c.c.o \
 *       -lnng -lprotobuf-c -lcrypto -lm -lpthread -ldl -o /tmp/shmcoll_bench
 *   /tmp/shmcoll_bench [-o] [-n 2,4] [-s 4,4096,...] [-x iteration-multiplier]
 *   (-o: out of place, into a separate output buffer)
 *
 * Built with mpicc and -DKOLO_BENCH_MPI, the same program measures Open
 * MPI's MPI_Allreduce (in place) the same way when started by mpirun
 * with -m, so both can be measured side by side on a machine whose load
 * one does not control:
 *   mpirun -np 2 --mca btl vader,self /tmp/shmcoll_bench_mpi -m
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"

#ifdef KOLO_BENCH_MPI
#include <mpi.h>
#endif

#define MAX_RANKS 16

/* -o: out of place (a separate output buffer, allocated and touched once) */
static int out_of_place;
#define MAX_ITERS 4000

struct shared {
    _Atomic int created;
    _Atomic int pids_set;
    int pids[MAX_RANKS];
    _Atomic int bad;
    double t[MAX_RANKS][MAX_ITERS];
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The peers-bench iteration counts: fewer for the big sizes. */
static int iterations_for(size_t bytes)
{
    if (bytes <= 4096)
        return 1000;
    if (bytes <= 65536)
        return 500;
    if (bytes <= (1u << 20))
        return 100;
    if (bytes <= (16u << 20))
        return 20;
    if (bytes <= (64u << 20))
        return 10;
    return 5;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-th percentile of n sorted values (nearest rank): with the few
 * iterations of the big sizes, p99 is the slowest one. */
static double percentile(const double *sorted, int n, double p)
{
    int k = (int)ceil(p / 100 * n) - 1;
    return sorted[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static void print_row(int n, size_t bytes, const double *sorted, int iters, const char *tag)
{
    double us = percentile(sorted, iters, 50), p99 = percentile(sorted, iters, 99);
    printf("%5d %12zu %14.2f %12.2f %12.3f%s\n", n, bytes, us, p99,
           bytes / (us * 1e-6) * 2 * (n - 1) / n / 1e9, tag);
    fflush(stdout);
}

static void rank_main(struct shared *sh, const char *name, int rank, int n, size_t bytes, int iters,
                      int warm)
{
    struct coll *c;
    int rc;
    if (rank == 0) {
        rc = shmcoll_create(name, 0, n, 0, &c);
        atomic_store(&sh->created, rc ? -1 : 1);
    } else {
        while (atomic_load(&sh->created) == 0)
            usleep(100);
        rc = atomic_load(&sh->created) < 0 ? KOLO_EIO : shmcoll_attach(name, rank, n, 0, &c);
    }
    if (rc) {
        fprintf(stderr, "rank %d: create/attach: %s\n", rank, kolo_errname(rc));
        _exit(1);
    }
    while (!atomic_load(&sh->pids_set))
        usleep(100);
    if ((rc = shmcoll_ready(c, sh->pids, 0)) != 0) {
        fprintf(stderr, "rank %d: ready: %s\n", rank, kolo_errname(rc));
        _exit(1);
    }
    size_t count = bytes / sizeof(float);
    size_t alloc = (bytes + 4095) / 4096 * 4096;
    float *buf = aligned_alloc(4096, alloc);
    float *out = out_of_place ? aligned_alloc(4096, alloc) : buf;
    for (size_t i = 0; i < count; i++)
        buf[i] = (float)(rank + 1);
    if (out != buf)
        memset(out, 0, bytes);
    /* One checked run, then warm-up and timed runs on the same buffers. */
    rc = c->ops->allreduce(c, KOLO_FLOAT32, KOLO_SUM, buf, out, count, 0);
    float want = (float)n * (n + 1) / 2;
    if (rc || (count && (out[0] != want || out[count - 1] != want || out[count / 2] != want)))
        atomic_store(&sh->bad, 1);
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f / 1024;
    for (int it = -warm; it < iters && !rc; it++) {
        rc = c->ops->barrier(c, 0);
        double t0 = now_us();
        rc = rc ? rc : c->ops->allreduce(c, KOLO_FLOAT32, KOLO_SUM, buf, out, count, 0);
        double t1 = now_us();
        if (it >= 0)
            sh->t[rank][it] = t1 - t0;
    }
    if (rc) {
        fprintf(stderr, "rank %d: %s (%s)\n", rank, kolo_errname(rc), c->why);
        atomic_store(&sh->bad, 1);
    }
    c->ops->barrier(c, 0);
    c->ops->destroy(c);
    if (out != buf)
        free(out);
    free(buf);
    _exit(0);
}

static int run(int n, size_t bytes, double mult)
{
    struct shared *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return -1;
    int iters = (int)(iterations_for(bytes) * mult);
    if (iters < 3)
        iters = 3;
    if (iters > MAX_ITERS)
        iters = MAX_ITERS;
    int warm = iters / 10 + 2;
    char name[64];
    snprintf(name, sizeof name, "/kolo-bench-%d-%d-%zu", (int)getpid(), n, bytes);
    for (int r = 0; r < n; r++) {
        pid_t p = fork();
        if (p == 0)
            rank_main(sh, name, r, n, bytes, iters, warm);
        sh->pids[r] = (int)p;
    }
    atomic_store(&sh->pids_set, 1);
    int ok = 1;
    for (int r = 0; r < n; r++) {
        int st;
        wait(&st);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    ok &= !atomic_load(&sh->bad);
    double v[MAX_ITERS];
    for (int it = 0; it < iters; it++) {
        v[it] = 0;
        for (int r = 0; r < n; r++)
            if (sh->t[r][it] > v[it])
                v[it] = sh->t[r][it];
    }
    qsort(v, (size_t)iters, sizeof v[0], cmp_double);
    if (ok)
        print_row(n, bytes, v, iters, out_of_place ? "  (kolo, out of place)" : "  (kolo)");
    munmap(sh, sizeof *sh);
    return ok ? 0 : -1;
}

#ifdef KOLO_BENCH_MPI
/* The peer measurement: the same iteration, timed in every rank, the
 * maximum over ranks taken per iteration at the end. */
static void mpi_bench(const size_t *sizes, int nsizes, double mult)
{
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (int b = 0; b < nsizes; b++) {
        size_t bytes = sizes[b], count = bytes / sizeof(float);
        size_t alloc = (bytes + 4095) / 4096 * 4096;
        float *buf = aligned_alloc(4096, alloc);
        float *out = out_of_place ? aligned_alloc(4096, alloc) : NULL;
        for (size_t i = 0; i < count; i++)
            buf[i] = 1.0f / 1024;
        if (out)
            memset(out, 0, bytes);
        int iters = (int)(iterations_for(bytes) * mult);
        iters = iters < 3 ? 3 : iters > MAX_ITERS ? MAX_ITERS : iters;
        static double t[MAX_ITERS], worst[MAX_ITERS];
        for (int it = -(iters / 10 + 2); it < iters; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now_us();
            if (out)
                MPI_Allreduce(buf, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t1 = now_us();
            if (it >= 0)
                t[it] = t1 - t0;
        }
        MPI_Reduce(t, worst, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            qsort(worst, (size_t)iters, sizeof worst[0], cmp_double);
            print_row(n, bytes, worst, iters, out ? "  (MPI, out of place)" : "  (MPI)");
        }
        free(out);
        free(buf);
    }
}
#endif

static int parse_list(const char *s, size_t *out, int max)
{
    int k = 0;
    while (*s && k < max) {
        char *end;
        out[k++] = strtoull(s, &end, 10);
        s = *end ? end + 1 : end;
    }
    return k;
}

int main(int argc, char **argv)
{
    size_t ranks[8] = {2, 4},
           sizes[16] = {4, 4096, 65536, 1u << 20, 16u << 20, 64u << 20, 256u << 20};
    int nranks = 2, nsizes = 7;
    double mult = 1;
    int opt, mpi = 0;
    while ((opt = getopt(argc, argv, "mon:s:x:")) != -1) {
        if (opt == 'n')
            nranks = parse_list(optarg, ranks, 8);
        else if (opt == 's')
            nsizes = parse_list(optarg, sizes, 16);
        else if (opt == 'x')
            mult = atof(optarg);
        else if (opt == 'm')
            mpi = 1;
        else if (opt == 'o')
            out_of_place = 1;
        else {
            fprintf(stderr, "usage: %s [-m] [-o] [-n 2,4] [-s bytes,...] [-x mult]\n", argv[0]);
            return 2;
        }
    }
    if (mpi) {
#ifdef KOLO_BENCH_MPI
        MPI_Init(&argc, &argv);
        mpi_bench(sizes, nsizes, mult);
        MPI_Finalize();
        return 0;
#else
        fprintf(stderr, "%s: built without KOLO_BENCH_MPI\n", argv[0]);
        return 2;
#endif
    }
    printf("%5s %12s %14s %12s %12s\n", "ranks", "bytes", "p50_us", "p99_us", "busbw_GB/s");
    for (int a = 0; a < nranks; a++) {
        int n = (int)ranks[a];
        if (n < 1 || n > MAX_RANKS)
            continue;
        for (int b = 0; b < nsizes; b++) {
            if (run(n, sizes[b], mult) != 0)
                printf("%5d %12zu  FAILED\n", n, sizes[b]);
        }
    }
    return 0;
}
