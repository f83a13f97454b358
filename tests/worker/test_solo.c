/*
 * test_solo.c - libkolo without a coordinator: a process started alone is
 * rank 0 of 1 and runs every collective through the public API (solo.c),
 * with the edges on purpose: zero elements, odd sizes, every dtype and
 * reduction with average and pre/post scaling, uneven alltoall splits,
 * init -> fini -> init, and a size above 1 refused with its reason.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype_values.h"
#include "kolo.h"
#include "test.h"

#define WAIT_MS 10000

static const size_t counts[] = {0, 1, 7, 4099};

/* Only the variables a solo context may see: none of a job's. */
static void clear_env(void)
{
    const char *vars[] = {"KOLO_COORDINATOR", "KOLO_SIZE", "HOROVOD_SIZE",
                          "KOLO_RANK",        "KOLO_JOB",  "KOLO_FAST_PATH"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static kolo_ctx *solo_init(void)
{
    kolo_ctx *ctx = NULL;
    int rc = kolo_init(&ctx, NULL);
    if (rc)
        fprintf(stderr, "kolo_init: %s: %s\n", kolo_errname(rc), kolo_last_error(NULL));
    REQUIRE(rc == 0 && ctx);
    return ctx;
}

static bool is_float(kolo_dtype dt)
{
    return dt == KOLO_FLOAT16 || dt == KOLO_BFLOAT16 || dt == KOLO_FLOAT32 || dt == KOLO_FLOAT64;
}

/* Small integers, negative too where the type has them: every value and
 * its scaled forms below are exact in every dtype. */
static double value(kolo_dtype dt, size_t i)
{
    return dt == KOLO_UINT8 ? (double)(i % 13) : (double)(i % 13) - 6;
}

/* One rank's allreduce is its input, scaled as the executor scales:
 * prescale, then postscale (integers truncating at each step). */
static double scaled(kolo_dtype dt, double x, double pre, double post)
{
    return is_float(dt) ? x * pre * post : trunc(trunc(x * pre) * post);
}

static int wait_op(kolo_ctx *ctx, kolo_handle h)
{
    int rc = kolo_wait(ctx, h, WAIT_MS);
    if (rc)
        fprintf(stderr, "kolo_wait: %s: %s\n", kolo_errname(rc), kolo_last_error(ctx));
    return rc;
}

static int submit_wait(kolo_ctx *ctx, const kolo_request *r)
{
    kolo_handle h = 0;
    int rc = kolo_submit(ctx, r, 1, &h);
    if (rc) {
        fprintf(stderr, "kolo_submit: %s: %s\n", kolo_errname(rc), kolo_last_error(ctx));
        return rc;
    }
    return wait_op(ctx, h);
}

static void test_topology(kolo_ctx *ctx)
{
    /* libkolo's threads say whose they are in top -H, ps -L and gdb */
    CHECK(test_threads_named("kolo-bg") >= 1);
    CHECK_EQ_INT(kolo_solo(ctx), 1);
    CHECK_EQ_INT(kolo_rank(ctx), 0);
    CHECK_EQ_INT(kolo_size(ctx), 1);
    CHECK_EQ_INT(kolo_local_rank(ctx), 0);
    CHECK_EQ_INT(kolo_local_size(ctx), 1);
    CHECK_EQ_INT(kolo_cross_rank(ctx), 0);
    CHECK_EQ_INT(kolo_cross_size(ctx), 1);
    CHECK_EQ_INT(kolo_process_set_id(ctx), 0);
    CHECK_EQ_INT(kolo_solo(NULL), -1);
}

/* Every dtype x reduction x count, out of place and in place, plain and
 * with prescale 3, postscale 0.5. */
static void test_allreduce(kolo_ctx *ctx)
{
    for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
        size_t es = kolo_dtype_size((kolo_dtype)dt);
        for (int op = 0; op < KOLO_OP_COUNT; op++) {
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                for (int variant = 0; variant < 4; variant++) {
                    size_t n = counts[ci];
                    bool in_place = variant & 1, scale = variant & 2;
                    double pre = scale ? 3.0 : 1.0, post = scale ? 0.5 : 1.0;
                    unsigned char *in = malloc(n * es + 1), *out = malloc(n * es + 1);
                    REQUIRE(in && out);
                    for (size_t i = 0; i < n; i++)
                        dtype_put((kolo_dtype)dt, in, i, value((kolo_dtype)dt, i));
                    int64_t shape[1] = {(int64_t)n};
                    kolo_request r = {.coll = KOLO_COLL_ALLREDUCE,
                                      .sendbuf = in,
                                      .recvbuf = in_place ? in : out,
                                      .dtype = (kolo_dtype)dt,
                                      .ndim = 1,
                                      .shape = shape,
                                      .op = (kolo_op)op,
                                      .prescale = pre,
                                      .postscale = post,
                                      .device = -1};
                    CHECK_EQ_INT(submit_wait(ctx, &r), 0);
                    const unsigned char *res = in_place ? in : out;
                    int bad = 0;
                    for (size_t i = 0; i < n && !bad; i++) {
                        double want = scaled((kolo_dtype)dt, value((kolo_dtype)dt, i), pre, post);
                        if (dtype_get((kolo_dtype)dt, res, i) != want) {
                            fprintf(stderr,
                                    "allreduce %s %s n=%zu variant %d: [%zu] = %g, want %g\n",
                                    kolo_dtype_name((kolo_dtype)dt), kolo_op_name((kolo_op)op), n,
                                    variant, i, dtype_get((kolo_dtype)dt, res, i), want);
                            bad = 1;
                        }
                    }
                    CHECK(!bad);
                    free(in);
                    free(out);
                }
            }
        }
    }
}

