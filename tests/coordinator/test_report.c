/*
 * test_report.c - WorkerService.Report and AdminService.GetEpochs against
 * an in-process coordinator over real RPC, and the REST routes /epochs,
 * /steps and /ranks over real HTTP (issue 6): derived wall times and
 * samples/s, incomplete epochs, fencing, malformed reports, bad query
 * parameters (400), unknown jobs (404), the metrics; and /studies (issue
 * 18), derived from jobs labelled as kolo tune labels its trials.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "buf.h"
#include "coord.h"
#include "coord_report.h"
#include "coord_static.h"
#include "errors.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "store.h"
#include "test.h"
#include "coord_harness.h"
#include "util.h"

static char dir[] = "/tmp/kolo-test-coord-report-XXXXXX";
static char dbpath[256];
static struct coord *coord;
static uint64_t job_id;

static struct coord *start(void)
{
    struct coord_config cfg = {.listen = "tcp://127.0.0.1:0",
                               .http = "127.0.0.1:0",
                               .db_path = dbpath,
                               .lease_ms = 60000,
                               .heartbeat_ms = 1000};
    return harness_coord_start(&cfg);
}

static struct rpc_client *client(uint64_t job, uint64_t gen, int rank)
{
    return harness_client(coord_rpc_url(coord), job, gen, rank);
}

static void make_job(void)
{
    job_id = harness_submit_job(coord_rpc_url(coord), "rep-host", 2);
}

/* report sends one batch: epochs as (epoch, phase, ts, start, samples,
 * metrics) and steps as (ts, seconds, count). */
struct ep {
    int64_t epoch;
    int phase;
    uint64_t ts, start;
    int64_t samples;
    const char *metrics;
};
struct st {
    uint64_t ts;
    double seconds;
    uint32_t count;
};

static int report(struct rpc_client *cli, const struct ep *eps, size_t ne, const struct st *sts,
                  size_t ns, char *err, size_t errlen)
{
    Kolo__EpochReport e[8], *ep[8];
    Kolo__StepSample s[8], *sp[8];
    REQUIRE(ne <= 8 && ns <= 8);
    for (size_t i = 0; i < ne; i++) {
        kolo__epoch_report__init(&e[i]);
        e[i].epoch = eps[i].epoch;
        e[i].phase = eps[i].phase;
        e[i].ts_ms = eps[i].ts;
        e[i].start_ms = eps[i].start;
        e[i].samples = eps[i].samples;
        e[i].metrics_json = (char *)(eps[i].metrics ? eps[i].metrics : "");
        ep[i] = &e[i];
    }
    for (size_t i = 0; i < ns; i++) {
        kolo__step_sample__init(&s[i]);
        s[i].ts_ms = sts[i].ts;
        s[i].seconds = sts[i].seconds;
        s[i].count = sts[i].count;
        sp[i] = &s[i];
    }
    Kolo__WorkerReportRequest req = KOLO__WORKER_REPORT_REQUEST__INIT;
    req.epochs = ep;
    req.n_epochs = ne;
    req.steps = sp;
    req.n_steps = ns;
    uint8_t buf[8192];
    size_t len = kolo__worker_report_request__pack(&req, buf);
    void *out = NULL;
    size_t olen;
    int rv = rpc_client_call(cli, "WorkerService.Report", buf, len, &out, &olen, 3000, err, errlen);
    free(out);
    return rv;
}

static char *http_get(const char *path, int *status)
{
    return harness_http_get(coord_http_url(coord), path, status);
}

static struct json *get_json(const char *path, int want_status)
{
    int status;
    char *body = http_get(path, &status);
    if (status != want_status)
        fprintf(stderr, "GET %s: %d, want %d: %s\n", path, status, want_status, body);
    CHECK_EQ_INT(status, want_status);
    struct json *v = NULL;
    char err[128];
    REQUIRE(json_parse(body, strlen(body), &v, err, sizeof err) == 0);
    free(body);
    return v;
}

static double num(const struct json *o, const char *key)
{
    const struct json *v = json_get(o, key);
    REQUIRE(v);
    return v->type == JSON_NUMBER ? v->num : -999;
}

