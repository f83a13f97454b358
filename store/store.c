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
 * Errors. SQLite's message is kept in st->errmsg for store_last_error().
 * Failures map to kolo codes: a primary-key or unique conflict is
 * KOLO_EEXIST, a foreign key that names a missing job or host is
 * KOLO_ENOTFOUND, anything else from SQLite is KOLO_ESTORE.
 */
#include "store.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "errors.h"

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

/* ---- reports (issue 6): begin ---- */
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
/* ---- reports (issue 6): end ---- */

/*
 * Version 5: snapshots.duration_ms, how long the coordinator took from an
 * upload's first chunk to its commit (0 in rows written before).
 */
static const char schema_v5[] =
    "ALTER TABLE snapshots ADD COLUMN duration_ms INTEGER NOT NULL DEFAULT 0;";

static const struct migration migrations[] = {
    {1, schema_v1},
    {2, schema_v2},
    {3, schema_v3},
    {4, schema_v4},
    {5, schema_v5},
};

/* Versions are consecutive from 1, so the array's length is the newest. */
_Static_assert(sizeof migrations / sizeof migrations[0] == STORE_SCHEMA_VERSION,
               "every schema version needs exactly one migration");

/* -------------------------------------------------------------- statements */

#define HOST_COLUMNS                                                                               \
    "id, name, hostname, addr, slots, cpus, gpus, gpu_names, mem_bytes, state, "                   \
    "registered_ms, last_seen_ms, agent_instance, reg_order"
#define JOB_COLUMNS                                                                                \
    "id, name, state, np, argv_json, env_json, cwd, hosts, exit_code, reason, generation, "        \
    "start_timeout_ms, submitted_ms, started_ms, ended_ms, elastic"
#define RANK_COLUMNS                                                                               \
    "job_id, generation, rank, host_id, local_rank, local_size, cross_rank, cross_size, "          \
    "state, exit_code, term_signal, pid, worker_id"
#define EVENT_COLUMNS  "id, ts_ms, job_id, host_id, kind, message"
#define OUTPUT_COLUMNS "job_id, seq, rank, stream, text, ts_ms"
#define SNAPSHOT_COLUMNS                                                                           \
    "id, job_id, generation, rank, upload_id, created_ms, meta_json, total_bytes, checksum, "      \
    "chunks, duration_ms"

