/*
 * test_report.c - kolo_report_epoch, kolo_report_epoch_span and
 * kolo_report_step end to end (issue 6): two ranks as threads against an
 * in-process coordinator; typed errors for bad arguments; a queue that
 * overflows drops and counts instead of blocking; kolo_fini sends what is
 * queued; the coordinator derives the epochs (AdminService.GetEpochs);
 * report_flush_spans sends the timeline's spans at once; the readiness
 * rounds' telemetry (a lock-free ring for rank 0's waits) arrives whole
 * after its ring wrapped (the coordinator's /metrics).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "kolo.h"
#include "kolo.pb-c.h"
#include "report.h"
#include "report_rate.h"
#include "rpc.h"
#include "test.h"
#include "coord_harness.h"
#include "util.h"

#define NP 2

static char dir[] = "/tmp/kolo-test-worker-report-XXXXXX";
static char dbpath[256];
static struct coord *coord;
static uint64_t job_id;

static int call(const char *method, const ProtobufCMessage *req, void **out, size_t *olen)
{
    struct rpc_client *cli;
    struct rpc_client_config cc = {.url = coord_rpc_url(coord), .identity = "test"};
    REQUIRE(rpc_client_open(&cli, &cc) == 0);
    uint8_t buf[512];
    size_t len = protobuf_c_message_pack(req, buf);
    char err[512];
    int rv = rpc_client_call(cli, method, buf, len, out, olen, 3000, err, sizeof err);
    rpc_client_close(cli);
    return rv;
}

static void make_job(void)
{
    job_id = harness_submit_job(coord_rpc_url(coord), "report-host", NP);
}

/* rank of job's generation 1, NP ranks on one host */
static kolo_ctx *join(uint64_t job, int rank)
{
    kolo_config cfg = {0};
    cfg.coordinator = coord_rpc_url(coord);
    cfg.job_id = job;
    cfg.generation = 1;
    cfg.rank = rank;
    cfg.size = NP;
    cfg.local_rank = rank;
    cfg.local_size = NP;
    cfg.host_id = "report-host";
    cfg.data_addr = "127.0.0.1";
    cfg.timeout_ms = 10000;
    kolo_ctx *ctx = NULL;
    REQUIRE(kolo_init(&ctx, &cfg) == 0);
    return ctx;
}

static uint64_t dropped[NP];
static int flood_busy; /* rank 1's reports refused with KOLO_EBUSY */