static void test_epochs(void)
{
    char err[512];
    struct rpc_client *r0 = client(job_id, 1, 0), *r1 = client(job_id, 1, 1);
    uint64_t t = 1700000000000ull;
    /* epoch 0: rank 0 reports start and end, rank 1 an end with its start */
    struct ep a[] = {{0, 0, t, 0, 0, NULL}, {0, 1, t + 2000, 0, 100, "{\"loss\":0.5,\"acc\":1}"}};
    CHECK_EQ_INT(report(r0, a, 2, NULL, 0, err, sizeof err), 0);
    struct ep b[] = {{0, 1, t + 2500, t + 500, 150, "{\"loss\":1.5,\"acc\":\"x\"}"}};
    struct st s[] = {{t + 1000, 0.25, 4}, {t + 2000, 0.5, 2}};
    CHECK_EQ_INT(report(r1, b, 1, s, 2, err, sizeof err), 0);
    /* epoch 1: only rank 0 so far */
    struct ep c[] = {{1, 1, t + 4500, t + 2000, 100, "{\"loss\":0.25}"}};
    CHECK_EQ_INT(report(r0, c, 1, NULL, 0, err, sizeof err), 0);

    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64 "/epochs", job_id);
    struct json *v = get_json(path, 200);
    const struct json *eps = json_get(v, "epochs");
    REQUIRE(eps && eps->count == 2);
    const struct json *e0 = json_at(eps, 0), *e1 = json_at(eps, 1);
    CHECK(num(e0, "epoch") == 0);
    CHECK(num(e0, "start_ms") == (double)t && num(e0, "end_ms") == (double)(t + 2500));
    CHECK(num(e0, "wall_s") == 2.5);
    CHECK(num(e0, "samples") == 250);
    CHECK(num(e0, "samples_per_s") == 100);
    CHECK(num(e0, "ranks_reported") == 2 && num(e0, "ranks_expected") == 2);
    CHECK(json_get(e0, "complete")->b);
    CHECK(num(json_get(e0, "metrics"), "loss") == 0.5);      /* rank 0's */
    CHECK(num(json_get(e0, "metrics_mean"), "loss") == 1.0); /* the mean */
    CHECK(num(json_get(e0, "metrics_mean"), "acc") == 1.0);  /* numbers only */
    CHECK(num(e1, "ranks_reported") == 1 && !json_get(e1, "complete")->b);
    CHECK(num(e1, "wall_s") == 2.5);
    json_free(v);

    /* GetEpochs, after epoch 0 */
    Kolo__GetEpochsRequest gq = KOLO__GET_EPOCHS_REQUEST__INIT;
    gq.job_id = job_id;
    gq.after_epoch = 0;
    uint8_t buf[64];
    size_t len = kolo__get_epochs_request__pack(&gq, buf);
    void *out = NULL;
    size_t olen;
    CHECK_EQ_INT(
        rpc_client_call(r0, "AdminService.GetEpochs", buf, len, &out, &olen, 3000, err, sizeof err),
        0);
    Kolo__GetEpochsReply *gr = kolo__get_epochs_reply__unpack(NULL, olen, out);
    REQUIRE(gr);
    CHECK(gr->n_epochs == 1 && gr->epochs[0]->epoch == 1 && !gr->epochs[0]->complete);
    CHECK(!gr->job_done);
    kolo__get_epochs_reply__free_unpacked(gr, NULL);
    free(out);
    gq.job_id = job_id + 77;
    len = kolo__get_epochs_request__pack(&gq, buf);
    CHECK_EQ_INT(
        rpc_client_call(r0, "AdminService.GetEpochs", buf, len, &out, &olen, 3000, err, sizeof err),
        KOLO_ENOTFOUND);

    /* steps: one host, the bucket holds both rows */
    snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64 "/steps?downsample=60", job_id);
    v = get_json(path, 200);
    const struct json *hosts = json_get(v, "hosts");
    REQUIRE(hosts && hosts->count == 1);
    const struct json *h = json_at(hosts, 0);
    CHECK_EQ_STR(json_get(h, "host")->str, "rep-host");
    const struct json *bk = json_get(h, "buckets");
    REQUIRE(bk && bk->count >= 1);
    double steps = 0;
    for (size_t i = 0; i < bk->count; i++)
        steps += num(json_at(bk, i), "steps");
    CHECK(steps == 6);
    json_free(v);

    /* ranks: the last step time and epoch of each */
    snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64 "/ranks", job_id);
    v = get_json(path, 200);
    const struct json *ranks = json_get(v, "ranks");
    REQUIRE(ranks && ranks->count == 2);
    CHECK(json_get(json_at(ranks, 0), "last_step_s")->type == JSON_NULL);
    CHECK(num(json_at(ranks, 0), "last_epoch") == 1);
    CHECK(num(json_at(ranks, 1), "last_step_s") == 0.5);
    CHECK(num(json_at(ranks, 1), "last_epoch") == 0);
    json_free(v);
    rpc_client_close(r0);
    rpc_client_close(r1);
}

