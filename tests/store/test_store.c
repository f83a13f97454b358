/*
 * test_store.c - every store API on a real database file: create, migrate,
 * reopen, upserts, nested transactions, event and output paging, and the
 * refusal of a database from a newer kolo.
 *
 * A raw sqlite3 connection is used only to look at what the store API does
 * not expose (journal mode, generations) and to fake a future schema.
 */
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "errors.h"
#include "store.h"
#include "test.h"

static char dir[] = "/tmp/kolo-test-store-XXXXXX";
static char db_path[256];

/* ------------------------------------------------------------ raw helpers */

static long long raw_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    REQUIRE(sqlite3_open(path, &db) == SQLITE_OK);
    sqlite3_stmt *s = NULL;
    REQUIRE(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK);
    long long value = -1;
    if (sqlite3_step(s) == SQLITE_ROW)
        value = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return value;
}

static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    REQUIRE(sqlite3_open(path, &db) == SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK)
        fprintf(stderr, "raw_exec(%s): %s\n", sql, msg ? msg : "?");
    REQUIRE(rc == SQLITE_OK);
    sqlite3_free(msg);
    sqlite3_close(db);
}

static struct store *open_store(const char *path)
{
    struct store *st = NULL;
    char err[256];
    int rc = store_open(&st, path, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "store_open(%s): %s: %s\n", path, abi_errname(rc), err);
    REQUIRE(rc == 0 && st);
    return st;
}

/* ---------------------------------------------------------- open, schema */

static void test_open_create(void)
{
    struct store *st = open_store(db_path);
    CHECK_EQ_INT(store_schema_version(st), STORE_SCHEMA_VERSION);
    char err[256];
    CHECK_EQ_INT(store_integrity_check(st, err, sizeof err), 0);
    store_close(st);
    CHECK(access(db_path, F_OK) == 0);

    /* WAL is a property of the file, so a plain connection sees it. */
    sqlite3 *db = NULL;
    REQUIRE(sqlite3_open(db_path, &db) == SQLITE_OK);
    sqlite3_stmt *s = NULL;
    REQUIRE(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL) == SQLITE_OK);
    REQUIRE(sqlite3_step(s) == SQLITE_ROW);
    CHECK_EQ_STR((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    sqlite3_close(db);

    /* Reopening an up-to-date file runs no migration and keeps the version. */
    st = open_store(db_path);
    CHECK_EQ_INT(store_schema_version(st), STORE_SCHEMA_VERSION);
    store_close(st);

    CHECK_EQ_INT(store_open(NULL, db_path, NULL, 0), KOLO_EINVAL);
    store_close(NULL);
}

static void test_meta(struct store *st)
{
    char value[64];
    CHECK_EQ_INT(store_meta_get(st, "cluster", value, sizeof value), KOLO_ENOTFOUND);
    CHECK_EQ_INT(store_meta_put(st, "cluster", "alpha"), 0);
    CHECK_EQ_INT(store_meta_get(st, "cluster", value, sizeof value), 0);
    CHECK_EQ_STR(value, "alpha");
    CHECK_EQ_INT(store_meta_put(st, "cluster", "beta-longer-value"), 0);
    CHECK_EQ_INT(store_meta_get(st, "cluster", value, sizeof value), 0);
    CHECK_EQ_STR(value, "beta-longer-value");
    char small[4];
    CHECK_EQ_INT(store_meta_get(st, "cluster", small, sizeof small), KOLO_ETOOBIG);
    CHECK_EQ_STR(small, "bet");
    CHECK_EQ_INT(store_meta_put(st, NULL, "x"), KOLO_EINVAL);
    CHECK(store_last_error(st)[0] != '\0');
}

/* ------------------------------------------------------------------ hosts */

struct host_seen {
    int n;
    char ids[8][32];
    int64_t order[8];
    uint64_t registered_ms[8];
    char names[8][32];
    char states[8][16];
    int gpu_names_null[8];
};

static int collect_host(const struct store_host *h, void *arg)
{
    struct host_seen *seen = arg;
    if (seen->n >= 8)
        return 1;
    int i = seen->n++;
    snprintf(seen->ids[i], sizeof seen->ids[i], "%s", h->id);
    snprintf(seen->names[i], sizeof seen->names[i], "%s", h->name ? h->name : "(null)");
    snprintf(seen->states[i], sizeof seen->states[i], "%s", h->state);
    seen->order[i] = h->order;
    seen->registered_ms[i] = h->registered_ms;
    seen->gpu_names_null[i] = h->gpu_names == NULL;
    return 0;
}

static int stop_at_first_host(const struct store_host *h, void *arg)
{
    (*(int *)arg)++;
    return 42;
}

static void test_hosts(struct store *st)
{
    struct store_host h = {.id = "h-b",
                           .name = "beta",
                           .hostname = "beta.local",
                           .addr = "10.0.0.2:7070",
                           .slots = 2,
                           .cpus = 8,
                           .gpus = 1,
                           .gpu_names = "[\"H100\"]",
                           .mem_bytes = 64ull << 30,
                           .state = "alive",
                           .registered_ms = 1000,
                           .last_seen_ms = 1000};
    CHECK_EQ_INT(store_host_put(st, &h), 0);
    h.id = "h-a";
    h.name = "alpha";
    h.gpu_names = NULL;
    h.registered_ms = 2000;
    CHECK_EQ_INT(store_host_put(st, &h), 0);
    h.id = "h-c";
    h.name = "gamma";
    h.registered_ms = 3000;
    CHECK_EQ_INT(store_host_put(st, &h), 0);

    /* h-b reconnects: new name, later registration time, a bogus order. It
     * must keep its first place and its first registration time. */
    struct store_host again = {.id = "h-b",
                               .name = "beta2",
                               .state = "alive",
                               .slots = 4,
                               .registered_ms = 9000,
                               .last_seen_ms = 9000,
                               .order = 77};
    CHECK_EQ_INT(store_host_put(st, &again), 0);

    struct host_seen seen = {0};
    CHECK_EQ_INT(store_hosts_each(st, collect_host, &seen), 0);
    REQUIRE(seen.n == 3);
    CHECK_EQ_STR(seen.ids[0], "h-b");
    CHECK_EQ_STR(seen.ids[1], "h-a");
    CHECK_EQ_STR(seen.ids[2], "h-c");
    CHECK(seen.order[0] < seen.order[1] && seen.order[1] < seen.order[2]);
    CHECK_EQ_STR(seen.names[0], "beta2");
    CHECK_EQ_INT(seen.registered_ms[0], 1000);
    CHECK(seen.gpu_names_null[0]);
    CHECK(seen.gpu_names_null[1]);

    CHECK_EQ_INT(store_host_set_state(st, "h-a", "lost", 5000), 0);
    CHECK_EQ_INT(store_host_set_state(st, "nope", "lost", 5000), KOLO_ENOTFOUND);
    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_hosts_each(st, collect_host, &seen), 0);
    CHECK_EQ_STR(seen.states[1], "lost");

    struct store_host bad = {.id = NULL, .state = "alive"};
    CHECK_EQ_INT(store_host_put(st, &bad), KOLO_EINVAL);
    int calls = 0;
    CHECK_EQ_INT(store_hosts_each(st, stop_at_first_host, &calls), 42);
    CHECK_EQ_INT(calls, 1);
}

