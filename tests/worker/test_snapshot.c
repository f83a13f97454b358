/*
 * test_snapshot.c - libkolo's snapshot calls end to end: an in-process
 * coordinator, ranks as threads. Rank 0 commits while the ranks keep
 * running collectives (the calls must not disturb the background thread),
 * every rank reads back; a put survives a coordinator restart in the
 * middle of its upload; kolo_fini ends a put in flight; bad arguments.
 * Small chunks (KOLO_SNAPSHOT_CHUNK_BYTES) make every upload many chunks.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "kolo.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "test.h"
#include "coord_harness.h"
#include "util.h"

#define NP 2

static char dir[] = "/tmp/kolo-test-worker-snap-XXXXXX";
static char dbpath[256];
static char listen_url[64] = "tcp://127.0.0.1:0";
static struct coord *coord;
static uint64_t job_id;
static char host_id[32]; /* one host per job: the first job's "ranks" never exit */

static void start_coord(void)
{
    char err[512];
    struct coord_config cfg = {.listen = listen_url,
                               .db_path = dbpath,
                               .lease_ms = 60000,
                               .heartbeat_ms = 1000,
                               .snapshot_keep = 100};
    int rv = coord_start(&coord, &cfg, err, sizeof err);
    if (rv)
        fprintf(stderr, "coord_start: %s\n", err);
    REQUIRE(rv == 0);
    /* restarts listen on the same port, as a restarted coordinator would */
    snprintf(listen_url, sizeof listen_url, "%s", coord_rpc_url(coord));
}

static void make_job(void)
{
    static int jobs;
    snprintf(host_id, sizeof host_id, "snap-host-%d", ++jobs);
    job_id = harness_submit_job(coord_rpc_url(coord), host_id, NP);
}

static kolo_ctx *join(int rank)
{
    kolo_config cfg = {0};
    cfg.coordinator = coord_rpc_url(coord);
    cfg.job_id = job_id;
    cfg.generation = 1;
    cfg.rank = rank;
    cfg.size = NP;
    cfg.local_rank = rank;
    cfg.local_size = NP;
    cfg.host_id = host_id;
    cfg.data_addr = "127.0.0.1";
    cfg.timeout_ms = 10000;
    kolo_ctx *ctx = NULL;
    int rv = kolo_init(&ctx, &cfg);
    if (rv)
        fprintf(stderr, "rank %d: kolo_init: %s\n", rank, kolo_strerror(rv));
    REQUIRE(rv == 0);
    return ctx;
}

static uint8_t *pattern(size_t len, unsigned seed)
{
    uint8_t *p = malloc(len + 1);
    REQUIRE(p);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
    return p;
}

static void barrier(kolo_ctx *ctx)
{
    kolo_handle h;
    REQUIRE(kolo_barrier_async(ctx, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 20000), 0);
}

/* ---------------------------------------------------------------- phase 1 */

struct putter {
    kolo_ctx *ctx;
    int n;
    uint64_t ids[8];
    int rc;
    volatile int started;
};

/* Commits n snapshots from a thread of its own, as state.commit() does. */
static void *put_loop(void *p)
{
    struct putter *pt = p;
    for (int i = 0; i < pt->n && !pt->rc; i++) {
        size_t len = 50000 + (size_t)i * 7777;
        uint8_t *data = pattern(len, (unsigned)i);
        char meta[64];
        snprintf(meta, sizeof meta, "{\"epoch\":%d,\"batch\":%d}", i, i * 10);
        pt->rc = kolo_snapshot_put(pt->ctx, data, len, meta, 20000, &pt->ids[i]);
        if (pt->rc)
            fprintf(stderr, "put %d: %s: %s\n", i, kolo_errname(pt->rc), kolo_last_error(pt->ctx));
        free(data);
    }
    return NULL;
}

struct rank_arg {
    int rank;
    uint64_t last_id;
};

