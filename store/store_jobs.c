/*
 * store_jobs.c - the jobs, generations and ranks tables.
 * The functions are declared in store.h; store_internal.h has what the
 * store's files share.
 */
#include "store_internal.h"

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
    bind_text(&b, job->metadata_json);
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

struct jobs_each {
    store_job_fn fn;
    void *arg;
};

static int jobs_row(sqlite3_stmt *s, void *ctx)
{
    const struct jobs_each *each = ctx;
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
        .metadata_json = col_text(s, 16),
    };
    return each->fn(&j, each->arg);
}

int store_jobs_each(struct store *st, store_job_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, STMT_JOBS_EACH, &b);
    if (err)
        return err;
    struct jobs_each e = {fn, arg};
    return query_each(st, STMT_JOBS_EACH, &b, "jobs", jobs_row, &e);
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

struct generations_each {
    store_generation_fn fn;
    void *arg;
};

static int generations_row(sqlite3_stmt *s, void *ctx)
{
    const struct generations_each *each = ctx;
    struct store_recovery rec = {(uint32_t)sqlite3_column_int64(s, 4),
                                 (uint32_t)sqlite3_column_int64(s, 5),
                                 (uint32_t)sqlite3_column_int64(s, 6),
                                 (uint32_t)sqlite3_column_int64(s, 7)};
    bool has = sqlite3_column_type(s, 4) != SQLITE_NULL;
    return each->fn(col_u64(s, 0), col_text(s, 1), sqlite3_column_int(s, 2), col_u64(s, 3),
                    has ? &rec : NULL, each->arg);
}

int store_generation_recovery(struct store *st, uint64_t job_id, uint64_t generation,
                              const struct store_recovery *rec)
{
    if (!st || job_id == 0 || !rec)
        return st ? store_reject(st, KOLO_EINVAL, "store_generation_recovery: invalid argument")
                  : KOLO_EINVAL;
    sqlite3_stmt *s;
    int err = stmt_data_get(st, STMT_GENERATION_RECOVERY, &s);
    if (err)
        return err;
    struct binder b = {s, 0, SQLITE_OK};
    bind_i64(&b, rec->told_ms);
    bind_i64(&b, rec->formed_ms);
    bind_i64(&b, rec->restored_ms);
    bind_i64(&b, rec->step_ms);
    bind_u64(&b, job_id);
    bind_u64(&b, generation);
    if (b.rc != SQLITE_OK)
        return bind_failed(st, STMT_GENERATION_RECOVERY, s, b.rc, "generation recovery");
    return step_write(st, STMT_GENERATION_RECOVERY, s, "generation recovery");
}

int store_generations_each(struct store *st, uint64_t job_id, store_generation_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, STMT_GENERATIONS_EACH, &b);
    if (err)
        return err;
    bind_u64(&b, job_id);
    struct generations_each e = {fn, arg};
    return query_each(st, STMT_GENERATIONS_EACH, &b, "generations", generations_row, &e);
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

struct ranks_each {
    store_rank_fn fn;
    void *arg;
};

static int ranks_row(sqlite3_stmt *s, void *ctx)
{
    const struct ranks_each *each = ctx;
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
    return each->fn(&r, each->arg);
}

int store_ranks_each(struct store *st, uint64_t job_id, uint64_t generation, store_rank_fn fn,
                     void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, STMT_RANKS_EACH, &b);
    if (err)
        return err;
    bind_u64(&b, job_id);
    bind_u64(&b, generation);
    struct ranks_each e = {fn, arg};
    return query_each(st, STMT_RANKS_EACH, &b, "ranks", ranks_row, &e);
}