/* The value of a counter in /metrics. */
static double metric(const char *name)
{
    return harness_metric(coord_http_url(coord), name);
}

static int count_step(const struct store_step *s, void *arg)
{
    (void)s;
    (*(int *)arg)++;
    return 0;
}

/* Step rows from many reports go to the store in one group commit (not a
 * transaction each), a reader sees them at once, and the coordinator's
 * shutdown stores what still waits (checked in main after coord_stop). */
#define GROUP_TS 5000000000000ull
static void test_steps_group_commit(void)
{
    char err[256];
    struct rpc_client *r0 = client(job_id, 1, 0), *r1 = client(job_id, 1, 1);
    double flushes0 = metric("kolo_report_step_flushes_total");
    REQUIRE(flushes0 >= 0);
    for (int i = 0; i < 20; i++) {
        struct st row = {GROUP_TS + (uint64_t)i * 1000, 0.25, 2};
        CHECK_EQ_INT(report(i % 2 ? r1 : r0, NULL, 0, &row, 1, err, sizeof err), 0);
    }
    double flushes = metric("kolo_report_step_flushes_total") - flushes0;
    /* the tick may commit once or twice meanwhile; 20 reports, not 20 */
    CHECK(flushes <= 3);
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64 "/steps?since_ms=%llu&downsample=1",
             job_id, (unsigned long long)GROUP_TS);
    struct json *v = get_json(path, 200);
    const struct json *hosts = json_get(v, "hosts");
    REQUIRE(hosts && hosts->count == 1);
    const struct json *bk = json_get(json_at(hosts, 0), "buckets");
    double steps = 0;
    for (size_t i = 0; bk && i < bk->count; i++)
        steps += num(json_at(bk, i), "steps");
    CHECK(steps == 40);
    json_free(v);
    CHECK_EQ_INT(metric("kolo_report_step_rows_lost_total"), 0);
    /* these wait for the shutdown's commit */
    for (int i = 0; i < 3; i++) {
        struct st row = {GROUP_TS + 100000 + (uint64_t)i * 1000, 0.5, 1};
        CHECK_EQ_INT(report(r0, NULL, 0, &row, 1, err, sizeof err), 0);
    }
    rpc_client_close(r0);
    rpc_client_close(r1);
}

static void check_shutdown_commit(void)
{
    struct store *st;
    char err[256];
    REQUIRE(store_open(&st, dbpath, err, sizeof err) == 0);
    int n = 0;
    CHECK_EQ_INT(store_steps_each(st, job_id, GROUP_TS + 100000, count_step, &n), 0);
    CHECK_EQ_INT(n, 3);
    store_close(st);
}