static void *phase1_rank(void *p)
{
    struct rank_arg *a = p;
    kolo_ctx *ctx = join(a->rank);
    void *data = NULL;
    size_t len = 0;
    char *meta = NULL;
    uint64_t id = 0;
    CHECK_EQ_INT(kolo_snapshot_get_latest(ctx, &data, &len, &meta, &id, 5000), KOLO_ENOTFOUND);
    CHECK(data == NULL && meta == NULL && id == 0);
    barrier(ctx);

    /* rank 0 commits from a thread while both ranks run allreduces */
    struct putter pt = {ctx, 5, {0}, 0, 0};
    pthread_t t;
    if (a->rank == 0)
        pthread_create(&t, NULL, put_loop, &pt);
    float v[256];
    for (int step = 0; step < 40; step++) {
        for (int i = 0; i < 256; i++)
            v[i] = (float)(a->rank + 1);
        kolo_handle h;
        REQUIRE(kolo_allreduce_async(ctx, "grad", v, v, 256, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
        CHECK_EQ_INT(kolo_wait(ctx, h, 20000), 0);
        CHECK(v[0] == 3.0f && v[255] == 3.0f);
    }
    if (a->rank == 0) {
        pthread_join(t, NULL);
        CHECK_EQ_INT(pt.rc, 0);
        for (int i = 1; i < pt.n; i++)
            CHECK(pt.ids[i] > pt.ids[i - 1]);
        a->last_id = pt.ids[pt.n - 1];
    }
    barrier(ctx);

    /* every rank reads the latest back, and an older one by id */
    CHECK_EQ_INT(kolo_snapshot_get_latest(ctx, &data, &len, &meta, &id, 5000), 0);
    size_t want_len = 50000 + 4 * 7777;
    uint8_t *want = pattern(want_len, 4);
    CHECK(len == want_len && memcmp(data, want, len) == 0);
    CHECK_EQ_STR(meta, "{\"epoch\":4,\"batch\":40}");
    if (a->rank == 0)
        CHECK_EQ_INT(id, a->last_id);
    kolo_snapshot_free(data);
    kolo_snapshot_free(meta);
    free(want);
    CHECK_EQ_INT(kolo_snapshot_get(ctx, id - 1, &data, &len, NULL, NULL, 5000), 0);
    want = pattern(50000 + 3 * 7777, 3);
    CHECK(len == 50000 + 3 * 7777 && memcmp(data, want, len) == 0);
    kolo_snapshot_free(data);
    free(want);
    CHECK_EQ_INT(kolo_snapshot_get(ctx, id + 100, &data, &len, NULL, NULL, 5000), KOLO_ENOTFOUND);

    /* bad arguments */
    CHECK_EQ_INT(kolo_snapshot_put(NULL, "x", 1, NULL, 1000, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_snapshot_put(ctx, NULL, 5, NULL, 1000, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_snapshot_get(ctx, 0, NULL, &len, NULL, NULL, 1000), KOLO_EINVAL);
    if (a->rank == 1) {
        CHECK_EQ_INT(kolo_snapshot_put(ctx, "x", 1, "[1]", 5000, NULL), KOLO_EPROTO);
        CHECK(strstr(kolo_last_error(ctx), "JSON object") != NULL);
        uint64_t e = 0;
        CHECK_EQ_INT(kolo_snapshot_put(ctx, "", 0, NULL, 5000, &e), 0); /* empty is fine */
        CHECK(e > 0);
    }
    barrier(ctx);
    CHECK_EQ_INT(kolo_fini(ctx), 0);
    return NULL;
}

/* ---------------------------------------------------------------- phase 2 */

/* A put in flight while the coordinator restarts: it loses the partial
 * upload, sends it again and is acknowledged. */
static void *restart_put(void *p)
{
    struct putter *pt = p;
    size_t len = pt->n == 1 ? 3u << 20 : 8u << 20; /* 768 or 2048 chunks of 4 KiB */
    uint8_t *data = pattern(len, 99);
    __atomic_store_n(&pt->started, 1, __ATOMIC_SEQ_CST);
    pt->rc = kolo_snapshot_put(pt->ctx, data, len, "{\"restart\":true}", 60000, &pt->ids[0]);
    /* (the put that kolo_fini ends must not look at the context again:
     * it is freed once kolo_fini returns) */
    if (pt->rc && pt->n == 1)
        fprintf(stderr, "restart put: %s: %s\n", kolo_errname(pt->rc), kolo_last_error(pt->ctx));
    free(data);
    return NULL;
}

static void *join_thread(void *p)
{
    *(kolo_ctx **)p = join(1);
    return NULL;
}

static void phase2_restart(void)
{
    kolo_ctx *c1 = NULL;
    pthread_t t1;
    pthread_create(&t1, NULL, join_thread, &c1);
    kolo_ctx *c0 = join(0);
    pthread_join(t1, NULL);
    struct putter pt = {c0, 1, {0}, 0, 0};
    pthread_t t;
    pthread_create(&t, NULL, restart_put, &pt);
    usleep(150 * 1000);
    coord_stop(coord);
    usleep(100 * 1000);
    start_coord();
    pthread_join(t, NULL);
    CHECK_EQ_INT(pt.rc, 0);
    void *data = NULL;
    size_t len = 0;
    uint64_t id = 0;
    CHECK_EQ_INT(kolo_snapshot_get_latest(c1, &data, &len, NULL, &id, 20000), 0);
    uint8_t *want = pattern(3u << 20, 99);
    CHECK(len == 3u << 20 && memcmp(data, want, len) == 0);
    CHECK_EQ_INT(id, pt.ids[0]);
    kolo_snapshot_free(data);
    free(want);

    /* kolo_fini ends a put in flight: it fails with KOLO_ESHUTDOWN */
    /* The put must have started before kolo_fini does: like every call
     * on a context, it may not race with the context being freed. */
    struct putter late = {c0, 2, {0}, 0, 0};
    pthread_create(&t, NULL, restart_put, &late);
    while (!__atomic_load_n(&late.started, __ATOMIC_SEQ_CST))
        usleep(1000);
    usleep(200 * 1000);
    uint64_t t0 = now_mono_ms();
    kolo_abort(c0, "test");
    CHECK_EQ_INT(kolo_fini(c0), 0);
    pthread_join(t, NULL);
    CHECK(late.rc == KOLO_ESHUTDOWN || late.rc == 0);
    CHECK(now_mono_ms() - t0 < 5000);
    kolo_abort(c1, "test");
    kolo_fini(c1);
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(dbpath, sizeof dbpath, "%s/coord.db", dir);
    setenv("KOLO_SNAPSHOT_CHUNK_BYTES", "4096", 1);
    start_coord();
    make_job();
    pthread_t t[NP];
    struct rank_arg args[NP];
    for (int r = 0; r < NP; r++) {
        args[r] = (struct rank_arg){r, 0};
        pthread_create(&t[r], NULL, phase1_rank, &args[r]);
    }
    for (int r = 0; r < NP; r++)
        pthread_join(t[r], NULL);
    make_job();
    phase2_restart();
    coord_stop(coord);
    test_remove_db(dbpath, dir);
    TEST_DONE();
}