/* ------------------------------------------------------------------- jobs */

struct job_seen {
    int n;
    uint64_t ids[8];
    char states[8][16];
    char names[8][32];
    char meta[8][64];
    uint64_t generation[8];
    int nested_total;
    struct store *st;
};

static int count_job(const struct store_job *j, void *arg)
{
    (*(int *)arg)++;
    return 0;
}

static int collect_job(const struct store_job *j, void *arg)
{
    struct job_seen *seen = arg;
    if (seen->n >= 8)
        return 1;
    int i = seen->n++;
    seen->ids[i] = j->id;
    snprintf(seen->states[i], sizeof seen->states[i], "%s", j->state);
    snprintf(seen->names[i], sizeof seen->names[i], "%s", j->name ? j->name : "(null)");
    snprintf(seen->meta[i], sizeof seen->meta[i], "%s",
             j->metadata_json ? j->metadata_json : "(null)");
    seen->generation[i] = j->generation;
    /* Walk the jobs again from inside the walk: the store must not reuse
     * the statement that is still stepping. */
    int inner = 0;
    if (seen->st && store_jobs_each(seen->st, count_job, &inner) == 0)
        seen->nested_total += inner;
    return 0;
}

static void test_jobs(struct store *st, uint64_t *job1, uint64_t *job2)
{
    struct store_job j = {.name = "train",
                          .state = "pending",
                          .np = 4,
                          .argv_json = "[\"python\",\"train.py\"]",
                          .env_json = "[]",
                          .cwd = "/w",
                          .hosts = "",
                          .submitted_ms = 100,
                          .start_timeout_ms = 30000,
                          .metadata_json = "[\"kolo.study=s\"]"};
    CHECK_EQ_INT(store_job_insert(st, &j), 0);
    CHECK(j.id > 0);
    *job1 = j.id;
    j.name = "eval";
    j.metadata_json = NULL;
    CHECK_EQ_INT(store_job_insert(st, &j), 0);
    CHECK(j.id > *job1);
    *job2 = j.id;

    struct store_job upd = {.id = *job1,
                            .name = "ignored",
                            .state = "running",
                            .np = 4,
                            .hosts = "h-a:2,h-b:2",
                            .generation = 1,
                            .started_ms = 200};
    CHECK_EQ_INT(store_job_update(st, &upd), 0);
    upd.id = 9999;
    CHECK_EQ_INT(store_job_update(st, &upd), KOLO_ENOTFOUND);
    upd.id = 0;
    CHECK_EQ_INT(store_job_update(st, &upd), KOLO_EINVAL);

    struct job_seen seen = {.st = st};
    CHECK_EQ_INT(store_jobs_each(st, collect_job, &seen), 0);
    REQUIRE(seen.n == 2);
    CHECK_EQ_INT(seen.ids[0], *job1);
    CHECK_EQ_STR(seen.states[0], "running");
    CHECK_EQ_STR(seen.names[0], "train"); /* name is fixed at insert */
    CHECK_EQ_STR(seen.meta[0], "[\"kolo.study=s\"]"); /* so is the metadata */
    CHECK_EQ_STR(seen.meta[1], "(null)");
    CHECK_EQ_INT(seen.generation[0], 1);
    CHECK_EQ_STR(seen.states[1], "pending");
    CHECK_EQ_INT(seen.nested_total, 4);

    /* AUTOINCREMENT: the id of a deleted newest job is never handed out. */
    struct store_job tmp = {.name = "tmp", .state = "pending"};
    CHECK_EQ_INT(store_job_insert(st, &tmp), 0);
    char sql[128];
    snprintf(sql, sizeof sql, "DELETE FROM jobs WHERE id = %llu", (unsigned long long)tmp.id);
    raw_exec(db_path, sql);
    uint64_t deleted = tmp.id;
    CHECK_EQ_INT(store_job_insert(st, &tmp), 0);
    CHECK(tmp.id > deleted);
    snprintf(sql, sizeof sql, "DELETE FROM jobs WHERE id = %llu", (unsigned long long)tmp.id);
    raw_exec(db_path, sql);
}

