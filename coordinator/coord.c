/*
 * coord.c - the coordinator's life cycle, work queue and main loop.
 *
 * Start: open the store, reload hosts and jobs, bind RPC and HTTP, start
 * the main thread. Hosts reloaded from the store come back alive with a
 * fresh lease, so agents that re-register in time re-attach to their
 * running workers; hosts that do not are declared lost when that lease
 * runs out, exactly as if they had stopped heart-beating.
 */
#include "coord_api.h"
#include "coord_core.h"
#include "coord_elastic.h"
#include "coord_hosts.h"
#include "coord_jobs.h"
#include "coord_negot.h"
#include "coord_report.h"
#include "coord_snap.h"
#include "coord_stacks.h"
#include "coord_timeline.h"
#include "coord_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "log.h"
#include "util.h"

/* ---------------------------------------------------------------- hooks */

/* The domain modules' part in the core's jobs and hosts (coord_model.h,
 * struct coord_hooks), in the order it must happen. */

static void job_ended(struct coord *c, struct job *j, int code, const char *why)
{
    coord_negot_job_ended(c, j, code, why);
    coord_stacks_job_ended(c, j); /* kolo stacks callers get what came */
    coord_elastic_job_ended(c, j); /* its ranks leave the desired sets */
}

static void job_cron(struct coord *c, struct job *j, bool terminal, uint64_t now)
{
    if (terminal && (j->negot || j->nsets)) {
        /* An ended job keeps its record and its ranks' last reports (REST
         * /ranks), not its negotiation (issue 15, F12): its parked calls
         * were answered when it ended, and later worker calls are refused
         * as not running. */
        coord_negot_free_job(j);
    }
    if (j->negot)
        coord_negot_cron(c, j, now);
    if (j->tl)
        coord_timeline_cron(j->tl, terminal);
    if (j->tl_draining && (terminal || coord_timeline_drained(j->tl_draining))) {
        coord_timeline_free(j->tl_draining);
        j->tl_draining = NULL;
    } else if (j->tl_draining) {
        coord_timeline_cron(j->tl_draining, false);
    }
    if (j->el)
        coord_elastic_cron(c, j, now);
    if (j->stacks)
        coord_stacks_cron(c, j, now);
    if (!terminal)
        coord_report_straggler_cron(c, j, now);
}

static void job_free(struct job *j)
{
    free(j->sw);
    free(j->spares);
    coord_negot_free_job(j);
    coord_stacks_free(j);
    coord_elastic_free(j->el);
    coord_timeline_free(j->tl);
    coord_timeline_free(j->tl_draining);
}

/* The stop's drain (coord_main): every call the job parked, of every
 * kind, is answered while the RPC server that holds it is open. */
static void job_shutdown(struct coord *c, struct job *j)
{
    coord_negot_drop_parked(c, j);
    coord_stacks_finish(c, j);
    coord_elastic_shutdown(c, j); /* place requests waiting for capacity */
}

static const struct coord_hooks hooks = {
    .job_ended = job_ended,
    .job_cron = job_cron,
    .job_shutdown = job_shutdown,
    .job_stopping = coord_stacks_take,
    .job_free = job_free,
    .elastic_init = coord_elastic_init,
    .elastic_to_json = coord_elastic_to_json,
    .elastic_from_json = coord_elastic_from_json,
    .elastic_free_slots = coord_elastic_free_slots,
    .host_usable = coord_elastic_host_usable,
    .member_gone = coord_elastic_member_gone,
    .host_drained = coord_elastic_host_drained,
    .spare_event = coord_elastic_spare_event,
};

/* ---------------------------------------------------------------- queue */

/* Answers work that arrives while the coordinator shuts down. */
static void work_refuse(struct work *w)
{
    if (w->kind == WORK_RPC) {
        rpc_call_error(w->call, KOLO_ESHUTDOWN, "the coordinator is shutting down");
    } else {
        nng_http_res *res;
        if (nng_http_res_alloc_error(&res, 503) == 0) {
            nng_aio_set_output(w->aio, 0, res);
            nng_aio_finish(w->aio, 0);
        } else {
            nng_aio_finish(w->aio, NNG_ENOMEM);
        }
    }
    free(w);
}

