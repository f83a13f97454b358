/*
 * test_store_report.c - training progress in the store (schema version 4,
 * issue 6): epoch boundaries (start, end, an end that brings its own
 * start, a start that comes later), step rows merged per second, the
 * per-job cap, bad arguments, and the migration of a version 3 file.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "errors.h"
#include "store.h"
#include "test.h"

static char dir[] = "/tmp/kolo-test-store-report-XXXXXX";
static char db_path[256];

static struct store *open_store(void)
{
    struct store *st = NULL;
    char err[256];
    int rc = store_open(&st, db_path, err, sizeof err);
    if (rc)
        fprintf(stderr, "store_open: %s\n", err);
    REQUIRE(rc == 0);
    return st;
}

static uint64_t new_job(struct store *st)
{
    struct store_job j = {.name = "report", .state = "running", .np = 2};
    REQUIRE(store_job_insert(st, &j) == 0);
    return j.id;
}

struct epochs {
    struct store_epoch v[16];
    char metrics[16][64];
    int n;
};

static int copy_epoch(const struct store_epoch *e, void *arg)
{
    struct epochs *es = arg;
    REQUIRE(es->n < 16);
    es->v[es->n] = *e;
    snprintf(es->metrics[es->n], sizeof es->metrics[0], "%s",
             e->metrics_json ? e->metrics_json : "(null)");
    es->v[es->n].metrics_json = es->metrics[es->n];
    es->n++;
    return 0;
}

static void test_epochs(struct store *st)
{
    uint64_t job = new_job(st);
    struct store_job labelled = {.name = "m", .state = "pending", .metadata_json = "[\"a=b\"]"};
    CHECK_EQ_INT(store_job_insert(st, &labelled), 0);
    struct store_epoch e = {
        .job_id = job, .generation = 1, .rank = 0, .epoch = 0, .start_ms = 1000};
    CHECK_EQ_INT(store_epoch_report(st, &e, 0), 0);
    /* the end keeps the recorded start */
    e = (struct store_epoch){.job_id = job,
                             .generation = 1,
                             .rank = 0,
                             .epoch = 0,
                             .start_ms = 1,
                             .end_ms = 5000,
                             .samples = 64,
                             .metrics_json = "{\"loss\":0.5}"};
    CHECK_EQ_INT(store_epoch_report(st, &e, 1), 0);
    /* rank 1: an end that brings its own start */
    e = (struct store_epoch){.job_id = job,
                             .generation = 1,
                             .rank = 1,
                             .epoch = 0,
                             .start_ms = 1200,
                             .end_ms = 5200,
                             .samples = 32};
    CHECK_EQ_INT(store_epoch_report(st, &e, 1), 0);
    /* epoch 1 of rank 0 only started; an end resent is an update */
    e = (struct store_epoch){
        .job_id = job, .generation = 1, .rank = 0, .epoch = 1, .start_ms = 5000};
    CHECK_EQ_INT(store_epoch_report(st, &e, 0), 0);
    /* a second generation re-runs epoch 1 */
    e = (struct store_epoch){.job_id = job,
                             .generation = 2,
                             .rank = 0,
                             .epoch = 1,
                             .start_ms = 0,
                             .end_ms = 9000,
                             .samples = 10};
    CHECK_EQ_INT(store_epoch_report(st, &e, 1), 0);

    struct epochs es = {0};
    CHECK_EQ_INT(store_epochs_each(st, job, copy_epoch, &es), 0);
    REQUIRE(es.n == 4);
    /* by epoch, generation, rank */
    CHECK(es.v[0].epoch == 0 && es.v[0].rank == 0 && es.v[0].start_ms == 1000);
    CHECK(es.v[0].end_ms == 5000 && es.v[0].samples == 64);
    CHECK_EQ_STR(es.metrics[0], "{\"loss\":0.5}");
    CHECK(es.v[1].rank == 1 && es.v[1].start_ms == 1200 && es.v[1].end_ms == 5200);
    CHECK_EQ_STR(es.metrics[1], "(null)");
    CHECK(es.v[2].epoch == 1 && es.v[2].generation == 1 && es.v[2].end_ms == 0);
    CHECK(es.v[3].epoch == 1 && es.v[3].generation == 2 && es.v[3].start_ms == 0 &&
          es.v[3].end_ms == 9000);

    /* bad arguments, an unknown job */
    e = (struct store_epoch){.job_id = job, .generation = 1, .rank = 0, .epoch = -1};
    CHECK_EQ_INT(store_epoch_report(st, &e, 0), KOLO_EINVAL);
    e.epoch = 0;
    CHECK_EQ_INT(store_epoch_report(st, &e, 2), KOLO_EINVAL);
    e.samples = -1;
    CHECK_EQ_INT(store_epoch_report(st, &e, 1), KOLO_EINVAL);
    e = (struct store_epoch){
        .job_id = job + 100, .generation = 1, .rank = 0, .epoch = 0, .end_ms = 5};
    CHECK_EQ_INT(store_epoch_report(st, &e, 1), KOLO_ENOTFOUND);
    CHECK_EQ_INT(store_epoch_report(st, NULL, 1), KOLO_EINVAL);
    CHECK_EQ_INT(store_epochs_each(st, job, NULL, NULL), KOLO_EINVAL);
}

struct steps {
    struct store_step v[64];
    int n;
};

static int copy_step(const struct store_step *s, void *arg)
{
    struct steps *ss = arg;
    REQUIRE(ss->n < 64);
    ss->v[ss->n] = *s;
    ss->v[ss->n].host_id = NULL; /* valid only during the call */
    ss->n++;
    return 0;
}

