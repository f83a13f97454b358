/*
 * test_hosts.c - jobs that span hosts (issue 29), as threads in one
 * process: an in-process coordinator, every rank a thread with its own
 * kolo_ctx and a host id of its own host, so each simulated host's ranks
 * share a segment and hosts meet over real TCP lanes on 127.0.0.1.
 *
 * Shapes: 2 x 2; 3+1+2 with the ranks dealt across the hosts (not
 * numbered host after host) and listening on two loopback addresses (so
 * the coordinator sends the peer table, not its compact form); 4 x 1; 2 x 3; 3+2 (a rank beyond the two
 * lanes, whose shard of a large allreduce is empty); and (argument "big", ctest
 * kolo.worker.hosts_1024) 1,024 ranks on 128 hosts of 8. Every
 * collective is checked exactly for several dtypes and sizes (both of
 * the allreduce's algorithms), the data sockets of every rank are counted
 * against the bound 2 ceil(log2 H) + 4, and kolo_init's time is printed
 * (the 1,024-rank case asserts it stays under KOLO_TEST_INIT_MS).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "coord.h"
#include "hier.h"
#include "kolo.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "test.h"
#include "coord_harness.h"
#include "util.h"
#include "ctx_model.h"

#define CALL_MS (getenv("KOLO_TEST_CALL_MS") ? atoi(getenv("KOLO_TEST_CALL_MS")) : 120000)

static struct coord *coord;
static uint64_t job_id;

/* the shape: rank r lives on host host_of[r] */
static int np, nhosts, *host_of;
/* ranks of a host listen on 127.0.0.1 and 127.0.0.2 by turns: the
 * coordinator then sends the peer table, not its compact form */
static bool mixed_addrs;
static _Atomic int most_sockets, init_ms_max;
/* CPU of kolo_init: the rank threads' own, and the whole process's
 * (coordinator and libkolo's threads too) from the start to the last
 * rank's return, in microseconds */
static _Atomic long long init_cpu_us, init_proc_us, inits_done;
static long long proc_cpu_us(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (long long)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000000 + u.ru_utime.tv_usec +
           u.ru_stime.tv_usec;
}
static long long thread_cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
static pthread_barrier_t started, inited;

static void make_job(void)
{
    char id[32];
    snprintf(id, sizeof id, "sim-%d", np);
    job_id = harness_submit_job(coord_rpc_url(coord), id, np);
}

static int ceil_log2(int n)
{
    int k = 0;
    while ((1 << k) < n)
        k++;
    return k;
}

static bool wait_ok(kolo_ctx *ctx, kolo_handle h, const char *what)
{
    int rc = kolo_wait(ctx, h, CALL_MS);
    if (rc) {
        fprintf(stderr, "%s: %s (%s)\n", what, kolo_strerror(rc), kolo_last_error(ctx));
        pthread_mutex_lock(&ctx->mu);
        fprintf(stderr, "  rank %d: rounds %llu agreed %llu dirty %d busy %d slow %d join %d "
                "inflight %d calls %d cursor %llu resp_base %llu moded %u bits0 %llx exec %d "
                "idling %d\n", ctx->rank, (unsigned long long)ctx->fast_rounds,
                (unsigned long long)ctx->fast_agreed, ctx->fast_dirty, ctx->round_busy,
                ctx->slow_mode, ctx->join_mode, ctx->inflight, ctx->calls,
                (unsigned long long)ctx->cursor, (unsigned long long)ctx->resp_base,
                ctx->moded_ops, (unsigned long long)ctx->ready_bits[0], ctx->executing,
                ctx->idling);
        pthread_mutex_unlock(&ctx->mu);
    }
    CHECK_EQ_INT(rc, 0);
    return rc == 0;
}