/* ---------------------------------------------------- generations, ranks */

struct rank_seen {
    int n;
    int ranks[8];
    char states[8][16];
    char hosts[8][16];
    int exit_code[8];
    int pid[8];
};

static int collect_rank(const struct store_rank *r, void *arg)
{
    struct rank_seen *seen = arg;
    if (seen->n >= 8)
        return 1;
    int i = seen->n++;
    seen->ranks[i] = r->rank;
    snprintf(seen->states[i], sizeof seen->states[i], "%s", r->state);
    snprintf(seen->hosts[i], sizeof seen->hosts[i], "%s", r->host_id ? r->host_id : "");
    seen->exit_code[i] = r->exit_code;
    seen->pid[i] = r->pid;
    return 0;
}

struct gens_seen {
    int n;
    uint64_t gen[4];
    bool has_rec[4];
    struct store_recovery rec[4];
};

static int gens_cb(uint64_t generation, const char *cause, int size, uint64_t ts_ms,
                   const struct store_recovery *rec, void *arg)
{
    (void)cause, (void)size, (void)ts_ms;
    struct gens_seen *g = arg;
    if (g->n < 4) {
        g->gen[g->n] = generation;
        g->has_rec[g->n] = rec != NULL;
        if (rec)
            g->rec[g->n] = *rec;
        g->n++;
    }
    return 0;
}

static void test_generations_ranks(struct store *st, uint64_t job)
{
    CHECK_EQ_INT(store_generation_add(st, job, 1, "start", 3, 300), 0);
    CHECK_EQ_INT(store_generation_add(st, job, 2, "host lost", 2, 400), 0);
    CHECK_EQ_INT(store_generation_add(st, job, 1, "again", 3, 500), KOLO_EEXIST);
    CHECK_EQ_INT(store_generation_add(st, 123456, 1, "no job", 1, 500), KOLO_ENOTFOUND);
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM generations WHERE job_id = %llu",
             (unsigned long long)job);
    CHECK_EQ_INT(raw_int(db_path, sql), 2);
    /* the recovery generation 2 began with (job.recovered); generation 1
     * began with the start, it has none */
    struct store_recovery rec = {.told_ms = 3, .formed_ms = 20, .restored_ms = 31, .step_ms = 9};
    CHECK_EQ_INT(store_generation_recovery(st, job, 2, &rec), 0);
    CHECK_EQ_INT(store_generation_recovery(st, 0, 2, &rec), KOLO_EINVAL);
    struct gens_seen g = {0};
    CHECK_EQ_INT(store_generations_each(st, job, gens_cb, &g), 0);
    CHECK_EQ_INT(g.n, 2);
    CHECK(g.gen[0] == 1 && !g.has_rec[0]);
    CHECK(g.gen[1] == 2 && g.has_rec[1] && g.rec[1].told_ms == 3 && g.rec[1].formed_ms == 20 &&
          g.rec[1].restored_ms == 31 && g.rec[1].step_ms == 9);

    /* Stored out of order, read back by rank. */
    struct store_rank rs[3] = {
        {.job_id = job,
         .generation = 1,
         .rank = 2,
         .host_id = "h-c",
         .local_rank = 0,
         .local_size = 1,
         .cross_rank = 2,
         .cross_size = 3,
         .state = "assigned"},
        {.job_id = job,
         .generation = 1,
         .rank = 0,
         .host_id = "h-a",
         .local_rank = 0,
         .local_size = 1,
         .cross_rank = 0,
         .cross_size = 3,
         .state = "assigned"},
        {.job_id = job,
         .generation = 1,
         .rank = 1,
         .host_id = "h-b",
         .local_rank = 0,
         .local_size = 1,
         .cross_rank = 1,
         .cross_size = 3,
         .state = "assigned"},
    };
    CHECK_EQ_INT(store_ranks_put(st, rs, 3), 0);
    CHECK_EQ_INT(store_ranks_put(st, rs, 0), 0);

    struct store_rank upd = {
        .job_id = job, .generation = 1, .rank = 1, .state = "exited", .exit_code = 3, .pid = 4242};
    CHECK_EQ_INT(store_rank_update(st, &upd), 0);
    upd.rank = 7;
    CHECK_EQ_INT(store_rank_update(st, &upd), KOLO_ENOTFOUND);

    struct rank_seen seen = {0};
    CHECK_EQ_INT(store_ranks_each(st, job, 1, collect_rank, &seen), 0);
    REQUIRE(seen.n == 3);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(seen.ranks[i], i);
    CHECK_EQ_STR(seen.hosts[0], "h-a");
    CHECK_EQ_STR(seen.states[1], "exited");
    CHECK_EQ_INT(seen.exit_code[1], 3);
    CHECK_EQ_INT(seen.pid[1], 4242);

    /* A batch with one bad rank (unknown host) stores none of its ranks. */
    struct store_rank batch[2] = {
        {.job_id = job, .generation = 2, .rank = 0, .host_id = "h-a", .state = "assigned"},
        {.job_id = job, .generation = 2, .rank = 1, .host_id = "no-such-host", .state = "assigned"},
    };
    CHECK_EQ_INT(store_ranks_put(st, batch, 2), KOLO_ENOTFOUND);
    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_ranks_each(st, job, 2, collect_rank, &seen), 0);
    CHECK_EQ_INT(seen.n, 0);

    /* A re-put of a rank replaces it. */
    rs[0].state = "running";
    rs[0].pid = 99;
    CHECK_EQ_INT(store_ranks_put(st, rs, 1), 0);
    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_ranks_each(st, job, 1, collect_rank, &seen), 0);
    CHECK_EQ_INT(seen.n, 3);
    CHECK_EQ_STR(seen.states[2], "running");
    CHECK_EQ_INT(seen.pid[2], 99);
}