/* A group of three (one response each alone, still one submit). */
static void test_grouped(kolo_ctx *ctx)
{
    float a[5] = {1, 2, 3, 4, 5}, ra[5];
    int32_t b[3] = {-3, 7, 9};
    double c[1] = {2.5};
    int64_t sa[1] = {5}, sb[1] = {3}, sc[1] = {1};
    kolo_request r[3] = {
        {.coll = KOLO_COLL_ALLREDUCE,
         .name = "g.a",
         .sendbuf = a,
         .recvbuf = ra,
         .dtype = KOLO_FLOAT32,
         .ndim = 1,
         .shape = sa,
         .op = KOLO_AVERAGE,
         .device = -1},
        {.coll = KOLO_COLL_ALLREDUCE,
         .name = "g.b",
         .sendbuf = b,
         .recvbuf = b,
         .dtype = KOLO_INT32,
         .ndim = 1,
         .shape = sb,
         .op = KOLO_SUM,
         .device = -1},
        {.coll = KOLO_COLL_ALLREDUCE,
         .name = "g.c",
         .sendbuf = c,
         .recvbuf = c,
         .dtype = KOLO_FLOAT64,
         .ndim = 1,
         .shape = sc,
         .op = KOLO_MAX,
         .postscale = 2.0,
         .device = -1},
    };
    kolo_handle h[3];
    REQUIRE(kolo_submit(ctx, r, 3, h) == 0);
    for (int i = 2; i >= 0; i--) /* any order */
        CHECK_EQ_INT(wait_op(ctx, h[i]), 0);
    for (int i = 0; i < 5; i++)
        CHECK(ra[i] == a[i]);
    CHECK(b[0] == -3 && b[1] == 7 && b[2] == 9);
    CHECK(c[0] == 5.0);
}

/* allgather and alltoall: the library's result, rows and splits. */
static void check_result(kolo_ctx *ctx, kolo_handle h, const void *want, size_t bytes, int64_t rows,
                         int32_t split)
{
    const void *data = NULL;
    size_t got_bytes = 1;
    int64_t got_rows = -1, value = -1;
    const int32_t *splits = NULL;
    CHECK_EQ_INT(kolo_result(ctx, h, &data, &got_bytes, &got_rows, &splits, &value), 0);
    CHECK_EQ_INT(got_bytes, bytes);
    CHECK_EQ_INT(got_rows, rows);
    CHECK(bytes == 0 || (data && memcmp(data, want, bytes) == 0));
    if (split >= 0)
        CHECK(splits && splits[0] == split);
    CHECK_EQ_INT(kolo_release(ctx, h), 0);
}

