/*
 * store_snap.c - the snapshots and snapshot_chunks tables: durable
 * training state.
 * The functions are declared in store.h; store_internal.h has what the
 * store's files share.
 */
#include "store_internal.h"

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

/* a snapshot query's rows go to fn; rows counts them */
struct snapshots_each {
    store_snapshot_fn fn;
    void *arg;
    int rows;
};

static int snapshots_row(sqlite3_stmt *s, void *ctx)
{
    struct snapshots_each *each = ctx;
    each->rows++;
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
    return each->fn(&snap, each->arg);
}

/* snapshot_one runs a query that names at most one snapshot: by the job,
 * and by a second key (an id, an upload id) when has_key. */
static int snapshot_one(struct store *st, enum stmt_id id, uint64_t job_id, bool has_key,
                        uint64_t key, store_snapshot_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, id, &b);
    if (err)
        return err;
    bind_u64(&b, job_id);
    if (has_key)
        bind_u64(&b, key);
    struct snapshots_each e = {fn, arg, 0};
    int result = query_each(st, id, &b, "snapshot", snapshots_row, &e);
    if (result == 0 && e.rows == 0)
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
    struct binder b;
    int err = query_start(st, STMT_SNAPS_EACH, &b);
    if (err)
        return err;
    bind_u64(&b, job_id);
    bind_i64(&b, limit > 0 ? limit : -1);
    struct snapshots_each e = {fn, arg, 0};
    return query_each(st, STMT_SNAPS_EACH, &b, "snapshots", snapshots_row, &e);
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

