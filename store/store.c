/*
 * store.c - the coordinator's durable state in one SQLite file.
 *
 * DESIGN
 *
 * Durability. The database runs in WAL mode with synchronous=FULL: every
 * commit appends to the write-ahead log and fsyncs it before sqlite3_step
 * returns, so a function here that returned 0 has a write that survives a
 * kill -9 of the coordinator and a power cut. A write outside store_begin()
 * is its own transaction; a function that issues several statements
 * (store_ranks_put, store_output_append) wraps them in one so it is
 * all-or-nothing.
 *
 * Nesting. store_begin/commit/rollback keep a depth counter. Only the
 * outermost level issues BEGIN IMMEDIATE / COMMIT / ROLLBACK; inner levels
 * are SAVEPOINTs, so an inner rollback undoes only its own writes and the
 * outer transaction can still commit. BEGIN IMMEDIATE takes the write lock
 * up front, so a transaction never fails half-way with SQLITE_BUSY while
 * upgrading a read lock. If SQLite itself aborts the transaction (disk
 * full, I/O error), the store notices that the connection fell back to
 * autocommit, refuses further writes until the caller has unwound every
 * level, and reports the outermost commit as failed: otherwise writes the
 * caller meant to be atomic would silently be committed one by one.
 *
 * Schema. PRAGMA user_version holds the schema version. `migrations` below
 * lists, in order, the SQL that takes the database from version N-1 to N;
 * store_open applies every step newer than the file's version in one
 * transaction, so a crash mid-migration leaves the old version intact. A
 * future schema change is one more entry at the end of the array and a
 * bump of STORE_SCHEMA_VERSION. A file from a newer kolo is refused rather
 * than written by code that does not know its tables.
 *
 * Statements. Every SQL statement is prepared once, on first use, and kept
 * in the store. A read callback may call back into the store; if it reaches
 * a statement that is in the middle of stepping (a nested iteration of the
 * same kind), a fresh statement is prepared for that call and finalized
 * after it, since a prepared statement can run only one query at a time.
 *
 * Files. This file owns the connection, the schema, the statement cache,
 * transactions and errors; store_hosts.c, store_jobs.c (jobs, generations,
 * ranks), store_log.c (events, output), store_snap.c and store_report.c
 * hold the functions of their tables. store_internal.h is what they share.
 *
 * Errors. SQLite's message is kept in st->errmsg for store_last_error().
 * Failures map to kolo codes: a primary-key or unique conflict is
 * KOLO_EEXIST, a foreign key that names a missing job or host is
 * KOLO_ENOTFOUND, anything else from SQLite is KOLO_ESTORE.
 */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sqlite3.h>

#include "errors.h"
#include "store_internal.h"

/* How long a statement waits for another connection's lock before failing. */
#define STORE_BUSY_TIMEOUT_MS 5000

/* ------------------------------------------------------------------ schema */

struct migration {
    int version;     /* user_version after this step */
    const char *sql; /* one or more statements */
};

/*
 * Version 1. Column notes:
 * - jobs.id is AUTOINCREMENT so an id is never handed out twice, even after
 *   the newest job is deleted: ids appear in logs and in users' scripts.
 * - hosts.reg_order is the first-registration order; an upsert never
 *   touches it, so a host that reconnects keeps its place in host lists.
 * - events.job_id is NULL for "no job" and has no foreign key: the event
 *   log must accept a line about a job or host that was never stored (a
 *   rejected submission, an unknown agent).
 * - output.text is a BLOB because worker output is arbitrary bytes.
 */