/* Placeholders are positional and bound in the order they appear. */
#define STORE_STATEMENTS(X)                                                                        \
    X(BEGIN, "BEGIN IMMEDIATE")                                                                    \
    X(COMMIT, "COMMIT")                                                                            \
    X(ROLLBACK, "ROLLBACK")                                                                        \
    X(SAVEPOINT, "SAVEPOINT store_nested")                                                         \
    X(RELEASE, "RELEASE store_nested")                                                             \
    X(ROLLBACK_TO, "ROLLBACK TO store_nested")                                                     \
    X(USER_VERSION, "PRAGMA user_version")                                                         \
    X(META_GET, "SELECT value FROM meta WHERE key = ?")                                            \
    X(META_PUT, "INSERT INTO meta(key, value) VALUES (?, ?) "                                      \
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value")                           \
    X(HOST_PUT, "INSERT INTO hosts(" HOST_COLUMNS ") "                                             \
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "                                  \
                "        (SELECT IFNULL(MAX(reg_order), 0) + 1 FROM hosts)) "                      \
                "ON CONFLICT(id) DO UPDATE SET name = excluded.name, "                             \
                "hostname = excluded.hostname, addr = excluded.addr, "                             \
                "slots = excluded.slots, cpus = excluded.cpus, gpus = excluded.gpus, "             \
                "gpu_names = excluded.gpu_names, mem_bytes = excluded.mem_bytes, "                 \
                "state = excluded.state, last_seen_ms = excluded.last_seen_ms, "                   \
                "agent_instance = excluded.agent_instance")                                        \
    X(HOST_SET_STATE, "UPDATE hosts SET state = ?, last_seen_ms = ? WHERE id = ?")                 \
    X(HOSTS_EACH, "SELECT " HOST_COLUMNS " FROM hosts ORDER BY reg_order")                         \
    X(JOB_INSERT, "INSERT INTO jobs(name, state, np, argv_json, env_json, cwd, hosts, "            \
                  "exit_code, reason, generation, start_timeout_ms, submitted_ms, "                \
                  "started_ms, ended_ms, elastic) "                                                \
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")                          \
    X(JOB_UPDATE, "UPDATE jobs SET state = ?, np = ?, hosts = ?, exit_code = ?, "                  \
                  "reason = ?, generation = ?, start_timeout_ms = ?, started_ms = ?, "             \
                  "ended_ms = ?, elastic = ? WHERE id = ?")                                        \
    X(JOBS_EACH, "SELECT " JOB_COLUMNS " FROM jobs ORDER BY id")                                   \
    X(GENERATION_ADD, "INSERT INTO generations(job_id, generation, cause, size, ts_ms) "           \
                      "VALUES (?, ?, ?, ?, ?)")                                                    \
    X(GENERATIONS_EACH, "SELECT generation, cause, size, ts_ms FROM generations "                  \
                        "WHERE job_id = ? ORDER BY generation")                                    \
    X(RANK_PUT, "INSERT INTO ranks(" RANK_COLUMNS ") "                                             \
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "                                  \
                "ON CONFLICT(job_id, generation, rank) DO UPDATE SET "                             \
                "host_id = excluded.host_id, local_rank = excluded.local_rank, "                   \
                "local_size = excluded.local_size, cross_rank = excluded.cross_rank, "             \
                "cross_size = excluded.cross_size, state = excluded.state, "                       \
                "exit_code = excluded.exit_code, term_signal = excluded.term_signal, "             \
                "pid = excluded.pid, worker_id = excluded.worker_id")                              \
    X(RANK_UPDATE, "UPDATE ranks SET state = ?, exit_code = ?, term_signal = ?, pid = ? "          \
                   "WHERE job_id = ? AND generation = ? AND rank = ?")                             \
    X(RANKS_EACH, "SELECT " RANK_COLUMNS " FROM ranks "                                            \
                  "WHERE job_id = ? AND generation = ? ORDER BY rank")                             \
    X(EVENT_ADD, "INSERT INTO events(ts_ms, job_id, host_id, kind, message) "                      \
                 "VALUES (?, ?, ?, ?, ?)")                                                         \
    X(EVENTS_AFTER, "SELECT " EVENT_COLUMNS " FROM events "                                        \
                    "WHERE id > ? ORDER BY id LIMIT ?")                                            \
    X(EVENTS_AFTER_JOB, "SELECT " EVENT_COLUMNS " FROM events "                                    \
                        "WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?")                         \
    X(EVENTS_TAIL, "SELECT * FROM (SELECT " EVENT_COLUMNS " FROM events "                          \
                   "ORDER BY id DESC LIMIT ?) ORDER BY id")                                        \
    X(EVENTS_TAIL_JOB, "SELECT * FROM (SELECT " EVENT_COLUMNS " FROM events "                      \
                       "WHERE job_id = ? ORDER BY id DESC LIMIT ?) ORDER BY id")                   \
    X(OUTPUT_APPEND, "INSERT INTO output(" OUTPUT_COLUMNS ") VALUES (?, ?, ?, ?, ?, ?)")           \
    X(OUTPUT_EACH, "SELECT " OUTPUT_COLUMNS " FROM output "                                        \
                   "WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?")                            \
    X(OUTPUT_MAX_SEQ, "SELECT IFNULL(MAX(seq), 0) FROM output WHERE job_id = ?")                   \
    X(SNAP_INSERT, "INSERT INTO snapshots(job_id, generation, rank, upload_id, created_ms, "       \
                   "meta_json, total_bytes, checksum, chunks, duration_ms) "                       \
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")                                        \
    X(SNAP_CHUNK_INSERT, "INSERT INTO snapshot_chunks(snapshot_id, idx, data) VALUES (?, ?, ?)")   \
    X(SNAP_SET_DURATION, "UPDATE snapshots SET duration_ms = ? WHERE job_id = ? AND id = ?")       \
    X(SNAP_LATEST, "SELECT " SNAPSHOT_COLUMNS " FROM snapshots "                                   \
                   "WHERE job_id = ? ORDER BY id DESC LIMIT 1")                                    \
    X(SNAP_GET, "SELECT " SNAPSHOT_COLUMNS " FROM snapshots WHERE job_id = ? AND id = ?")          \
    X(SNAP_BY_UPLOAD, "SELECT " SNAPSHOT_COLUMNS " FROM snapshots "                                \
                      "WHERE job_id = ? AND upload_id = ?")                                        \
    X(SNAPS_EACH, "SELECT " SNAPSHOT_COLUMNS " FROM snapshots "                                    \
                  "WHERE job_id = ? ORDER BY id DESC LIMIT ?")                                     \
    X(SNAP_CHUNK_GET, "SELECT c.data FROM snapshot_chunks c JOIN snapshots s "                     \
                      "ON s.id = c.snapshot_id "                                                   \
                      "WHERE s.job_id = ? AND c.snapshot_id = ? AND c.idx = ?")                    \
    X(SNAP_PRUNE, "DELETE FROM snapshots WHERE job_id = ? AND id NOT IN "                          \
                  "(SELECT id FROM snapshots WHERE job_id = ? ORDER BY id DESC LIMIT ?)")           \
    X(EPOCH_START, "INSERT INTO epochs(job_id, generation, rank, epoch, start_ms) "                \
                   "VALUES (?, ?, ?, ?, ?) ON CONFLICT(job_id, generation, rank, epoch) "           \
                   "DO UPDATE SET start_ms = excluded.start_ms")                                   \
    X(EPOCH_END, "INSERT INTO epochs(job_id, generation, rank, epoch, start_ms, end_ms, samples, "  \
                 "metrics_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "                                  \
                 "ON CONFLICT(job_id, generation, rank, epoch) DO UPDATE SET "                     \
                 "start_ms = CASE WHEN start_ms > 0 THEN start_ms ELSE excluded.start_ms END, "    \
                 "end_ms = excluded.end_ms, samples = excluded.samples, "                          \
                 "metrics_json = excluded.metrics_json")                                           \
    X(EPOCHS_EACH, "SELECT job_id, generation, rank, epoch, start_ms, end_ms, samples, "           \
                   "metrics_json FROM epochs WHERE job_id = ? "                                    \
                   "ORDER BY epoch, generation, rank")                                             \
    X(STEP_ADD, "INSERT INTO steps(job_id, rank, host_id, ts_ms, seconds, n) "                     \
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(job_id, rank, ts_ms) DO UPDATE SET "        \
                "seconds = (seconds * n + excluded.seconds * excluded.n) / (n + excluded.n), "     \
                "n = n + excluded.n, host_id = excluded.host_id")                                  \
    X(STEPS_EACH, "SELECT job_id, rank, host_id, ts_ms, seconds, n FROM steps "                    \
                  "WHERE job_id = ? AND ts_ms >= ? ORDER BY ts_ms, rank")                          \
    X(STEPS_PRUNE, "DELETE FROM steps WHERE job_id = ? AND ts_ms < "                               \
                   "(SELECT ts_ms FROM steps WHERE job_id = ? ORDER BY ts_ms DESC "                \
                   "LIMIT 1 OFFSET ?)")

enum stmt_id {
#define STMT_ENUM(name, sql) STMT_##name,
    STORE_STATEMENTS(STMT_ENUM)
#undef STMT_ENUM
        STMT_COUNT
};

static const char *const stmt_sql[STMT_COUNT] = {
#define STMT_SQL(name, sql) [STMT_##name] = sql,
    STORE_STATEMENTS(STMT_SQL)
#undef STMT_SQL
};

struct store {
    sqlite3 *db;
    sqlite3_stmt *stmts[STMT_COUNT]; /* prepared on first use */
    int txn_depth;                   /* store_begin levels open */
    bool txn_lost;                   /* SQLite aborted the open transaction */
    char errmsg[512];
};

/* ------------------------------------------------------------------ errors */

/* store_fail records SQLite's message for rc and maps rc to a kolo code. */
static int store_fail(struct store *st, int rc, const char *what)
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
static int store_reject(struct store *st, int code, const char *what)
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
static int stmt_get(struct store *st, enum stmt_id id, sqlite3_stmt **out)
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
static void stmt_done(struct store *st, enum stmt_id id, sqlite3_stmt *s)
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
static int stmt_data_get(struct store *st, enum stmt_id id, sqlite3_stmt **out)
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

/*
 * A binder fills a statement's positional parameters left to right and
 * remembers the first failure, so a function binds all its values and
 * checks once. A NULL string is bound as SQL NULL.
 */
struct binder {
    sqlite3_stmt *s;
    int index;
    int rc;
};

static void bind_text(struct binder *b, const char *text)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    b->rc = text ? sqlite3_bind_text(b->s, b->index, text, -1, SQLITE_STATIC)
                 : sqlite3_bind_null(b->s, b->index);
}