static void dispatch_rpc(struct coord *c, struct rpc_call *call);

/* Called from nng threads: runs the work under the state lock, so exactly
 * one handler (or the cron tick) touches the state at a time, without a
 * hand-off to another thread on the hot path (negotiation latency). Once
 * the coordinator stops, work is refused at once. */
void coord_post(struct coord *c, struct work *w)
{
    pthread_mutex_lock(&c->mtx);
    if (c->draining) {
        pthread_mutex_unlock(&c->mtx);
        work_refuse(w);
        return;
    }
    c->handlers_out++;
    if (w->kind == WORK_RPC)
        dispatch_rpc(c, w->call);
    else
        coord_http_handle(c, w->aio);
    if (--c->handlers_out == 0 && c->stopping)
        pthread_cond_broadcast(&c->cond); /* the drain waits for this */
    pthread_mutex_unlock(&c->mtx);
    free(w);
}

static void rpc_handler(struct rpc_call *call, void *arg)
{
    struct coord *c = arg;
    struct work *w = calloc(1, sizeof(*w));
    if (!w) {
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return;
    }
    w->kind = WORK_RPC;
    w->call = call;
    coord_post(c, w);
}

/* The method table (COORD_METHODS): who may call each and its handler. */
enum method_who { WHO_HOST, WHO_WORKER, WHO_ADMIN, WHO_NONE };
struct method {
    const char *name;
    enum method_who who;
    void (*handler)(struct coord *c, struct rpc_call *call, enum coord_method m);
};

static const struct method methods[M_COUNT] = {
#define COORD_METHOD_ROW(id, name, who, handler) [M_##id] = {name, WHO_##who, handler},
    COORD_METHODS(COORD_METHOD_ROW)
#undef COORD_METHOD_ROW
};

static enum coord_method method_lookup(const char *name)
{
    for (int i = 0; i < M_UNKNOWN; i++)
        if (strcmp(methods[i].name, name) == 0)
            return (enum coord_method)i;
    return M_UNKNOWN;
}

/* Without a token the coordinator listens on loopback only, but loopback
 * is not a trust boundary on a shared host: there every call (an agent's,
 * a worker's, an operator's) is for the user who started it and root,
 * since an agent registered by another user would run the next job's
 * ranks as that user, and a worker's calls read and commit a job's
 * snapshots. The kernel says who owns the caller's socket (asked once per
 * connection, common/rpc.c); a caller whose user cannot be known is
 * refused too. With a token, the token (or a job's credential) decides. */
static bool caller_allowed(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    if (c->token)
        return true;
    int uid = rpc_call_peer_uid(call);
    if (uid == (int)geteuid() || uid == 0)
        return true;
    c->m.rpc_errors[m]++;
    c->m.admin_refused++;
    LOGW("coord", "refused %s from uid %d: this coordinator has no token, so only uid %d "
         "(who started it) and root may use it", rpc_call_frame(call)->method, uid,
         (int)geteuid());
    rpc_call_error(call, KOLO_EPERM, "this coordinator has no token: only the user who "
                   "started it (uid %d) and root may use it (submit or read jobs, register "
                   "agents, run workers); you are uid %d",
                   (int)geteuid(), uid);
    return false;
}

/* A training process holds its job's credential, not the cluster token
 * (common/creds.h): it may make its own job's worker calls (the frame's
 * job is the one the credential was made for) and nothing else. */
static bool scope_allows(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    if (methods[m].who == WHO_WORKER)
        return true;
    if (!rpc_call_job_scoped(call))
        return true;
    const struct rpc_frame *f = rpc_call_frame(call);
    c->m.rpc_errors[m]++;
    c->m.scope_refused++;
    LOGW("coord", "refused %s from '%s': it holds job %llu's credential, not the cluster token",
         f->method, f->identity, (unsigned long long)f->job_id);
    rpc_call_error(call, KOLO_EPERM, "%s needs the cluster token: a job's credential (what its "
                   "workers hold) opens only that job's worker calls", f->method);
    return false;
}