static const char schema_v1[] =
    "CREATE TABLE meta ("
    "  key   TEXT PRIMARY KEY,"
    "  value TEXT NOT NULL"
    ");"
    "CREATE TABLE hosts ("
    "  id            TEXT PRIMARY KEY,"
    "  reg_order     INTEGER NOT NULL UNIQUE,"
    "  name          TEXT,"
    "  hostname      TEXT,"
    "  addr          TEXT,"
    "  slots         INTEGER NOT NULL,"
    "  cpus          INTEGER NOT NULL,"
    "  gpus          INTEGER NOT NULL,"
    "  gpu_names     TEXT,"
    "  mem_bytes     INTEGER NOT NULL,"
    "  state         TEXT NOT NULL,"
    "  registered_ms INTEGER NOT NULL,"
    "  last_seen_ms  INTEGER NOT NULL,"
    "  agent_instance TEXT"
    ");"
    "CREATE TABLE jobs ("
    "  id               INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  name             TEXT,"
    "  state            TEXT NOT NULL,"
    "  np               INTEGER NOT NULL,"
    "  argv_json        TEXT,"
    "  env_json         TEXT,"
    "  cwd              TEXT,"
    "  hosts            TEXT,"
    "  exit_code        INTEGER NOT NULL,"
    "  reason           TEXT,"
    "  generation       INTEGER NOT NULL,"
    "  start_timeout_ms INTEGER NOT NULL,"
    "  submitted_ms     INTEGER NOT NULL,"
    "  started_ms       INTEGER NOT NULL,"
    "  ended_ms         INTEGER NOT NULL"
    ");"
    "CREATE TABLE generations ("
    "  job_id     INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  generation INTEGER NOT NULL,"
    "  cause      TEXT,"
    "  size       INTEGER NOT NULL,"
    "  ts_ms      INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, generation)"
    ");"
    "CREATE TABLE ranks ("
    "  job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  generation  INTEGER NOT NULL,"
    "  rank        INTEGER NOT NULL,"
    "  host_id     TEXT REFERENCES hosts(id),"
    "  local_rank  INTEGER NOT NULL,"
    "  local_size  INTEGER NOT NULL,"
    "  cross_rank  INTEGER NOT NULL,"
    "  cross_size  INTEGER NOT NULL,"
    "  state       TEXT NOT NULL,"
    "  exit_code   INTEGER NOT NULL,"
    "  term_signal INTEGER NOT NULL,"
    "  pid         INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, generation, rank)"
    ");"
    /* The foreign key check on hosts, and "which ranks ran on the host we
     * just lost", both look ranks up by host. */
    "CREATE INDEX ranks_by_host ON ranks(host_id);"
    "CREATE TABLE events ("
    "  id      INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  ts_ms   INTEGER NOT NULL,"
    "  job_id  INTEGER,"
    "  host_id TEXT,"
    "  kind    TEXT NOT NULL,"
    "  message TEXT"
    ");"
    /* store_events_each for one job walks this index in id order. */
    "CREATE INDEX events_by_job ON events(job_id, id);"
    "CREATE TABLE output ("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  seq    INTEGER NOT NULL,"
    "  rank   INTEGER NOT NULL,"
    "  stream INTEGER NOT NULL,"
    "  text   BLOB NOT NULL,"
    "  ts_ms  INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, seq)"
    ");";

/*
 * Version 2: elastic-state snapshots.
 * - snapshots.id is AUTOINCREMENT for the reason jobs.id is: clients log
 *   the ids they were acknowledged, and an id must never come back.
 * - (job_id, upload_id) is unique so that a client retrying the last
 *   chunk of an upload that was already committed finds it instead of
 *   storing it twice.
 * - One row per chunk, not one BLOB per snapshot: SQLite caps a value at
 *   1 GB by default, and a chunk is what GetSnapshot returns. Chunks go
 *   with their snapshot (ON DELETE CASCADE), so pruning is one DELETE.
 */
static const char schema_v2[] =
    "CREATE TABLE snapshots ("
    "  id          INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  generation  INTEGER NOT NULL,"
    "  rank        INTEGER NOT NULL,"
    "  upload_id   INTEGER NOT NULL,"
    "  created_ms  INTEGER NOT NULL,"
    "  meta_json   TEXT NOT NULL,"
    "  total_bytes INTEGER NOT NULL,"
    "  checksum    TEXT NOT NULL,"
    "  chunks      INTEGER NOT NULL,"
    "  UNIQUE (job_id, upload_id)"
    ");"
    /* latest, list and prune walk a job's snapshots in id order. */
    "CREATE INDEX snapshots_by_job ON snapshots(job_id, id);"
    "CREATE TABLE snapshot_chunks ("
    "  snapshot_id INTEGER NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,"
    "  idx         INTEGER NOT NULL,"
    "  data        BLOB NOT NULL,"
    "  PRIMARY KEY (snapshot_id, idx)"
    ");";

