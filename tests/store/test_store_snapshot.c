/*
 * test_store_snapshot.c - elastic-state snapshots in the store: put and
 * read back (record, chunks, latest, by upload id, listing), retention,
 * all-or-nothing writes, bad arguments, the migration of a version 1
 * database, and the commit duration of schema version 5 (stored, and 0
 * in rows from a version 4 file).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "errors.h"
#include "hmac.h"
#include "store.h"
#include "test.h"

static char dir[] = "/tmp/kolo-test-store-snap-XXXXXX";
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
    struct store_job j = {.name = "snap", .state = "running", .np = 2};
    REQUIRE(store_job_insert(st, &j) == 0);
    return j.id;
}

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

/* fill makes len deterministic bytes from seed. */
static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* put_blob stores len bytes from seed in chunks of `chunk` bytes. */
static int put_blob(struct store *st, uint64_t job, uint64_t upload, size_t len, size_t chunk,
                    uint64_t seed, uint64_t *id)
{
    uint8_t *data = malloc(len + 1);
    REQUIRE(data);
    fill(data, len, seed);
    size_t n = len ? (len + chunk - 1) / chunk : 1;
    struct store_blob *c = calloc(n, sizeof *c);
    REQUIRE(c);
    for (size_t i = 0; i < n; i++) {
        c[i].data = data + i * chunk;
        c[i].len = i + 1 < n ? chunk : len - i * chunk;
    }
    uint8_t sum[SHA256_LEN];
    char sumhex[2 * SHA256_LEN + 1];
    sha256(data, len, sum);
    hex(sum, SHA256_LEN, sumhex);
    char meta[64];
    snprintf(meta, sizeof meta, "{\"seed\":%" PRIu64 "}", seed);
    struct store_snapshot s = {.job_id = job,
                               .generation = 3,
                               .rank = 0,
                               .upload_id = upload,
                               .created_ms = 1000 + seed,
                               .meta_json = meta,
                               .total_bytes = len,
                               .checksum = sumhex,
                               .nchunks = (uint32_t)n,
                               .duration_ms = 10 * seed};
    int rc = store_snapshot_put(st, &s, c, n);
    if (id)
        *id = s.id;
    free(c);
    free(data);
    return rc;
}

struct rec {
    int calls;
    struct store_snapshot s;
    char meta[128];
    char checksum[80];
};

static int copy_rec(const struct store_snapshot *s, void *arg)
{
    struct rec *r = arg;
    r->calls++;
    r->s = *s;
    snprintf(r->meta, sizeof r->meta, "%s", s->meta_json);
    snprintf(r->checksum, sizeof r->checksum, "%s", s->checksum);
    r->s.meta_json = r->meta;
    r->s.checksum = r->checksum;
    return 0;
}

struct gather {
    uint8_t *buf;
    size_t len;
};

static int append_chunk(const void *data, size_t len, void *arg)
{
    struct gather *g = arg;
    g->buf = realloc(g->buf, g->len + len + 1);
    REQUIRE(g->buf);
    memcpy(g->buf + g->len, data, len);
    g->len += len;
    return 0;
}

/* check_blob reads snapshot id back chunk by chunk and compares it with
 * the bytes put_blob made from seed. */
static void check_blob(struct store *st, uint64_t job, uint64_t id, size_t len, uint64_t seed)
{
    struct rec r = {0};
    CHECK_EQ_INT(store_snapshot_get(st, job, id, copy_rec, &r), 0);
    CHECK_EQ_INT(r.calls, 1);
    CHECK_EQ_INT(r.s.total_bytes, len);
    struct gather g = {0};
    for (uint32_t i = 0; i < r.s.nchunks; i++)
        CHECK_EQ_INT(store_snapshot_chunk(st, job, id, i, append_chunk, &g), 0);
    CHECK_EQ_INT(g.len, len);
    uint8_t *want = malloc(len + 1);
    REQUIRE(want);
    fill(want, len, seed);
    CHECK(len == 0 || memcmp(g.buf, want, len) == 0);
    uint8_t sum[SHA256_LEN];
    char sumhex[2 * SHA256_LEN + 1];
    sha256(want, len, sum);
    hex(sum, SHA256_LEN, sumhex);
    CHECK_EQ_STR(r.s.checksum, sumhex);
    free(want);
    free(g.buf);
}