static void bind_null(struct binder *b)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    b->rc = sqlite3_bind_null(b->s, b->index);
}

static void bind_i64(struct binder *b, int64_t value)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    b->rc = sqlite3_bind_int64(b->s, b->index, value);
}

static void bind_double(struct binder *b, double value)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    b->rc = sqlite3_bind_double(b->s, b->index, value);
}

/* SQLite integers are signed 64-bit; the unsigned values stored here (ids,
 * timestamps, sequence numbers, byte counts) stay far below 2^63. */
static void bind_u64(struct binder *b, uint64_t value)
{
    bind_i64(b, (int64_t)value);
}

static void bind_blob(struct binder *b, const void *data, size_t len)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    /* sqlite3_bind_blob turns a NULL pointer into SQL NULL; an empty line
     * is a zero-length blob, not a missing one. */
    if (len == 0)
        b->rc = sqlite3_bind_zeroblob(b->s, b->index, 0);
    else
        b->rc = sqlite3_bind_blob64(b->s, b->index, data, len, SQLITE_STATIC);
}

static const char *col_text(sqlite3_stmt *s, int col)
{
    return (const char *)sqlite3_column_text(s, col);
}

static uint64_t col_u64(sqlite3_stmt *s, int col)
{
    return (uint64_t)sqlite3_column_int64(s, col);
}

/* step_write runs a bound INSERT/UPDATE to completion and releases s. */
static int step_write(struct store *st, enum stmt_id id, sqlite3_stmt *s, const char *what)
{
    int rc = sqlite3_step(s);
    int err = rc == SQLITE_DONE ? 0 : store_fail(st, rc, what);
    stmt_done(st, id, s);
    return err;
}

/* bind_failed releases s after a failed bind and reports it. */
static int bind_failed(struct store *st, enum stmt_id id, sqlite3_stmt *s, int rc, const char *what)
{
    int err = store_fail(st, rc, what);
    stmt_done(st, id, s);
    return err;
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

/* ------------------------------------------------------------------ hosts */

int store_host_put(struct store *st, const struct store_host *h)
{
    if (!st || !h || !h->id || !h->state)
        return st ? store_reject(st, KOLO_EINVAL, "store_host_put: id and state are required")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_HOST_PUT, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_text(&b, h->id);
    bind_text(&b, h->name);
    bind_text(&b, h->hostname);
    bind_text(&b, h->addr);
    bind_i64(&b, h->slots);
    bind_i64(&b, h->cpus);
    bind_i64(&b, h->gpus);
    bind_text(&b, h->gpu_names);
    bind_u64(&b, h->mem_bytes);
    bind_text(&b, h->state);
    bind_u64(&b, h->registered_ms);
    bind_u64(&b, h->last_seen_ms);
    bind_text(&b, h->agent_instance);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_HOST_PUT, s, b.rc, "host put");
    return step_write(st, STMT_HOST_PUT, s, "host put");
}