/* ----------------------------------------------------------------- events */

struct event_seen {
    int n;
    int64_t ids[32];
    uint64_t job_ids[32];
    int host_null[32];
    char messages[32][32];
};

static int collect_event(const struct store_event *ev, void *arg)
{
    struct event_seen *seen = arg;
    if (seen->n >= 32)
        return 1;
    int i = seen->n++;
    seen->ids[i] = ev->id;
    seen->job_ids[i] = ev->job_id;
    seen->host_null[i] = ev->host_id == NULL;
    snprintf(seen->messages[i], sizeof seen->messages[i], "%s", ev->message ? ev->message : "");
    return 0;
}

static struct event_seen events(struct store *st, uint64_t job, int64_t after, int limit)
{
    struct event_seen seen = {0};
    CHECK_EQ_INT(store_events_each(st, job, after, limit, collect_event, &seen), 0);
    for (int i = 1; i < seen.n; i++)
        CHECK(seen.ids[i] > seen.ids[i - 1]);
    return seen;
}

static void test_events(struct store *st, uint64_t job1, uint64_t job2)
{
    /* Ten events: even ones for job1, every third for job2, the rest none. */
    int64_t ids[10];
    for (int i = 0; i < 10; i++) {
        char msg[32];
        snprintf(msg, sizeof msg, "event %d", i);
        uint64_t job = i % 2 == 0 ? job1 : i % 3 == 0 ? job2 : 0;
        struct store_event ev = {.ts_ms = 1000 + (uint64_t)i,
                                 .job_id = job,
                                 .host_id = i == 4 ? NULL : "h-a",
                                 .kind = "test",
                                 .message = msg};
        CHECK_EQ_INT(store_event_add(st, &ev), 0);
        ids[i] = ev.id;
        if (i > 0)
            CHECK(ids[i] > ids[i - 1]);
    }
    struct store_event bad = {.kind = NULL};
    CHECK_EQ_INT(store_event_add(st, &bad), KOLO_EINVAL);

    struct event_seen all = events(st, 0, 0, 0);
    CHECK_EQ_INT(all.n, 10);
    CHECK_EQ_STR(all.messages[0], "event 0");
    CHECK(all.host_null[4]);
    CHECK(!all.host_null[5]);
    CHECK_EQ_INT(all.job_ids[1], 0);
    CHECK_EQ_INT(all.job_ids[3], job2);

    struct event_seen after = events(st, 0, ids[6], 0);
    CHECK_EQ_INT(after.n, 3);
    CHECK_EQ_INT(after.ids[0], ids[7]);

    struct event_seen page = events(st, 0, ids[1], 3);
    CHECK_EQ_INT(page.n, 3);
    CHECK_EQ_INT(page.ids[0], ids[2]);
    CHECK_EQ_INT(page.ids[2], ids[4]);

    /* The newest three, oldest of them first. */
    struct event_seen tail = events(st, 0, -1, 3);
    CHECK_EQ_INT(tail.n, 3);
    CHECK_EQ_INT(tail.ids[0], ids[7]);
    CHECK_EQ_INT(tail.ids[2], ids[9]);

    struct event_seen everything = events(st, 0, -1, 0);
    CHECK_EQ_INT(everything.n, 10);

    /* job1 has events 0,2,4,6,8; job2 has 3 and 9. */
    struct event_seen j1 = events(st, job1, 0, 0);
    CHECK_EQ_INT(j1.n, 5);
    CHECK_EQ_STR(j1.messages[4], "event 8");
    struct event_seen j1_tail = events(st, job1, -1, 2);
    CHECK_EQ_INT(j1_tail.n, 2);
    CHECK_EQ_STR(j1_tail.messages[0], "event 6");
    CHECK_EQ_STR(j1_tail.messages[1], "event 8");
    struct event_seen j1_page = events(st, job1, ids[2], 2);
    CHECK_EQ_INT(j1_page.n, 2);
    CHECK_EQ_STR(j1_page.messages[0], "event 4");
    struct event_seen j2 = events(st, job2, 0, 0);
    CHECK_EQ_INT(j2.n, 2);
    CHECK_EQ_STR(j2.messages[1], "event 9");
    struct event_seen big_tail = events(st, job2, -5, 100);
    CHECK_EQ_INT(big_tail.n, 2);
    struct event_seen none = events(st, 0, ids[9], 0);
    CHECK_EQ_INT(none.n, 0);
}

