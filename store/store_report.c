/*
 * store_report.c - the epochs and steps tables: training progress that
 * the workers report.
 * The functions are declared in store.h; store_internal.h has what the
 * store's files share.
 */
#include "store_internal.h"

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

struct epochs_each {
    store_epoch_fn fn;
    void *arg;
};

static int epochs_row(sqlite3_stmt *s, void *ctx)
{
    const struct epochs_each *each = ctx;
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
    return each->fn(&e, each->arg);
}

int store_epochs_each(struct store *st, uint64_t job_id, store_epoch_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, STMT_EPOCHS_EACH, &b);
    if (err)
        return err;
    bind_u64(&b, job_id);
    struct epochs_each e = {fn, arg};
    return query_each(st, STMT_EPOCHS_EACH, &b, "epochs", epochs_row, &e);
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

struct steps_each {
    store_step_fn fn;
    void *arg;
};

static int steps_row(sqlite3_stmt *s, void *ctx)
{
    const struct steps_each *each = ctx;
    struct store_step p = {
        .job_id = col_u64(s, 0),
        .rank = sqlite3_column_int(s, 1),
        .host_id = col_text(s, 2),
        .ts_ms = col_u64(s, 3),
        .seconds = sqlite3_column_double(s, 4),
        .n = (uint32_t)sqlite3_column_int64(s, 5),
    };
    return each->fn(&p, each->arg);
}

int store_steps_each(struct store *st, uint64_t job_id, uint64_t since_ms, store_step_fn fn,
                     void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, STMT_STEPS_EACH, &b);
    if (err)
        return err;
    bind_u64(&b, job_id);
    bind_u64(&b, since_ms);
    struct steps_each e = {fn, arg};
    return query_each(st, STMT_STEPS_EACH, &b, "steps", steps_row, &e);
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