int store_host_set_state(struct store *st, const char *id, const char *state, uint64_t ts_ms)
{
    if (!st || !id || !state)
        return st ? store_reject(st, KOLO_EINVAL, "store_host_set_state: invalid argument")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_HOST_SET_STATE, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_text(&b, state);
    bind_u64(&b, ts_ms);
    bind_text(&b, id);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_HOST_SET_STATE, s, b.rc, "host set state");
    err = step_write(st, STMT_HOST_SET_STATE, s, "host set state");
    if (!err && sqlite3_changes(st->db) == 0)
        err = store_reject(st, KOLO_ENOTFOUND, "store_host_set_state: no such host");
    return err;
}

int store_hosts_each(struct store *st, store_host_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_HOSTS_EACH, &s);
    if (err)
        return err;
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "hosts");
            break;
        }
        struct store_host h = {
            .id = col_text(s, 0),
            .name = col_text(s, 1),
            .hostname = col_text(s, 2),
            .addr = col_text(s, 3),
            .slots = sqlite3_column_int(s, 4),
            .cpus = sqlite3_column_int(s, 5),
            .gpus = sqlite3_column_int(s, 6),
            .gpu_names = col_text(s, 7),
            .mem_bytes = col_u64(s, 8),
            .state = col_text(s, 9),
            .registered_ms = col_u64(s, 10),
            .last_seen_ms = col_u64(s, 11),
            .agent_instance = col_text(s, 12),
            .order = sqlite3_column_int64(s, 13),
        };
        result = fn(&h, arg);
        if (result)
            break;
    }
    stmt_done(st, STMT_HOSTS_EACH, s);
    return result;
}

/* ------------------------------------------------------------------- jobs */

int store_job_insert(struct store *st, struct store_job *job)
{
    if (!st || !job || !job->state)
        return st ? store_reject(st, KOLO_EINVAL, "store_job_insert: state is required")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_JOB_INSERT, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_text(&b, job->name);
    bind_text(&b, job->state);
    bind_i64(&b, job->np);
    bind_text(&b, job->argv_json);
    bind_text(&b, job->env_json);
    bind_text(&b, job->cwd);
    bind_text(&b, job->hosts);
    bind_i64(&b, job->exit_code);
    bind_text(&b, job->reason);
    bind_u64(&b, job->generation);
    bind_i64(&b, job->start_timeout_ms);
    bind_u64(&b, job->submitted_ms);
    bind_u64(&b, job->started_ms);
    bind_u64(&b, job->ended_ms);
    bind_text(&b, job->elastic_json);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_JOB_INSERT, s, b.rc, "job insert");
    err = step_write(st, STMT_JOB_INSERT, s, "job insert");
    if (!err)
        job->id = (uint64_t)sqlite3_last_insert_rowid(st->db);
    return err;
}

int store_job_update(struct store *st, const struct store_job *job)
{
    if (!st || !job || job->id == 0 || !job->state)
        return st ? store_reject(st, KOLO_EINVAL, "store_job_update: id and state are required")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_JOB_UPDATE, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_text(&b, job->state);
    bind_i64(&b, job->np);
    bind_text(&b, job->hosts);
    bind_i64(&b, job->exit_code);
    bind_text(&b, job->reason);
    bind_u64(&b, job->generation);
    bind_i64(&b, job->start_timeout_ms);
    bind_u64(&b, job->started_ms);
    bind_u64(&b, job->ended_ms);
    bind_text(&b, job->elastic_json);
    bind_u64(&b, job->id);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_JOB_UPDATE, s, b.rc, "job update");
    err = step_write(st, STMT_JOB_UPDATE, s, "job update");
    if (!err && sqlite3_changes(st->db) == 0)
        err = store_reject(st, KOLO_ENOTFOUND, "store_job_update: no such job");
    return err;
}

int store_jobs_each(struct store *st, store_job_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_JOBS_EACH, &s);
    if (err)
        return err;
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "jobs");
            break;
        }
        struct store_job j = {
            .id = col_u64(s, 0),
            .name = col_text(s, 1),
            .state = col_text(s, 2),
            .np = sqlite3_column_int(s, 3),
            .argv_json = col_text(s, 4),
            .env_json = col_text(s, 5),
            .cwd = col_text(s, 6),
            .hosts = col_text(s, 7),
            .exit_code = sqlite3_column_int(s, 8),
            .reason = col_text(s, 9),
            .generation = col_u64(s, 10),
            .start_timeout_ms = (uint32_t)sqlite3_column_int64(s, 11),
            .submitted_ms = col_u64(s, 12),
            .started_ms = col_u64(s, 13),
            .ended_ms = col_u64(s, 14),
            .elastic_json = col_text(s, 15),
        };
        result = fn(&j, arg);
        if (result)
            break;
    }
    stmt_done(st, STMT_JOBS_EACH, s);
    return result;
}

/* ---------------------------------------------------- generations, ranks */

int store_generation_add(struct store *st, uint64_t job_id, uint64_t generation, const char *cause,
                         int size, uint64_t ts_ms)
{
    if (!st || job_id == 0 || size < 0)
        return st ? store_reject(st, KOLO_EINVAL, "store_generation_add: invalid argument")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_GENERATION_ADD, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    bind_u64(&b, generation);
    bind_text(&b, cause);
    bind_i64(&b, size);
    bind_u64(&b, ts_ms);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_GENERATION_ADD, s, b.rc, "generation add");
    return step_write(st, STMT_GENERATION_ADD, s, "generation add");
}