/* ----------------------------------------------------------------- output */

struct output_seen {
    int n;
    uint64_t seq[16];
    size_t len[16];
    char text[16][32];
    int stream[16];
    int terminated[16];
};

static int collect_output(const struct store_output *o, void *arg)
{
    struct output_seen *seen = arg;
    if (seen->n >= 16)
        return 1;
    int i = seen->n++;
    seen->seq[i] = o->seq;
    seen->len[i] = o->text_len;
    seen->stream[i] = o->stream;
    memcpy(seen->text[i], o->text, o->text_len < 32 ? o->text_len : 32);
    seen->terminated[i] = o->text[o->text_len] == '\0';
    return 0;
}

static void test_output(struct store *st, uint64_t job1, uint64_t job2)
{
    uint64_t max = 77;
    CHECK_EQ_INT(store_output_max_seq(st, job1, &max), 0);
    CHECK_EQ_INT(max, 0);

    static const char binary[] = {'a', '\0', 'b', '\n', '\xff', '\0'};
    struct store_output lines[4] = {
        {.job_id = job1, .seq = 1, .rank = 0, .stream = 1, .text = "hello\n", .text_len = 6},
        {.job_id = job1,
         .seq = 2,
         .rank = 1,
         .stream = 2,
         .text = binary,
         .text_len = sizeof binary},
        {.job_id = job1, .seq = 3, .rank = 0, .stream = 1, .text = NULL, .text_len = 0},
        {.job_id = job1, .seq = 5, .rank = 0, .stream = 1, .text = "last", .text_len = 4},
    };
    CHECK_EQ_INT(store_output_append(st, lines, 4), 0);
    struct store_output other = {.job_id = job2, .seq = 1, .stream = 1, .text = "x", .text_len = 1};
    CHECK_EQ_INT(store_output_append(st, &other, 1), 0);

    CHECK_EQ_INT(store_output_max_seq(st, job1, &max), 0);
    CHECK_EQ_INT(max, 5);

    struct output_seen seen = {0};
    CHECK_EQ_INT(store_output_each(st, job1, 0, 0, collect_output, &seen), 0);
    REQUIRE(seen.n == 4);
    CHECK_EQ_INT(seen.seq[0], 1);
    CHECK_EQ_INT(seen.len[0], 6);
    CHECK(memcmp(seen.text[0], "hello\n", 6) == 0);
    CHECK_EQ_INT(seen.len[1], sizeof binary);
    CHECK(memcmp(seen.text[1], binary, sizeof binary) == 0);
    CHECK_EQ_INT(seen.stream[1], 2);
    CHECK_EQ_INT(seen.len[2], 0);
    CHECK_EQ_INT(seen.seq[3], 5);
    for (int i = 0; i < 4; i++)
        CHECK(seen.terminated[i]);

    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_output_each(st, job1, 1, 2, collect_output, &seen), 0);
    CHECK_EQ_INT(seen.n, 2);
    CHECK_EQ_INT(seen.seq[0], 2);
    CHECK_EQ_INT(seen.seq[1], 3);

    /* one rank's last lines of one stream, newest first */
    struct store_output more[2] = {
        {.job_id = job1, .seq = 6, .rank = 1, .stream = 2, .text = "E2", .text_len = 2},
        {.job_id = job1, .seq = 7, .rank = 0, .stream = 2, .text = "zero", .text_len = 4},
    };
    CHECK_EQ_INT(store_output_append(st, more, 2), 0);
    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_output_rank_tail(st, job1, 1, 2, 5, collect_output, &seen), 0);
    REQUIRE(seen.n == 2);
    CHECK(seen.seq[0] == 6 && seen.seq[1] == 2);
    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_output_rank_tail(st, job1, 1, 2, 1, collect_output, &seen), 0);
    CHECK(seen.n == 1 && seen.seq[0] == 6);
    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_output_rank_tail(st, job2, 1, 2, 5, collect_output, &seen), 0);
    CHECK_EQ_INT(seen.n, 0);
    CHECK_EQ_INT(store_output_max_seq(st, job1, &max), 0);
    CHECK_EQ_INT(max, 7);

    /* A batch that repeats a seq is refused as a whole. */
    struct store_output dup[2] = {
        {.job_id = job1, .seq = 8, .stream = 1, .text = "new", .text_len = 3},
        {.job_id = job1, .seq = 5, .stream = 1, .text = "dup", .text_len = 3},
    };
    CHECK_EQ_INT(store_output_append(st, dup, 2), KOLO_EEXIST);
    CHECK_EQ_INT(store_output_max_seq(st, job1, &max), 0);
    CHECK_EQ_INT(max, 7);

    struct store_output orphan = {
        .job_id = 424242, .seq = 1, .stream = 1, .text = "?", .text_len = 1};
    CHECK_EQ_INT(store_output_append(st, &orphan, 1), KOLO_ENOTFOUND);
    struct store_output bad = {.job_id = job1, .seq = 9, .text = NULL, .text_len = 3};
    CHECK_EQ_INT(store_output_append(st, &bad, 1), KOLO_EINVAL);
}