static void dispatch_rpc(struct coord *c, struct rpc_call *call)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    enum coord_method m = method_lookup(f->method);
    c->m.rpc_requests[m]++;
    if (!caller_allowed(c, call, m))
        return;
    if (!scope_allows(c, call, m))
        return;
    if (m == M_UNKNOWN) {
        c->m.rpc_errors[M_UNKNOWN]++;
        LOGW("coord", "unknown method '%s' from '%s'", f->method, f->identity);
        rpc_call_error(call, KOLO_ENOMETHOD, "unknown method '%s'", f->method);
        return;
    }
    methods[m].handler(c, call, m);
}

/* ---------------------------------------------------------------- main loop */

/* A gap between two ticks longer than this means the coordinator itself
 * stood still (stopped, swapped out, a paused VM, a stalled disk). */
#define COORD_STALL_MS 1000

static void coord_cron(struct coord *c)
{
    uint64_t now = now_mono_ms();
    /* The heartbeats it could not read meanwhile are the coordinator's own
     * fault, not the hosts': every lease gets the time back before any is
     * judged (issue 15, F9), and the hosts' queued heartbeats renew them. */
    if (c->last_cron && now - c->last_cron > COORD_STALL_MS) {
        LOGW("coord", "the coordinator stood still for %llu ms; the hosts' leases are extended "
             "by as much", (unsigned long long)(now - c->last_cron));
        coord_hosts_extend_leases(c, now - c->last_cron);
    }
    c->last_cron = now;
    coord_store_probe(c, now);
    coord_hosts_cron(c, now);
    coord_jobs_cron(c, now);
    coord_snap_cron(c, now);
    coord_report_cron(c, now);
    coord_http_guard(c, now);
}

/* How often the tick hands freed heap back to the system. */
#define COORD_TRIM_MS 30000

/* The tick: every COORD_CRON_MS, under the state lock. Every
 * COORD_TRIM_MS, outside it, malloc_trim: elastic resets and bursts of
 * calls free memory all over malloc's arenas (nng's threads each have
 * one), and glibc keeps such pages unless asked; a long elastic soak saw
 * the coordinator's RSS creep by that much (docs/reliability.md). */