int store_generations_each(struct store *st, uint64_t job_id, store_generation_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_GENERATIONS_EACH, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_GENERATIONS_EACH, s, b.rc, "generations");
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "generations");
            break;
        }
        result = fn(col_u64(s, 0), col_text(s, 1), sqlite3_column_int(s, 2), col_u64(s, 3), arg);
        if (result)
            break;
    }
    stmt_done(st, STMT_GENERATIONS_EACH, s);
    return result;
}

/* Stores n items (size bytes apart) with one(st, item) in one
 * transaction: all of them or none, one fsync for the batch. */
static int put_all(struct store *st, const void *items, size_t n, size_t size,
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

static int rank_put_one(struct store *st, const void *item)
{
    const struct store_rank *r = item;
    if (r->job_id == 0 || !r->state)
        return store_reject(st, KOLO_EINVAL, "store_ranks_put: job_id and state are required");
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_RANK_PUT, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, r->job_id);
    bind_u64(&b, r->generation);
    bind_i64(&b, r->rank);
    bind_text(&b, r->host_id);
    bind_i64(&b, r->local_rank);
    bind_i64(&b, r->local_size);
    bind_i64(&b, r->cross_rank);
    bind_i64(&b, r->cross_size);
    bind_text(&b, r->state);
    bind_i64(&b, r->exit_code);
    bind_i64(&b, r->term_signal);
    bind_i64(&b, r->pid);
    bind_u64(&b, r->worker_id);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_RANK_PUT, s, b.rc, "rank put");
    return step_write(st, STMT_RANK_PUT, s, "rank put");
}

int store_ranks_put(struct store *st, const struct store_rank *ranks, size_t n)
{
    if (!st || (!ranks && n > 0))
        return st ? store_reject(st, KOLO_EINVAL, "store_ranks_put: invalid argument")
                  : KOLO_EINVAL;
    /* A generation's ranks are stored together or not at all. */
    return put_all(st, ranks, n, sizeof(*ranks), rank_put_one);
}

int store_rank_update(struct store *st, const struct store_rank *r)
{
    if (!st || !r || r->job_id == 0 || !r->state)
        return st ? store_reject(st, KOLO_EINVAL,
                                 "store_rank_update: job_id and state are required")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_RANK_UPDATE, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_text(&b, r->state);
    bind_i64(&b, r->exit_code);
    bind_i64(&b, r->term_signal);
    bind_i64(&b, r->pid);
    bind_u64(&b, r->job_id);
    bind_u64(&b, r->generation);
    bind_i64(&b, r->rank);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_RANK_UPDATE, s, b.rc, "rank update");
    err = step_write(st, STMT_RANK_UPDATE, s, "rank update");
    if (!err && sqlite3_changes(st->db) == 0)
        err = store_reject(st, KOLO_ENOTFOUND, "store_rank_update: no such rank");
    return err;
}

int store_ranks_each(struct store *st, uint64_t job_id, uint64_t generation, store_rank_fn fn,
                     void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_RANKS_EACH, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    bind_u64(&b, generation);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_RANKS_EACH, s, b.rc, "ranks");
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "ranks");
            break;
        }
        struct store_rank r = {
            .job_id = col_u64(s, 0),
            .generation = col_u64(s, 1),
            .rank = sqlite3_column_int(s, 2),
            .host_id = col_text(s, 3),
            .local_rank = sqlite3_column_int(s, 4),
            .local_size = sqlite3_column_int(s, 5),
            .cross_rank = sqlite3_column_int(s, 6),
            .cross_size = sqlite3_column_int(s, 7),
            .state = col_text(s, 8),
            .exit_code = sqlite3_column_int(s, 9),
            .term_signal = sqlite3_column_int(s, 10),
            .pid = sqlite3_column_int(s, 11),
            .worker_id = col_u64(s, 12),
        };
        result = fn(&r, arg);
        if (result)
            break;
    }
    stmt_done(st, STMT_RANKS_EACH, s);
    return result;
}

/* ----------------------------------------------------------------- events */

int store_event_add(struct store *st, struct store_event *ev)
{
    if (!st || !ev || !ev->kind)
        return st ? store_reject(st, KOLO_EINVAL, "store_event_add: kind is required")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_EVENT_ADD, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, ev->ts_ms);
    /* 0 means "no job"; NULL keeps such events out of every per-job
     * query and lets a later schema add a foreign key without rewriting. */
    if (ev->job_id == 0)
        bind_null(&b);
    else
        bind_u64(&b, ev->job_id);
    bind_text(&b, ev->host_id);
    bind_text(&b, ev->kind);
    bind_text(&b, ev->message);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_EVENT_ADD, s, b.rc, "event add");
    err = step_write(st, STMT_EVENT_ADD, s, "event add");
    if (!err)
        ev->id = sqlite3_last_insert_rowid(st->db);
    return err;
}