/* allreduce: dtypes x ops x counts (the leaders' path and the lanes') */
static void t_allreduce(kolo_ctx *ctx, int rank, int size, bool big)
{
    static const size_t counts[] = {0, 1, 7, 4099, 70000};
    static const struct {
        kolo_dtype dt;
        kolo_op op;
    } kinds[] = {{KOLO_FLOAT32, KOLO_SUM}, {KOLO_INT32, KOLO_MAX}, {KOLO_FLOAT64, KOLO_MIN},
                 {KOLO_INT64, KOLO_SUM},   {KOLO_INT32, KOLO_AVERAGE}};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
            size_t n = counts[ci];
            /* 1,024 ranks: both algorithms for float32 sums, one small
             * count of each other kind (every op goes through the
             * coordinator there: a few seconds each on 2 CPUs) */
            if (big && (k == 0 ? n != 1 && n != 70000 : n != 7))
                continue;
            size_t es = kolo_dtype_size(kinds[k].dt);
            unsigned char *in = malloc(n * es + 8), *out = malloc(n * es + 8);
            for (size_t i = 0; i < n; i++) {
                long v = (long)((rank + 1) * (int)(i % 13 + 1));
                switch (kinds[k].dt) {
                case KOLO_FLOAT32: ((float *)in)[i] = (float)v; break;
                case KOLO_FLOAT64: ((double *)in)[i] = (double)v; break;
                case KOLO_INT32: ((int32_t *)in)[i] = (int32_t)v; break;
                default: ((int64_t *)in)[i] = v; break;
                }
            }
            char name[48];
            snprintf(name, sizeof name, "ar.%zu.%zu", k, n);
            kolo_handle h;
            REQUIRE(kolo_allreduce_async(ctx, name, in, out, n, kinds[k].dt, kinds[k].op, &h) ==
                    0);
            wait_ok(ctx, h, name);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                double m = (double)(i % 13 + 1), want;
                switch (kinds[k].op) {
                case KOLO_SUM: want = m * size * (size + 1) / 2; break;
                case KOLO_MAX: want = m * size; break;
                case KOLO_MIN: want = m; break;
                default: want = floor(m * (size + 1) / 2); break; /* int average of m*(r+1) */
                }
                double got;
                switch (kinds[k].dt) {
                case KOLO_FLOAT32: got = ((float *)out)[i]; break;
                case KOLO_FLOAT64: got = ((double *)out)[i]; break;
                case KOLO_INT32: got = ((int32_t *)out)[i]; break;
                default: got = (double)((int64_t *)out)[i]; break;
                }
                bad += got != want;
            }
            if (bad)
                fprintf(stderr, "rank %d: %s: %zu wrong\n", rank, name, bad);
            CHECK_EQ_INT(bad, 0);
            free(in);
            free(out);
        }
    }
}

static void t_alltoall(kolo_ctx *ctx, int rank, int size)
{
    kolo_handle h;
    const void *data;
    size_t bytes, off;
    int64_t nrows;
    int bad;
    /* alltoall: rank r sends (d % 2) + 1 rows of 2 to rank d, value r*1000+d.
     * Its links to every rank of another host are all in this process:
     * called up to 64 ranks (a million descriptors at 1,024). */
    int32_t *splits = malloc((size_t)size * sizeof(int32_t));
    int64_t total = 0;
    for (int d = 0; d < size; d++) {
        splits[d] = d % 2 + 1;
        total += splits[d];
    }
    int32_t *sendv = malloc((size_t)total * 2 * sizeof(int32_t));
    off = 0;
    for (int d = 0; d < size; d++)
        for (int i = 0; i < splits[d] * 2; i++)
            sendv[off++] = rank * 1000 + d;
    int64_t ashape[2] = {total, 2};
    REQUIRE(kolo_alltoall_async(ctx, "a2a", sendv, 2, ashape, KOLO_INT32, splits, &h) == 0);
    wait_ok(ctx, h, "alltoall");
    const int32_t *recv_splits;
    REQUIRE(kolo_result(ctx, h, &data, &bytes, &nrows, &recv_splits, NULL) == 0);
    CHECK_EQ_INT(nrows, (int64_t)size * (rank % 2 + 1));
    const int32_t *av = data;
    bad = 0;
    off = 0;
    for (int s = 0; s < size; s++) {
        bad += recv_splits[s] != rank % 2 + 1;
        for (int i = 0; i < (rank % 2 + 1) * 2; i++)
            bad += av[off++] != s * 1000 + rank;
    }
    CHECK_EQ_INT(bad, 0);
    kolo_release(ctx, h);
    free(sendv);
    free(splits);
}