/*
 * Version 3: elastic jobs.
 * - ranks.worker_id names the process behind a rank; it stays the same
 *   across generations while the process lives (0 in rows written before).
 * - jobs.elastic is the coordinator's JSON of an elastic job's settings and
 *   the state a restart must keep (resets, exclusions); NULL: fixed size.
 */
static const char schema_v3[] = "ALTER TABLE ranks ADD COLUMN worker_id INTEGER NOT NULL DEFAULT 0;"
                                "ALTER TABLE jobs ADD COLUMN elastic TEXT;";

/*
 * Version 4: training progress reported by the workers.
 * - epochs: one row per (job, generation, rank, epoch); start_ms and
 *   end_ms are the worker's wall clock, 0 while unknown. A rank that runs
 *   an epoch again in a new generation (an elastic reset) gets a new row.
 * - steps: step times downsampled to one row per rank and wall-clock
 *   second (ts_ms is the second's start): seconds is the mean of the n
 *   steps in it. The coordinator caps the rows per job (store_steps_prune).
 */
static const char schema_v4[] =
    "CREATE TABLE epochs ("
    "  job_id       INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  generation   INTEGER NOT NULL,"
    "  rank         INTEGER NOT NULL,"
    "  epoch        INTEGER NOT NULL,"
    "  start_ms     INTEGER NOT NULL DEFAULT 0,"
    "  end_ms       INTEGER NOT NULL DEFAULT 0,"
    "  samples      INTEGER NOT NULL DEFAULT 0,"
    "  metrics_json TEXT,"
    "  PRIMARY KEY (job_id, generation, rank, epoch)"
    ");"
    "CREATE TABLE steps ("
    "  job_id  INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  rank    INTEGER NOT NULL,"
    "  host_id TEXT,"
    "  ts_ms   INTEGER NOT NULL,"
    "  seconds REAL NOT NULL,"
    "  n       INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, rank, ts_ms)"
    ");"
    "CREATE INDEX steps_by_time ON steps(job_id, ts_ms);";

/*
 * Version 5: snapshots.duration_ms, how long the coordinator took from an
 * upload's first chunk to its commit (0 in rows written before).
 */
static const char schema_v5[] =
    "ALTER TABLE snapshots ADD COLUMN duration_ms INTEGER NOT NULL DEFAULT 0;";

/*
 * Version 6: jobs.metadata_json, the labels a job was submitted with (a
 * JSON array of "key=value" strings, as env_json); NULL in rows written
 * before. Fixed at submit, so the job update leaves it alone.
 */
static const char schema_v6[] = "ALTER TABLE jobs ADD COLUMN metadata_json TEXT;";

/*
 * Version 7: stacks, what every rank of a job was doing when the
 * coordinator took their stacks before a stop, a stall or a frozen rank
 * (coord_stacks.c). reply is the packed StacksReply; verdict the line
 * kolo run printed. The coordinator keeps a few per job (store_stacks_add).
 */
static const char schema_v7[] =
    "CREATE TABLE stacks ("
    "  id       INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  job_id   INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  taken_ms INTEGER NOT NULL,"
    "  reason   TEXT NOT NULL,"
    "  verdict  TEXT NOT NULL,"
    "  reply    BLOB NOT NULL"
    ");"
    "CREATE INDEX stacks_by_job ON stacks(job_id, id);";

/*
 * Version 8: how the recovery that a generation began with went (issue
 * 32, the job.recovered event's parts, in ms): detected -> survivors told,
 * told -> the generation formed, formed -> state restored, restored ->
 * first step done. NULL for a generation that began otherwise (a start,
 * a grow, a drain) or in rows written before.
 */
static const char schema_v8[] = "ALTER TABLE generations ADD COLUMN rec_told_ms INTEGER;"
                                "ALTER TABLE generations ADD COLUMN rec_formed_ms INTEGER;"
                                "ALTER TABLE generations ADD COLUMN rec_restored_ms INTEGER;"
                                "ALTER TABLE generations ADD COLUMN rec_step_ms INTEGER;";