/* ----------------------------------------------------------- transactions */

static int meta_present(struct store *st, const char *key)
{
    char value[64];
    return store_meta_get(st, key, value, sizeof value) == 0;
}

struct stacks_seen {
    int n;
    int64_t ids[8];
    char reasons[8][48];
    size_t lens[8];
};

static int collect_stacks(const struct store_stacks *x, void *arg)
{
    struct stacks_seen *s = arg;
    if (s->n < 8) {
        s->ids[s->n] = x->id;
        snprintf(s->reasons[s->n], sizeof s->reasons[0], "%s|%s", x->reason, x->verdict);
        s->lens[s->n] = x->reply_len;
        s->n++;
    }
    return 0;
}

/* Stacks: newest first, the job's newest `keep` kept, other jobs alone,
 * an empty reply stored as empty. */
static void test_stacks(struct store *st, uint64_t job1, uint64_t job2)
{
    static const char blob[] = {1, 0, 2, 0, 3};
    struct store_stacks other = {.job_id = job2, .taken_ms = 5, .reason = "stall", .verdict = "",
                                 .reply = blob, .reply_len = sizeof blob};
    CHECK_EQ_INT(store_stacks_add(st, &other, 3), 0);
    int64_t last = 0;
    for (int i = 0; i < 5; i++) {
        char reason[16];
        snprintf(reason, sizeof reason, "stop %d", i);
        struct store_stacks x = {.job_id = job1, .taken_ms = 10 + (uint64_t)i, .reason = reason,
                                 .verdict = i == 4 ? "rank 1 never submitted it" : "",
                                 .reply = i == 2 ? NULL : blob, .reply_len = i == 2 ? 0 : sizeof blob};
        CHECK_EQ_INT(store_stacks_add(st, &x, 3), 0);
        CHECK(x.id > last);
        last = x.id;
    }
    struct stacks_seen seen = {0};
    CHECK_EQ_INT(store_stacks_each(st, job1, 0, collect_stacks, &seen), 0);
    CHECK_EQ_INT(seen.n, 3);
    CHECK_EQ_INT(seen.ids[0], last);
    CHECK_EQ_STR(seen.reasons[0], "stop 4|rank 1 never submitted it");
    CHECK_EQ_STR(seen.reasons[1], "stop 3|");
    CHECK_EQ_STR(seen.reasons[2], "stop 2|");
    CHECK_EQ_INT(seen.lens[0], sizeof blob);
    CHECK_EQ_INT(seen.lens[2], 0);
    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_stacks_each(st, job1, 1, collect_stacks, &seen), 0);
    CHECK_EQ_INT(seen.n, 1);
    memset(&seen, 0, sizeof seen);
    CHECK_EQ_INT(store_stacks_each(st, job2, 0, collect_stacks, &seen), 0);
    CHECK_EQ_INT(seen.n, 1);
    CHECK_EQ_STR(seen.reasons[0], "stall|");
    struct store_stacks bad = {.job_id = 0, .reason = "x"};
    CHECK(store_stacks_add(st, &bad, 3) != 0);
    bad.job_id = job1;
    CHECK(store_stacks_add(st, &bad, 0) != 0);
}

static void test_transactions(struct store *st, uint64_t job)
{
    CHECK_EQ_INT(store_commit(st), KOLO_EINVAL);
    CHECK_EQ_INT(store_rollback(st), KOLO_EINVAL);

    /* Outer commit keeps the outer write; the inner rollback drops only
     * the inner one, including a batch call's own nested transaction. */
    CHECK_EQ_INT(store_begin(st), 0);
    CHECK_EQ_INT(store_meta_put(st, "outer", "1"), 0);
    CHECK_EQ_INT(store_begin(st), 0);
    CHECK_EQ_INT(store_meta_put(st, "inner", "1"), 0);
    struct store_output line = {.job_id = job, .seq = 100, .stream = 1, .text = "t", .text_len = 1};
    CHECK_EQ_INT(store_output_append(st, &line, 1), 0);
    CHECK_EQ_INT(store_rollback(st), 0);
    CHECK_EQ_INT(store_begin(st), 0);
    CHECK_EQ_INT(store_meta_put(st, "inner2", "1"), 0);
    CHECK_EQ_INT(store_begin(st), 0);
    CHECK_EQ_INT(store_meta_put(st, "inner3", "1"), 0);
    CHECK_EQ_INT(store_commit(st), 0);
    CHECK_EQ_INT(store_commit(st), 0);
    /* A failing batch inside the transaction does not doom it. */
    struct store_output dup = {.job_id = job, .seq = 1, .stream = 1, .text = "d", .text_len = 1};
    CHECK_EQ_INT(store_output_append(st, &dup, 1), KOLO_EEXIST);
    CHECK_EQ_INT(store_commit(st), 0);
    CHECK(meta_present(st, "outer"));
    CHECK(!meta_present(st, "inner"));
    CHECK(meta_present(st, "inner2"));
    CHECK(meta_present(st, "inner3"));
    uint64_t max = 0;
    CHECK_EQ_INT(store_output_max_seq(st, job, &max), 0);
    CHECK(max < 100);

    /* Outer rollback drops everything, committed inner levels included. */
    CHECK_EQ_INT(store_begin(st), 0);
    CHECK_EQ_INT(store_meta_put(st, "gone", "1"), 0);
    CHECK_EQ_INT(store_begin(st), 0);
    CHECK_EQ_INT(store_meta_put(st, "gone2", "1"), 0);
    CHECK_EQ_INT(store_commit(st), 0);
    CHECK_EQ_INT(store_rollback(st), 0);
    CHECK(!meta_present(st, "gone"));
    CHECK(!meta_present(st, "gone2"));
    CHECK_EQ_INT(store_commit(st), KOLO_EINVAL);

    /* An open transaction is rolled back by close. */
    CHECK_EQ_INT(store_begin(st), 0);
    CHECK_EQ_INT(store_meta_put(st, "unfinished", "1"), 0);
}