static void test_allgather_alltoall(kolo_ctx *ctx)
{
    const int64_t row_counts[] = {0, 1, 7, 4099};
    for (size_t k = 0; k < sizeof row_counts / sizeof row_counts[0]; k++) {
        int64_t rows = row_counts[k], shape[2] = {rows, 3};
        size_t bytes = (size_t)rows * 3 * sizeof(int16_t);
        int16_t *t = malloc(bytes + 1);
        REQUIRE(t);
        for (int64_t i = 0; i < rows * 3; i++)
            t[i] = (int16_t)(i * 7 - 100);
        kolo_handle h;
        REQUIRE(kolo_allgather_async(ctx, "ag", t, 2, shape, KOLO_INT16, &h) == 0);
        CHECK_EQ_INT(wait_op(ctx, h), 0);
        check_result(ctx, h, t, bytes, rows, -1);
        /* even: every row to the one rank */
        REQUIRE(kolo_alltoall_async(ctx, "a2a", t, 2, shape, KOLO_INT16, NULL, &h) == 0);
        CHECK_EQ_INT(wait_op(ctx, h), 0);
        check_result(ctx, h, t, bytes, rows, (int32_t)rows);
        /* splits: an uneven share, fewer rows than the tensor has */
        int32_t split[1] = {(int32_t)(rows / 2)};
        REQUIRE(kolo_alltoall_async(ctx, "a2a.split", t, 2, shape, KOLO_INT16, split, &h) == 0);
        CHECK_EQ_INT(wait_op(ctx, h), 0);
        check_result(ctx, h, t, (size_t)split[0] * 3 * sizeof(int16_t), split[0], split[0]);
        free(t);
    }
    /* splits that ask for more rows than there are: refused at submit */
    int16_t t[6] = {0};
    int64_t shape[2] = {2, 3};
    int32_t split[1] = {3};
    kolo_handle h;
    CHECK_EQ_INT(kolo_alltoall_async(ctx, "a2a.bad", t, 2, shape, KOLO_INT16, split, &h),
                 KOLO_EINVAL);
    /* a rank-zero tensor cannot be gathered */
    CHECK_EQ_INT(kolo_allgather_async(ctx, "ag.bad", t, 0, shape, KOLO_INT16, &h), KOLO_EINVAL);
}

static void test_broadcast(kolo_ctx *ctx)
{
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        size_t n = counts[ci];
        double *in = malloc(n * sizeof(double) + 1), *out = malloc(n * sizeof(double) + 1);
        REQUIRE(in && out);
        for (size_t i = 0; i < n; i++) {
            in[i] = (double)i * 0.5;
            out[i] = -1;
        }
        kolo_handle h;
        REQUIRE(kolo_broadcast_async(ctx, "bc", in, n, KOLO_FLOAT64, 0, &h) == 0);
        CHECK_EQ_INT(wait_op(ctx, h), 0);
        int64_t shape[1] = {(int64_t)n};
        kolo_request r = {.coll = KOLO_COLL_BROADCAST,
                          .sendbuf = in,
                          .recvbuf = out,
                          .dtype = KOLO_FLOAT64,
                          .ndim = 1,
                          .shape = shape,
                          .device = -1};
        CHECK_EQ_INT(submit_wait(ctx, &r), 0);
        CHECK(n == 0 || memcmp(in, out, n * sizeof(double)) == 0);
        free(in);
        free(out);
    }
    float x = 1;
    kolo_handle h;
    CHECK_EQ_INT(kolo_broadcast_async(ctx, "bc.root", &x, 1, KOLO_FLOAT32, 1, &h), KOLO_EINVAL);
    CHECK(strstr(kolo_last_error(ctx), "root 1") != NULL);
}

/* The one rank keeps every row: sum and average, with and without scaling. */
static void test_reducescatter(kolo_ctx *ctx)
{
    const int64_t row_counts[] = {0, 1, 7, 4099};
    for (size_t k = 0; k < sizeof row_counts / sizeof row_counts[0]; k++) {
        for (int variant = 0; variant < 4; variant++) {
            int64_t rows = row_counts[k], shape[2] = {rows, 3};
            size_t n = (size_t)rows * 3;
            kolo_op op = variant & 1 ? KOLO_AVERAGE : KOLO_SUM;
            double pre = variant & 2 ? 3.0 : 1.0, post = variant & 2 ? 0.5 : 1.0;
            float *in = malloc(n * sizeof(float) + 1), *out = malloc(n * sizeof(float) + 1);
            REQUIRE(in && out);
            for (size_t i = 0; i < n; i++)
                in[i] = (float)value(KOLO_FLOAT32, i);
            kolo_request r = {.coll = KOLO_COLL_REDUCESCATTER,
                              .sendbuf = in,
                              .recvbuf = out,
                              .dtype = KOLO_FLOAT32,
                              .ndim = 2,
                              .shape = shape,
                              .op = op,
                              .prescale = pre,
                              .postscale = post,
                              .device = -1};
            CHECK_EQ_INT(submit_wait(ctx, &r), 0);
            int bad = 0;
            for (size_t i = 0; i < n && !bad; i++)
                bad = out[i] != (float)scaled(KOLO_FLOAT32, in[i], pre, post);
            CHECK(!bad);
            free(in);
            free(out);
        }
    }
    float x[2] = {1, 2};
    int64_t shape[1] = {2};
    kolo_handle h;
    CHECK_EQ_INT(
        kolo_reducescatter_async(ctx, "rs.max", x, x, 1, shape, KOLO_FLOAT32, KOLO_MAX, &h),
        KOLO_EINVAL);
}