static const struct migration migrations[] = {
    {1, schema_v1},
    {2, schema_v2},
    {3, schema_v3},
    {4, schema_v4},
    {5, schema_v5},
    {6, schema_v6},
    {7, schema_v7},
    {8, schema_v8},
};

/* Versions are consecutive from 1, so the array's length is the newest. */
_Static_assert(sizeof migrations / sizeof migrations[0] == STORE_SCHEMA_VERSION,
               "every schema version needs exactly one migration");

/* -------------------------------------------------------------- statements */

static const char *const stmt_sql[STMT_COUNT] = {
#define STMT_SQL(name, sql) [STMT_##name] = sql,
    STORE_STATEMENTS(STMT_SQL)
#undef STMT_SQL
};


/* ------------------------------------------------------------------ errors */

/* store_fail records SQLite's message for rc and maps rc to a kolo code. */
int store_fail(struct store *st, int rc, const char *what)
{
    snprintf(st->errmsg, sizeof st->errmsg, "%s: %s", what, sqlite3_errmsg(st->db));
    switch (rc) {
    case SQLITE_CONSTRAINT_PRIMARYKEY:
    case SQLITE_CONSTRAINT_UNIQUE:
        return KOLO_EEXIST;
    case SQLITE_CONSTRAINT_FOREIGNKEY:
        return KOLO_ENOTFOUND;
    default:
        return KOLO_ESTORE;
    }
}

/* store_reject records why the store refused a call without asking SQLite. */
int store_reject(struct store *st, int code, const char *what)
{
    snprintf(st->errmsg, sizeof st->errmsg, "%s", what);
    return code;
}

/*
 * store_txn_lost reports whether SQLite rolled back the caller's open
 * transaction behind its back (it does so on SQLITE_FULL, SQLITE_IOERR and
 * SQLITE_NOMEM). From then on writes would run in autocommit mode, so
 * they are refused until the caller unwinds its store_begin levels.
 */
static bool store_txn_lost(struct store *st)
{
    if (st->txn_depth > 0 && !st->txn_lost && sqlite3_get_autocommit(st->db)) {
        st->txn_lost = true;
        snprintf(st->errmsg, sizeof st->errmsg,
                 "transaction was rolled back by SQLite after an earlier error");
    }
    return st->txn_lost;
}

/* -------------------------------------------------------------- statements */

/* stmt_get returns the cached statement for id, or a fresh one when the
 * cached one is busy in an enclosing iteration. */
int stmt_get(struct store *st, enum stmt_id id, sqlite3_stmt **out)
{
    sqlite3_stmt *cached = st->stmts[id];
    if (cached && !sqlite3_stmt_busy(cached)) {
        *out = cached;
        return 0;
    }
    unsigned flags = cached ? 0 : SQLITE_PREPARE_PERSISTENT;
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v3(st->db, stmt_sql[id], -1, flags, &s, NULL);
    if (rc != SQLITE_OK)
        return store_fail(st, rc, "prepare");
    if (!cached)
        st->stmts[id] = s;
    *out = s;
    return 0;
}

/* stmt_done makes s ready for its next use, or frees it if it was a
 * one-off prepared by stmt_get for a nested call. */
void stmt_done(struct store *st, enum stmt_id id, sqlite3_stmt *s)
{
    if (s == st->stmts[id]) {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    } else {
        sqlite3_finalize(s);
    }
}

/* stmt_data_get is stmt_get for statements that read or write tables:
 * they must not run once the caller's transaction has been lost. */
int stmt_data_get(struct store *st, enum stmt_id id, sqlite3_stmt **out)
{
    if (store_txn_lost(st))
        return KOLO_ESTORE;
    return stmt_get(st, id, out);
}

/* stmt_exec runs a statement that takes no parameters and returns no rows. */
static int stmt_exec(struct store *st, enum stmt_id id)
{
    sqlite3_stmt *s;
    int err = stmt_get(st, id, &s);
    if (err)
        return err;
    int rc = sqlite3_step(s);
    err = rc == SQLITE_DONE ? 0 : store_fail(st, rc, stmt_sql[id]);
    stmt_done(st, id, s);
    return err;
}