static void test_put_get(void)
{
    struct store *st = open_store();
    uint64_t job = new_job(st), other = new_job(st);
    struct rec r = {0};
    CHECK_EQ_INT(store_snapshot_latest(st, job, copy_rec, &r), KOLO_ENOTFOUND);
    CHECK_EQ_INT(r.calls, 0);

    uint64_t id1 = 0, id2 = 0, id3 = 0, id0 = 0;
    CHECK_EQ_INT(put_blob(st, job, 11, 10000, 4096, 1, &id1), 0);
    CHECK_EQ_INT(put_blob(st, job, 12, 4096 * 3, 4096, 2, &id2), 0); /* exact multiple */
    CHECK_EQ_INT(put_blob(st, other, 11, 5, 4096, 3, &id3), 0);      /* same upload, other job */
    CHECK_EQ_INT(put_blob(st, job, 13, 0, 4096, 4, &id0), 0);        /* empty: one empty chunk */
    CHECK(id1 > 0 && id2 > id1 && id3 > id2 && id0 > id3);

    check_blob(st, job, id1, 10000, 1);
    check_blob(st, job, id2, 4096 * 3, 2);
    check_blob(st, other, id3, 5, 3);
    check_blob(st, job, id0, 0, 4);

    memset(&r, 0, sizeof r);
    CHECK_EQ_INT(store_snapshot_latest(st, job, copy_rec, &r), 0);
    CHECK_EQ_INT(r.s.id, id0);
    CHECK_EQ_INT(r.s.generation, 3);
    CHECK_EQ_INT(r.s.created_ms, 1004);
    CHECK_EQ_INT(r.s.duration_ms, 40);
    CHECK_EQ_STR(r.s.meta_json, "{\"seed\":4}");

    memset(&r, 0, sizeof r);
    CHECK_EQ_INT(store_snapshot_by_upload(st, job, 12, copy_rec, &r), 0);
    CHECK_EQ_INT(r.s.id, id2);
    CHECK_EQ_INT(r.s.nchunks, 3);
    CHECK_EQ_INT(r.s.duration_ms, 20);
    /* the duration is replaced once the commit's length is known */
    CHECK_EQ_INT(store_snapshot_set_duration(st, job, id2, 12345), 0);
    memset(&r, 0, sizeof r);
    CHECK_EQ_INT(store_snapshot_get(st, job, id2, copy_rec, &r), 0);
    CHECK_EQ_INT(r.s.duration_ms, 12345);
    CHECK_EQ_INT(r.s.nchunks, 3);
    CHECK_EQ_INT(store_snapshot_set_duration(st, other, id2, 1), KOLO_ENOTFOUND);
    CHECK_EQ_INT(store_snapshot_set_duration(st, job, id2 + 1000, 1), KOLO_ENOTFOUND);
    CHECK_EQ_INT(store_snapshot_set_duration(NULL, job, id2, 1), KOLO_EINVAL);
    CHECK_EQ_INT(store_snapshot_by_upload(st, job, 99, copy_rec, &r), KOLO_ENOTFOUND);
    /* A random 64-bit upload id survives the trip through a signed column. */
    uint64_t big = 0xF00DFACEDEADBEEFull, idb = 0;
    CHECK_EQ_INT(put_blob(st, other, big, 1, 4096, 5, &idb), 0);
    memset(&r, 0, sizeof r);
    CHECK_EQ_INT(store_snapshot_by_upload(st, other, big, copy_rec, &r), 0);
    CHECK(r.s.upload_id == big && r.s.id == idb);

    /* ids belong to their job */
    CHECK_EQ_INT(store_snapshot_get(st, other, id1, copy_rec, &r), KOLO_ENOTFOUND);
    struct gather g = {0};
    CHECK_EQ_INT(store_snapshot_chunk(st, other, id1, 0, append_chunk, &g), KOLO_ENOTFOUND);
    CHECK_EQ_INT(store_snapshot_chunk(st, job, id1, 3, append_chunk, &g), KOLO_ENOTFOUND);
    free(g.buf);

    /* one upload id stored twice: refused, and nothing of it is left */
    CHECK_EQ_INT(put_blob(st, job, 12, 100, 10, 9, NULL), KOLO_EEXIST);
    /* an unknown job */
    CHECK_EQ_INT(put_blob(st, job + 100, 1, 100, 10, 9, NULL), KOLO_ENOTFOUND);

    store_close(st);
}

static int first_job(const struct store_job *j, void *arg)
{
    CHECK_EQ_STR(j->name, "old");
    CHECK_EQ_STR(j->state, "succeeded");
    *(uint64_t *)arg = j->id;
    return 1;
}

struct ids {
    uint64_t id[16];
    uint64_t duration[16];
    int n;
};