static void test_barrier_join(kolo_ctx *ctx)
{
    kolo_handle h;
    for (int i = 0; i < 3; i++) {
        REQUIRE(kolo_barrier_async(ctx, &h) == 0);
        CHECK_EQ_INT(wait_op(ctx, h), 0);
    }
    REQUIRE(kolo_join_async(ctx, &h) == 0);
    CHECK_EQ_INT(wait_op(ctx, h), 0);
    int64_t last = -1;
    CHECK_EQ_INT(kolo_result(ctx, h, NULL, NULL, NULL, NULL, &last), 0);
    CHECK_EQ_INT(last, 0);
    CHECK_EQ_INT(kolo_release(ctx, h), 0);
    /* A join naming a GPU: alone there is nobody to contribute zeros to,
     * so it needs none (this host may have no GPU at all). */
    kolo_request r = {.coll = KOLO_COLL_JOIN, .device = 0};
    REQUIRE(kolo_submit(ctx, &r, 1, &h) == 0);
    CHECK_EQ_INT(wait_op(ctx, h), 0);
    CHECK_EQ_INT(kolo_release(ctx, h), 0);
    /* after a join, collectives go on as before */
    int32_t v = 5;
    REQUIRE(kolo_allreduce_async(ctx, "after.join", &v, &v, 1, KOLO_INT32, KOLO_SUM, &h) == 0);
    CHECK_EQ_INT(wait_op(ctx, h), 0);
    CHECK_EQ_INT(v, 5);
}

/* Names, polling without waiting, and what needs a coordinator. */
static void test_rest_of_the_api(kolo_ctx *ctx)
{
    float x[4] = {1, 2, 3, 4};
    kolo_handle h1, h2;
    REQUIRE(kolo_allreduce_async(ctx, "same", x, x, 4, KOLO_FLOAT32, KOLO_SUM, &h1) == 0);
    int rc = kolo_allreduce_async(ctx, "same", x, x, 4, KOLO_FLOAT32, KOLO_SUM, &h2);
    /* a name still in flight is refused; one that finished is free again */
    CHECK(rc == KOLO_EEXIST || rc == 0);
    int done = 0;
    for (int i = 0; i < 10000 && !done; i++) {
        CHECK_EQ_INT(kolo_poll(ctx, h1, &done), 0);
        if (!done)
            usleep(1000);
    }
    CHECK(done); /* the background thread runs it without a waiter */
    CHECK_EQ_INT(wait_op(ctx, h1), 0);
    if (rc == 0)
        CHECK_EQ_INT(wait_op(ctx, h2), 0);
    CHECK_EQ_INT(kolo_wait(ctx, h1, 0), KOLO_ENOTFOUND);

    CHECK_EQ_INT(kolo_timeline(ctx, "/tmp/kolo-solo-timeline.json"), KOLO_ENOTSUP);
    CHECK(strstr(kolo_last_error(ctx), "kolo run") != NULL);
    uint64_t id = 0;
    CHECK_EQ_INT(kolo_snapshot_put(ctx, "x", 1, NULL, 1000, &id), KOLO_ENOTSUP);
    CHECK(strstr(kolo_last_error(ctx), "kolo run") != NULL);
    CHECK_EQ_INT(kolo_report_epoch(ctx, 0, 1, 10, "{\"loss\":1}"), 0);
    CHECK_EQ_INT(kolo_report_step(ctx, 0.01), 0);
    uint64_t stamp = 1;
    int kind = 1;
    CHECK_EQ_INT(kolo_hosts_updated(ctx, &stamp, &kind), 0);
    CHECK(stamp == 0 && kind == 0);
    CHECK_EQ_INT(kolo_generation(ctx), 0);

    /* a GPU tensor on a host without one: a clear refusal, never a crash */
    char why[256];
    if (kolo_gpu_count(why, sizeof why) == 0) {
        int64_t shape[1] = {4};
        kolo_request r = {.coll = KOLO_COLL_ALLREDUCE,
                          .sendbuf = x,
                          .recvbuf = x,
                          .dtype = KOLO_FLOAT32,
                          .ndim = 1,
                          .shape = shape,
                          .device = 0};
        CHECK_EQ_INT(kolo_submit(ctx, &r, 1, &h1), KOLO_ENOTSUP);
    }
}