/* step_write runs a bound INSERT/UPDATE to completion and releases s. */
int step_write(struct store *st, enum stmt_id id, sqlite3_stmt *s, const char *what)
{
    int rc = sqlite3_step(s);
    int err = rc == SQLITE_DONE ? 0 : store_fail(st, rc, what);
    stmt_done(st, id, s);
    return err;
}

/* bind_failed releases s after a failed bind and reports it. */
int bind_failed(struct store *st, enum stmt_id id, sqlite3_stmt *s, int rc, const char *what)
{
    int err = store_fail(st, rc, what);
    stmt_done(st, id, s);
    return err;
}

/* query_start readies statement id for a query: the caller binds its
 * parameters into b, then hands b to query_each. */
int query_start(struct store *st, enum stmt_id id, struct binder *b)
{
    sqlite3_stmt *s;
    int err = stmt_data_get(st, id, &s);
    if (err)
        return err;
    *b = (struct binder){s, 0, SQLITE_OK};
    return 0;
}

/* query_each steps the bound statement and calls row(s, ctx) on every row
 * until one returns non-zero (which it then returns); it releases the
 * statement in every case. A failed bind or step is reported as what. */
int query_each(struct store *st, enum stmt_id id, struct binder *b, const char *what,
                      int (*row)(sqlite3_stmt *s, void *ctx), void *ctx)
{
    if (b->rc != SQLITE_OK)
        return bind_failed(st, id, b->s, b->rc, what);
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(b->s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, what);
            break;
        }
        result = row(b->s, ctx);
        if (result)
            break;
    }
    stmt_done(st, id, b->s);
    return result;
}

/* Stores n items (size bytes apart) with one(st, item) in one
 * transaction: all of them or none, one fsync for the batch. */
int put_all(struct store *st, const void *items, size_t n, size_t size,
                   int (*one)(struct store *, const void *))
{
    if (n == 0)
        return 0;
    int err = store_begin(st);
    if (err)
        return err;
    for (size_t i = 0; i < n && !err; i++)
        err = one(st, (const char *)items + i * size);
    if (err) {
        store_rollback(st);
        return err;
    }
    return store_commit(st);
}


/* ------------------------------------------------------------- open/close */

/* pragma_int runs a PRAGMA that returns one integer row. */
static int pragma_int(sqlite3 *db, const char *sql, int *value)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *value = sqlite3_column_int(s, 0);
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(s);
    return rc;
}

/* pragma_text runs a PRAGMA that returns one text row, such as
 * journal_mode, which answers with the mode actually in effect. */
static int pragma_text(sqlite3 *db, const char *sql, char *value, size_t size)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            const char *text = (const char *)sqlite3_column_text(s, 0);
            snprintf(value, size, "%s", text ? text : "");
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(s);
    return rc;
}

static int refuse_newer(int version, char *err, size_t errlen)
{
    snprintf(err, errlen, "database schema version %d is newer than this kolo (%d)", version,
             STORE_SCHEMA_VERSION);
    return KOLO_ESTORE;
}

/*
 * store_migrate brings the schema up to STORE_SCHEMA_VERSION. The version
 * is read again inside the write transaction: two coordinators started on
 * the same file at once must not both run the same migration.
 */
static int store_migrate(struct store *st, char *err, size_t errlen)
{
    sqlite3 *db = st->db;
    char *msg = NULL;
    int version = 0;
    int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, &msg);
    if (rc == SQLITE_OK)
        rc = pragma_int(db, "PRAGMA user_version", &version);
    if (rc != SQLITE_OK)
        goto fail;
    if (version > STORE_SCHEMA_VERSION) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return refuse_newer(version, err, errlen);
    }
    for (size_t i = 0; i < sizeof migrations / sizeof migrations[0]; i++) {
        const struct migration *m = &migrations[i];
        if (m->version <= version)
            continue;
        char set_version[64];
        snprintf(set_version, sizeof set_version, "PRAGMA user_version = %d", m->version);
        rc = sqlite3_exec(db, m->sql, NULL, NULL, &msg);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db, set_version, NULL, NULL, &msg);
        if (rc != SQLITE_OK) {
            snprintf(err, errlen, "migration to schema version %d failed: %s", m->version,
                     msg ? msg : sqlite3_errmsg(db));
            sqlite3_free(msg);
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            return KOLO_ESTORE;
        }
    }
    rc = sqlite3_exec(db, "COMMIT", NULL, NULL, &msg);
    if (rc == SQLITE_OK)
        return 0;