int store_events_each(struct store *st, uint64_t job_id, int64_t after_id, int limit,
                      store_event_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    /* Four shapes, each its own statement so that SQLite can plan it on
     * the right index: from an id forwards, or the newest `limit` (picked
     * in descending order, then returned ascending), for all jobs or one.
     * SQLite reads LIMIT -1 as no limit. */
    bool tail = after_id < 0 && limit > 0;
    int64_t sql_limit = limit > 0 ? limit : -1;
    if (after_id < 0)
        after_id = 0;
    enum stmt_id id;
    if (tail)
        id = job_id ? STMT_EVENTS_TAIL_JOB : STMT_EVENTS_TAIL;
    else
        id = job_id ? STMT_EVENTS_AFTER_JOB : STMT_EVENTS_AFTER;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, id, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    if (job_id)
        bind_u64(&b, job_id);
    if (!tail)
        bind_i64(&b, after_id);
    bind_i64(&b, sql_limit);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, id, s, b.rc, "events");
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "events");
            break;
        }
        struct store_event ev = {
            .id = sqlite3_column_int64(s, 0),
            .ts_ms = col_u64(s, 1),
            .job_id = col_u64(s, 2), /* NULL reads as 0: no job */
            .host_id = col_text(s, 3),
            .kind = col_text(s, 4),
            .message = col_text(s, 5),
        };
        result = fn(&ev, arg);
        if (result)
            break;
    }
    stmt_done(st, id, s);
    return result;
}

/* ----------------------------------------------------------------- output */

static int output_append_one(struct store *st, const void *item)
{
    const struct store_output *o = item;
    if (o->job_id == 0 || (!o->text && o->text_len > 0))
        return store_reject(st, KOLO_EINVAL, "store_output_append: invalid line");
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_OUTPUT_APPEND, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, o->job_id);
    bind_u64(&b, o->seq);
    bind_i64(&b, o->rank);
    bind_i64(&b, o->stream);
    bind_blob(&b, o->text, o->text_len);
    bind_u64(&b, o->ts_ms);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_OUTPUT_APPEND, s, b.rc, "output append");
    return step_write(st, STMT_OUTPUT_APPEND, s, "output append");
}

int store_output_append(struct store *st, const struct store_output *lines, size_t n)
{
    if (!st || (!lines && n > 0))
        return st ? store_reject(st, KOLO_EINVAL, "store_output_append: invalid argument")
                  : KOLO_EINVAL;
    /* One transaction for the batch: one fsync instead of n, and a reader
     * never sees half of what an agent sent in one message. */
    return put_all(st, lines, n, sizeof(*lines), output_append_one);
}

int store_output_each(struct store *st, uint64_t job_id, uint64_t after_seq, int limit,
                      store_output_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_OUTPUT_EACH, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    bind_u64(&b, after_seq);
    bind_i64(&b, limit > 0 ? limit : -1);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_OUTPUT_EACH, s, b.rc, "output");
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "output");
            break;
        }
        /* sqlite3_column_text on a BLOB gives its bytes unchanged plus a
         * terminating NUL, so callers may also treat a line as a C string
         * when they know it holds none. It must come before column_bytes. */
        const char *text = col_text(s, 4);
        size_t len = (size_t)sqlite3_column_bytes(s, 4);
        struct store_output o = {
            .job_id = col_u64(s, 0),
            .seq = col_u64(s, 1),
            .rank = sqlite3_column_int(s, 2),
            .stream = sqlite3_column_int(s, 3),
            .text = text ? text : "",
            .text_len = text ? len : 0,
            .ts_ms = col_u64(s, 5),
        };
        result = fn(&o, arg);
        if (result)
            break;
    }
    stmt_done(st, STMT_OUTPUT_EACH, s);
    return result;
}

int store_output_max_seq(struct store *st, uint64_t job_id, uint64_t *seq)
{
    if (!st || !seq)
        return st ? store_reject(st, KOLO_EINVAL, "store_output_max_seq: invalid argument")
                  : KOLO_EINVAL;
    *seq = 0;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_OUTPUT_MAX_SEQ, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_OUTPUT_MAX_SEQ, s, b.rc, "output max seq");
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        *seq = col_u64(s, 0);
    else
        err = store_fail(st, rc, "output max seq");
    stmt_done(st, STMT_OUTPUT_MAX_SEQ, s);
    return err;
}

/* -------------------------------------------------------------- snapshots */

static int snapshot_chunk_put(struct store *st, uint64_t id, size_t idx, const struct store_blob *c)
{
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_SNAP_CHUNK_INSERT, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, id);
    bind_u64(&b, idx);
    bind_blob(&b, c->data, c->len);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_SNAP_CHUNK_INSERT, s, b.rc, "snapshot chunk");
    return step_write(st, STMT_SNAP_CHUNK_INSERT, s, "snapshot chunk");
}

static int snapshot_insert(struct store *st, struct store_snapshot *snap)
{
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_SNAP_INSERT, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, snap->job_id);
    bind_u64(&b, snap->generation);
    bind_i64(&b, snap->rank);
    /* upload ids are random 64-bit values: stored as their signed image */
    bind_u64(&b, snap->upload_id);
    bind_u64(&b, snap->created_ms);
    bind_text(&b, snap->meta_json);
    bind_u64(&b, snap->total_bytes);
    bind_text(&b, snap->checksum);
    bind_i64(&b, snap->nchunks);
    bind_u64(&b, snap->duration_ms);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_SNAP_INSERT, s, b.rc, "snapshot insert");
    err = step_write(st, STMT_SNAP_INSERT, s, "snapshot insert");
    if (!err)
        snap->id = (uint64_t)sqlite3_last_insert_rowid(st->db);
    return err;
}

