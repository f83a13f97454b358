/*
 * test_api.c - libkolo end to end: an in-process coordinator, N threads as
 * ranks (each with its own kolo_ctx, so "no library globals" is tested by
 * construction), over shared memory and over TCP.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "kolo.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "round.h"
#include "test.h"
#include "util.h"
#include "ops.h"

static struct coord *coord;
static uint64_t job_id;
static int job_np;
static int use_tcp;

/* Registers a host with np slots and submits an np-rank job, so the
 * coordinator has a running generation for the threads to join. */
static void make_job(int np)
{
    struct rpc_client *cli;
    struct rpc_client_config cc = {.url = coord_rpc_url(coord), .identity = "test"};
    REQUIRE(rpc_client_open(&cli, &cc) == 0);
    char err[512], id[32], inst[32];
    snprintf(id, sizeof(id), "host-%d", np);
    random_hex(inst, 8);
    Kolo__RegisterRequest reg = KOLO__REGISTER_REQUEST__INIT;
    reg.host_id = id;
    reg.name = id;
    reg.hostname = id;
    reg.addr = "127.0.0.1";
    reg.slots = np;
    reg.agent_instance = inst;
    size_t len = kolo__register_request__get_packed_size(&reg);
    uint8_t buf[512];
    kolo__register_request__pack(&reg, buf);
    void *out;
    size_t olen;
    REQUIRE(rpc_client_call(cli, "AgentService.RegisterHost", buf, len, &out, &olen, 3000, err,
                            sizeof(err)) == 0);
    free(out);
    Kolo__SubmitJobRequest sub = KOLO__SUBMIT_JOB_REQUEST__INIT;
    char *argv[] = {"true"};
    sub.argv = argv;
    sub.n_argv = 1;
    sub.np = np;
    sub.hosts = id;
    char hosts[64];
    snprintf(hosts, sizeof(hosts), "%s:%d", id, np);
    sub.hosts = hosts;
    len = kolo__submit_job_request__get_packed_size(&sub);
    kolo__submit_job_request__pack(&sub, buf);
    REQUIRE(rpc_client_call(cli, "AdminService.SubmitJob", buf, len, &out, &olen, 3000, err,
                            sizeof(err)) == 0);
    Kolo__SubmitJobReply *rep = kolo__submit_job_reply__unpack(NULL, olen, out);
    job_id = rep->job_id;
    kolo__submit_job_reply__free_unpacked(rep, NULL);
    free(out);
    rpc_client_close(cli);
    job_np = np;
}

typedef void (*rank_fn)(kolo_ctx *ctx, int rank, int size);

struct thread_arg {
    int rank;
    rank_fn fn;
};

/* Rank `rank` of the job make_job made, all ranks on one host (host,
 * which must outlive the config, holds its id). */
static kolo_config rank_config(int rank, char *host, size_t hostlen)
{
    snprintf(host, hostlen, "host-%d", job_np);
    kolo_config cfg = {.coordinator = coord_rpc_url(coord), .job_id = job_id, .generation = 1,
                       .rank = rank, .size = job_np, .local_rank = rank, .local_size = job_np,
                       .host_id = host, .data_addr = "127.0.0.1", .timeout_ms = 10000,
                       .disable_shm = use_tcp};
    return cfg;
}

static void *rank_main(void *p)
{
    struct thread_arg *a = p;
    char host[32];
    kolo_config cfg = rank_config(a->rank, host, sizeof(host));
    kolo_ctx *ctx = NULL;
    int rv = kolo_init(&ctx, &cfg);
    if (rv)
        fprintf(stderr, "rank %d: kolo_init: %s\n", a->rank, kolo_strerror(rv));
    REQUIRE(rv == 0);
    CHECK_EQ_INT(kolo_rank(ctx), a->rank);
    CHECK_EQ_INT(kolo_size(ctx), job_np);
    a->fn(ctx, a->rank, job_np);
    CHECK_EQ_INT(kolo_fini(ctx), 0);
    return NULL;
}

