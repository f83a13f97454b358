/*
 * store_internal.h - what the store's files share, and nothing outside
 * store/ sees: the statement table (every SQL statement, prepared once on
 * first use and cached in struct store), the binder, the error mapping and
 * the one row walker. store.c owns the connection, the schema, the cache
 * and transactions; each store_<entity>.c holds its tables' functions of
 * store.h.
 */
#ifndef KOLO_STORE_INTERNAL_H
#define KOLO_STORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include "errors.h"
#include "store.h"

#define HOST_COLUMNS                                                                               \
    "id, name, hostname, addr, slots, cpus, gpus, gpu_names, mem_bytes, state, "                   \
    "registered_ms, last_seen_ms, agent_instance, reg_order"
#define JOB_COLUMNS                                                                                \
    "id, name, state, np, argv_json, env_json, cwd, hosts, exit_code, reason, generation, "        \
    "start_timeout_ms, submitted_ms, started_ms, ended_ms, elastic, metadata_json"
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
                  "started_ms, ended_ms, elastic, metadata_json) "                                 \
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")                       \
    X(JOB_UPDATE, "UPDATE jobs SET state = ?, np = ?, hosts = ?, exit_code = ?, "                  \
                  "reason = ?, generation = ?, start_timeout_ms = ?, started_ms = ?, "             \
                  "ended_ms = ?, elastic = ? WHERE id = ?")                                        \
    X(JOBS_EACH, "SELECT " JOB_COLUMNS " FROM jobs ORDER BY id")                                   \
    X(GENERATION_ADD, "INSERT INTO generations(job_id, generation, cause, size, ts_ms) "           \
                      "VALUES (?, ?, ?, ?, ?)")                                                    \
    X(GENERATIONS_EACH, "SELECT generation, cause, size, ts_ms, rec_told_ms, rec_formed_ms, "      \
                        "rec_restored_ms, rec_step_ms FROM generations "                           \
                        "WHERE job_id = ? ORDER BY generation")                                    \
    X(GENERATION_RECOVERY, "UPDATE generations SET rec_told_ms = ?, rec_formed_ms = ?, "           \
                           "rec_restored_ms = ?, rec_step_ms = ? "                                 \
                           "WHERE job_id = ? AND generation = ?")                                  \
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
    X(EVENTS_TAIL_JOB_EXCEPT, "SELECT * FROM (SELECT " EVENT_COLUMNS " FROM events "               \
                              "WHERE job_id = ? AND kind <> ? ORDER BY id DESC LIMIT ?) "          \
                              "ORDER BY id")                                                       \
    X(OUTPUT_APPEND, "INSERT INTO output(" OUTPUT_COLUMNS ") VALUES (?, ?, ?, ?, ?, ?)")           \
    X(OUTPUT_EACH, "SELECT " OUTPUT_COLUMNS " FROM output "                                        \
                   "WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?")                            \
    X(OUTPUT_MAX_SEQ, "SELECT IFNULL(MAX(seq), 0) FROM output WHERE job_id = ?")                   \
    X(OUTPUT_RANK_TAIL, "SELECT " OUTPUT_COLUMNS " FROM output "                                   \
                        "WHERE job_id = ? AND rank = ? AND stream = ? ORDER BY seq DESC LIMIT ?")  \
    X(STACKS_ADD, "INSERT INTO stacks(job_id, taken_ms, reason, verdict, reply) "                  \
                  "VALUES (?, ?, ?, ?, ?)")                                                        \
    X(STACKS_PRUNE, "DELETE FROM stacks WHERE job_id = ? AND id NOT IN "                           \
                    "(SELECT id FROM stacks WHERE job_id = ? ORDER BY id DESC LIMIT ?)")           \
    X(STACKS_EACH, "SELECT id, job_id, taken_ms, reason, verdict, reply FROM stacks "              \
                   "WHERE job_id = ? ORDER BY id DESC LIMIT ?")                                    \
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

struct store {
    sqlite3 *db;
    sqlite3_stmt *stmts[STMT_COUNT]; /* prepared on first use */
    int txn_depth;                   /* store_begin levels open */
    bool txn_lost;                   /* SQLite aborted the open transaction */
    char errmsg[512];
};

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

static inline void bind_text(struct binder *b, const char *text)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    b->rc = text ? sqlite3_bind_text(b->s, b->index, text, -1, SQLITE_STATIC)
                 : sqlite3_bind_null(b->s, b->index);
}

static inline void bind_null(struct binder *b)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    b->rc = sqlite3_bind_null(b->s, b->index);
}

static inline void bind_i64(struct binder *b, int64_t value)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    b->rc = sqlite3_bind_int64(b->s, b->index, value);
}

static inline void bind_double(struct binder *b, double value)
{
    if (b->rc != SQLITE_OK)
        return;
    b->index++;
    b->rc = sqlite3_bind_double(b->s, b->index, value);
}

/* SQLite integers are signed 64-bit; the unsigned values stored here (ids,
 * timestamps, sequence numbers, byte counts) stay far below 2^63. */
static inline void bind_u64(struct binder *b, uint64_t value)
{
    bind_i64(b, (int64_t)value);
}

static inline void bind_blob(struct binder *b, const void *data, size_t len)
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

static inline const char *col_text(sqlite3_stmt *s, int col)
{
    return (const char *)sqlite3_column_text(s, col);
}

static inline uint64_t col_u64(sqlite3_stmt *s, int col)
{
    return (uint64_t)sqlite3_column_int64(s, col);
}

/* errors: SQLite's message kept for store_last_error, rc mapped to a kolo
 * code (store_fail); a refusal without asking SQLite (store_reject) */
int store_fail(struct store *st, int rc, const char *what);
int store_reject(struct store *st, int code, const char *what);

/* the statement cache: stmt_get hands out statement id (a fresh one when
 * the cached one is busy in an enclosing iteration), stmt_done readies or
 * frees it; stmt_data_get refuses once the caller's transaction was lost */
int stmt_get(struct store *st, enum stmt_id id, sqlite3_stmt **out);
void stmt_done(struct store *st, enum stmt_id id, sqlite3_stmt *s);
int stmt_data_get(struct store *st, enum stmt_id id, sqlite3_stmt **out);

/* step_write runs a bound INSERT/UPDATE to completion and releases s;
 * bind_failed releases s after a failed bind and reports it */
int step_write(struct store *st, enum stmt_id id, sqlite3_stmt *s, const char *what);
int bind_failed(struct store *st, enum stmt_id id, sqlite3_stmt *s, int rc, const char *what);

/* The one walker of every store_*_each: query_start readies statement id
 * into b, the caller binds its parameters, query_each steps it and calls
 * row(s, ctx) per row until one returns non-zero (returned), and releases
 * the statement in every case. */
int query_start(struct store *st, enum stmt_id id, struct binder *b);
int query_each(struct store *st, enum stmt_id id, struct binder *b, const char *what,
               int (*row)(sqlite3_stmt *s, void *ctx), void *ctx);

/* put_all stores n items (size bytes apart) with one(st, item) in one
 * transaction: all of them or none, one fsync for the batch. */
int put_all(struct store *st, const void *items, size_t n, size_t size,
            int (*one)(struct store *, const void *));

#endif