static void test_refused(void)
{
    char err[512];
    uint64_t t = 1700000000000ull;
    struct ep ok[] = {{5, 1, t, 0, 1, NULL}};
    /* fencing: a stale generation, an unknown job, a rank out of range */
    struct rpc_client *stale = client(job_id, 9, 0);
    CHECK_EQ_INT(report(stale, ok, 1, NULL, 0, err, sizeof err), KOLO_ESTALE);
    rpc_client_close(stale);
    struct rpc_client *nojob = client(job_id + 50, 1, 0);
    CHECK_EQ_INT(report(nojob, ok, 1, NULL, 0, err, sizeof err), KOLO_EINVAL);
    rpc_client_close(nojob);
    struct rpc_client *badrank = client(job_id, 1, 7);
    CHECK_EQ_INT(report(badrank, ok, 1, NULL, 0, err, sizeof err), KOLO_EINVAL);
    rpc_client_close(badrank);

    struct rpc_client *r0 = client(job_id, 1, 0);
    struct ep bad_phase[] = {{1, 2, t, 0, 0, NULL}};
    CHECK_EQ_INT(report(r0, bad_phase, 1, NULL, 0, err, sizeof err), KOLO_EINVAL);
    struct ep bad_epoch[] = {{-1, 1, t, 0, 0, NULL}};
    CHECK_EQ_INT(report(r0, bad_epoch, 1, NULL, 0, err, sizeof err), KOLO_EINVAL);
    struct ep bad_json[] = {{1, 1, t, 0, 0, "{loss"}};
    CHECK_EQ_INT(report(r0, bad_json, 1, NULL, 0, err, sizeof err), KOLO_EINVAL);
    CHECK(strstr(err, "metrics_json") != NULL);
    struct ep not_object[] = {{1, 1, t, 0, 0, "[1]"}};
    CHECK_EQ_INT(report(r0, not_object, 1, NULL, 0, err, sizeof err), KOLO_EINVAL);
    struct ep start_after_end[] = {{1, 1, t, t + 5, 0, NULL}};
    CHECK_EQ_INT(report(r0, start_after_end, 1, NULL, 0, err, sizeof err), KOLO_EINVAL);
    struct ep huge[] = {{1, 1, t, 0, (int64_t)1 << 60, NULL}};
    CHECK_EQ_INT(report(r0, huge, 1, NULL, 0, err, sizeof err), KOLO_EINVAL);
    struct st bad_step[] = {{t, -1.0, 1}};
    CHECK_EQ_INT(report(r0, NULL, 0, bad_step, 1, err, sizeof err), KOLO_EINVAL);
    struct st zero_count[] = {{t, 1.0, 0}};
    CHECK_EQ_INT(report(r0, NULL, 0, zero_count, 1, err, sizeof err), KOLO_EINVAL);
    /* a refused batch stores nothing: epoch 5 is not there */
    void *out = NULL;
    size_t olen;
    uint8_t garbage[] = {0xff, 0xff, 0xff};
    CHECK_EQ_INT(rpc_client_call(r0, "WorkerService.Report", garbage, sizeof garbage, &out, &olen,
                                 3000, err, sizeof err),
                 KOLO_EPROTO);
    rpc_client_close(r0);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64 "/epochs", job_id);
    struct json *v = get_json(path, 200);
    CHECK_EQ_INT((int)json_get(v, "epochs")->count, 2);
    json_free(v);
}

static void test_http_errors(void)
{
    const char *bad[] = {"downsample=0", "downsample=x", "downsample=86401",
                         "downsample=",  "since_ms=-5",  "downsample=1.5"};
    char path[200];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64 "/steps?%s", job_id, bad[i]);
        struct json *v = get_json(path, 400);
        const struct json *e = json_get(v, "error");
        CHECK(e && e->type == JSON_STRING && strlen(e->str) > 0);
        json_free(v);
    }
    const char *subs[] = {"epochs", "steps", "ranks"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "/api/v1/jobs/424242/%s", subs[i]);
        json_free(get_json(path, 404));
    }
    int status;
    char *body = http_get("/metrics", &status);
    CHECK_EQ_INT(status, 200);
    CHECK(strstr(body, "kolo_report_epochs_total 4\n") != NULL);
    CHECK(strstr(body, "kolo_report_step_rows_total 25\n") != NULL); /* 2 + test_steps_group_commit's 23 */
    CHECK(strstr(body, "kolo_reports_refused_total") != NULL);
    free(body);
}

/* WorkerService.Timeline starts and stops a timeline at run time; its
 * writer thread writes the file, REST serves it while open (after the
 * writer caught up) and after the stop, and the stop leaves the file
 * complete. Runs under the sanitizers with the writer thread. */
static int timeline_call(struct rpc_client *cli, const char *path)
{
    Kolo__TimelineRequest req = KOLO__TIMELINE_REQUEST__INIT;
    req.path = (char *)path;
    uint8_t buf[1024];
    size_t len = kolo__timeline_request__pack(&req, buf);
    void *out = NULL;
    size_t olen;
    char err[256];
    int rv = rpc_client_call(cli, "WorkerService.Timeline", buf, len, &out, &olen, 3000, err,
                             sizeof err);
    free(out);
    return rv;
}

/* timeline_read copies the coordinator's timeline for path from 0 to its
 * end with WorkerService.TimelineRead, as rank 0 does; the bytes (to
 * free) and whether the file ended. */