int store_snapshot_put(struct store *st, struct store_snapshot *snap,
                       const struct store_blob *chunks, size_t n)
{
    if (!st)
        return KOLO_EINVAL;
    if (!snap || snap->job_id == 0 || !snap->meta_json || !snap->checksum || n == 0 ||
        n != snap->nchunks || !chunks)
        return store_reject(st, KOLO_EINVAL, "store_snapshot_put: invalid argument");
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!chunks[i].data && chunks[i].len > 0)
            return store_reject(st, KOLO_EINVAL, "store_snapshot_put: chunk without data");
        total += chunks[i].len;
    }
    if (total != snap->total_bytes)
        return store_reject(st, KOLO_EINVAL,
                            "store_snapshot_put: chunk lengths do not add up to total_bytes");
    /* The record and every chunk in one transaction: a reader (or a
     * coordinator restarted after a crash) sees the snapshot whole or not
     * at all, and a return of 0 means all of it is on disk. */
    int err = store_begin(st);
    if (err)
        return err;
    err = snapshot_insert(st, snap);
    for (size_t i = 0; i < n && !err; i++)
        err = snapshot_chunk_put(st, snap->id, i, &chunks[i]);
    if (err) {
        store_rollback(st);
        snap->id = 0;
        return err;
    }
    err = store_commit(st);
    if (err)
        snap->id = 0;
    return err;
}

/* snapshot_rows steps a bound snapshot query and hands every row to fn;
 * *rows counts them. */
static int snapshot_rows(struct store *st, enum stmt_id id, sqlite3_stmt *s, store_snapshot_fn fn,
                         void *arg, int *rows)
{
    int result = 0;
    *rows = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "snapshots");
            break;
        }
        (*rows)++;
        struct store_snapshot snap = {
            .id = col_u64(s, 0),
            .job_id = col_u64(s, 1),
            .generation = col_u64(s, 2),
            .rank = sqlite3_column_int(s, 3),
            .upload_id = col_u64(s, 4),
            .created_ms = col_u64(s, 5),
            .meta_json = col_text(s, 6),
            .total_bytes = col_u64(s, 7),
            .checksum = col_text(s, 8),
            .nchunks = (uint32_t)sqlite3_column_int64(s, 9),
            .duration_ms = col_u64(s, 10),
        };
        result = fn(&snap, arg);
        if (result)
            break;
    }
    stmt_done(st, id, s);
    return result;
}

/* snapshot_one runs a query that names at most one snapshot: by the job,
 * and by a second key (an id, an upload id) when has_key. */
static int snapshot_one(struct store *st, enum stmt_id id, uint64_t job_id, bool has_key,
                        uint64_t key, store_snapshot_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, id, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    if (has_key)
        bind_u64(&b, key);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, id, s, b.rc, "snapshot");
    int rows = 0;
    int result = snapshot_rows(st, id, s, fn, arg, &rows);
    if (result == 0 && rows == 0)
        result = store_reject(st, KOLO_ENOTFOUND, "no such snapshot");
    return result;
}

int store_snapshot_latest(struct store *st, uint64_t job_id, store_snapshot_fn fn, void *arg)
{
    return snapshot_one(st, STMT_SNAP_LATEST, job_id, false, 0, fn, arg);
}

int store_snapshot_get(struct store *st, uint64_t job_id, uint64_t id, store_snapshot_fn fn,
                       void *arg)
{
    return snapshot_one(st, STMT_SNAP_GET, job_id, true, id, fn, arg);
}

int store_snapshot_by_upload(struct store *st, uint64_t job_id, uint64_t upload_id,
                             store_snapshot_fn fn, void *arg)
{
    return snapshot_one(st, STMT_SNAP_BY_UPLOAD, job_id, true, upload_id, fn, arg);
}

int store_snapshots_each(struct store *st, uint64_t job_id, int limit, store_snapshot_fn fn,
                         void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_SNAPS_EACH, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    bind_i64(&b, limit > 0 ? limit : -1);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_SNAPS_EACH, s, b.rc, "snapshots");
    int rows = 0;
    return snapshot_rows(st, STMT_SNAPS_EACH, s, fn, arg, &rows);
}

int store_snapshot_chunk(struct store *st, uint64_t job_id, uint64_t id, uint32_t index,
                         store_blob_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_SNAP_CHUNK_GET, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    bind_u64(&b, id);
    bind_i64(&b, index);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_SNAP_CHUNK_GET, s, b.rc, "snapshot chunk");
    int rc = sqlite3_step(s);
    int result;
    if (rc == SQLITE_ROW) {
        /* column_blob gives NULL for a zero-length blob */
        const void *data = sqlite3_column_blob(s, 0);
        size_t len = (size_t)sqlite3_column_bytes(s, 0);
        result = fn(data ? data : "", len, arg);
    } else if (rc == SQLITE_DONE) {
        result = store_reject(st, KOLO_ENOTFOUND, "no such snapshot chunk");
    } else {
        result = store_fail(st, rc, "snapshot chunk");
    }
    stmt_done(st, STMT_SNAP_CHUNK_GET, s);
    return result;
}

int store_snapshot_prune(struct store *st, uint64_t job_id, int keep, int *deleted)
{
    if (deleted)
        *deleted = 0;
    if (!st || keep < 1)
        return st ? store_reject(st, KOLO_EINVAL, "store_snapshot_prune: keep must be >= 1")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_SNAP_PRUNE, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    bind_u64(&b, job_id);
    bind_i64(&b, keep);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_SNAP_PRUNE, s, b.rc, "snapshot prune");
    err = step_write(st, STMT_SNAP_PRUNE, s, "snapshot prune");
    /* sqlite3_changes counts the snapshots, not the cascaded chunks */
    if (!err && deleted)
        *deleted = sqlite3_changes(st->db);
    return err;
}