/* --------------------------------------------------------- reopen, future */

static void test_reopen(uint64_t job1)
{
    struct store *st = open_store(db_path);
    CHECK(!meta_present(st, "unfinished"));
    CHECK(meta_present(st, "outer"));
    struct host_seen hosts = {0};
    CHECK_EQ_INT(store_hosts_each(st, collect_host, &hosts), 0);
    CHECK_EQ_INT(hosts.n, 3);
    CHECK_EQ_STR(hosts.ids[0], "h-b");
    struct event_seen ev = events(st, 0, 0, 0);
    CHECK_EQ_INT(ev.n, 10);
    uint64_t max = 0;
    CHECK_EQ_INT(store_output_max_seq(st, job1, &max), 0);
    CHECK_EQ_INT(max, 7); /* test_output's last */
    char err[256];
    CHECK_EQ_INT(store_integrity_check(st, err, sizeof err), 0);
    store_close(st);
}

/* A second connection that only reads (the coordinator's REST reader):
 * it sees what the writer committed, and refuses to write. */
static void test_query_only(void)
{
    struct store *w = open_store(db_path);
    struct store *r = open_store(db_path);
    CHECK_EQ_INT(store_query_only(r), 0);
    CHECK_EQ_INT(store_meta_put(w, "seen-by-reader", "yes"), 0);
    char value[16];
    CHECK_EQ_INT(store_meta_get(r, "seen-by-reader", value, sizeof value), 0);
    CHECK_EQ_STR(value, "yes");
    CHECK_EQ_INT(store_meta_put(r, "written-by-reader", "no"), KOLO_ESTORE);
    CHECK(strstr(store_last_error(r), "readonly") != NULL ||
          strstr(store_last_error(r), "read-only") != NULL ||
          strstr(store_last_error(r), "query_only") != NULL);
    CHECK_EQ_INT(store_meta_get(w, "written-by-reader", value, sizeof value), KOLO_ENOTFOUND);
    store_close(r);
    store_close(w);
}

static void test_future_schema(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/future.db", dir);
    store_close(open_store(path));
    raw_exec(path, "PRAGMA user_version = 99");

    struct store *st = (struct store *)1;
    char err[256] = "";
    CHECK_EQ_INT(store_open(&st, path, err, sizeof err), KOLO_ESTORE);
    CHECK(st == NULL);
    char want[128];
    snprintf(want, sizeof want, "database schema version 99 is newer than this kolo (%d)",
             STORE_SCHEMA_VERSION);
    CHECK_EQ_STR(err, want);
    /* The refused file is left as it was. */
    CHECK_EQ_INT(raw_int(path, "PRAGMA user_version"), 99);
}

static int file_exists(const char *path)
{
    return access(path, F_OK) == 0;
}