static char *timeline_read(struct rpc_client *cli, const char *path, size_t *len, bool *ended)
{
    struct buf b;
    buf_init(&b);
    *ended = false;
    for (int i = 0; i < 200 && !*ended; i++) {
        Kolo__TimelineReadRequest req = KOLO__TIMELINE_READ_REQUEST__INIT;
        req.path = (char *)path;
        req.offset = b.len;
        uint8_t in[1024];
        size_t ilen = kolo__timeline_read_request__pack(&req, in);
        void *out = NULL;
        size_t olen;
        char err[256];
        REQUIRE(rpc_client_call(cli, "WorkerService.TimelineRead", in, ilen, &out, &olen, 3000,
                                err, sizeof err) == 0);
        Kolo__TimelineReadReply *rep = kolo__timeline_read_reply__unpack(NULL, olen, out);
        REQUIRE(rep != NULL);
        buf_append(&b, rep->data.data, rep->data.len);
        *ended = rep->ended && b.len >= rep->size;
        bool idle = !rep->data.len;
        kolo__timeline_read_reply__free_unpacked(rep, NULL);
        free(out);
        if (idle && !*ended)
            usleep(20000);
    }
    *len = b.len;
    return buf_steal(&b, NULL);
}

static void test_timeline(void)
{
    char path[300], url[128];
    snprintf(path, sizeof path, "%s/tl.json", dir);
    snprintf(url, sizeof url, "/api/v1/jobs/%llu/timeline", (unsigned long long)job_id);
    struct rpc_client *r0 = client(job_id, 1, 0);
    int status = 0;
    char *body = http_get(url, &status);
    CHECK_EQ_INT(status, 404);
    free(body);
    for (int round = 0; round < 3; round++) {
        REQUIRE(timeline_call(r0, path) == 0);
        for (int i = 0; i < 20; i++) { /* the writer and REST, interleaved */
            struct json *tl = get_json(url, 200);
            REQUIRE(tl != NULL && tl->type == JSON_ARRAY && tl->count >= 2);
            json_free(tl);
        }
        REQUIRE(timeline_call(r0, "") == 0);
        /* issue 28: the path is a label; the coordinator's own file is in
         * its own directory, and TimelineRead hands it out whole */
        CHECK(access(path, F_OK) != 0);
        bool ended = false;
        size_t len = 0;
        char *data = timeline_read(r0, path, &len, &ended);
        CHECK(ended);
        CHECK(len > 2 && data[0] == '[' && memmem(data, len, "\n]\n", 3) != NULL);
        CHECK(memmem(data, len, "start_time_since_epoch_in_micros", 32) != NULL);
        char own[400];
        snprintf(own, sizeof own, "%s.timelines", dbpath);
        struct stat st;
        CHECK(stat(own, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
        free(data);
        struct json *tl = get_json(url, 200); /* the stopped file */
        CHECK(tl != NULL && tl->type == JSON_ARRAY);
        json_free(tl);
    }
    unlink(path);
    rpc_client_close(r0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The rule written the slow way: each rank against the sorted others. */
static bool straggler_brute(const double *lag, int n, int r)
{
    double others[64];
    int k = 0;
    for (int q = 0; q < n; q++)
        if (q != r)
            others[k++] = lag[q];
    if (k == 0)
        return false;
    qsort(others, (size_t)k, sizeof(*others), cmp_double);
    double med = k % 2 ? others[k / 2] : (others[k / 2 - 1] + others[k / 2]) / 2;
    return lag[r] >= 0.02 && lag[r] >= 3.0 * med && lag[r] >= 0.5 * others[k - 1];
}

/* The straggler rule alone: >= 20 ms late, >= 3x the others' median and
 * >= half the largest lag. */
static void test_straggler_rule(void)
{
    /* against the brute force, on random lags with ties */
    srand(7);
    int mismatches = 0;
    for (int round = 0; round < 2000; round++) {
        int n = 1 + rand() % 12;
        double lag[64];
        bool got[64];
        for (int r = 0; r < n; r++)
            lag[r] = (rand() % 8) * (rand() % 2 ? 0.005 : 0.04);
        coord_straggler_flags(lag, n, got);
        for (int r = 0; r < n; r++)
            mismatches += got[r] != straggler_brute(lag, n, r);
    }
    CHECK_EQ_INT(mismatches, 0);

    bool slow[5];
    double none[] = {0.001, 0.002, 0.0015, 0.001};
    coord_straggler_flags(none, 4, slow);
    for (int i = 0; i < 4; i++)
        CHECK(!slow[i]);
    double one[] = {0.001, 0.002, 0.12, 0.001};
    coord_straggler_flags(one, 4, slow);
    CHECK(!slow[0] && !slow[1] && slow[2] && !slow[3]);
    double two_ranks[] = {0.0, 0.05};
    coord_straggler_flags(two_ranks, 2, slow);
    CHECK(!slow[0] && slow[1]);
    /* everyone equally late (a noisy host): nobody is singled out */
    double even[] = {0.03, 0.035, 0.04, 0.03};
    coord_straggler_flags(even, 4, slow);
    for (int i = 0; i < 4; i++)
        CHECK(!slow[i]);
    /* late, but under the floor */
    double small[] = {0.0, 0.0, 0.015};
    coord_straggler_flags(small, 3, slow);
    CHECK(!slow[2]);
    /* two slow ranks of five are both named */
    double pair[] = {0.001, 0.2, 0.001, 0.18, 0.002};
    coord_straggler_flags(pair, 5, slow);
    CHECK(!slow[0] && slow[1] && !slow[2] && slow[3] && !slow[4]);
    /* a busy CPU made one rank 30 ms late beside a 120 ms straggler: the
     * job waits for the straggler alone */
    double busy[] = {0.001, 0.003, 0.12, 0.03};
    coord_straggler_flags(busy, 4, slow);
    CHECK(!slow[0] && !slow[1] && slow[2] && !slow[3]);
    /* one rank: nobody to wait for it */
    double solo[] = {0.5};
    coord_straggler_flags(solo, 1, slow);
    CHECK(!slow[0]);
}

/* The dashboard is compiled in: index at / and its files, nothing else. */
static void test_static_files(void)
{
    const struct static_file *f = static_file_find("/");
    REQUIRE(f != NULL);
    CHECK_EQ_STR(f->path, "/index.html");
    CHECK(f->len > 100 && memmem(f->data, f->len, "app.js", 6) != NULL);
    CHECK_EQ_STR(static_content_type(f->path), "text/html; charset=utf-8");
    const char *want[] = {"/app.js", "/charts.js", "/style.css", "/favicon.svg"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        CHECK(static_file_find(want[i]) != NULL);
    CHECK_EQ_STR(static_content_type("/app.js"), "text/javascript; charset=utf-8");
    CHECK_EQ_STR(static_content_type("/x.bin"), "application/octet-stream");
    CHECK(static_file_find("/nope.html") == NULL);
    CHECK(static_file_find("/../index.html") == NULL);
    CHECK(static_file_find("index.html") == NULL);
}

static void stop_job(uint64_t job, const char *reason)
{
    struct rpc_client *cli = client(0, 0, 0);
    Kolo__StopJobRequest stop = KOLO__STOP_JOB_REQUEST__INIT;
    stop.job_id = job;
    stop.reason = (char *)reason;
    void *out;
    size_t olen;
    harness_call(cli, "AdminService.StopJob", &stop.base, &out, &olen);
    free(out);
    rpc_client_close(cli);
}

/* Trials of two studies: one running (its curve is the mean over its two
 * ranks per complete epoch), one pruned, one stopped; a job of no study;
 * the list, one study, 404s, and an encoded name. */
static void test_studies(void)
{
    char *m0[] = {"kolo.study=st udy", "kolo.trial=0", "kolo.params={\"lr\":0.5}",
                  "kolo.metric=loss", "kolo.mode=min"};
    char *m1[] = {"kolo.study=st udy", "kolo.trial=1", "kolo.metric=loss"};
    char *m2[] = {"kolo.study=st udy", "kolo.trial=2", "kolo.params=not json"};
    char *m3[] = {"kolo.study=other", "kolo.mode=max", "kolo.metric=acc"};
    const char *url = coord_rpc_url(coord);
    uint64_t j0 = harness_submit_job_meta(url, "st-h0", 2, m0, 5);
    uint64_t j1 = harness_submit_job_meta(url, "st-h1", 1, m1, 3);
    uint64_t j2 = harness_submit_job_meta(url, "st-h2", 1, m2, 3);
    uint64_t j3 = harness_submit_job_meta(url, "st-h3", 1, m3, 3);
    REQUIRE(j0 && j1 && j2 && j3);
    char err[256];
    uint64_t t = 1700000100000ull;
    struct rpc_client *r0 = client(j0, 1, 0), *r1 = client(j0, 1, 1), *p0 = client(j1, 1, 0);
    struct ep a0[] = {{0, 1, t + 100, t, 10, "{\"loss\":1.0}"},
                      {1, 1, t + 200, t + 100, 10, "{\"loss\":0.5}"}};
    struct ep a1[] = {{0, 1, t + 110, t, 10, "{\"loss\":3.0}"}}; /* epoch 1: rank 0 only */
    struct ep b0[] = {{0, 1, t + 150, t, 10, "{\"loss\":0.25,\"acc\":1}"}};
    CHECK_EQ_INT(report(r0, a0, 2, NULL, 0, err, sizeof err), 0);
    CHECK_EQ_INT(report(r1, a1, 1, NULL, 0, err, sizeof err), 0);
    CHECK_EQ_INT(report(p0, b0, 1, NULL, 0, err, sizeof err), 0);
    stop_job(j1, "pruned by kolo tune after epoch 0");
    stop_job(j2, "the search was interrupted");

    struct json *v = get_json("/api/v1/studies", 200);
    const struct json *list = json_get(v, "studies");
    REQUIRE(list && list->count == 2);
    CHECK_EQ_STR(json_get(json_at(list, 0), "name")->str, "other"); /* newest first */
    CHECK_EQ_STR(json_get(json_at(list, 0), "mode")->str, "max");
    const struct json *s = json_at(list, 1);
    CHECK_EQ_STR(json_get(s, "name")->str, "st udy");
    CHECK(num(s, "trial_count") == 3);
    CHECK(num(json_get(s, "states"), "running") == 1);
    CHECK(num(json_get(s, "states"), "pruned") == 1);
    CHECK(num(json_get(s, "states"), "stopped") == 1);
    CHECK(json_get(s, "best_value")->type == JSON_NULL); /* no trial completed */
    CHECK(json_get(s, "last_ms")->num == 0);              /* one still runs */
    json_free(v);

    v = get_json("/api/v1/studies/st%20udy", 200);
    CHECK_EQ_STR(json_get(v, "metric")->str, "loss");
    const struct json *trials = json_get(v, "trials");
    REQUIRE(trials && trials->count == 3);
    const struct json *t0 = json_at(trials, 0), *t1 = json_at(trials, 1), *t2 = json_at(trials, 2);
    CHECK(num(t0, "number") == 0 && num(t0, "job") == (double)j0);
    CHECK_EQ_STR(json_get(t0, "state")->str, "running");
    CHECK(num(json_get(t0, "params"), "lr") == 0.5);
    const struct json *curve = json_get(t0, "curve");
    REQUIRE(curve && curve->count == 1); /* epoch 1 is not complete */
    CHECK(num(json_at(curve, 0), "value") == 2.0); /* (1.0 + 3.0) / 2 */
    CHECK(num(t0, "value") == 2.0 && num(t0, "epochs") == 1);
    CHECK_EQ_STR(json_get(t1, "state")->str, "pruned");
    CHECK(num(t1, "value") == 0.25);
    CHECK(json_get(t1, "params")->type == JSON_NULL);
    CHECK_EQ_STR(json_get(t2, "state")->str, "stopped");
    CHECK(json_get(t2, "params")->type == JSON_NULL); /* not JSON: null, not broken output */
    CHECK(json_get(v, "best_so_far")->count == 0);
    json_free(v);
    v = get_json("/api/v1/studies/nope", 404);
    json_free(v);
    v = get_json("/api/v1/studies/%ZZ", 404);
    json_free(v);
    /* the job carries its labels */
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64, j1);
    v = get_json(path, 200);
    CHECK_EQ_STR(json_get(json_get(v, "metadata"), "kolo.trial")->str, "1");
    CHECK_EQ_STR(json_get(v, "reason")->str, "pruned by kolo tune after epoch 0");
    json_free(v);
    rpc_client_close(r0);
    rpc_client_close(r1);
    rpc_client_close(p0);
}

int main(void)
{
    test_straggler_rule();
    test_static_files();
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(dbpath, sizeof dbpath, "%s/coord.db", dir);
    coord = start();
    make_job();
    test_epochs();
    test_steps_group_commit();
    test_refused();
    test_http_errors();
    test_timeline();
    test_studies();
    coord_stop(coord);
    check_shutdown_commit();
    test_remove_db(dbpath, dir);
    TEST_DONE();
}