int store_snapshot_set_duration(struct store *st, uint64_t job_id, uint64_t id,
                                uint64_t duration_ms)
{
    if (!st)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_SNAP_SET_DURATION, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, duration_ms);
    bind_u64(&b, job_id);
    bind_u64(&b, id);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_SNAP_SET_DURATION, s, b.rc, "snapshot duration");
    err = step_write(st, STMT_SNAP_SET_DURATION, s, "snapshot duration");
    if (!err && sqlite3_changes(st->db) == 0)
        err = store_reject(st, KOLO_ENOTFOUND, "store_snapshot_set_duration: no such snapshot");
    return err;
}

/* ---- reports (issue 6): begin ---- */
/* ------------------------------------------------------------ reports */

int store_epoch_report(struct store *st, const struct store_epoch *e, int phase)
{
    if (!st)
        return KOLO_EINVAL;
    if (!e || e->job_id == 0 || e->rank < 0 || e->epoch < 0 || (phase != 0 && phase != 1) ||
        e->samples < 0)
        return store_reject(st, KOLO_EINVAL, "store_epoch_report: invalid argument");
    enum stmt_id id = phase == 0 ? STMT_EPOCH_START : STMT_EPOCH_END;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, id, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, e->job_id);
    bind_u64(&b, e->generation);
    bind_i64(&b, e->rank);
    bind_i64(&b, e->epoch);
    bind_u64(&b, e->start_ms);
    if (phase == 1) {
        bind_u64(&b, e->end_ms);
        bind_i64(&b, e->samples);
        bind_text(&b, e->metrics_json);
    }
    if (b.rc != SQLITE_OK)
        return bind_failed(st, id, s, b.rc, "epoch report");
    return step_write(st, id, s, "epoch report");
}

int store_epochs_each(struct store *st, uint64_t job_id, store_epoch_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_EPOCHS_EACH, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_EPOCHS_EACH, s, b.rc, "epochs");
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "epochs");
            break;
        }
        struct store_epoch e = {
            .job_id = col_u64(s, 0),
            .generation = col_u64(s, 1),
            .rank = sqlite3_column_int(s, 2),
            .epoch = sqlite3_column_int64(s, 3),
            .start_ms = col_u64(s, 4),
            .end_ms = col_u64(s, 5),
            .samples = sqlite3_column_int64(s, 6),
            .metrics_json = col_text(s, 7),
        };
        result = fn(&e, arg);
        if (result)
            break;
    }
    stmt_done(st, STMT_EPOCHS_EACH, s);
    return result;
}

static int step_add_one(struct store *st, const void *item)
{
    const struct store_step *p = item;
    if (p->job_id == 0 || p->rank < 0 || p->n == 0 || !(p->seconds >= 0))
        return store_reject(st, KOLO_EINVAL, "store_steps_add: invalid sample");
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_STEP_ADD, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, p->job_id);
    bind_i64(&b, p->rank);
    bind_text(&b, p->host_id);
    bind_u64(&b, p->ts_ms);
    bind_double(&b, p->seconds);
    bind_i64(&b, p->n);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_STEP_ADD, s, b.rc, "step add");
    return step_write(st, STMT_STEP_ADD, s, "step add");
}

int store_steps_add(struct store *st, const struct store_step *steps, size_t n)
{
    if (!st || (!steps && n > 0))
        return st ? store_reject(st, KOLO_EINVAL, "store_steps_add: invalid argument")
                  : KOLO_EINVAL;
    return put_all(st, steps, n, sizeof(*steps), step_add_one);
}

int store_steps_each(struct store *st, uint64_t job_id, uint64_t since_ms, store_step_fn fn,
                     void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_STEPS_EACH, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    bind_u64(&b, since_ms);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_STEPS_EACH, s, b.rc, "steps");
    int result = 0;
    for (;;) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            result = store_fail(st, rc, "steps");
            break;
        }
        struct store_step p = {
            .job_id = col_u64(s, 0),
            .rank = sqlite3_column_int(s, 1),
            .host_id = col_text(s, 2),
            .ts_ms = col_u64(s, 3),
            .seconds = sqlite3_column_double(s, 4),
            .n = (uint32_t)sqlite3_column_int64(s, 5),
        };
        result = fn(&p, arg);
        if (result)
            break;
    }
    stmt_done(st, STMT_STEPS_EACH, s);
    return result;
}

int store_steps_prune(struct store *st, uint64_t job_id, int keep, int *deleted)
{
    if (deleted)
        *deleted = 0;
    if (!st || keep < 1)
        return st ? store_reject(st, KOLO_EINVAL, "store_steps_prune: keep must be >= 1")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_STEPS_PRUNE, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, job_id);
    bind_u64(&b, job_id);
    bind_i64(&b, keep - 1);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_STEPS_PRUNE, s, b.rc, "steps prune");
    err = step_write(st, STMT_STEPS_PRUNE, s, "steps prune");
    if (!err && deleted)
        *deleted = sqlite3_changes(st->db);
    return err;
}
/* ---- reports (issue 6): end ---- */