static int collect_id(const struct store_snapshot *s, void *arg)
{
    struct ids *x = arg;
    if (x->n < 16) {
        x->duration[x->n] = s->duration_ms;
        x->id[x->n++] = s->id;
    }
    return 0;
}

static int count_rows(const char *sql)
{
    sqlite3 *db = NULL;
    REQUIRE(sqlite3_open(db_path, &db) == SQLITE_OK);
    sqlite3_stmt *s = NULL;
    REQUIRE(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK);
    int v = -1;
    if (sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

static void test_list_and_prune(void)
{
    struct store *st = open_store();
    uint64_t job = new_job(st), other = new_job(st);
    uint64_t ids[6];
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(put_blob(st, job, 100 + (uint64_t)i, 3000, 1000, 10 + (uint64_t)i, &ids[i]),
                     0);
    uint64_t other_id;
    CHECK_EQ_INT(put_blob(st, other, 1, 3000, 1000, 99, &other_id), 0);

    struct ids x = {0};
    CHECK_EQ_INT(store_snapshots_each(st, job, 0, collect_id, &x), 0);
    CHECK_EQ_INT(x.n, 6);
    for (int i = 0; i < 6 && i < x.n; i++) {
        CHECK_EQ_INT(x.id[i], ids[5 - i]);
        CHECK_EQ_INT(x.duration[i], 10 * (15 - i)); /* seeds 15 down to 10 */
    }
    memset(&x, 0, sizeof x);
    CHECK_EQ_INT(store_snapshots_each(st, job, 2, collect_id, &x), 0);
    CHECK_EQ_INT(x.n, 2);
    CHECK_EQ_INT(x.id[0], ids[5]);

    int deleted = -1;
    CHECK_EQ_INT(store_snapshot_prune(st, job, 0, &deleted), KOLO_EINVAL);
    CHECK_EQ_INT(store_snapshot_prune(st, job, 10, &deleted), 0);
    CHECK_EQ_INT(deleted, 0);
    CHECK_EQ_INT(store_snapshot_prune(st, job, 3, &deleted), 0);
    CHECK_EQ_INT(deleted, 3);
    memset(&x, 0, sizeof x);
    CHECK_EQ_INT(store_snapshots_each(st, job, 0, collect_id, &x), 0);
    CHECK_EQ_INT(x.n, 3);
    CHECK_EQ_INT(x.id[2], ids[3]);
    struct rec r = {0};
    CHECK_EQ_INT(store_snapshot_get(st, job, ids[2], copy_rec, &r), KOLO_ENOTFOUND);
    check_blob(st, job, ids[3], 3000, 13);
    /* the other job's snapshot is untouched, and pruned chunks are gone */
    check_blob(st, other, other_id, 3000, 99);
    store_close(st);
    char sql[200];
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*) FROM snapshot_chunks WHERE snapshot_id IN "
             "(SELECT id FROM snapshots WHERE job_id = %" PRIu64 ")",
             job);
    CHECK_EQ_INT(count_rows(sql), 9);
    CHECK_EQ_INT(count_rows("SELECT COUNT(*) FROM snapshot_chunks WHERE snapshot_id NOT IN "
                            "(SELECT id FROM snapshots)"),
                 0);
    st = open_store();
    CHECK_EQ_INT(store_snapshot_prune(st, job, 1, &deleted), 0);
    CHECK_EQ_INT(deleted, 2);
    memset(&r, 0, sizeof r);
    CHECK_EQ_INT(store_snapshot_latest(st, job, copy_rec, &r), 0);
    CHECK_EQ_INT(r.s.id, ids[5]);
    store_close(st);
}