static void run_ranks(int np, rank_fn fn)
{
    make_job(np);
    pthread_t t[16];
    struct thread_arg args[16];
    for (int r = 0; r < np; r++) {
        args[r] = (struct thread_arg){r, fn};
        pthread_create(&t[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < np; r++)
        pthread_join(t[r], NULL);
}

/* Sessions: every rank calls kolo_init and kolo_fini `cycles` times in
 * the same generation (Horovod's init -> shutdown -> init), reusing one
 * tensor name; rank 0 leaves each session late, so the others' next join
 * waits for it instead of cutting it off. */
struct session_arg {
    int rank, cycles;
};

static void *rank_sessions(void *p)
{
    struct session_arg *a = p;
    char host[32];
    for (int i = 0; i < a->cycles; i++) {
        kolo_config cfg = rank_config(a->rank, host, sizeof(host));
        kolo_ctx *ctx = NULL;
        int rv = kolo_init(&ctx, &cfg);
        if (rv)
            fprintf(stderr, "rank %d, session %d: kolo_init: %s\n", a->rank, i,
                    kolo_strerror(rv));
        REQUIRE(rv == 0);
        CHECK_EQ_INT(ctx->session, (uint32_t)i);
        float x = (float)(a->rank + 1), y = 0;
        kolo_handle h;
        for (int k = 0; k < 3; k++) { /* the same name each session: cached, then rounds */
            REQUIRE(kolo_allreduce_async(ctx, "same.name", &x, &y, 1, KOLO_FLOAT32, KOLO_SUM,
                                         &h) == 0);
            CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
            CHECK(y == (float)(job_np * (job_np + 1) / 2));
        }
        if (a->rank == 0)
            usleep(20000);
        CHECK_EQ_INT(kolo_fini(ctx), 0);
    }
    return NULL;
}

static void run_sessions(int np, int cycles)
{
    make_job(np);
    pthread_t t[16];
    struct session_arg args[16];
    for (int r = 0; r < np; r++) {
        args[r] = (struct session_arg){r, cycles};
        pthread_create(&t[r], NULL, rank_sessions, &args[r]);
    }
    for (int r = 0; r < np; r++)
        pthread_join(t[r], NULL);
}

/* ---------------------------------------------------------------- cases */

static void t_allreduce(kolo_ctx *ctx, int rank, int size)
{
    /* sum of float32, several counts incl. 0; in place and not */
    size_t counts[] = {0, 1, 7, 4099, 1 << 18};
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
        size_t n = counts[ci];
        float *in = malloc((n + 1) * sizeof(float)), *out = malloc((n + 1) * sizeof(float));
        for (size_t i = 0; i < n; i++)
            in[i] = (float)(rank + 1) * (float)(i % 13);
        char name[32];
        snprintf(name, sizeof(name), "sum.%zu", n);
        kolo_handle h;
        REQUIRE(kolo_allreduce_async(ctx, name, in, out, n, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
        float tri = (float)(size * (size + 1) / 2);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += out[i] != tri * (float)(i % 13);
        CHECK_EQ_INT(bad, 0);
        free(in);
        free(out);
    }
    /* average of int32 truncates; max of int64; in place */
    int32_t v[5];
    for (int i = 0; i < 5; i++)
        v[i] = rank * 10 + i;
    kolo_handle h;
    REQUIRE(kolo_allreduce_async(ctx, "avg", v, v, 5, KOLO_INT32, KOLO_AVERAGE, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    int32_t want = 0;
    for (int r = 0; r < size; r++)
        want += r * 10;
    CHECK_EQ_INT(v[0], want / size);
    int64_t m = rank * 3, mo = -1;
    REQUIRE(kolo_allreduce_async(ctx, "max", &m, &mo, 1, KOLO_INT64, KOLO_MAX, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    CHECK_EQ_INT(mo, (size - 1) * 3);
    /* prescale / postscale on float64 */
    double d = 1.0, dout = 0;
    int64_t shape[1] = {1};
    kolo_request req = {.coll = KOLO_COLL_ALLREDUCE,
                        .name = "scaled",
                        .sendbuf = &d,
                        .recvbuf = &dout,
                        .dtype = KOLO_FLOAT64,
                        .ndim = 1,
                        .shape = shape,
                        .op = KOLO_SUM,
                        .prescale = 2.0,
                        .postscale = 0.5,
                        .device = -1};
    REQUIRE(kolo_submit(ctx, &req, 1, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    CHECK(fabs(dout - size) < 1e-12);
}

/* Many tensors at once (fused), repeated (response cache), checked. */
static void t_fused_steps(kolo_ctx *ctx, int rank, int size)
{
    enum { NT = 40, STEPS = 100 };
    float *in[NT], *out[NT];
    size_t n[NT];
    for (int t = 0; t < NT; t++) {
        n[t] = (size_t)(t * 37 % 500 + 1);
        in[t] = malloc(n[t] * sizeof(float));
        out[t] = malloc(n[t] * sizeof(float));
    }
    for (int s = 0; s < STEPS; s++) {
        kolo_handle h[NT];
        for (int t = 0; t < NT; t++) {
            for (size_t i = 0; i < n[t]; i++)
                in[t][i] = (float)(rank + s + t);
            char name[32];
            snprintf(name, sizeof(name), "grad.%d", t);
            REQUIRE(kolo_allreduce_async(ctx, name, in[t], out[t], n[t], KOLO_FLOAT32,
                                         KOLO_AVERAGE, &h[t]) == 0);
        }
        int bad = 0;
        for (int t = 0; t < NT; t++) {
            CHECK_EQ_INT(kolo_wait(ctx, h[t], 10000), 0);
            float want = (float)(size - 1) / 2.0f + (float)(s + t);
            for (size_t i = 0; i < n[t]; i++)
                bad += fabsf(out[t][i] - want) > 1e-4f;
        }
        CHECK_EQ_INT(bad, 0);
    }
    for (int t = 0; t < NT; t++) {
        free(in[t]);
        free(out[t]);
    }
}

static void t_others(kolo_ctx *ctx, int rank, int size)
{
    kolo_handle h;
    /* allgather with uneven first dimensions: rank r sends r+1 rows of 3 */
    int64_t shape[2] = {rank + 1, 3};
    int32_t *rows = malloc((size_t)(rank + 1) * 3 * sizeof(int32_t));
    for (int i = 0; i < (rank + 1) * 3; i++)
        rows[i] = rank * 100 + i;
    REQUIRE(kolo_allgather_async(ctx, "gather", rows, 2, shape, KOLO_INT32, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    const void *data;
    size_t bytes;
    int64_t nrows;
    REQUIRE(kolo_result(ctx, h, &data, &bytes, &nrows, NULL, NULL) == 0);
    CHECK_EQ_INT(nrows, size * (size + 1) / 2);
    const int32_t *g = data;
    size_t off = 0;
    int bad = 0;
    for (int r = 0; r < size; r++)
        for (int i = 0; i < (r + 1) * 3; i++)
            bad += g[off++] != r * 100 + i;
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(kolo_release(ctx, h), 0);
    CHECK_EQ_INT(kolo_release(ctx, h), KOLO_ENOTFOUND);
    free(rows);

    /* broadcast from the last rank */
    double b[4] = {rank, rank, rank, rank};
    REQUIRE(kolo_broadcast_async(ctx, "bcast", b, 4, KOLO_FLOAT64, size - 1, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    CHECK(b[0] == size - 1 && b[3] == size - 1);

    /* alltoall: rank r sends d+1 rows (of 2) to rank d, value r*1000+d */
    int32_t splits[16];
    int64_t total = 0;
    for (int d = 0; d < size; d++) {
        splits[d] = d + 1;
        total += d + 1;
    }
    int16_t *sendv = malloc((size_t)total * 2 * sizeof(int16_t));
    off = 0;
    for (int d = 0; d < size; d++)
        for (int i = 0; i < (d + 1) * 2; i++)
            sendv[off++] = (int16_t)(rank * 100 + d);
    int64_t ashape[2] = {total, 2};
    REQUIRE(kolo_alltoall_async(ctx, "a2a", sendv, 2, ashape, KOLO_INT16, splits, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    const int32_t *recv_splits;
    REQUIRE(kolo_result(ctx, h, &data, &bytes, &nrows, &recv_splits, NULL) == 0);
    CHECK_EQ_INT(nrows, (int64_t)size * (rank + 1));
    const int16_t *av = data;
    bad = 0;
    off = 0;
    for (int s = 0; s < size; s++) {
        bad += recv_splits[s] != rank + 1;
        for (int i = 0; i < (rank + 1) * 2; i++)
            bad += av[off++] != s * 100 + rank;
    }
    CHECK_EQ_INT(bad, 0);
    kolo_release(ctx, h);
    free(sendv);

    /* reducescatter of 2*size+1 rows of 2 floats: uneven split */
    int64_t rrows = 2 * size + 1;
    int64_t rshape[2] = {rrows, 2};
    float *rin = malloc((size_t)rrows * 2 * sizeof(float));
    for (int64_t i = 0; i < rrows * 2; i++)
        rin[i] = (float)i;
    int64_t mine = rrows / size + (rank < rrows % size ? 1 : 0);
    float *rout = malloc((size_t)mine * 2 * sizeof(float) + 4);
    REQUIRE(kolo_reducescatter_async(ctx, "rs", rin, rout, 2, rshape, KOLO_FLOAT32, KOLO_SUM,
                                     &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    int64_t first = 0;
    for (int r = 0; r < rank; r++)
        first += rrows / size + (r < rrows % size ? 1 : 0);
    bad = 0;
    for (int64_t i = 0; i < mine * 2; i++)
        bad += rout[i] != (float)((first * 2 + i) * size);
    CHECK_EQ_INT(bad, 0);
    free(rin);
    free(rout);

    /* barrier */
    REQUIRE(kolo_barrier_async(ctx, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
}

/* Mismatches give the same error on every rank; a duplicate name fails
 * at submission; the context keeps working afterwards. */
static void t_errors(kolo_ctx *ctx, int rank, int size)
{
    kolo_handle h, h2;
    float f[4] = {0};
    /* shape mismatch: rank 0 sends 3 elements, others 4 */
    REQUIRE(kolo_allreduce_async(ctx, "bad.shape", f, f, rank == 0 ? 3 : 4, KOLO_FLOAT32,
                                 KOLO_SUM, &h) == 0);
    if (size == 1) {
        CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
        return; /* one rank cannot disagree with itself */
    }
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), KOLO_EMISMATCH);
    CHECK(strstr(kolo_last_error(ctx), "Mismatched ALLREDUCE tensor shapes") != NULL);
    /* dtype mismatch */
    REQUIRE(kolo_allreduce_async(ctx, "bad.type", f, f, 1, rank == 0 ? KOLO_INT32 : KOLO_FLOAT32,
                                 KOLO_SUM, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), KOLO_EMISMATCH);
    CHECK(strstr(kolo_last_error(ctx), "Mismatched data types") != NULL);
    /* op mismatch */
    REQUIRE(kolo_allreduce_async(ctx, "bad.op", f, f, 1, KOLO_FLOAT32,
                                 rank == 0 ? KOLO_MIN : KOLO_MAX, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), KOLO_EMISMATCH);
    CHECK(strstr(kolo_last_error(ctx), "Mismatched reduction operation") != NULL);
    /* broadcast root mismatch */
    REQUIRE(kolo_broadcast_async(ctx, "bad.root", f, 1, KOLO_FLOAT32, rank == 0 ? 0 : size - 1,
                                 &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), size > 1 ? KOLO_EMISMATCH : 0);
    /* collective kind mismatch */
    if (rank == 0)
        REQUIRE(kolo_allreduce_async(ctx, "bad.kind", f, f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    else
        REQUIRE(kolo_broadcast_async(ctx, "bad.kind", f, 1, KOLO_FLOAT32, 0, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), size > 1 ? KOLO_EMISMATCH : 0);
    /* duplicate names: within one submission, and against an op in flight
     * (a group of two where the first one is still queued: deterministic) */
    int64_t one_shape[1] = {1};
    kolo_request two[2] = {{.coll = KOLO_COLL_ALLREDUCE, .name = "dup", .sendbuf = f,
                            .recvbuf = f, .dtype = KOLO_FLOAT32, .ndim = 1,
                            .shape = one_shape, .device = -1},
                           {.coll = KOLO_COLL_ALLREDUCE, .name = "dup", .sendbuf = f,
                            .recvbuf = f, .dtype = KOLO_FLOAT32, .ndim = 1,
                            .shape = one_shape, .device = -1}};
    kolo_handle hs[2];
    CHECK_EQ_INT(kolo_submit(ctx, two, 2, hs), KOLO_EEXIST);
    CHECK(strstr(kolo_last_error(ctx), "same name") != NULL);
    if (rank == 0) {
        /* only rank 0 submits "lonely": it stays in flight */
        REQUIRE(kolo_allreduce_async(ctx, "lonely", f, f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
        CHECK_EQ_INT(kolo_allreduce_async(ctx, "lonely", f, f, 1, KOLO_FLOAT32, KOLO_SUM, &h2),
                     KOLO_EEXIST);
        CHECK_EQ_INT(kolo_wait(ctx, h, 0), KOLO_ETIMEDOUT);
    }
    (void)h2;
    /* local argument errors */
    CHECK_EQ_INT(kolo_allreduce_async(ctx, "x", f, f, 1, (kolo_dtype)99, KOLO_SUM, &h),
                 KOLO_EINVAL);
    CHECK_EQ_INT(kolo_broadcast_async(ctx, "x", f, 1, KOLO_FLOAT32, size, &h), KOLO_EINVAL);
    /* an empty group says so, not the refusal before it */
    CHECK_EQ_INT(kolo_submit(ctx, two, 0, hs), KOLO_EINVAL);
    CHECK(strstr(kolo_last_error(ctx), "no request") != NULL);
    CHECK_EQ_INT(kolo_wait(ctx, 12345, 0), KOLO_ENOTFOUND);
    int done = 0;
    CHECK_EQ_INT(kolo_poll(ctx, -7, &done), KOLO_ENOTFOUND);
    /* unnamed ops match by order */
    float one = 1, sum = 0;
    REQUIRE(kolo_allreduce_async(ctx, NULL, &one, &sum, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    CHECK(sum == (float)size);
}

/* Join: the last rank joins early; the others keep reducing; the joined
 * rank contributes zeros; all learn the last rank to join. */
static void t_join(kolo_ctx *ctx, int rank, int size)
{
    kolo_handle h;
    int64_t last = -1;
    if (rank == size - 1 && size > 1) {
        REQUIRE(kolo_join_async(ctx, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
        REQUIRE(kolo_result(ctx, h, NULL, NULL, NULL, NULL, &last) == 0);
        kolo_release(ctx, h);
        CHECK(last != size - 1);
        return;
    }
    for (int s = 0; s < 5; s++) {
        float v = 1.0f, out = 0;
        char name[32];
        snprintf(name, sizeof(name), "j.%d", s);
        REQUIRE(kolo_allreduce_async(ctx, name, &v, &out, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
        CHECK(out == (float)(size > 1 ? size - 1 : 1));
    }
    REQUIRE(kolo_join_async(ctx, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    REQUIRE(kolo_result(ctx, h, NULL, NULL, NULL, NULL, &last) == 0);
    kolo_release(ctx, h);
    CHECK(last >= 0 && last < size);
}

/* A round counter of ctx, read under its lock (the background thread
 * runs rounds too). */
static uint64_t locked_u64(kolo_ctx *ctx, const uint64_t *field)
{
    pthread_mutex_lock(&ctx->mu);
    uint64_t v = *field;
    pthread_mutex_unlock(&ctx->mu);
    return v;
}

/* Readiness rounds: 200 named tensors of mixed dtypes, submitted in a
 * different random order on every rank with random pauses, over several
 * steps; every result exact, and after the first step the ranks agreed on
 * them among themselves (the coordinator saw none of them again). A few
 * tensors are new every step (slow path mixed in), and barriers run back
 * to back with the allreduces. */
static void t_fast_order(kolo_ctx *ctx, int rank, int size)
{
    enum { NT = 200, STEPS = 4 };
    static __thread double vals[NT][3];
    static __thread int32_t ivals[NT][5];
    unsigned seed = (unsigned)(rank * 7919 + 17);
    for (int s = 0; s < STEPS; s++) {
        int order[NT];
        for (int i = 0; i < NT; i++)
            order[i] = i;
        for (int i = NT - 1; i > 0; i--) {
            int j = (int)(rand_r(&seed) % (unsigned)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        kolo_handle h[NT + 2];
        for (int i = 0; i < NT; i++) {
            int t = order[i];
            char name[32];
            snprintf(name, sizeof(name), "ord.%d", t);
            if (t % 2) {
                for (int k = 0; k < 3; k++)
                    vals[t][k] = rank + t + s + k;
                REQUIRE(kolo_allreduce_async(ctx, name, vals[t], vals[t], 3, KOLO_FLOAT64,
                                             KOLO_SUM, &h[t]) == 0);
            } else {
                for (int k = 0; k < 5; k++)
                    ivals[t][k] = rank * 3 + t + s - k;
                REQUIRE(kolo_allreduce_async(ctx, name, ivals[t], ivals[t], 5, KOLO_INT32,
                                             KOLO_MAX, &h[t]) == 0);
            }
            if (rand_r(&seed) % 50 == 0)
                usleep(rand_r(&seed) % 2000);
        }
        /* a first-time tensor every step, and a barrier */
        char fresh[32];
        snprintf(fresh, sizeof(fresh), "fresh.%d", s);
        float f = 1.0f;
        REQUIRE(kolo_allreduce_async(ctx, fresh, &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h[NT]) == 0);
        REQUIRE(kolo_barrier_async(ctx, &h[NT + 1]) == 0);
        int bad = 0;
        for (int t = 0; t < NT + 2; t++)
            CHECK_EQ_INT(kolo_wait(ctx, h[t], 20000), 0);
        for (int t = 0; t < NT; t++) {
            if (t % 2) {
                for (int k = 0; k < 3; k++)
                    bad += vals[t][k] != (double)(size * (size - 1) / 2 + size * (t + s + k));
            } else {
                for (int k = 0; k < 5; k++)
                    bad += ivals[t][k] != (size - 1) * 3 + t + s - k;
            }
        }
        bad += f != (float)size;
        CHECK_EQ_INT(bad, 0);
    }
    if (size > 1 && ctx->fast) {
        /* steps 1..3 were agreed by the ranks: at least 3 x 200 tensors */
        CHECK(locked_u64(ctx, &ctx->fast_agreed) >= 3 * NT);
        CHECK(locked_u64(ctx, &ctx->fast_rounds) > 0);
    }
}

/* Readiness rounds: tensors of a few bytes ride inside the round that
 * agrees them (round.h, "The payload"). A float32 sum whose value depends
 * on the order of the additions (1e8 + 1 - 1e8) comes out with the same
 * bits on every rank; a float64 average with pre- and postscale, an int64
 * max and a 0-element tensor come out exact; once cached, the rounds
 * completed them from the payload. */
#define TINY_STEPS 40
/* each rank's float32 sums, as bits; atomics, because the barrier that
 * orders the ranks' writes before the reads is libkolo's, not one that
 * ThreadSanitizer knows */
static uint32_t tiny_sum[8][TINY_STEPS];

static void t_fast_tiny(kolo_ctx *ctx, int rank, int size)
{
    static const float parts[4] = {1e8f, 1.0f, -1e8f, 3.5f};
    for (int s = 0; s < TINY_STEPS; s++) {
        float f[2] = {parts[rank % 4] * (float)(1 + s % 3), (float)rank};
        double d[3] = {rank + 0.5, -rank, s};
        int64_t m = rank == s % size ? 1000 + s : -s;
        float none = 7.0f;
        int64_t shape_f = 2, shape_d = 3, shape_0 = 0;
        kolo_request req[4] = {
            {.coll = KOLO_COLL_ALLREDUCE, .name = "tiny.f", .sendbuf = f, .recvbuf = f,
             .dtype = KOLO_FLOAT32, .ndim = 1, .shape = &shape_f, .op = KOLO_SUM, .device = -1},
            {.coll = KOLO_COLL_ALLREDUCE, .name = "tiny.d", .sendbuf = d, .recvbuf = d,
             .dtype = KOLO_FLOAT64, .ndim = 1, .shape = &shape_d, .op = KOLO_AVERAGE,
             .prescale = 2.0, .postscale = 0.25, .device = -1},
            {.coll = KOLO_COLL_ALLREDUCE, .name = "tiny.m", .sendbuf = &m, .recvbuf = &m,
             .dtype = KOLO_INT64, .ndim = 0, .op = KOLO_MAX, .device = -1},
            {.coll = KOLO_COLL_ALLREDUCE, .name = "tiny.0", .sendbuf = &none, .recvbuf = &none,
             .dtype = KOLO_FLOAT32, .ndim = 1, .shape = &shape_0, .op = KOLO_SUM, .device = -1},
        };
        kolo_handle h[4];
        /* one at a time, in a different order per rank and step */
        for (int i = 0; i < 4; i++)
            REQUIRE(kolo_submit(ctx, &req[(i + rank + s) % 4], 1, &h[(i + rank + s) % 4]) == 0);
        for (int i = 0; i < 4; i++)
            CHECK_EQ_INT(kolo_wait(ctx, h[i], 20000), 0);
        uint32_t bits;
        memcpy(&bits, &f[0], sizeof bits);
        __atomic_store_n(&tiny_sum[rank][s], bits, __ATOMIC_RELEASE);
        CHECK(f[1] == (float)(size * (size - 1) / 2));
        double mean0 = 0, mean1 = 0;
        for (int r = 0; r < size; r++) {
            mean0 += (r + 0.5) * 2.0;
            mean1 += -r * 2.0;
        }
        CHECK(fabs(d[0] - mean0 / size * 0.25) < 1e-12);
        CHECK(fabs(d[1] - mean1 / size * 0.25) < 1e-12);
        CHECK(d[2] == s * 0.5);
        CHECK_EQ_INT(m, 1000 + s);
        CHECK(none == 7.0f);
    }
    kolo_handle b;
    REQUIRE(kolo_barrier_async(ctx, &b) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, b, 20000), 0);
    int differ = 0;
    for (int s = 0; s < TINY_STEPS; s++)
        differ += __atomic_load_n(&tiny_sum[rank][s], __ATOMIC_ACQUIRE) !=
                  __atomic_load_n(&tiny_sum[0][s], __ATOMIC_ACQUIRE);
    CHECK_EQ_INT(differ, 0);
    if (size > 1 && ctx->fast)
        CHECK(locked_u64(ctx, &ctx->fast_inline) >= (TINY_STEPS - 2) * 3);
}

/* Readiness rounds carry broadcasts too (a broadcast_object, an elastic
 * commit's check): named host broadcasts of several roots and sizes (0
 * bytes, a few bytes, 2 MiB), mixed with allreduces of the same dtype and
 * submitted in a different order on every rank, come out exact every
 * step and, once cached, are agreed by the ranks (never fused with the
 * allreduces beside them); a root that differs on one rank gets the
 * coordinator's mismatch text; a root changed on every rank renegotiates. */
static void t_fast_bcast(kolo_ctx *ctx, int rank, int size)
{
    enum { NB = 4, STEPS = 5, BIG = 512 * 1024 };
    static const size_t counts[NB] = {1, 3, 0, BIG};
    float *buf[NB], ar[NB][3];
    for (int i = 0; i < NB; i++)
        REQUIRE((buf[i] = malloc((counts[i] + 1) * sizeof(float))) != NULL);
    uint64_t agreed0 = locked_u64(ctx, &ctx->fast_agreed);
    for (int s = 0; s < STEPS; s++) {
        kolo_handle h[2 * NB];
        for (int x = 0; x < NB; x++) {
            int i = (x + rank + s) % NB, root = i % size;
            for (size_t k = 0; k < counts[i]; k++)
                buf[i][k] = rank == root ? (float)(1000 * s + 10 * i + (int)(k % 7)) : -1.0f;
            for (int k = 0; k < 3; k++)
                ar[i][k] = (float)(rank + k);
            char name[32];
            snprintf(name, sizeof name, "bc.%d", i);
            REQUIRE(kolo_broadcast_async(ctx, name, buf[i], counts[i], KOLO_FLOAT32, root,
                                         &h[2 * i]) == 0);
            snprintf(name, sizeof name, "bc.ar.%d", i);
            REQUIRE(kolo_allreduce_async(ctx, name, ar[i], ar[i], 3, KOLO_FLOAT32, KOLO_SUM,
                                         &h[2 * i + 1]) == 0);
        }
        for (int i = 0; i < 2 * NB; i++)
            CHECK_EQ_INT(kolo_wait(ctx, h[i], 20000), 0);
        int bad = 0;
        for (int i = 0; i < NB; i++) {
            for (size_t k = 0; k < counts[i]; k++)
                bad += buf[i][k] != (float)(1000 * s + 10 * i + (int)(k % 7));
            for (int k = 0; k < 3; k++)
                bad += ar[i][k] != (float)(size * (size - 1) / 2 + size * k);
        }
        CHECK_EQ_INT(bad, 0);
    }
    if (size > 1 && ctx->fast) /* steps 1..4 agreed by the ranks */
        CHECK(locked_u64(ctx, &ctx->fast_agreed) - agreed0 >= (STEPS - 1) * 2 * NB);
    kolo_handle h;
    if (size > 1) {
        buf[1][0] = 5;
        REQUIRE(kolo_broadcast_async(ctx, "bc.1", buf[1], counts[1], KOLO_FLOAT32,
                                     rank == 0 ? 0 : 1, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 20000), KOLO_EMISMATCH);
        CHECK(strstr(kolo_last_error(ctx), "Mismatched BROADCAST root ranks") != NULL);
    }
    for (int s = 0; s < 3; s++) {
        int root = size - 1;
        buf[1][0] = rank == root ? 42.0f + (float)s : 0.0f;
        REQUIRE(kolo_broadcast_async(ctx, "bc.1", buf[1], 1, KOLO_FLOAT32, root, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 20000), 0);
        CHECK(buf[1][0] == 42.0f + (float)s);
    }
    for (int i = 0; i < NB; i++)
        free(buf[i]);
}

/* Readiness rounds: a cached tensor whose signature changes on one rank
 * gets the coordinator's mismatch text on every rank; the same change on
 * every rank renegotiates it and it runs. */
static void t_fast_mismatch(kolo_ctx *ctx, int rank, int size)
{
    float f[4] = {1, 1, 1, 1};
    kolo_handle h;
    for (int s = 0; s < 3; s++) {
        REQUIRE(kolo_allreduce_async(ctx, "cached", f, f, 4, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 20000), 0);
        for (int i = 0; i < 4; i++)
            f[i] = 1;
    }
    if (size > 1) {
        REQUIRE(kolo_allreduce_async(ctx, "cached", f, f, rank == 0 ? 3 : 4, KOLO_FLOAT32,
                                     KOLO_SUM, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 20000), KOLO_EMISMATCH);
        CHECK(strstr(kolo_last_error(ctx), "Mismatched ALLREDUCE tensor shapes") != NULL);
    }
    /* the same change everywhere: renegotiated, then cached again */
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 4; i++)
            f[i] = 2;
        REQUIRE(kolo_allreduce_async(ctx, "cached", f, f, 2, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 20000), 0);
        CHECK(f[0] == 2.0f * (float)size && f[1] == 2.0f * (float)size && f[2] == 2.0f);
    }
    /* barriers back to back */
    for (int s = 0; s < 20; s++) {
        REQUIRE(kolo_barrier_async(ctx, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 20000), 0);
    }
}

/* Stall inspector: rank 1 never submits "stuck"; with a 1 s warning and a
 * 2 s shutdown time the others fail with a message naming rank 1. */
static void t_stall(kolo_ctx *ctx, int rank, int size)
{
    kolo_handle h;
    float f = 1;
    if (rank == 1) {
        usleep(3000 * 1000);
        /* the generation was shut down meanwhile: new work fails too, at
         * submission when this rank heard it already (its long-poll),
         * else when it waits */
        int rc = kolo_allreduce_async(ctx, "after", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h);
        if (rc == 0)
            rc = kolo_wait(ctx, h, 10000);
        CHECK(rc != 0);
        CHECK(strstr(kolo_last_error(ctx), "stall") != NULL);
        return;
    }
    uint64_t t0 = now_mono_ms();
    REQUIRE(kolo_allreduce_async(ctx, "stuck", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), KOLO_ETIMEDOUT);
    uint64_t took = now_mono_ms() - t0;
    CHECK(took >= 1500 && took < 5000);
    CHECK(strstr(kolo_last_error(ctx), "stall shutdown") != NULL);
    CHECK(strstr(kolo_last_error(ctx), "rank(s) 1") != NULL);
    (void)size;
}

/* Shutdown while the others' cached ops are pending (issue 13): every rank
 * reduces "held" twice (cached from then on, so with rounds it no longer
 * goes to the coordinator), then the last rank calls kolo_fini while the
 * others wait for "held" again. They fail at once, with Horovod's text
 * naming the rank that left, not with a timeout or a bare peer error. */
static void t_shutdown_pending(kolo_ctx *ctx, int rank, int size)
{
    kolo_handle h;
    float f = 1;
    for (int i = 0; i < 2; i++) {
        REQUIRE(kolo_allreduce_async(ctx, "held", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    }
    if (rank == size - 1) {
        usleep(200 * 1000); /* the others' ops are pending by now */
        return;             /* rank_main calls kolo_fini */
    }
    uint64_t t0 = now_mono_ms();
    REQUIRE(kolo_allreduce_async(ctx, "held", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    int rc = kolo_wait(ctx, h, 10000);
    uint64_t took = now_mono_ms() - t0;
    CHECK_EQ_INT(rc, KOLO_ESHUTDOWN);
    if (!strstr(kolo_last_error(ctx), "Horovod has been shut down") ||
        !strstr(kolo_last_error(ctx), "left the job"))
        fprintf(stderr, "rank %d: %s\n", rank, kolo_last_error(ctx));
    CHECK(strstr(kolo_last_error(ctx), "Horovod has been shut down") != NULL);
    CHECK(strstr(kolo_last_error(ctx), "left the job") != NULL);
    CHECK(took < 1800); /* 200 ms until the leave, then at once */
    /* and so does new work */
    rc = kolo_allreduce_async(ctx, "after", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h);
    if (rc == 0)
        rc = kolo_wait(ctx, h, 10000);
    CHECK_EQ_INT(rc, KOLO_ESHUTDOWN);
}

/* kolo_abort from another thread while a collective runs: the waiter must
 * not get its op back before the data plane is done with its buffers (it
 * frees or reuses them at once, as Python does). The sentinel written after
 * kolo_wait returns must survive: a late write of the result would show. */
struct abort_arg {
    kolo_ctx *ctx;
    bool fired;
};

static void *abort_when_running(void *p)
{
    struct abort_arg *a = p;
    for (int i = 0; i < 5000 && !a->fired; i++) {
        pthread_mutex_lock(&a->ctx->mu);
        bool running = a->ctx->executing;
        pthread_mutex_unlock(&a->ctx->mu);
        if (running) {
            usleep(1000);
            kolo_abort(a->ctx, "test: abort while a collective runs");
            a->fired = true;
        } else {
            usleep(200);
        }
    }
    return NULL;
}

/* Set by rank 0 once it has checked its buffer. */
static _Atomic int abort_checked;

/* 16 MiB: the collective takes milliseconds; under a sanitizer 1 MiB
 * takes that long already (16 MiB took 7 s under ThreadSanitizer). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define ABORT_COUNT ((size_t)1 << 18)
#else
#define ABORT_COUNT ((size_t)4 << 20)
#endif

static void t_abort_running(kolo_ctx *ctx, int rank, int size)
{
    const size_t n = ABORT_COUNT;
    float *in = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    REQUIRE(in && out);
    for (size_t i = 0; i < n; i++)
        in[i] = 1.0f;
    kolo_handle h;
    REQUIRE(kolo_allreduce_async(ctx, "abort.big", in, out, n, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    if (rank != 0) {
        /* Done or failed: both are fine. An op that rank 0's abort cut
         * off here would wait out the peer's liveness window (10 s; its
         * peer is a thread of this same, living process): once rank 0
         * has checked, or after 20 s whatever rank 0 does, this rank
         * aborts too if its op still runs. */
        int rc;
        uint64_t until = now_mono_ms() + 20000;
        while ((rc = kolo_wait(ctx, h, 100)) == KOLO_ETIMEDOUT && !atomic_load(&abort_checked) &&
               now_mono_ms() < until)
            ;
        if (rc == KOLO_ETIMEDOUT) {
            kolo_abort(ctx, "test: rank 0 is done");
            (void)kolo_wait(ctx, h, 20000);
        }
        free(in);
        free(out);
        return;
    }
    struct abort_arg a = {.ctx = ctx};
    pthread_t t;
    pthread_create(&t, NULL, abort_when_running, &a);
    int rc = kolo_wait(ctx, h, 20000);
    CHECK(rc != KOLO_ETIMEDOUT);
    memset(out, 0x7f, n * sizeof(float));
    pthread_join(t, NULL);
    usleep(200 * 1000);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += ((const unsigned char *)out)[i * sizeof(float)] != 0x7f;
    if (bad)
        fprintf(stderr, "abort while running: %zu element(s) written after kolo_wait (%s)\n",
                bad, a.fired ? "aborted" : "no abort");
    CHECK(bad == 0);
    atomic_store(&abort_checked, 1);
    free(in);
    free(out);
    (void)size;
}

/* More named tensors than the rounds have cache ids (ROUND_MAX_ID): the
 * coordinator gives the ids given longest ago to new names, and every rank
 * drops the old holder at the same log entry. Rank 1 has keep.3 pending in
 * its rounds when keep.3's id goes to another name: its op goes to the
 * coordinator in full, where the other ranks' keep.3 (a cache miss now)
 * meets it. Every result exact; evicted names are cached again. */
static void t_fast_evict(kolo_ctx *ctx, int rank, int size)
{
    enum { KEEP = 10, FILL = ROUND_MAX_ID - KEEP + 20, BATCH = 256 };
    static __thread float fill[BATCH];
    kolo_handle h[BATCH];
    float keep[KEEP];
    for (int k = 0; k < KEEP; k++) { /* the oldest ids */
        char name[32];
        snprintf(name, sizeof(name), "keep.%d", k);
        keep[k] = (float)(rank + k);
        REQUIRE(kolo_allreduce_async(ctx, name, &keep[k], &keep[k], 1, KOLO_FLOAT32, KOLO_SUM,
                                     &h[k]) == 0);
    }
    for (int k = 0; k < KEEP; k++) {
        CHECK_EQ_INT(kolo_wait(ctx, h[k], 20000), 0);
        CHECK(keep[k] == (float)(size * k + size * (size - 1) / 2));
    }
    float k3 = (float)(rank + 3);
    kolo_handle hk = 0;
    if (rank == 1)
        REQUIRE(kolo_allreduce_async(ctx, "keep.3", &k3, &k3, 1, KOLO_FLOAT32, KOLO_SUM, &hk) == 0);
    for (int b = 0; b < FILL; b += BATCH) {
        int n = FILL - b < BATCH ? FILL - b : BATCH;
        for (int i = 0; i < n; i++) {
            char name[32];
            snprintf(name, sizeof(name), "fill.%d", b + i);
            fill[i] = 1.0f;
            REQUIRE(kolo_allreduce_async(ctx, name, &fill[i], &fill[i], 1, KOLO_FLOAT32, KOLO_SUM,
                                         &h[i]) == 0);
        }
        int bad = 0;
        for (int i = 0; i < n; i++) {
            CHECK_EQ_INT(kolo_wait(ctx, h[i], 30000), 0);
            bad += fill[i] != (float)size;
        }
        CHECK_EQ_INT(bad, 0);
    }
    if (rank != 1)
        REQUIRE(kolo_allreduce_async(ctx, "keep.3", &k3, &k3, 1, KOLO_FLOAT32, KOLO_SUM, &hk) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, hk, 30000), 0);
    CHECK(k3 == (float)(size * 3 + size * (size - 1) / 2));
    /* keep.* (evicted: renegotiated once, then cached again) in one step
     * with the fill names that took their ids and the next ones (cached
     * under those ids), ranks in opposite orders: a rank that still mapped
     * an old name to its id would pair it with another rank's new one */
    enum { NEW0 = ROUND_MAX_ID - KEEP, NNEW = 20 };
    float fresh[NNEW];
    uint64_t agreed0 = 0;
    for (int s = 0; s < 3; s++) {
        if (s == 2)
            agreed0 = locked_u64(ctx, &ctx->fast_agreed);
        for (int i = 0; i < KEEP + NNEW; i++) {
            int j = rank % 2 ? KEEP + NNEW - 1 - i : i;
            char name[32];
            float *v;
            if (j < KEEP) {
                snprintf(name, sizeof(name), "keep.%d", j);
                v = &keep[j];
                *v = (float)(rank + j + s);
            } else {
                snprintf(name, sizeof(name), "fill.%d", NEW0 + j - KEEP);
                v = &fresh[j - KEEP];
                *v = (float)(1000 + 10 * (j - KEEP) + rank);
            }
            REQUIRE(kolo_allreduce_async(ctx, name, v, v, 1, KOLO_FLOAT32, KOLO_SUM, &h[j]) == 0);
        }
        int bad = 0;
        for (int j = 0; j < KEEP + NNEW; j++)
            CHECK_EQ_INT(kolo_wait(ctx, h[j], 20000), 0);
        for (int k = 0; k < KEEP; k++)
            bad += keep[k] != (float)(size * (k + s) + size * (size - 1) / 2);
        for (int i = 0; i < NNEW; i++)
            bad += fresh[i] != (float)(size * (1000 + 10 * i) + size * (size - 1) / 2);
        CHECK_EQ_INT(bad, 0);
    }
    if (size > 1 && ctx->fast) {
        CHECK(locked_u64(ctx, &ctx->fast_evicted) >= KEEP); /* keep.*, then fill.0.. */
        CHECK(locked_u64(ctx, &ctx->fast_agreed) - agreed0 >= KEEP);
    }
}

/* An op completed by another thread while its waiter sleeps in the
 * rounds' idle wait wakes the waiter at once, not at the end of its
 * 100 ms slice. The GPU finaliser does this for every CUDA op (each took
 * 100 ms on an H100 before the fix); here a thread completes the pending
 * op the way the finaliser does, while the peer is late. */
struct wake_arg {
    kolo_ctx *ctx;
    kolo_handle h;
    double fired_ms;
    bool idled;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *complete_later(void *p)
{
    struct wake_arg *a = p;
    kolo_ctx *c = a->ctx;
    usleep(150 * 1000);
    pthread_mutex_lock(&c->mu);
    struct op *op = ops_lookup(c, a->h);
    a->idled = c->idling;
    if (op && op->fast && op->cache_id && c->pending[op->cache_id] == op) {
        c->pending[op->cache_id] = NULL;
        c->ready_bits[op->cache_id / 64] &= ~(1ull << (op->cache_id % 64));
        a->fired_ms = now_ms();
        ops_complete(c, op, KOLO_EINTERNAL, "test: completed on another thread");
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void t_wake_on_complete(kolo_ctx *ctx, int rank, int size)
{
    float f = 1;
    kolo_handle h;
    REQUIRE(kolo_allreduce_async(ctx, "wake.x", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    if (rank != 0) {
        usleep(600 * 1000); /* rank 0 waits for this rank in the rounds */
        /* rank 0 aborted meanwhile: any clear result */
        if (kolo_allreduce_async(ctx, "wake.x", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0)
            (void)kolo_wait(ctx, h, 20000);
        return;
    }
    REQUIRE(kolo_allreduce_async(ctx, "wake.x", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    struct wake_arg a = {.ctx = ctx, .h = h};
    pthread_t t;
    pthread_create(&t, NULL, complete_later, &a);
    int rc = kolo_wait(ctx, h, 20000);
    double woke = now_ms() - a.fired_ms;
    pthread_join(t, NULL);
    CHECK_EQ_INT(rc, KOLO_EINTERNAL);
    CHECK(a.idled); /* the case under test: the waiter slept in idle_wait */
    if (woke >= 30)
        fprintf(stderr, "wake on complete: the waiter returned %.1f ms after its op completed\n",
                woke);
    CHECK(woke < 30);
    kolo_abort(ctx, "test: done"); /* rank 1's late op fails at once */
    (void)size;
}

/* CPU time of a thread, in ms. */
static double thread_cpu_ms(pthread_t t)
{
    clockid_t id;
    struct timespec ts;
    if (pthread_getcpuclockid(t, &id) != 0 || clock_gettime(id, &ts) != 0)
        return -1;
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* While a rank waits 400 ms for a late peer, its threads sleep: the
 * waiting thread and the background thread together use a small part of
 * the wait (a busy loop would take a CPU from the ranks that compute). */
static void t_idle_cpu(kolo_ctx *ctx, int rank, int size)
{
    float f = 1;
    kolo_handle h;
    /* cached first, so the wait below is in readiness rounds when on */
    REQUIRE(kolo_allreduce_async(ctx, "idle.x", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    if (rank == 1)
        usleep(400 * 1000);
    double bg0 = thread_cpu_ms(ctx->bg), me0 = thread_cpu_ms(pthread_self());
    REQUIRE(kolo_allreduce_async(ctx, "idle.x", &f, &f, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    if (rank == 0) {
        double bg = thread_cpu_ms(ctx->bg) - bg0, me = thread_cpu_ms(pthread_self()) - me0;
        if (bg + me >= 100)
            fprintf(stderr, "idle cpu: background %.1f ms, waiter %.1f ms in a 400 ms wait\n", bg,
                    me);
        CHECK(bg0 >= 0 && bg + me < 100);
    }
    (void)size;
}

int main(int argc, char **argv)
{
    char dir[] = "/tmp/kolo-test-api-XXXXXX", db[128];
    REQUIRE(mkdtemp(dir));
    snprintf(db, sizeof(db), "%s/c.db", dir);
    char err[512];
    /* The fake hosts never heartbeat: a lease longer than the test keeps
     * their jobs running however slow the build (sanitizers) is. */
    struct coord_config cfg = {
        .listen = "tcp://127.0.0.1:0", .db_path = db, .lease_ms = 3600000, .heartbeat_ms = 1000};
    REQUIRE(coord_start(&coord, &cfg, err, sizeof(err)) == 0);
    int sizes[] = {1, 2, 3, 4, 5};
    const char *only = getenv("KOLO_TEST_TRANSPORT"); /* "shm" or "tcp" to run one */
    int only_np = getenv("KOLO_TEST_NP") ? atoi(getenv("KOLO_TEST_NP")) : 0; /* one size */
    /* Every case with the coordinator alone, or (argument "rounds", the
     * ctest kolo.worker.api_rounds) with readiness rounds. */
    int rounds = argc > 1 && strcmp(argv[1], "rounds") == 0;
    for (int fast = rounds; fast < 1 + rounds; fast++) {
        setenv("KOLO_FAST_PATH", fast ? "1" : "0", 1);
        for (use_tcp = 0; use_tcp < 2; use_tcp++) {
            if (only && strcmp(only, use_tcp ? "tcp" : "shm") != 0)
                continue;
            for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
                int np = sizes[i];
                if (only_np && np != only_np)
                    continue;
                fprintf(stderr, "-- %s, %s, %d rank(s)\n", fast ? "rounds" : "coordinator",
                        use_tcp ? "tcp" : "shm", np);
                run_ranks(np, t_allreduce);
                run_ranks(np, t_others);
                run_ranks(np, t_errors);
                run_ranks(np, t_join);
                if (np <= 3)
                    run_ranks(np, t_fused_steps);
                if (fast) {
                    run_ranks(np, t_fast_order);
                    run_ranks(np, t_fast_tiny);
                    run_ranks(np, t_fast_bcast);
                    run_ranks(np, t_fast_mismatch);
                }
                if (np > 1)
                    run_ranks(np, t_shutdown_pending);
            }
        }
    }
    if (rounds && !only) {
        fprintf(stderr, "-- cache ids run out: the oldest go to new names\n");
        setenv("KOLO_FAST_PATH", "1", 1);
        use_tcp = 0;
        run_ranks(2, t_fast_evict);
        use_tcp = 1;
        run_ranks(3, t_fast_evict);
    }
    unsetenv("KOLO_FAST_PATH");
    if (!only && !rounds) {
        fprintf(stderr, "-- stall inspector\n");
        setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "1", 1);
        setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "2", 1);
        use_tcp = 0;
        run_ranks(3, t_stall);
        unsetenv("HOROVOD_STALL_CHECK_TIME_SECONDS");
        unsetenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS");
    }
    if (!only) {
        fprintf(stderr, "-- threads sleep while a rank waits for a late peer\n");
        use_tcp = 0;
        for (int fast = 0; fast < 2; fast++) {
            setenv("KOLO_FAST_PATH", fast ? "1" : "0", 1);
            run_ranks(2, t_idle_cpu);
        }
        fprintf(stderr, "-- an op completed by another thread wakes its waiter\n");
        use_tcp = 0;
        setenv("KOLO_FAST_PATH", "1", 1);
        for (int i = 0; i < 4; i++)
            run_ranks(2, t_wake_on_complete);
        fprintf(stderr, "-- init and fini again in the same generation (sessions)\n");
        for (int fast = 0; fast < 2; fast++) {
            setenv("KOLO_FAST_PATH", fast ? "1" : "0", 1);
            for (use_tcp = 0; use_tcp < 2; use_tcp++)
                run_sessions(fast ? 3 : 2, 8);
        }
        fprintf(stderr, "-- abort while a collective runs\n");
        use_tcp = 0;
        for (int i = 0; i < 4; i++) {
            setenv("KOLO_FAST_PATH", i % 2 ? "1" : "0", 1);
            atomic_store(&abort_checked, 0);
            run_ranks(2, t_abort_running);
        }
        unsetenv("KOLO_FAST_PATH");
    }
    coord_stop(coord);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    (void)argc;
    (void)argv;
    TEST_DONE();
}
