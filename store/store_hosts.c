/*
 * store_hosts.c - the hosts table.
 * The functions are declared in store.h; store_internal.h has what the
 * store's files share.
 */
#include "store_internal.h"

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

struct hosts_each {
    store_host_fn fn;
    void *arg;
};

static int hosts_row(sqlite3_stmt *s, void *ctx)
{
    const struct hosts_each *each = ctx;
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
    return each->fn(&h, each->arg);
}

int store_hosts_each(struct store *st, store_host_fn fn, void *arg)
{
    if (!st || !fn)
        return KOLO_EINVAL;
    struct binder b;
    int err = query_start(st, STMT_HOSTS_EACH, &b);
    if (err)
        return err;
    struct hosts_each e = {fn, arg};
    return query_each(st, STMT_HOSTS_EACH, &b, "hosts", hosts_row, &e);
}

