/*
 * store_log.c - the events and output tables: what happened, and what
 * the workers printed.
 * The functions are declared in store.h; store_internal.h has what the
 * store's files share.
 */
#include "store_internal.h"

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

struct events_each {
    store_event_fn fn;
    void *arg;
};

static int events_row(sqlite3_stmt *s, void *ctx)
{
    const struct events_each *each = ctx;
    struct store_event ev = {
        .id = sqlite3_column_int64(s, 0),
        .ts_ms = col_u64(s, 1),
        .job_id = col_u64(s, 2), /* NULL reads as 0: no job */
        .host_id = col_text(s, 3),
        .kind = col_text(s, 4),
        .message = col_text(s, 5),
    };
    return each->fn(&ev, each->arg);
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
    struct binder b;
    int err = query_start(st, id, &b);
    if (err)
        return err;
    if (job_id)
        bind_u64(&b, job_id);
    if (!tail)
        bind_i64(&b, after_id);
    bind_i64(&b, sql_limit);
    struct events_each e = {fn, arg};
    return query_each(st, id, &b, "events", events_row, &e);
}

int store_events_tail_except(struct store *st, uint64_t job_id, const char *except, int limit,
                             store_event_fn fn, void *arg)
{
    if (!st || !fn || !job_id || !except || limit <= 0)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, STMT_EVENTS_TAIL_JOB_EXCEPT, &b);
    if (err)
        return err;
    bind_u64(&b, job_id);
    bind_text(&b, except);
    bind_i64(&b, limit);
    struct events_each e = {fn, arg};
    return query_each(st, STMT_EVENTS_TAIL_JOB_EXCEPT, &b, "events", events_row, &e);
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

struct output_each {
    store_output_fn fn;
    void *arg;
};

static int output_row(sqlite3_stmt *s, void *ctx)
{
    const struct output_each *each = ctx;
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
    return each->fn(&o, each->arg);
}

/* The rows of an output query, its parameters in order (the last one a
 * limit, <= 0: none). */
static int output_rows(struct store *st, enum stmt_id id, const int64_t *args, int nargs,
                       store_output_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, id, &b);
    if (err)
        return err;
    for (int i = 0; i < nargs; i++)
        bind_i64(&b, i == nargs - 1 && args[i] <= 0 ? -1 : args[i]);
    struct output_each e = {fn, arg};
    return query_each(st, id, &b, "output", output_row, &e);
}

int store_output_each(struct store *st, uint64_t job_id, uint64_t after_seq, int limit,
                      store_output_fn fn, void *arg)
{
    const int64_t args[] = {(int64_t)job_id, (int64_t)after_seq, limit};
    return output_rows(st, STMT_OUTPUT_EACH, args, 3, fn, arg);
}

int store_output_rank_tail(struct store *st, uint64_t job_id, int rank, int stream, int limit,
                           store_output_fn fn, void *arg)
{
    const int64_t args[] = {(int64_t)job_id, rank, stream, limit};
    return output_rows(st, STMT_OUTPUT_RANK_TAIL, args, 4, fn, arg);
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


/* ----------------------------------------------------------------- stacks */

static int stacks_add_one(struct store *st, struct store_stacks *x, int keep)
{
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_STACKS_ADD, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_u64(&b, x->job_id);
    bind_u64(&b, x->taken_ms);
    bind_text(&b, x->reason ? x->reason : "");
    bind_text(&b, x->verdict ? x->verdict : "");
    bind_blob(&b, x->reply, x->reply_len);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_STACKS_ADD, s, b.rc, "stacks add");
    err = step_write(st, STMT_STACKS_ADD, s, "stacks add");
    if (err)
        return err;
    x->id = sqlite3_last_insert_rowid(st->db);
    err = stmt_data_get(st, STMT_STACKS_PRUNE, &s);
    if (err)
        return err;
    b = (struct binder){s, 0, SQLITE_OK};
    bind_u64(&b, x->job_id);
    bind_u64(&b, x->job_id);
    bind_i64(&b, keep);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_STACKS_PRUNE, s, b.rc, "stacks prune");
    return step_write(st, STMT_STACKS_PRUNE, s, "stacks prune");
}

int store_stacks_add(struct store *st, struct store_stacks *x, int keep)
{
    if (!st || !x || x->job_id == 0 || (!x->reply && x->reply_len) || keep < 1)
        return st ? store_reject(st, KOLO_EINVAL, "store_stacks_add: invalid argument")
                  : KOLO_EINVAL;
    int err = store_begin(st);
    if (err)
        return err;
    err = stacks_add_one(st, x, keep);
    if (err) {
        store_rollback(st);
        return err;
    }
    return store_commit(st);
}

struct stacks_each {
    store_stacks_fn fn;
    void *arg;
};

static int stacks_row(sqlite3_stmt *s, void *ctx)
{
    const struct stacks_each *each = ctx;
    const void *reply = sqlite3_column_blob(s, 5);
    struct store_stacks x = {
        .id = sqlite3_column_int64(s, 0),
        .job_id = col_u64(s, 1),
        .taken_ms = col_u64(s, 2),
        .reason = col_text(s, 3),
        .verdict = col_text(s, 4),
        .reply = reply,
        .reply_len = reply ? (size_t)sqlite3_column_bytes(s, 5) : 0,
    };
    return each->fn(&x, each->arg);
}

int store_stacks_each(struct store *st, uint64_t job_id, int limit, store_stacks_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, STMT_STACKS_EACH, &b);
    if (err)
        return err;
    bind_u64(&b, job_id);
    bind_i64(&b, limit > 0 ? limit : -1);
    struct stacks_each e = {fn, arg};
    return query_each(st, STMT_STACKS_EACH, &b, "stacks", stacks_row, &e);
}