static void *rank_main(void *p)
{
    int rank = (int)(intptr_t)p;
    kolo_ctx *ctx = join(job_id, rank);

    /* bad arguments: typed errors, nothing queued */
    CHECK_EQ_INT(kolo_report_epoch(NULL, 0, 0, 0, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_epoch(ctx, -1, 0, 0, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_epoch(ctx, 0, 2, 0, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_epoch(ctx, 0, 1, -3, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_epoch(ctx, 0, 1, 1, "[1]"), KOLO_EINVAL);
    CHECK(strstr(kolo_last_error(ctx), "JSON object") != NULL);
    CHECK_EQ_INT(kolo_report_epoch(ctx, 0, 1, 1, "{\"loss\":"), KOLO_EINVAL);
    char *big = malloc(5000);
    memset(big, ' ', 4999);
    big[0] = '{';
    big[4998] = '}';
    big[4999] = '\0';
    CHECK_EQ_INT(kolo_report_epoch(ctx, 0, 1, 1, big), KOLO_ETOOBIG);
    free(big);
    CHECK_EQ_INT(kolo_report_epoch_span(ctx, 0, 10, 5, 0, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_epoch_span(ctx, 0, 0, 0, 0, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_step(ctx, NAN), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_step(ctx, -1), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_step(ctx, 1e7), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_step(NULL, 1), KOLO_EINVAL);
    CHECK_EQ_INT(kolo_report_recovery(NULL, 1, 2, 3), KOLO_EINVAL);
    /* a fixed-size job has no recovery to speak of: sent, and ignored */
    CHECK_EQ_INT(kolo_report_recovery(ctx, 10, 20, 30), 0);

    /* stop_timeline's flush: a span queued before the first clock sample
     * goes at once (the sample, then the span), not a period or two later */
    Kolo__TraceSpan span = KOLO__TRACE_SPAN__INIT;
    int64_t shape[1] = {4};
    REQUIRE(report_span_fill(&span, "t.flush", shape, 1));
    span.round = 1;
    span.ready_us = span.agreed_us = now_mono_us();
    report_trace(ctx, &span, 1);
    uint64_t f0 = now_mono_ms();
    CHECK(report_flush_spans(ctx, 3000));
    CHECK(now_mono_ms() - f0 < REPORT_PERIOD_MS);
    f0 = now_mono_ms();
    CHECK(report_flush_spans(ctx, 3000)); /* nothing queued: at once */
    CHECK(now_mono_ms() - f0 < 50);

    /* epoch 0: start and end; epoch 1: an end whose start is epoch 0's end */
    CHECK_EQ_INT(kolo_report_epoch(ctx, 0, 0, 0, NULL), 0);
    for (int i = 0; i < 10; i++) {
        CHECK_EQ_INT(kolo_report_step(ctx, 0.01), 0);
        usleep(20000);
    }
    CHECK_EQ_INT(kolo_report_epoch(ctx, 0, 1, 100, rank == 0 ? "{\"loss\":0.5}" : NULL), 0);
    usleep(700000); /* one send period: epoch 0 goes in its own batch */
    usleep(100000);
    CHECK_EQ_INT(kolo_report_epoch(ctx, 1, 1, 50, "{\"loss\":0.25}"), 0);
    /* a flood never blocks: beyond the queue's room reports are dropped */
    if (rank == 1) {
        uint64_t t0 = now_mono_ms();
        int busy = 0;
        for (int i = 0; i < 3000; i++)
            busy += kolo_report_epoch_span(ctx, 1000 + i, 0, now_wall_ms(), 1, NULL) == KOLO_EBUSY;
        CHECK(now_mono_ms() - t0 < 2000);
        CHECK(busy > 0);
        CHECK(kolo_report_dropped(ctx) >= (uint64_t)busy);
        flood_busy = busy;
    }
    dropped[rank] = kolo_report_dropped(ctx);
    CHECK_EQ_INT(kolo_fini(ctx), 0); /* sends what is queued */
    return NULL;
}

/* Readiness rounds' telemetry (report_round): ROUND_BATCHES batches of
 * ROUND_OPS cached 4-byte allreduces, each batch under the ring's 4,096
 * samples and a report period apart, so nothing is dropped while the
 * ring's indexes go round it twice. */
#define ROUND_BATCHES 3
#define ROUND_OPS 3000
static uint64_t round_job;

static void *rounds_main(void *p)
{
    kolo_ctx *ctx = join(round_job, (int)(intptr_t)p);
    for (int b = 0; b < ROUND_BATCHES; b++) {
        for (int i = 0; i < ROUND_OPS + (b == 0); i++) { /* the first: negotiated */
            float v = 1.0f;
            kolo_handle h;
            REQUIRE(kolo_allreduce_async(ctx, "tel.x", &v, &v, 1, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
            REQUIRE(kolo_wait(ctx, h, 10000) == 0);
            CHECK(v == (float)NP);
        }
        usleep((REPORT_PERIOD_MS + 300) * 1000);
    }
    CHECK_EQ_INT(kolo_fini(ctx), 0);
    return NULL;
}

static double metric(const char *name)
{
    return harness_metric(coord_http_url(coord), name);
}

static void test_round_telemetry(void)
{
    double ops0 = metric("kolo_negotiation_round_ops_total");
    double waits0 = metric("kolo_negotiation_wait_seconds_count");
    REQUIRE(ops0 >= 0 && waits0 >= 0);
    round_job = harness_submit_job(coord_rpc_url(coord), "report-host", NP);
    pthread_t t[NP];
    for (int r = 0; r < NP; r++)
        pthread_create(&t[r], NULL, rounds_main, (void *)(intptr_t)r);
    for (int r = 0; r < NP; r++)
        pthread_join(t[r], NULL);
    /* every op the rounds agreed is counted once (rank 0's reports), and
     * every round's wait sample arrived, weighted by its ops */
    double ops = metric("kolo_negotiation_round_ops_total") - ops0;
    double waits = metric("kolo_negotiation_wait_seconds_count") - waits0;
    CHECK(ops >= ROUND_BATCHES * ROUND_OPS);
    CHECK(waits >= ROUND_BATCHES * ROUND_OPS);
    if (ops < ROUND_BATCHES * ROUND_OPS || waits < ROUND_BATCHES * ROUND_OPS)
        fprintf(stderr, "round ops %.0f, wait samples %.0f, want %d each\n", ops, waits,
                ROUND_BATCHES * ROUND_OPS);
}

/* The telemetry period (report_rate.h): 500 ms up to 256 ranks and for
 * rank 0; stretched with the job beyond, capped. */
static void test_report_period(void)
{
    static const struct {
        int rank, size, ms;
    } cases[] = {{0, 1, 500},    {0, 4096, 500},  {1, 2, 500},     {255, 256, 500},
                 {1, 257, 501},  {1, 512, 1000},  {1023, 1024, 2000}, {7, 2048, 4000},
                 {7, 100000, 4000}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_EQ_INT(report_period_ms(cases[i].rank, cases[i].size), cases[i].ms);
}

int main(void)
{
    test_report_period();
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(dbpath, sizeof dbpath, "%s/coord.db", dir);
    char err[512];
    struct coord_config cfg = {.listen = "tcp://127.0.0.1:0",
                               .http = "127.0.0.1:0",
                               .db_path = dbpath,
                               .lease_ms = 60000,
                               .heartbeat_ms = 1000};
    REQUIRE(coord_start(&coord, &cfg, err, sizeof err) == 0);
    make_job();
    pthread_t t[NP];
    for (int r = 0; r < NP; r++)
        pthread_create(&t[r], NULL, rank_main, (void *)(intptr_t)r);
    for (int r = 0; r < NP; r++)
        pthread_join(t[r], NULL);
    CHECK_EQ_INT(dropped[0], 0);

    Kolo__GetEpochsRequest gq = KOLO__GET_EPOCHS_REQUEST__INIT;
    gq.job_id = job_id;
    gq.after_epoch = -1;
    void *out = NULL;
    size_t olen;
    REQUIRE(call("AdminService.GetEpochs", &gq.base, &out, &olen) == 0);
    Kolo__GetEpochsReply *rep = kolo__get_epochs_reply__unpack(NULL, olen, out);
    REQUIRE(rep && rep->n_epochs >= 2);
    const Kolo__EpochSummary *e0 = rep->epochs[0], *e1 = rep->epochs[1];
    CHECK(e0->epoch == 0 && e0->complete && e0->ranks_reported == NP);
    CHECK(e0->samples == 200);
    CHECK(e0->wall_s >= 0.15 && e0->wall_s < 10);
    CHECK(e0->samples_per_s > 0);
    CHECK(strcmp(e0->metrics_json, "{\"loss\":0.5}") == 0);
    CHECK(e1->epoch == 1 && e1->complete && e1->samples == 100);
    /* epoch 1 started where each rank's epoch 0 ended */
    CHECK(e1->start_ms >= e0->start_ms && e1->start_ms <= e0->end_ms);
    CHECK(e1->wall_s >= 0.7 && e1->wall_s < 10);
    /* the flood: what was queued arrived, what was dropped did not */
    CHECK_EQ_INT((int)rep->n_epochs, 2 + 3000 - flood_busy);
    kolo__get_epochs_reply__free_unpacked(rep, NULL);
    free(out);
    test_round_telemetry();
    coord_stop(coord);
    test_remove_db(dbpath, dir);
    TEST_DONE();
}