fail:
    snprintf(err, errlen, "schema migration: %s", msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    if (!sqlite3_get_autocommit(db))
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return KOLO_ESTORE;
}

/* store_configure sets the connection's pragmas; err gets the reason on
 * failure. The version check comes first so that a file from a newer kolo
 * is refused before anything, even its journal mode, is changed. */
static int store_configure(struct store *st, char *err, size_t errlen)
{
    sqlite3 *db = st->db;
    int version = 0;
    char mode[32];
    sqlite3_extended_result_codes(db, 1);
    int rc = sqlite3_busy_timeout(db, STORE_BUSY_TIMEOUT_MS);
    if (rc == SQLITE_OK)
        rc = pragma_int(db, "PRAGMA user_version", &version);
    if (rc != SQLITE_OK)
        goto fail;
    if (version > STORE_SCHEMA_VERSION)
        return refuse_newer(version, err, errlen);

    rc = sqlite3_exec(db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = pragma_text(db, "PRAGMA journal_mode = WAL", mode, sizeof mode);
    if (rc != SQLITE_OK)
        goto fail;
    /* An in-memory database (the empty file name or ":memory:", used by
     * tests) cannot use WAL and has no durability to lose; a file that
     * stays out of WAL would lose the crash guarantees, so it is refused. */
    const char *file = sqlite3_db_filename(db, "main");
    if (strcmp(mode, "wal") != 0 && file && file[0] != '\0') {
        snprintf(err, errlen, "cannot switch %s to WAL mode (journal_mode is %s)", file, mode);
        return KOLO_ESTORE;
    }
    rc = sqlite3_exec(db, "PRAGMA synchronous = FULL", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        goto fail;
    return 0;
fail:
    snprintf(err, errlen, "%s", sqlite3_errmsg(db));
    return KOLO_ESTORE;
}

int store_open(struct store **stp, const char *path, char *err, size_t errlen)
{
    char scratch[8];
    if (!err || errlen == 0) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    if (!stp || !path) {
        snprintf(err, errlen, "store_open: invalid argument");
        return KOLO_EINVAL;
    }
    *stp = NULL;
    struct store *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "store_open: out of memory");
        return KOLO_ENOMEM;
    }
    /* NOMUTEX: a store is used by one thread at a time, so SQLite's own
     * per-connection mutex would only cost time. */
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    int rc = sqlite3_open_v2(path, &st->db, flags, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path, st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
        store_close(st);
        return KOLO_ESTORE;
    }
    int code = store_configure(st, err, errlen);
    if (code == 0)
        code = store_migrate(st, err, errlen);
    if (code != 0) {
        store_close(st);
        return code;
    }
    *stp = st;
    return 0;
}

/*
 * store_open_readonly: a file URI with mode=ro, so SQLite itself refuses
 * every write and never creates the file. A database with no -wal file
 * next to it (a run that ended: the last close checkpoints and removes it)
 * is opened immutable as well, which takes no lock and creates no -shm or
 * -wal file; one with a -wal file (a run still going, or killed) is read
 * through it, which needs the -shm file the writer keeps.
 */