/* The one rank's process set: a one-rank context of its own. */
static void test_process_set(kolo_ctx *ctx)
{
    int ranks[1] = {0}, other[1] = {1};
    kolo_ctx *set = NULL;
    CHECK_EQ_INT(kolo_process_set_init(ctx, 3, other, 1, &set), KOLO_EINVAL);
    REQUIRE(kolo_process_set_init(ctx, 3, ranks, 1, &set) == 0 && set);
    CHECK_EQ_INT(kolo_process_set_id(set), 3);
    CHECK_EQ_INT(kolo_size(set), 1);
    CHECK_EQ_INT(kolo_solo(set), 1);
    int64_t v[3] = {4, -5, 6};
    kolo_handle h;
    REQUIRE(kolo_allreduce_async(set, "in.set", v, v, 3, KOLO_INT64, KOLO_AVERAGE, &h) == 0);
    CHECK_EQ_INT(wait_op(set, h), 0);
    CHECK(v[0] == 4 && v[1] == -5 && v[2] == 6);
    CHECK_EQ_INT(kolo_fini(set), 0);
}

/* kolo_abort fails what is pending and everything after it. */
static void test_abort(void)
{
    kolo_ctx *ctx = solo_init();
    CHECK_EQ_INT(kolo_abort(ctx, "test"), 0);
    float x = 1;
    kolo_handle h;
    CHECK_EQ_INT(kolo_allreduce_async(ctx, "late", &x, &x, 1, KOLO_FLOAT32, KOLO_SUM, &h),
                 KOLO_ESHUTDOWN);
    CHECK_EQ_INT(kolo_fini(ctx), 0);
}

/* Without a coordinator only one rank makes sense: the reason says how. */
static void test_size_refused(void)
{
    const char *want = "this process was not started by kolo (KOLO_COORDINATOR is not set) but a "
                       "size of 2 was asked for; launch it with `kolo run -np 2 ...`";
    kolo_ctx *ctx = (kolo_ctx *)1;
    setenv("KOLO_SIZE", "2", 1);
    CHECK_EQ_INT(kolo_init(&ctx, NULL), KOLO_EINVAL);
    CHECK(ctx == NULL);
    CHECK_EQ_STR(kolo_last_error(NULL), want);
    unsetenv("KOLO_SIZE");
    setenv("HOROVOD_SIZE", "3", 1); /* Horovod's name for it */
    CHECK_EQ_INT(kolo_init(&ctx, NULL), KOLO_EINVAL);
    CHECK(strstr(kolo_last_error(NULL), "a size of 3") != NULL);
    unsetenv("HOROVOD_SIZE");
    kolo_config cfg = {.size = 2};
    CHECK_EQ_INT(kolo_init(&ctx, &cfg), KOLO_EINVAL);
    CHECK_EQ_STR(kolo_last_error(NULL), want);
    /* a size of 1, or an empty coordinator, is alone */
    setenv("KOLO_SIZE", "1", 1);
    setenv("KOLO_COORDINATOR", "", 1);
    ctx = solo_init();
    CHECK_EQ_STR(kolo_last_error(NULL), "");
    CHECK_EQ_INT(kolo_fini(ctx), 0);
    cfg.size = 1;
    REQUIRE(kolo_init(&ctx, &cfg) == 0);
    CHECK_EQ_INT(kolo_solo(ctx), 1);
    CHECK_EQ_INT(kolo_fini(ctx), 0);
    clear_env();
}

int main(void)
{
    clear_env();
    test_size_refused();
    /* init -> fini -> init in one process, and two contexts at once */
    for (int round = 0; round < 3; round++) {
        kolo_ctx *ctx = solo_init(), *other = solo_init();
        test_topology(ctx);
        if (round == 0) {
            test_allreduce(ctx);
            test_grouped(ctx);
            test_allgather_alltoall(ctx);
            test_broadcast(ctx);
            test_reducescatter(ctx);
            test_barrier_join(ctx);
            test_rest_of_the_api(ctx);
            test_process_set(ctx);
        } else {
            test_grouped(other);
            test_barrier_join(ctx);
        }
        CHECK_EQ_INT(kolo_fini(other), 0);
        CHECK_EQ_INT(kolo_fini(ctx), 0);
    }
    test_abort();
    TEST_DONE();
}