static void test_steps(struct store *st)
{
    uint64_t job = new_job(st);
    struct store_step rows[] = {
        {.job_id = job, .rank = 0, .host_id = "h", .ts_ms = 1000, .seconds = 0.1, .n = 1},
        {.job_id = job, .rank = 1, .host_id = "h", .ts_ms = 1000, .seconds = 0.2, .n = 2},
        {.job_id = job, .rank = 0, .host_id = "h", .ts_ms = 2000, .seconds = 0.3, .n = 1},
    };
    CHECK_EQ_INT(store_steps_add(st, rows, 3), 0);
    /* the same second again: a weighted mean, (0.1 * 1 + 0.4 * 3) / 4 */
    struct store_step more = {
        .job_id = job, .rank = 0, .host_id = "h", .ts_ms = 1000, .seconds = 0.4, .n = 3};
    CHECK_EQ_INT(store_steps_add(st, &more, 1), 0);
    struct steps ss = {0};
    CHECK_EQ_INT(store_steps_each(st, job, 0, copy_step, &ss), 0);
    REQUIRE(ss.n == 3);
    CHECK(ss.v[0].rank == 0 && ss.v[0].ts_ms == 1000 && ss.v[0].n == 4);
    CHECK(fabs(ss.v[0].seconds - 0.325) < 1e-9);
    CHECK(ss.v[1].rank == 1 && ss.v[1].n == 2);
    CHECK(ss.v[2].ts_ms == 2000);
    ss.n = 0;
    CHECK_EQ_INT(store_steps_each(st, job, 1500, copy_step, &ss), 0);
    CHECK_EQ_INT(ss.n, 1);

    /* all or nothing: a bad row fails the batch */
    struct store_step bad[] = {
        {.job_id = job, .rank = 0, .ts_ms = 5000, .seconds = 0.1, .n = 1},
        {.job_id = job, .rank = 0, .ts_ms = 6000, .seconds = 0.1, .n = 0},
    };
    CHECK_EQ_INT(store_steps_add(st, bad, 2), KOLO_EINVAL);
    bad[1].n = 1;
    bad[1].seconds = NAN;
    CHECK_EQ_INT(store_steps_add(st, bad, 2), KOLO_EINVAL);
    ss.n = 0;
    CHECK_EQ_INT(store_steps_each(st, job, 0, copy_step, &ss), 0);
    CHECK_EQ_INT(ss.n, 3);

    /* the cap keeps the newest rows */
    for (int i = 0; i < 20; i++) {
        struct store_step s = {
            .job_id = job, .rank = 2, .ts_ms = 10000 + 1000 * (uint64_t)i, .seconds = 0.5, .n = 1};
        CHECK_EQ_INT(store_steps_add(st, &s, 1), 0);
    }
    int deleted = -1;
    CHECK_EQ_INT(store_steps_prune(st, job, 5, &deleted), 0);
    CHECK_EQ_INT(deleted, 18);
    ss.n = 0;
    CHECK_EQ_INT(store_steps_each(st, job, 0, copy_step, &ss), 0);
    CHECK_EQ_INT(ss.n, 5);
    CHECK(ss.v[0].ts_ms == 25000);
    CHECK_EQ_INT(store_steps_prune(st, job, 0, NULL), KOLO_EINVAL);
}

static void raw_exec(const char *sql)
{
    sqlite3 *db;
    REQUIRE(sqlite3_open(db_path, &db) == SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK)
        fprintf(stderr, "raw_exec: %s\n", msg ? msg : "?");
    sqlite3_free(msg);
    sqlite3_close(db);
    REQUIRE(rc == SQLITE_OK);
}

/* A version 3 file (no report tables, no snapshots.duration_ms of version
 * 5, no jobs.metadata_json of version 6) is migrated to the newest version. */
static void test_migration(void)
{
    raw_exec("DROP TABLE epochs; DROP TABLE steps; "
             "ALTER TABLE snapshots DROP COLUMN duration_ms; "
             "ALTER TABLE jobs DROP COLUMN metadata_json; DROP TABLE stacks; "
             "ALTER TABLE generations DROP COLUMN rec_told_ms; "
             "ALTER TABLE generations DROP COLUMN rec_formed_ms; "
             "ALTER TABLE generations DROP COLUMN rec_restored_ms; "
             "ALTER TABLE generations DROP COLUMN rec_step_ms; PRAGMA user_version = 3;");
    struct store *st = open_store();
    CHECK_EQ_INT(store_schema_version(st), STORE_SCHEMA_VERSION);
    uint64_t job = new_job(st);
    struct store_job labelled = {.name = "m", .state = "pending", .metadata_json = "[\"a=b\"]"};
    CHECK_EQ_INT(store_job_insert(st, &labelled), 0);
    struct store_epoch e = {
        .job_id = job, .generation = 1, .rank = 0, .epoch = 0, .start_ms = 1, .end_ms = 2};
    CHECK_EQ_INT(store_epoch_report(st, &e, 1), 0);
    char err[256];
    CHECK_EQ_INT(store_integrity_check(st, err, sizeof err), 0);
    store_close(st);
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(db_path, sizeof db_path, "%s/store.db", dir);
    struct store *st = open_store();
    CHECK(STORE_SCHEMA_VERSION >= 4);
    test_epochs(st);
    test_steps(st);
    store_close(st);
    test_migration();
    test_remove_db(db_path, dir);
    TEST_DONE();
}