int store_open_readonly(struct store **stp, const char *path, char *err, size_t errlen)
{
    char scratch[8];
    if (!err || errlen == 0) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    if (!stp || !path || !path[0]) {
        snprintf(err, errlen, "store_open_readonly: invalid argument");
        return KOLO_EINVAL;
    }
    *stp = NULL;
    struct stat sb;
    char *wal = NULL;
    errno = 0;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "%s: %s", path, errno ? strerror(errno) : "not a regular file");
        return KOLO_ENOTFOUND;
    }
    bool live = asprintf(&wal, "%s-wal", path) > 0 && stat(wal, &sb) == 0;
    free(wal);
    /* the URI's path: '%', '?' and '#' would end or escape it */
    size_t len = strlen(path);
    char *uri = malloc(3 * len + 40);
    if (!uri) {
        snprintf(err, errlen, "store_open_readonly: out of memory");
        return KOLO_ENOMEM;
    }
    char *o = uri + sprintf(uri, "file:");
    for (const char *p = path; *p; p++)
        o += strchr("%?#", *p) ? sprintf(o, "%%%02X", (unsigned char)*p) : sprintf(o, "%c", *p);
    sprintf(o, "?mode=ro%s", live ? "" : "&immutable=1");
    struct store *st = calloc(1, sizeof *st);
    if (!st) {
        free(uri);
        snprintf(err, errlen, "store_open_readonly: out of memory");
        return KOLO_ENOMEM;
    }
    int rc = sqlite3_open_v2(uri, &st->db,
                             SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
    free(uri);
    int version = -1;
    if (rc == SQLITE_OK) {
        sqlite3_extended_result_codes(st->db, 1);
        rc = sqlite3_busy_timeout(st->db, STORE_BUSY_TIMEOUT_MS);
    }
    if (rc == SQLITE_OK)
        rc = pragma_int(st->db, "PRAGMA user_version", &version);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(st->db, "PRAGMA query_only = 1", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path, st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
        store_close(st);
        return KOLO_ESTORE;
    }
    /* nothing can be migrated here: only the schema this kolo writes */
    if (version != STORE_SCHEMA_VERSION) {
        if (version > STORE_SCHEMA_VERSION)
            refuse_newer(version, err, errlen);
        else
            snprintf(err, errlen,
                     "%s: schema version %d was written by an older kolo (this one "
                     "reads %d)",
                     path, version, STORE_SCHEMA_VERSION);
        store_close(st);
        return KOLO_ESTORE;
    }
    *stp = st;
    return 0;
}

int store_query_only(struct store *st)
{
    int rc = sqlite3_exec(st->db, "PRAGMA query_only = 1", NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : store_fail(st, rc, "PRAGMA query_only");
}

void store_close(struct store *st)
{
    if (!st)
        return;
    for (int i = 0; i < STMT_COUNT; i++)
        sqlite3_finalize(st->stmts[i]);
    /* Closing with a transaction still open rolls it back, which is what
     * an unfinished store_begin should mean. */
    sqlite3_close(st->db);
    free(st);
}

const char *store_last_error(const struct store *st)
{
    return st ? st->errmsg : "no store";
}

int store_integrity_check(struct store *st, char *err, size_t errlen)
{
    char scratch[8];
    if (!err || errlen == 0) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    if (!st)
        return KOLO_EINVAL;
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, "PRAGMA integrity_check", -1, &s, NULL);
    if (rc != SQLITE_OK) {
        int code = store_fail(st, rc, "integrity_check");
        snprintf(err, errlen, "%s", st->errmsg);
        return code;
    }
    /* A healthy database answers with exactly one row, "ok"; otherwise
     * every row is one problem, and the first is enough to report. */
    int code = 0;
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        const char *line = (const char *)sqlite3_column_text(s, 0);
        if (!line || strcmp(line, "ok") != 0) {
            snprintf(err, errlen, "integrity check: %s", line ? line : "(null)");
            code = store_reject(st, KOLO_ESTORE, err);
        }
    } else {
        code = store_fail(st, rc, "integrity_check");
        snprintf(err, errlen, "%s", st->errmsg);
    }
    sqlite3_finalize(s);
    return code;
}

long long store_cache_bytes(struct store *st)
{
    int cache = 0, schema = 0, hi = 0;
    if (!st || sqlite3_db_status(st->db, SQLITE_DBSTATUS_CACHE_USED, &cache, &hi, 0) != SQLITE_OK ||
        sqlite3_db_status(st->db, SQLITE_DBSTATUS_SCHEMA_USED, &schema, &hi, 0) != SQLITE_OK)
        return -1;
    return (long long)cache + schema;
}