static void t_others(kolo_ctx *ctx, int rank, int size, bool big)
{
    kolo_handle h;
    /* allgather, rank r sends r % 3 rows of 2 (some none) */
    int rows_mine = rank % 3;
    int64_t shape[2] = {rows_mine, 2};
    int32_t *rows = malloc((size_t)(rows_mine + 1) * 2 * sizeof(int32_t));
    for (int i = 0; i < rows_mine * 2; i++)
        rows[i] = rank * 100 + i;
    REQUIRE(kolo_allgather_async(ctx, "gather", rows, 2, shape, KOLO_INT32, &h) == 0);
    wait_ok(ctx, h, "allgather");
    const void *data;
    size_t bytes;
    int64_t nrows;
    REQUIRE(kolo_result(ctx, h, &data, &bytes, &nrows, NULL, NULL) == 0);
    const int32_t *g = data;
    size_t off = 0;
    int bad = 0, want_rows = 0;
    for (int r = 0; r < size; r++) {
        want_rows += r % 3;
        for (int i = 0; i < (r % 3) * 2 && off < bytes / 4; i++)
            bad += g[off++] != r * 100 + i;
    }
    CHECK_EQ_INT(nrows, want_rows);
    CHECK_EQ_INT(bad, 0);
    kolo_release(ctx, h);
    free(rows);

    /* broadcast from a rank on the last host, then from rank 1, small and large */
    int roots[2] = {size - 1, size > 1 ? 1 : 0};
    size_t lens[2] = {5, 300000};
    for (int ri = 0; ri < 2; ri++)
        for (int li = 0; li < 2; li++) {
            if (big && ri != li)
                continue; /* small from the last rank, large from rank 1 */
            double *b = malloc(lens[li] * sizeof(double));
            for (size_t i = 0; i < lens[li]; i++)
                b[i] = rank == roots[ri] ? (double)i + 0.5 : -1;
            char name[32];
            snprintf(name, sizeof name, "bcast.%d.%d", ri, li);
            REQUIRE(kolo_broadcast_async(ctx, name, b, lens[li], KOLO_FLOAT64, roots[ri], &h) == 0);
            wait_ok(ctx, h, name);
            size_t wrong = 0;
            for (size_t i = 0; i < lens[li]; i++)
                wrong += b[i] != (double)i + 0.5;
            CHECK_EQ_INT(wrong, 0);
            free(b);
        }

    if (size <= 64)
        t_alltoall(ctx, rank, size);

    /* reducescatter of 2*size+1 rows of 2 floats: uneven split */
    int64_t rrows = 2 * size + 1, rshape[2] = {rrows, 2};
    float *rin = malloc((size_t)rrows * 2 * sizeof(float));
    for (int64_t i = 0; i < rrows * 2; i++)
        rin[i] = (float)i;
    int64_t mine = rrows / size + (rank < rrows % size ? 1 : 0), first = 0;
    float *rout = malloc((size_t)mine * 2 * sizeof(float) + 4);
    REQUIRE(kolo_reducescatter_async(ctx, "rs", rin, rout, 2, rshape, KOLO_FLOAT32, KOLO_SUM,
                                     &h) == 0);
    wait_ok(ctx, h, "reducescatter");
    for (int r = 0; r < rank; r++)
        first += rrows / size + (r < rrows % size ? 1 : 0);
    bad = 0;
    for (int64_t i = 0; i < mine * 2; i++)
        bad += rout[i] != (float)((first * 2 + i) * size);
    CHECK_EQ_INT(bad, 0);
    free(rin);
    free(rout);

    REQUIRE(kolo_barrier_async(ctx, &h) == 0);
    wait_ok(ctx, h, "barrier");
}

/* The same cached allreduce over and over: the readiness rounds agree it
 * between the hosts (the leaders' lane) from the second step on. */