static char *file_bytes(const char *path, long *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    rewind(f);
    char *b = malloc((size_t)*len + 1);
    if (b && fread(b, 1, (size_t)*len, f) != (size_t)*len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

/* store_open_readonly (kolo dashboard): a kept run's database is read, never
 * written, its -wal and -shm files never made; a run still writing is read
 * through its WAL; other schema versions and missing files are refused. */
static void test_readonly(void)
{
    char wal[320], shm[320], err[256] = "";
    snprintf(wal, sizeof wal, "%s-wal", db_path);
    snprintf(shm, sizeof shm, "%s-shm", db_path);
    REQUIRE(!file_exists(wal)); /* every connection closed: checkpointed */
    long len0 = 0, len1 = 0;
    char *before = file_bytes(db_path, &len0);
    REQUIRE(before);
    struct store *r = NULL;
    CHECK_EQ_INT(store_open_readonly(&r, db_path, err, sizeof err), 0);
    REQUIRE(r);
    char value[16];
    CHECK_EQ_INT(store_meta_get(r, "seen-by-reader", value, sizeof value), 0);
    CHECK_EQ_INT(store_meta_put(r, "written-by-view", "no"), KOLO_ESTORE);
    CHECK(!file_exists(wal) && !file_exists(shm));
    store_close(r);
    char *after = file_bytes(db_path, &len1);
    CHECK(after && len0 == len1 && memcmp(before, after, (size_t)len0) == 0);
    free(before);
    free(after);

    /* a run still going: its commits are read from the WAL */
    struct store *w = open_store(db_path);
    CHECK_EQ_INT(store_meta_put(w, "live", "1"), 0);
    CHECK_EQ_INT(store_open_readonly(&r, db_path, err, sizeof err), 0);
    CHECK_EQ_INT(store_meta_get(r, "live", value, sizeof value), 0);
    store_close(r);
    store_close(w);

    char path[300];
    snprintf(path, sizeof path, "%s/future.db", dir);
    r = (struct store *)1;
    CHECK_EQ_INT(store_open_readonly(&r, path, err, sizeof err), KOLO_ESTORE);
    CHECK(r == NULL && strstr(err, "newer") != NULL);
    snprintf(path, sizeof path, "%s/missing.db", dir);
    CHECK_EQ_INT(store_open_readonly(&r, path, err, sizeof err), KOLO_ENOTFOUND);
    CHECK(!file_exists(path));
}

/* A job's milestones (kolo dashboard's event list): its start and reset
 * stay among the newest events other than commits after 300 commits,
 * oldest first; other jobs' events are not its. */
static void test_events_except(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/events.db", dir);
    struct store *st = open_store(path);
    struct store_job j = {.name = "long", .state = "running", .np = 2};
    CHECK_EQ_INT(store_job_insert(st, &j), 0);
    const char *kinds[] = {"job.started", "generation.reset"};
    CHECK_EQ_INT(store_begin(st), 0);
    for (int i = 0; i < 302; i++) {
        const char *kind = i == 0 ? kinds[0] : i == 150 ? kinds[1] : "snapshot.committed";
        struct store_event ev = {
            .ts_ms = 1000 + (uint64_t)i, .job_id = j.id, .kind = kind, .message = kind};
        CHECK_EQ_INT(store_event_add(st, &ev), 0);
    }
    struct store_event other = {.ts_ms = 5000, .kind = "host.lost", .message = "other"};
    CHECK_EQ_INT(store_event_add(st, &other), 0);
    CHECK_EQ_INT(store_commit(st), 0);
    struct event_seen seen = {0};
    CHECK_EQ_INT(
        store_events_tail_except(st, j.id, "snapshot.committed", 200, collect_event, &seen), 0);
    CHECK_EQ_INT(seen.n, 2);
    CHECK_EQ_STR(seen.messages[0], "job.started");
    CHECK_EQ_STR(seen.messages[1], "generation.reset");
    CHECK(seen.ids[0] < seen.ids[1]);
    seen.n = 0;
    CHECK_EQ_INT(store_events_tail_except(st, j.id, "snapshot.committed", 1, collect_event, &seen),
                 0);
    CHECK(seen.n == 1 && strcmp(seen.messages[0], "generation.reset") == 0);
    CHECK_EQ_INT(store_events_tail_except(st, j.id, NULL, 1, collect_event, &seen), KOLO_EINVAL);
    store_close(st);
}

static void test_migrate_empty_file(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/empty.db", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fclose(f);
    struct store *st = open_store(path);
    CHECK_EQ_INT(store_schema_version(st), STORE_SCHEMA_VERSION);
    struct store_job j = {.name = "first", .state = "pending", .np = 1};
    CHECK_EQ_INT(store_job_insert(st, &j), 0);
    CHECK_EQ_INT(j.id, 1);
    char err[256];
    CHECK_EQ_INT(store_integrity_check(st, err, sizeof err), 0);
    store_close(st);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                               "name IN ('meta','hosts','jobs','generations','ranks',"
                               "'events','output')"),
                 7);
}

static void test_not_a_database(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/garbage.db", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    for (int i = 0; i < 512; i++)
        fputs("this is not a database ", f);
    fclose(f);
    struct store *st = NULL;
    char err[256] = "";
    CHECK_EQ_INT(store_open(&st, path, err, sizeof err), KOLO_ESTORE);
    CHECK(st == NULL);
    CHECK(err[0] != '\0');
}

static void cleanup(void)
{
    static const char *const names[] = {
        "store.db",      "store.db-wal",  "store.db-shm", "future.db",    "future.db-wal",
        "future.db-shm", "empty.db",      "empty.db-wal", "empty.db-shm", "garbage.db",
        "events.db",     "events.db-wal", "events.db-shm"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[300];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(db_path, sizeof db_path, "%s/store.db", dir);

    test_open_create();
    struct store *st = open_store(db_path);
    uint64_t job1 = 0, job2 = 0;
    test_meta(st);
    test_hosts(st);
    test_jobs(st, &job1, &job2);
    test_generations_ranks(st, job1);
    test_events(st, job1, job2);
    test_output(st, job1, job2);
    test_stacks(st, job1, job2);
    test_transactions(st, job1);
    store_close(st);
    test_reopen(job1);
    test_query_only();
    test_future_schema();
    test_readonly();
    test_events_except();
    test_migrate_empty_file();
    test_not_a_database();
    cleanup();
    TEST_DONE();
}