int store_schema_version(struct store *st)
{
    if (!st)
        return -1;
    int version = -1;
    int rc = pragma_int(st->db, "PRAGMA user_version", &version);
    if (rc != SQLITE_OK) {
        store_fail(st, rc, "user_version");
        return -1;
    }
    return version;
}

/* ------------------------------------------------------------ transactions */

int store_begin(struct store *st)
{
    if (!st)
        return KOLO_EINVAL;
    if (store_txn_lost(st))
        return KOLO_ESTORE;
    int err = stmt_exec(st, st->txn_depth == 0 ? STMT_BEGIN : STMT_SAVEPOINT);
    if (err)
        return err;
    st->txn_depth++;
    return 0;
}

/* txn_unwind_lost closes one level of a transaction SQLite already rolled
 * back; the flag clears once the outermost level is gone. */
static void txn_unwind_lost(struct store *st)
{
    st->txn_depth--;
    if (st->txn_depth == 0)
        st->txn_lost = false;
}

int store_commit(struct store *st)
{
    if (!st)
        return KOLO_EINVAL;
    if (st->txn_depth == 0)
        return store_reject(st, KOLO_EINVAL, "store_commit without store_begin");
    if (store_txn_lost(st)) {
        txn_unwind_lost(st);
        return KOLO_ESTORE;
    }
    if (st->txn_depth > 1) {
        int err = stmt_exec(st, STMT_RELEASE);
        st->txn_depth--;
        return err;
    }
    int err = stmt_exec(st, STMT_COMMIT);
    /* A COMMIT that failed may leave the transaction open; roll it back so
     * the connection is clean and the caller's depth of zero is true. */
    if (err && !sqlite3_get_autocommit(st->db))
        stmt_exec(st, STMT_ROLLBACK);
    st->txn_depth = 0;
    return err;
}

int store_rollback(struct store *st)
{
    if (!st)
        return KOLO_EINVAL;
    if (st->txn_depth == 0)
        return store_reject(st, KOLO_EINVAL, "store_rollback without store_begin");
    if (store_txn_lost(st)) {
        txn_unwind_lost(st);
        return 0;
    }
    if (st->txn_depth > 1) {
        /* ROLLBACK TO undoes the savepoint's writes but keeps it open;
         * RELEASE then removes it, leaving the outer level as it was. */
        int err = stmt_exec(st, STMT_ROLLBACK_TO);
        if (!err)
            err = stmt_exec(st, STMT_RELEASE);
        st->txn_depth--;
        return err;
    }
    int err = stmt_exec(st, STMT_ROLLBACK);
    st->txn_depth = 0;
    return err;
}

/* ------------------------------------------------------------------- meta */

int store_meta_get(struct store *st, const char *key, char *value, size_t size)
{
    if (!st || !key || !value || size == 0)
        return st ? store_reject(st, KOLO_EINVAL, "store_meta_get: invalid argument") : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_META_GET, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_text(&b, key);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_META_GET, s, b.rc, "meta get");
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        const char *text = col_text(s, 0);
        size_t len = (size_t)sqlite3_column_bytes(s, 0);
        if (len < size) {
            memcpy(value, text ? text : "", len + 1);
        } else {
            snprintf(value, size, "%s", text ? text : "");
            err = store_reject(st, KOLO_ETOOBIG, "store_meta_get: value does not fit");
        }
    } else if (rc == SQLITE_DONE) {
        value[0] = '\0';
        err = store_reject(st, KOLO_ENOTFOUND, "store_meta_get: no such key");
    } else {
        err = store_fail(st, rc, "meta get");
    }
    stmt_done(st, STMT_META_GET, s);
    return err;
}

int store_meta_put(struct store *st, const char *key, const char *value)
{
    if (!st || !key || !value)
        return st ? store_reject(st, KOLO_EINVAL, "store_meta_put: invalid argument") : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_META_PUT, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_text(&b, key);
    bind_text(&b, value);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_META_PUT, s, b.rc, "meta put");
    return step_write(st, STMT_META_PUT, s, "meta put");
}