static void *coord_main(void *arg)
{
    thread_name("kolo-coord");
    struct coord *c = arg;
    uint64_t trimmed = now_mono_ms();
    pthread_mutex_lock(&c->mtx);
    while (!c->stopping) {
        coord_cron(c);
        if (c->last_cron - trimmed >= COORD_TRIM_MS) {
            pthread_mutex_unlock(&c->mtx);
            malloc_trim(0);
            pthread_mutex_lock(&c->mtx);
            trimmed = c->last_cron;
            if (c->stopping)
                break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += COORD_CRON_MS * 1000000L;
        while (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cond, &c->mtx, &ts);
    }
    /* From now on coord_post refuses work. A handler that released the
     * lock for a while (coord_read, a snapshot chunk's hash) may still
     * park its call or hand it to a writer: wait for it, then answer every
     * parked call, of every kind, while the RPC server is still open. */
    c->draining = true;
    while (c->handlers_out > 0)
        pthread_cond_wait(&c->cond, &c->mtx);
    coord_report_flush(c);
    coord_hosts_shutdown(c);
    coord_jobs_shutdown(c);
    pthread_mutex_unlock(&c->mtx);
    return NULL;
}

/* ---------------------------------------------------------------- lifecycle */

static int load_host_cb(const struct store_host *sh, void *arg)
{
    struct coord *c = arg;
    struct host *h = calloc(1, sizeof(*h));
    if (!h)
        return KOLO_ENOMEM;
    str_copy(h->id, sh->id, sizeof(h->id));
    str_copy(h->name, sh->name ? sh->name : "", sizeof(h->name));
    str_copy(h->hostname, sh->hostname ? sh->hostname : "", sizeof(h->hostname));
    str_copy(h->addr, sh->addr ? sh->addr : "", sizeof(h->addr));
    str_copy(h->agent_instance, sh->agent_instance ? sh->agent_instance : "",
             sizeof(h->agent_instance));
    h->slots = sh->slots;
    h->cpus = sh->cpus;
    h->gpus = sh->gpus;
    h->gpu_names_json = sh->gpu_names ? strdup(sh->gpu_names) : NULL;
    h->mem_bytes = sh->mem_bytes;
    h->order = sh->order;
    h->registered_ms = sh->registered_ms;
    h->last_seen_ms = sh->last_seen_ms;
    /* A host that was alive gets a fresh lease to re-register in. */
    /* "drained" is a live host that takes no new work (kept over restarts) */
    h->leaving = strcmp(sh->state, "leaving") == 0; /* its agent drained it as it stopped */
    h->drained = h->leaving || strcmp(sh->state, "drained") == 0;
    h->state = strcmp(sh->state, "alive") == 0 || h->drained ? HOST_ALIVE : HOST_LOST;
    h->lease_deadline = now_mono_ms() + (uint64_t)c->cfg.lease_ms;
    h->last_seen_mono = now_mono_ms();
    struct host **tail = &c->hosts;
    while (*tail)
        tail = &(*tail)->next;
    *tail = h;
    return 0;
}

/* Frees the state. Every parked call was answered by the drain
 * (coord_main) while the RPC server was open; nothing here answers one. */
static void coord_free(struct coord *c)
{
    coord_snap_free(c);
    coord_report_free(c); /* issue 6 */
    coord_jobs_free(c);
    coord_hosts_free(c);
    if (c->store)
        store_close(c->store);
    c->store = NULL;
    free(c->listen);
    free(c->http_addr);
    free(c->db_path);
    free(c->timeline_dir);
    free(c->token);
    free(c->dashboard_dir);
    if (c->http_left)
        return; /* with its lock: a late HTTP callback is refused (draining) */
    pthread_mutex_destroy(&c->mtx);
    pthread_cond_destroy(&c->cond);
    free(c);
}

/* The writer threads (coord_writer.h): snapshot commits, output appends. */
/* The store's other connections: the writer threads (coord_writer.h,
 * snapshot commits and output appends) and REST's reader (coord_read). */
static int writers_start(struct coord *c, char *err, size_t errlen)
{
    int rv = coord_snap_start(c, err, errlen);
    if (rv == 0 && (rv = coord_writer_start(&c->out_writer, "output", c->db_path, &c->mtx, err,
                                            errlen)) != 0)
        coord_snap_stop(c);
    if (rv == 0 && (rv = coord_reader_open(c, err, errlen)) != 0) {
        coord_writer_stop(c->out_writer);
        c->out_writer = NULL;
        coord_snap_stop(c);
    }
    return rv;
}

static void writers_stop(struct coord *c)
{
    coord_writer_stop(c->out_writer);
    c->out_writer = NULL;
    coord_snap_stop(c);
}

int coord_start(struct coord **out, const struct coord_config *cfg, char *err, size_t errlen)
{
    struct coord *c = calloc(1, sizeof(*c));
    int rv;
    if (!c)
        return KOLO_ENOMEM;
    if (!cfg->token && random_hex(c->mesh_secret, 32) != 0) {
        free(c);
        return KOLO_ESYS;
    }
    c->cfg = *cfg;
    c->hooks = hooks;
    if (cfg->tls)
        c->tls = *cfg->tls;
    c->cfg.tls = &c->tls;
    c->listen = strdup(cfg->listen ? cfg->listen : "tcp://127.0.0.1:0");
    c->http_addr = cfg->http && cfg->http[0] ? strdup(cfg->http) : NULL;
    c->db_path = strdup(cfg->db_path ? cfg->db_path : "kolo.db");
    c->token = cfg->token ? strdup(cfg->token) : NULL;
    c->dashboard_dir = cfg->dashboard_dir ? strdup(cfg->dashboard_dir) : NULL;
    c->cfg.listen = c->listen;
    c->cfg.http = c->http_addr;
    c->cfg.db_path = c->db_path;
    c->cfg.token = c->token;
    c->cfg.dashboard_dir = c->dashboard_dir;
    if (c->cfg.lease_ms <= 0)
        c->cfg.lease_ms = 5000;
    if (c->cfg.heartbeat_ms <= 0)
        c->cfg.heartbeat_ms = 1000;
    if (c->cfg.stop_grace_ms <= 0)
        c->cfg.stop_grace_ms = 5000;
    pthread_mutex_init(&c->mtx, NULL);
    cond_init_monotonic(&c->cond);
    random_hex(c->instance, 8);
    c->started_ms = now_wall_ms();

    if (!c->token && !addr_is_loopback(c->listen)) {
        snprintf(err, errlen,
                 "refusing to listen on %s without a cluster token: pass --token-file, or listen "
                 "on 127.0.0.1",
                 c->listen);
        coord_free(c);
        return KOLO_EPERM;
    }
    if (!c->token && c->http_addr && !addr_is_loopback(c->http_addr)) {
        snprintf(err, errlen,
                 "refusing to serve HTTP on %s without a cluster token: pass --token-file, or "
                 "serve on 127.0.0.1",
                 c->http_addr);
        coord_free(c);
        return KOLO_EPERM;
    }
    /* The database holds job environments: create it private to its owner
     * (SQLite gives the -wal and -shm files the same mode). */
    int fd = open(c->db_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0)
        close(fd);
    if ((rv = store_open(&c->store, c->db_path, err, errlen)) != 0) {
        coord_free(c);
        return rv;
    }
    if ((rv = store_hosts_each(c->store, load_host_cb, c)) != 0 || (rv = coord_jobs_load(c)) != 0) {
        snprintf(err, errlen, "cannot load state from %s: %s", c->db_path,
                 store_last_error(c->store));
        coord_free(c);
        return rv;
    }
    int contexts = (int)(c->cfg.rpc_contexts > 0 ? c->cfg.rpc_contexts : 4096);
    struct rpc_server_config rc = {
        .url = c->listen,
        .token = c->token,
        .max_msg = (size_t)(c->cfg.max_msg > 0 ? c->cfg.max_msg : 0),
        .contexts = contexts,
        .tls = &c->tls,
        /* Agents' heartbeats and reports keep hosts alive: long polls of
         * clients and ranks may never take their receive contexts (F10). */
        .reserved_prefix = "AgentService.",
        .reserved = contexts >= 64 ? contexts / 16 : (contexts + 3) / 4,
        /* A coordinator sized for more calls at once admits as many
         * connections in their handshake: a job's ranks connect at once
         * (1024 ranks and their agents evicted each other at 1024). */
        .max_unproven = contexts > RPC_MAX_UNPROVEN ? contexts : 0,
        .handler = rpc_handler,
        .arg = c,
    };
    if ((rv = rpc_server_open(&c->rpc, &rc)) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", c->listen, abi_strerror(rv));
        coord_free(c);
        return rv;
    }
    str_copy(c->rpc_url, rpc_server_url(c->rpc), sizeof(c->rpc_url));
    if (c->http_addr && (rv = coord_http_start(c, err, errlen)) != 0) {
        rpc_server_close(c->rpc);
        coord_free(c);
        return rv;
    }
    c->last_cron = now_mono_ms();
    if ((rv = writers_start(c, err, errlen)) != 0) {
        coord_http_stop(c);
        rpc_server_close(c->rpc);
        coord_free(c);
        return rv;
    }
    if (coord_discovery_start(c) != 0) {
        writers_stop(c);
        snprintf(err, errlen, "cannot start the host discovery thread");
        coord_http_stop(c);
        coord_reader_close(c);
        rpc_server_close(c->rpc);
        coord_free(c);
        return KOLO_ESYS;
    }
    if (pthread_create(&c->thread, NULL, coord_main, c) != 0) {
        coord_discovery_stop(c);
        writers_stop(c);
        snprintf(err, errlen, "cannot start the coordinator thread");
        coord_http_stop(c);
        coord_reader_close(c);
        rpc_server_close(c->rpc);
        coord_free(c);
        return KOLO_ESYS;
    }
    LOGI("coord", "coordinator %s listening on %s%s%s, state in %s", c->instance, c->rpc_url,
         c->http_url[0] ? ", http " : "", c->http_url, c->db_path);
    *out = c;
    return 0;
}

/*
 * A view (kolo dashboard): the state a coordinator kept in its database,
 * loaded as coord_start loads it, from connections that only read
 * (store_open_readonly), with no listener, thread or writer: requests are
 * answered by coord_http_handle on the caller's thread, under the state
 * lock as on the main thread. Every route that changes state answers 403,
 * as on a coordinator without a token.
 */
int coord_view_open(struct coord **out, const char *db_path, const char *view_key, int http_port,
                    char *err, size_t errlen)
{
    *out = NULL;
    struct coord *c = calloc(1, sizeof(*c));
    if (!c || !(c->db_path = strdup(db_path))) {
        free(c);
        snprintf(err, errlen, "out of memory");
        return KOLO_ENOMEM;
    }
    c->read_only = true;
    c->hooks = hooks;
    c->cfg.db_path = c->db_path;
    c->cfg.lease_ms = 5000;
    c->cfg.heartbeat_ms = 1000;
    c->cfg.tls = &c->tls;
    str_copy(c->view_key, view_key, sizeof c->view_key);
    c->http_port = http_port;
    pthread_mutex_init(&c->mtx, NULL);
    cond_init_monotonic(&c->cond);
    random_hex(c->instance, 8);
    c->started_ms = now_wall_ms();
    int rv = store_open_readonly(&c->store, c->db_path, err, errlen);
    if (rv == 0 &&
        ((rv = store_hosts_each(c->store, load_host_cb, c)) != 0 || (rv = coord_jobs_load(c)) != 0))
        snprintf(err, errlen, "cannot load %s: %s", c->db_path, store_last_error(c->store));
    if (rv == 0)
        rv = coord_reader_open(c, err, errlen);
    if (rv != 0) {
        coord_free(c);
        return rv;
    }
    *out = c;
    return 0;
}

void coord_view_http(struct coord *c, nng_aio *aio)
{
    pthread_mutex_lock(&c->mtx);
    coord_http_handle(c, aio);
    pthread_mutex_unlock(&c->mtx);
}

void coord_view_close(struct coord *c)
{
    if (!c)
        return;
    coord_reader_close(c);
    coord_free(c);
}

const char *coord_rpc_url(const struct coord *c)
{
    return c->rpc_url;
}

const char *coord_http_url(const struct coord *c)
{
    return c->http_url;
}

const char *coord_db_path(const struct coord *c)
{
    return c->db_path;
}

/*
 * The stop, in this order (each step needs the ones before it):
 *   1. the main thread leaves its loop and drains: coord_post refuses new
 *      work from then on, handlers still running finish, and every parked
 *      call (heartbeats, output streams, rendezvous, negotiation long
 *      polls, elastic place requests) is answered while the RPC server's
 *      contexts are alive;
 *   2. the discovery thread and the writers stop (the writers answer the
 *      calls whose writes they hold, the RPC server still open);
 *   3. the HTTP server stops, bounded (coord_http_stop);
 *   4. the RPC server closes (no handler runs after it), then the state
 *      is freed, with no call left to answer.
 */
void coord_stop(struct coord *c)
{
    if (!c)
        return;
    uint64_t t0 = now_mono_ms();
    pthread_mutex_lock(&c->mtx);
    c->stopping = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mtx);
    pthread_join(c->thread, NULL);
    coord_discovery_stop(c);
    writers_stop(c); /* they answer the calls whose writes they still hold */
    coord_http_stop(c); /* bounded; on time-out it sets c->http_left */
    coord_reader_close(c); /* after the last REST read */
    if (!rpc_server_close(c->rpc)) {
        /* nng still holds the socket and may call back into c: c stays */
        LOGW("coord", "coordinator %s stopped in %llu ms, its RPC socket still closing: its "
             "state stays in memory", c->instance, (unsigned long long)(now_mono_ms() - t0));
        return;
    }
    c->rpc = NULL;
    LOGI("coord", "coordinator %s stopped in %llu ms", c->instance,
         (unsigned long long)(now_mono_ms() - t0));
    coord_free(c);
}