static void test_bad_arguments(void)
{
    struct store *st = open_store();
    uint64_t job = new_job(st);
    uint8_t data[10] = {0};
    struct store_blob c[2] = {{data, 5}, {data, 5}};
    struct store_snapshot s = {.job_id = job,
                               .upload_id = 1,
                               .meta_json = "{}",
                               .total_bytes = 10,
                               .checksum = "00",
                               .nchunks = 2};
    CHECK_EQ_INT(store_snapshot_put(NULL, &s, c, 2), KOLO_EINVAL);
    CHECK_EQ_INT(store_snapshot_put(st, NULL, c, 2), KOLO_EINVAL);
    CHECK_EQ_INT(store_snapshot_put(st, &s, c, 1), KOLO_EINVAL); /* n != nchunks */
    CHECK_EQ_INT(store_snapshot_put(st, &s, NULL, 2), KOLO_EINVAL);
    s.total_bytes = 11;
    CHECK_EQ_INT(store_snapshot_put(st, &s, c, 2), KOLO_EINVAL); /* lengths do not add up */
    s.total_bytes = 10;
    s.meta_json = NULL;
    CHECK_EQ_INT(store_snapshot_put(st, &s, c, 2), KOLO_EINVAL);
    s.meta_json = "{}";
    s.checksum = NULL;
    CHECK_EQ_INT(store_snapshot_put(st, &s, c, 2), KOLO_EINVAL);
    s.checksum = "00";
    struct store_blob bad[2] = {{NULL, 5}, {data, 5}};
    CHECK_EQ_INT(store_snapshot_put(st, &s, bad, 2), KOLO_EINVAL);
    s.job_id = 0;
    CHECK_EQ_INT(store_snapshot_put(st, &s, c, 2), KOLO_EINVAL);
    s.job_id = job;
    CHECK_EQ_INT(store_snapshot_put(st, &s, c, 2), 0);
    CHECK(s.id > 0);
    CHECK_EQ_INT(store_snapshot_latest(st, job, NULL, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(store_snapshot_chunk(st, job, s.id, 0, NULL, NULL), KOLO_EINVAL);
    CHECK_EQ_INT(store_snapshot_prune(NULL, job, 1, NULL), KOLO_EINVAL);
    store_close(st);
}

/* Inside an outer transaction that is rolled back, a snapshot put that
 * succeeded is gone with it: the put nests as a savepoint. */
static void test_nested_rollback(void)
{
    struct store *st = open_store();
    uint64_t job = new_job(st);
    CHECK_EQ_INT(store_begin(st), 0);
    uint64_t id = 0;
    CHECK_EQ_INT(put_blob(st, job, 5, 5000, 1000, 7, &id), 0);
    CHECK(id > 0);
    CHECK_EQ_INT(store_snapshot_prune(st, job, 1, NULL), 0);
    CHECK_EQ_INT(store_rollback(st), 0);
    struct rec r = {0};
    CHECK_EQ_INT(store_snapshot_latest(st, job, copy_rec, &r), KOLO_ENOTFOUND);
    /* and committed, it is there */
    CHECK_EQ_INT(store_begin(st), 0);
    CHECK_EQ_INT(put_blob(st, job, 5, 5000, 1000, 7, &id), 0);
    CHECK_EQ_INT(store_commit(st), 0);
    check_blob(st, job, id, 5000, 7);
    store_close(st);
}

/* The schema of version 1, as kolo 0.1 wrote it (frozen: versions only
 * ever add migrations on top). */
static const char schema_v1[] =
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE hosts (id TEXT PRIMARY KEY, reg_order INTEGER NOT NULL UNIQUE, name TEXT,"
    "  hostname TEXT, addr TEXT, slots INTEGER NOT NULL, cpus INTEGER NOT NULL,"
    "  gpus INTEGER NOT NULL, gpu_names TEXT, mem_bytes INTEGER NOT NULL, state TEXT NOT NULL,"
    "  registered_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL, agent_instance TEXT);"
    "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, state TEXT NOT NULL,"
    "  np INTEGER NOT NULL, argv_json TEXT, env_json TEXT, cwd TEXT, hosts TEXT,"
    "  exit_code INTEGER NOT NULL, reason TEXT, generation INTEGER NOT NULL,"
    "  start_timeout_ms INTEGER NOT NULL, submitted_ms INTEGER NOT NULL,"
    "  started_ms INTEGER NOT NULL, ended_ms INTEGER NOT NULL);"
    "CREATE TABLE generations (job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  generation INTEGER NOT NULL, cause TEXT, size INTEGER NOT NULL, ts_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, generation));"
    "CREATE TABLE ranks (job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  generation INTEGER NOT NULL, rank INTEGER NOT NULL, host_id TEXT REFERENCES hosts(id),"
    "  local_rank INTEGER NOT NULL, local_size INTEGER NOT NULL, cross_rank INTEGER NOT NULL,"
    "  cross_size INTEGER NOT NULL, state TEXT NOT NULL, exit_code INTEGER NOT NULL,"
    "  term_signal INTEGER NOT NULL, pid INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, generation, rank));"
    "CREATE INDEX ranks_by_host ON ranks(host_id);"
    "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts_ms INTEGER NOT NULL,"
    "  job_id INTEGER, host_id TEXT, kind TEXT NOT NULL, message TEXT);"
    "CREATE INDEX events_by_job ON events(job_id, id);"
    "CREATE TABLE output (job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL, rank INTEGER NOT NULL, stream INTEGER NOT NULL,"
    "  text BLOB NOT NULL, ts_ms INTEGER NOT NULL, PRIMARY KEY (job_id, seq));"
    "INSERT INTO jobs(name, state, np, exit_code, generation, start_timeout_ms, submitted_ms,"
    "  started_ms, ended_ms) VALUES ('old', 'succeeded', 1, 0, 1, 0, 5, 6, 7);"
    "PRAGMA user_version = 1;";

/* A version 1 file (from before snapshots) is migrated at open, keeps its
 * data and takes snapshots. */
static void test_migration_from_v1(void)
{
    char path[200];
    snprintf(path, sizeof path, "%s/v1.db", dir);
    sqlite3 *db = NULL;
    REQUIRE(sqlite3_open(path, &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, schema_v1, NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);

    struct store *st = NULL;
    char err[256];
    REQUIRE(store_open(&st, path, err, sizeof err) == 0);
    CHECK_EQ_INT(store_schema_version(st), STORE_SCHEMA_VERSION);
    CHECK_EQ_INT(store_integrity_check(st, err, sizeof err), 0);
    uint64_t job = 0;
    CHECK_EQ_INT(store_jobs_each(st, first_job, &job), 1); /* stopped at the first */
    CHECK_EQ_INT(job, 1);
    uint64_t id = 0;
    char save[256];
    snprintf(save, sizeof save, "%s", db_path);
    snprintf(db_path, sizeof db_path, "%s", path);
    CHECK_EQ_INT(put_blob(st, job, 1, 100, 30, 8, &id), 0);
    check_blob(st, job, id, 100, 8);
    snprintf(db_path, sizeof db_path, "%s", save);
    store_close(st);
    const char *suffixes[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        char p[320];
        snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
        unlink(p);
    }
}

/* A version 4 file (snapshots without duration_ms, jobs without
 * metadata_json) is migrated to the newest version: its snapshots read a
 * duration of 0 and keep everything else, and new ones store theirs. */
static void test_migration_from_v4(void)
{
    struct store *st = open_store();
    uint64_t job = new_job(st), old_id = 0;
    CHECK_EQ_INT(put_blob(st, job, 1, 300, 100, 3, &old_id), 0);
    store_close(st);
    sqlite3 *db = NULL;
    REQUIRE(sqlite3_open(db_path, &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db,
                         "ALTER TABLE snapshots DROP COLUMN duration_ms; "
                         "ALTER TABLE jobs DROP COLUMN metadata_json; DROP TABLE stacks; "
                         "ALTER TABLE generations DROP COLUMN rec_told_ms; "
                         "ALTER TABLE generations DROP COLUMN rec_formed_ms; "
                         "ALTER TABLE generations DROP COLUMN rec_restored_ms; "
                         "ALTER TABLE generations DROP COLUMN rec_step_ms; "
                         "PRAGMA user_version = 4;",
                         NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    CHECK_EQ_INT(count_rows("PRAGMA user_version"), 4);

    st = open_store();
    CHECK_EQ_INT(store_schema_version(st), STORE_SCHEMA_VERSION);
    struct rec r = {0};
    CHECK_EQ_INT(store_snapshot_get(st, job, old_id, copy_rec, &r), 0);
    CHECK_EQ_INT(r.s.duration_ms, 0);
    CHECK_EQ_INT(r.s.created_ms, 1003);
    CHECK_EQ_STR(r.s.meta_json, "{\"seed\":3}");
    check_blob(st, job, old_id, 300, 3);
    uint64_t new_id = 0;
    CHECK_EQ_INT(put_blob(st, job, 2, 300, 100, 6, &new_id), 0);
    memset(&r, 0, sizeof r);
    CHECK_EQ_INT(store_snapshot_latest(st, job, copy_rec, &r), 0);
    CHECK_EQ_INT(r.s.id, new_id);
    CHECK_EQ_INT(r.s.duration_ms, 60);
    char err[256];
    CHECK_EQ_INT(store_integrity_check(st, err, sizeof err), 0);
    store_close(st);
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(db_path, sizeof db_path, "%s/store.db", dir);
    test_put_get();
    test_list_and_prune();
    test_bad_arguments();
    test_nested_rollback();
    test_migration_from_v1();
    test_migration_from_v4();
    struct store *st = open_store();
    char err[256];
    CHECK_EQ_INT(store_integrity_check(st, err, sizeof err), 0);
    store_close(st);
    test_remove_db(db_path, dir);
    TEST_DONE();
}