static void t_steps(kolo_ctx *ctx, int rank, int size, int steps)
{
    for (int s = 0; s < steps; s++) {
        float v[3] = {(float)rank, 1, (float)s}, out[3];
        kolo_handle h;
        REQUIRE(kolo_allreduce_async(ctx, "step", v, out, 3, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
        if (!wait_ok(ctx, h, "step")) {
            sleep(5); /* every rank's state printed, then out */
            exit(1);
        }
        CHECK(out[0] == (float)size * (size - 1) / 2 && out[1] == size && out[2] == s * size);
    }
}

struct rank_arg {
    int rank;
    bool big;
};

static void *rank_main(void *p)
{
    struct rank_arg *a = p;
    int r = a->rank, local_rank = 0, local_size = 0;
    for (int x = 0; x < np; x++)
        if (host_of[x] == host_of[r]) {
            local_rank += x < r;
            local_size++;
        }
    char host[32];
    snprintf(host, sizeof host, "sim-host-%d", host_of[r]);
    kolo_config cfg = {.coordinator = coord_rpc_url(coord), .job_id = job_id, .generation = 1,
                       .rank = r, .size = np, .local_rank = local_rank,
                       .local_size = local_size, .host_id = host,
                       .data_addr = mixed_addrs && r % 2 ? "127.0.0.2" : "127.0.0.1",
                       .timeout_ms = CALL_MS};
    pthread_barrier_wait(&started);
    uint64_t t0 = now_mono_ms();
    long long cpu0 = thread_cpu_us();
    kolo_ctx *ctx = NULL;
    int rv = kolo_init(&ctx, &cfg);
    atomic_fetch_add(&init_cpu_us, thread_cpu_us() - cpu0);
    if (atomic_fetch_add(&inits_done, 1) + 1 == np)
        atomic_store(&init_proc_us, proc_cpu_us() - atomic_load(&init_proc_us));
    if (rv)
        fprintf(stderr, "rank %d: kolo_init: %s\n", r, kolo_strerror(rv));
    REQUIRE(rv == 0);
    int took = (int)(now_mono_ms() - t0), seen = atomic_load(&init_ms_max);
    while (took > seen && !atomic_compare_exchange_weak(&init_ms_max, &seen, took)) {
    }
    CHECK_EQ_INT(kolo_local_size(ctx), local_size);
    int socks = hier_sockets(ctx->coll);
    CHECK(strcmp(ctx->coll->ops->name, "hier") == 0);
    int most = atomic_load(&most_sockets);
    while (socks > most && !atomic_compare_exchange_weak(&most_sockets, &most, socks)) {
    }
    if (r == 0)
        fprintf(stderr, "   rank 0 joined in %d ms\n", took);
    if (a->big && getenv("KOLO_TEST_INIT_ONLY")) { /* measuring kolo_init alone */
        if (getenv("KOLO_TEST_NO_FINI"))
            return NULL;
        /* no rank's teardown in the others' kolo_init */
        pthread_barrier_wait(&inited);
        CHECK_EQ_INT(kolo_fini(ctx), 0);
        return NULL;
    }
    t_steps(ctx, r, np, a->big ? 3 : 50);
    if (r == 0)
        fprintf(stderr, "   rank 0: steps done at %llu ms\n",
                (unsigned long long)(now_mono_ms() - t0));
    t_allreduce(ctx, r, np, a->big);
    t_others(ctx, r, np, a->big);
    t_steps(ctx, r, np, a->big ? 2 : 5);
    CHECK_EQ_INT(kolo_fini(ctx), 0);
    return NULL;
}

static void run_shape(const char *what, int n, int h, const int *hosts, bool big)
{
    np = n;
    nhosts = h;
    host_of = (int *)hosts;
    atomic_store(&most_sockets, 0);
    atomic_store(&init_ms_max, 0);
    atomic_store(&init_cpu_us, 0);
    atomic_store(&inits_done, 0);
    make_job();
    atomic_store(&init_proc_us, proc_cpu_us());
    fprintf(stderr, "-- %s: %d ranks on %d hosts\n", what, n, h);
    uint64_t t0 = now_mono_ms();
    pthread_t *t = calloc((size_t)n, sizeof *t);
    struct rank_arg *args = calloc((size_t)n, sizeof *args);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, (size_t)1 << 20);
    pthread_barrier_init(&started, NULL, (unsigned)n);
    pthread_barrier_init(&inited, NULL, (unsigned)n);
    for (int r = 0; r < n; r++) {
        args[r] = (struct rank_arg){r, big};
        REQUIRE(pthread_create(&t[r], &attr, rank_main, &args[r]) == 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(t[r], NULL);
    pthread_barrier_destroy(&started);
    pthread_barrier_destroy(&inited);
    pthread_attr_destroy(&attr);
    int bound = 2 * ceil_log2(h) + 4;
    fprintf(stderr, "   kolo_init: %d ms (slowest rank); data sockets per rank: %d (bound %d); "
            "all in %llu ms\n", atomic_load(&init_ms_max), atomic_load(&most_sockets), bound,
            (unsigned long long)(now_mono_ms() - t0));
    fprintf(stderr, "   kolo_init CPU: %lld ms in the rank threads (%lld us a rank), %lld ms in "
            "the process\n", atomic_load(&init_cpu_us) / 1000, atomic_load(&init_cpu_us) / n,
            atomic_load(&init_proc_us) / 1000);
    CHECK(atomic_load(&most_sockets) <= bound);
    if (big) {
        const char *lim = getenv("KOLO_TEST_INIT_MS");
        CHECK(atomic_load(&init_ms_max) <= (lim ? atoi(lim) : 20000));
    }
    free(t);
    free(args);
}

int main(int argc, char **argv)
{
    bool big = argc > 1 && strcmp(argv[1], "big") == 0;
    /* every rank's sockets, listeners and event fds are this process's */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* ranks outnumber the cores: nobody spins */
    setenv("KOLO_SPIN_US", "0", 1);
    setenv("KOLO_YIELD_US", "0", 1);
    char dir[] = "/tmp/kolo-test-hosts-XXXXXX", db[128], err[512];
    REQUIRE(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/c.db", dir);
    struct coord_config cfg = {
        .listen = "tcp://127.0.0.1:0", .db_path = db, .lease_ms = 3600000, .heartbeat_ms = 1000};
    REQUIRE(coord_start(&coord, &cfg, err, sizeof err) == 0);
    if (big) {
        /* Every op through the coordinator: with readiness rounds, 512 or
         * more ranks in one process stall (some ranks' first Negotiate
         * never reaches the in-process coordinator; issue 29's note).
         * KOLO_TEST_ROUNDS=1 runs them anyway. */
        if (!getenv("KOLO_TEST_ROUNDS"))
            setenv("KOLO_FAST_PATH", "0", 1);
        /* KOLO_TEST_SHAPE=HxL for another size, KOLO_TEST_INIT_ONLY=1 to
         * stop after kolo_init (measuring), and KOLO_TEST_NO_FINI=1 as well
         * to exit right after it (profiling kolo_init without the teardown) */
        int H = 128, L = 8;
        const char *shape = getenv("KOLO_TEST_SHAPE");
        if (shape && sscanf(shape, "%dx%d", &H, &L) != 2)
            H = 128, L = 8;
        static int hosts[4096];
        REQUIRE(H * L <= 4096);
        for (int r = 0; r < H * L; r++)
            hosts[r] = r / L;
        char what[64];
        snprintf(what, sizeof what, "%d hosts x %d", H, L);
        run_shape(what, H * L, H, hosts, true);
        if (getenv("KOLO_TEST_NO_FINI")) /* profiling kolo_init: no teardown either */
            _exit(test_failures ? 1 : 0);
    } else {
        static const int h22[] = {0, 0, 1, 1};
        static const int h312[] = {0, 1, 2, 0, 2, 0}; /* 3+1+2, dealt across the hosts */
        static const int h41[] = {0, 1, 2, 3};
        static const int h23[] = {0, 0, 0, 1, 1, 1};
        static const int h32[] = {0, 1, 0, 1, 0}; /* 3+2: two lanes, rank 4 beyond them */
        for (int fast = 1; fast >= 0; fast--) {
            setenv("KOLO_FAST_PATH", fast ? "1" : "0", 1);
            fprintf(stderr, "== readiness rounds %s\n", fast ? "on" : "off");
            run_shape("2 hosts x 2", 4, 2, h22, false);
            mixed_addrs = true;
            run_shape("3+1+2, ranks dealt across hosts, two addresses", 6, 3, h312, false);
            mixed_addrs = false;
            if (fast) {
                run_shape("4 hosts x 1", 4, 4, h41, false);
                run_shape("2 hosts x 3", 6, 2, h23, false);
                run_shape("3+2, a rank beyond the lanes", 5, 2, h32, false);
            }
        }
        unsetenv("KOLO_FAST_PATH");
    }
    coord_stop(coord);
    test_remove_db(db, dir);
    TEST_DONE();
}
