/*
 * coord_hosts.c - agents: registration, leases, parked heartbeats, reports.
 *
 * A host is known by the stable id its agent keeps on disk. Registration
 * opens a session; heartbeats name the session and renew the lease, which
 * is timed on the monotonic clock so wall-clock jumps cannot expire (or
 * immortalise) a host. A heartbeat parks until the host's desired worker
 * set changes or half a lease passes, so launch orders reach an agent as
 * soon as they exist without polling.
 *
 * The agent instance id tells restarts apart from reconnects: the same
 * instance re-registering (the coordinator restarted, or a lease lapsed
 * during a partition) still has its workers and lists them; a new instance
 * for a known host id means the old agent died and took its workers with
 * it. Two live agents sharing one host id would take turns superseding
 * each other; the second one to come back inside a lease is refused.
 */
#include "coord_hosts.h"
#include "coord_core.h"
#include "coord_jobs.h"
#include "coord_writer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "util.h"

enum { REG_NEW, REG_REREGISTER, REG_RESTART, REG_REFUSED };

struct host *coord_host_find(struct coord *c, const char *id)
{
    for (struct host *h = c->hosts; h; h = h->next)
        if (strcmp(h->id, id) == 0)
            return h;
    return NULL;
}

struct host *coord_host_named(struct coord *c, const char *id_or_name)
{
    struct host *h = coord_host_find(c, id_or_name);
    for (struct host *x = c->hosts; !h && x; x = x->next)
        if (strcmp(x->name, id_or_name) == 0)
            h = x;
    return h;
}

void coord_host_drain(struct coord *c, struct host *h, bool drain, bool leaving, const char *via)
{
    if (h->drained == drain)
        return; /* an operator's drain stays one; a second drain changes nothing */
    h->drained = drain;
    h->leaving = drain && leaving;
    coord_host_persist(c, h);
    coord_event(c, 0, h->id, drain ? "host.drained" : "host.undrained", "host %s %s through %s",
                h->name,
                drain ? "drained: no new work, elastic jobs leave it" : "undrained: usable again",
                via);
    if (drain)
        c->hooks.host_drained(c, h);
    else
        coord_jobs_place_pending(c);
}

struct host *coord_host_by_session(struct coord *c, const char *session)
{
    if (!session || !session[0])
        return NULL;
    for (struct host *h = c->hosts; h; h = h->next)
        if (h->session[0] && strcmp(h->session, session) == 0)
            return h;
    return NULL;
}

int coord_host_slots_used(struct coord *c, const struct host *h)
{
    int used = 0;
    for (struct job *j = c->jobs; j; j = j->next) {
        if (j->state != JOB_RUNNING)
            continue;
        for (int r = 0; r < j->nranks; r++)
            if (j->ranks[r].host == h &&
                (j->ranks[r].state == RANK_ASSIGNED || j->ranks[r].state == RANK_RUNNING))
                used++;
        for (int s = 0; s < j->nspares; s++)
            used += j->spares[s].host == h; /* a hot spare holds its slot */
    }
    return used;
}

void coord_host_persist(struct coord *c, struct host *h)
{
    struct store_host sh = {
        .id = h->id,
        .name = h->name,
        .hostname = h->hostname,
        .addr = h->addr,
        .slots = h->slots,
        .cpus = h->cpus,
        .gpus = h->gpus,
        .gpu_names = h->gpu_names_json,
        .mem_bytes = h->mem_bytes,
        .state = h->leaving   ? "leaving"
                 : h->drained ? "drained"
                 : h->state == HOST_ALIVE ? "alive"
                                          : "lost",
        .registered_ms = h->registered_ms,
        .last_seen_ms = h->last_seen_ms,
        .order = h->order,
        .agent_instance = h->agent_instance,
    };
    if (store_host_put(c->store, &sh) != 0)
        coord_store_failed(c, "host put");
}

/* The desired set's version: the coordinator instance (a restarted
 * coordinator never matches a version an agent kept) and a counter. */
static void host_version(struct coord *c, struct host *h, char *out, size_t size)
{
    snprintf(out, size, "%s-%llu", c->instance, (unsigned long long)h->desired_counter);
}

/* Answers a heartbeat: with the desired set when the agent's version is
 * not the current one (NULL: the agent's version is unknown). */
static void heartbeat_answer(struct coord *c, struct host *h, struct rpc_call *call,
                             const char *agent_version)
{
    char version[64];
    host_version(c, h, version, sizeof(version));
    Kolo__HeartbeatReply rep = KOLO__HEARTBEAT_REPLY__INIT;
    rep.lease_ms = (uint32_t)c->cfg.lease_ms;
    rep.stop_grace_ms = (uint32_t)c->cfg.stop_grace_ms;
    rep.desired_version = version;
    rep.stacks_job = h->stacks_job;
    rep.stacks_seq = h->stacks_seq;
    void **specs = NULL;
    size_t n = 0;
    if (!agent_version || strcmp(agent_version, version) != 0) {
        if (coord_job_desired_for_host(c, h, &specs, &n) != 0) {
            rpc_call_error(call, KOLO_ENOMEM, "out of memory");
            return;
        }
        rep.has_desired = 1;
        rep.n_desired = n;
        rep.desired = (Kolo__WorkerSpec **)specs;
    }
    coord_send_pb(call, &rep.base);
    coord_job_desired_free(specs, n);
}

void coord_host_wake(struct coord *c, struct host *h)
{
    h->desired_counter++;
    if (h->parked_hb) {
        struct rpc_call *call = h->parked_hb;
        h->parked_hb = NULL;
        heartbeat_answer(c, h, call, NULL);
    }
}

void coord_host_poke(struct coord *c, struct host *h)
{
    if (h->parked_hb) {
        struct rpc_call *call = h->parked_hb;
        h->parked_hb = NULL;
        char version[64];
        host_version(c, h, version, sizeof(version));
        heartbeat_answer(c, h, call, version); /* the same set: only what else it carries */
    }
}

static void host_drop_parked(struct host *h, int code, const char *why)
{
    if (h->parked_hb) {
        rpc_call_error(h->parked_hb, code, "%s", why);
        h->parked_hb = NULL;
    }
}

static bool valid_host_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
            return false;
    return true;
}

static bool printable(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n >= max)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

void coord_rpc_agent_register(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    (void)m;
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__RegisterRequest *req = kolo__register_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_AGENT_REGISTER]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed RegisterRequest");
        return;
    }
    const char *bad = NULL;
    if (!valid_host_id(req->host_id))
        bad = "host_id must be 1-63 characters of [A-Za-z0-9._-]";
    else if (!req->name[0] || !printable(req->name, sizeof(((struct host *)0)->name)))
        bad = "name must be non-empty printable text under 128 bytes";
    else if (!printable(req->hostname, 256) || !printable(req->addr, 256))
        bad = "hostname and addr must be printable text under 256 bytes";
    else if (!printable(req->agent_instance, 64))
        bad = "agent_instance must be printable text under 64 bytes";
    else if (req->slots < 0 || req->slots > COORD_MAX_NP)
        bad = "slots out of range";
    if (bad) {
        c->m.rpc_errors[M_AGENT_REGISTER]++;
        rpc_call_error(call, KOLO_EINVAL, "%s", bad);
        kolo__register_request__free_unpacked(req, NULL);
        return;
    }

    uint64_t now = now_mono_ms();
    struct host *h = coord_host_find(c, req->host_id);
    int kind = REG_NEW;
    if (h) {
        kind = REG_REREGISTER;
        if (h->agent_instance[0] && strcmp(h->agent_instance, req->agent_instance) != 0) {
            if (strcmp(h->superseded_instance, req->agent_instance) == 0 &&
                now - h->superseded_mono < (uint64_t)c->cfg.lease_ms && h->state == HOST_ALIVE) {
                c->m.registrations[REG_REFUSED]++;
                c->m.rpc_errors[M_AGENT_REGISTER]++;
                coord_event(c, 0, h->id, "host.duplicate",
                            "refused a second agent for host id %s ('%s'): another agent "
                            "registered with that id",
                            h->id, req->name);
                rpc_call_error(call, KOLO_EEXIST,
                               "host id %s is in use by another live agent; give every agent "
                               "its own --state-dir",
                               h->id);
                kolo__register_request__free_unpacked(req, NULL);
                return;
            }
            kind = REG_RESTART;
            str_copy(h->superseded_instance, h->agent_instance, sizeof(h->superseded_instance));
            h->superseded_mono = now;
            char why[256];
            snprintf(why, sizeof(why), "the agent on host %s restarted; its workers were lost",
                     h->name);
            coord_jobs_host_lost(c, h, why);
        }
        host_drop_parked(h, KOLO_ESTALE, "superseded by a new registration");
    } else {
        h = calloc(1, sizeof(*h));
        if (!h) {
            rpc_call_error(call, KOLO_ENOMEM, "out of memory");
            kolo__register_request__free_unpacked(req, NULL);
            return;
        }
        str_copy(h->id, req->host_id, sizeof(h->id));
        int64_t order = 0;
        struct host **tail = &c->hosts;
        while (*tail) {
            if ((*tail)->order >= order)
                order = (*tail)->order + 1;
            tail = &(*tail)->next;
        }
        h->order = order;
        h->registered_ms = now_wall_ms();
        *tail = h;
    }
    bool was_lost = h->state == HOST_LOST && kind != REG_NEW;
    str_copy(h->name, req->name, sizeof(h->name));
    str_copy(h->hostname, req->hostname, sizeof(h->hostname));
    str_copy(h->addr, req->addr, sizeof(h->addr));
    str_copy(h->agent_instance, req->agent_instance, sizeof(h->agent_instance));
    h->slots = req->slots;
    if (req->inventory) {
        h->cpus = req->inventory->cpus;
        h->gpus = req->inventory->gpus;
        h->mem_bytes = req->inventory->mem_bytes;
        struct buf b;
        struct jw w;
        buf_init(&b);
        jw_init(&w, &b);
        jw_arr_begin(&w);
        for (size_t i = 0; i < req->inventory->n_gpu_names && i < 64; i++)
            jw_str(&w, req->inventory->gpu_names[i]);
        jw_arr_end(&w);
        free(h->gpu_names_json);
        h->gpu_names_json = b.oom ? NULL : buf_steal(&b, NULL);
        buf_free(&b);
    }
    h->state = HOST_ALIVE;
    h->lease_deadline = now + (uint64_t)c->cfg.lease_ms;
    h->last_seen_mono = now;
    h->last_seen_ms = now_wall_ms();
    h->last_batch_seq = h->lines_batch_seq = 0; /* a new session counts from 1 */
    random_hex(h->session, 16);
    coord_host_persist(c, h);
    c->m.registrations[kind]++;
    static const char *kinds[] = {"registered", "re-registered", "restarted", "refused"};
    coord_event(c, 0, h->id, was_lost ? "host.rejoined" : "host.registered",
                "host %s ('%s', %s, %d slot(s)) %s%s", h->id, h->name, h->addr, h->slots,
                kinds[kind], req->n_running ? " with running workers" : "");

    /* Re-attach: workers the agent still runs are running ranks again. */
    for (size_t i = 0; i < req->n_running; i++) {
        Kolo__RunningWorker *rw = req->running[i];
        coord_job_worker_event(c, h, rw->job_id, rw->generation, rw->rank, rw->worker_id,
                               KOLO__WORKER_EVENT_KIND__WORKER_STARTED, rw->pid, 0, 0, NULL);
    }

    Kolo__RegisterReply rep = KOLO__REGISTER_REPLY__INIT;
    rep.host_id = h->id;
    rep.session = h->session;
    rep.lease_ms = (uint32_t)c->cfg.lease_ms;
    rep.heartbeat_ms = (uint32_t)c->cfg.heartbeat_ms;
    coord_send_pb(call, &rep.base);
    kolo__register_request__free_unpacked(req, NULL);
    /* A host its agent drained as it stopped is back in service once a new
     * agent runs there (not when the leaving one re-registers mid-drain). */
    if (h->leaving && kind == REG_RESTART)
        coord_host_drain(c, h, false, false, "its agent's return");
    /* New capacity may let a pending job start. */
    coord_jobs_place_pending(c);
}

static struct host *session_host(struct coord *c, struct rpc_call *call, enum coord_method m,
                                 const char *session)
{
    struct host *h = coord_host_by_session(c, session);
    if (!h) {
        c->m.heartbeats_rejected++;
        c->m.rpc_errors[m]++;
        rpc_call_error(call, KOLO_ESTALE,
                       "unknown or expired agent session: register again (the coordinator "
                       "restarted or the host's lease expired)");
        return NULL;
    }
    uint64_t now = now_mono_ms();
    h->lease_deadline = now + (uint64_t)c->cfg.lease_ms;
    h->last_seen_mono = now;
    h->last_seen_ms = now_wall_ms();
    return h;
}

/* A worker stopped by a signal (SIGSTOP, SIGTSTP) for this long is
 * frozen: its peers wait on it and nothing in the job can end that. An
 * elastic job goes on without it (its host excluded as for a failure,
 * its agent stops it); any other job is told so (a notice). A debugger's
 * stop (state t) never counts, nor a long collective or a long step: the
 * process is running there. */
#define STOPPED_FROZEN_MS 8000

/* The host's stopped workers from its heartbeat: every rank of the
 * host's jobs not in the list runs (again). */
static void heartbeat_stopped(struct coord *c, struct host *h, const Kolo__HeartbeatRequest *req)
{
    for (struct job *j = c->jobs; j; j = j->next) {
        if (j->state != JOB_RUNNING)
            continue;
        for (int r = 0; r < j->nranks; r++) {
            struct rank *rk = &j->ranks[r];
            if (rk->host != h)
                continue;
            uint32_t ms = 0;
            for (size_t i = 0; i < req->n_stopped; i++) {
                const Kolo__RunningWorker *w = req->stopped[i];
                bool same = w->job_id == j->id &&
                            (w->worker_id ? w->worker_id == rk->wid : w->rank == r);
                if (same) {
                    ms = w->stopped_ms;
                    rk->stopped_pid = w->pid;
                }
            }
            rk->stopped_ms = ms;
            if (!ms)
                rk->stopped_told = false;
        }
    }
    for (struct job *j = c->jobs; j; j = j->next) {
        for (int r = 0; j->state == JOB_RUNNING && r < j->nranks; r++) {
            struct rank *rk = &j->ranks[r];
            if (rk->host != h || rk->stopped_ms < STOPPED_FROZEN_MS || rk->stopped_told ||
                (rk->state != RANK_ASSIGNED && rk->state != RANK_RUNNING))
                continue;
            rk->stopped_told = true;
            char why[300];
            snprintf(why, sizeof why,
                     "rank %d (pid %d) on host %s has been stopped by a signal for %u s "
                     "(SIGSTOP or SIGTSTP; state T)%s",
                     r, rk->stopped_pid, h->name, rk->stopped_ms / 1000,
                     j->el ? ": stopped as frozen, the job goes on without it"
                           : ": the other ranks wait on it until it is continued (kill -CONT)");
            char what[64];
            snprintf(what, sizeof what, "when rank %d was found stopped", r);
            c->hooks.job_stopping(c, j, what);
            if (j->el) {
                rk->state = RANK_LOST;
                j->el->fail_streak = 0; /* not an error of the code's */
                coord_event(c, j->id, h->id, "worker.frozen", "%s", why);
                c->hooks.member_gone(c, j, h, true, CAUSE_FAILURE, why);
                return; /* the job's ranks changed: the next heartbeat goes on */
            }
            coord_event(c, j->id, h->id, "worker.stopped", "%s", why);
        }
    }
}

void coord_rpc_agent_heartbeat(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    (void)m;
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__HeartbeatRequest *req = kolo__heartbeat_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_AGENT_HEARTBEAT]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed HeartbeatRequest");
        return;
    }
    struct host *h = session_host(c, call, M_AGENT_HEARTBEAT, req->session);
    if (!h) {
        kolo__heartbeat_request__free_unpacked(req, NULL);
        return;
    }
    heartbeat_stopped(c, h, req);
    if (h->parked_hb) {
        /* The agent gave up on the parked call (its deadline passed first). */
        char version[64];
        struct rpc_call *old = h->parked_hb;
        h->parked_hb = NULL;
        host_version(c, h, version, sizeof(version));
        heartbeat_answer(c, h, old, version);
    }
    char version[64];
    host_version(c, h, version, sizeof(version));
    uint32_t wait = req->wait_ms;
    if (wait > (uint64_t)c->cfg.lease_ms / 2)
        wait = (uint32_t)(c->cfg.lease_ms / 2);
    if (strcmp(req->desired_version, version) != 0 || wait == 0) {
        heartbeat_answer(c, h, call, req->desired_version);
    } else {
        h->parked_hb = call;
        h->parked_deadline = now_mono_ms() + wait;
    }
    kolo__heartbeat_request__free_unpacked(req, NULL);
}

/* A report's output lines on their way to the output writer (issue 17,
 * item 2): the fsync of a chatty job's lines runs off the state lock, so
 * it no longer delays other jobs' negotiation. The batch is acknowledged,
 * and its events applied, only once its lines are stored: an exit event
 * still follows its output, and a StreamOutput client sees the end only
 * after every line (job->out_stored). */
struct out_write {
    struct writer_job job;
    struct coord *c;
    struct host *h;
    struct rpc_call *call;
    char agent_instance[64];  /* the agent process that sent it */
    Kolo__ReportRequest *req; /* owns the lines' text */
    struct store_output *out;
    size_t nout;
    char why[256];
};

static void report_apply(struct coord *c, struct host *h, struct rpc_call *call,
                         Kolo__ReportRequest *req, bool mark);

static void out_write_free(struct out_write *ow)
{
    kolo__report_request__free_unpacked(ow->req, NULL);
    free(ow->out);
    free(ow);
}

static int out_write(struct writer_job *job, struct store *st)
{
    struct out_write *ow = (struct out_write *)job;
    int rc = store_output_append(st, ow->out, ow->nout);
    if (rc)
        str_copy(ow->why, store_last_error(st), sizeof(ow->why));
    return rc;
}

static void out_done(struct writer_job *job, int rc)
{
    struct out_write *ow = (struct out_write *)job;
    struct coord *c = ow->c;
    struct host *h = ow->h;
    h->out_pending = NULL;
    /* Stored or not, these seqs are settled: a batch that failed is sent
     * again and gets new ones. (Lines come in runs of one job.) */
    struct job *j = NULL;
    for (size_t i = 0; i < ow->nout; i++) {
        if (!j || j->id != ow->out[i].job_id)
            j = coord_job_find(c, ow->out[i].job_id);
        if (j && ow->out[i].seq > j->out_stored)
            j->out_stored = ow->out[i].seq;
    }
    if (rc) {
        /* Not acknowledged: the agent keeps the batch and sends it again
         * (issue 15, F8). */
        coord_store_failed_why(c, "output append", ow->why);
        rpc_call_error(ow->call, KOLO_ESTORE,
                       "the coordinator cannot store output now (%s); keep the batch and send "
                       "it again",
                       ow->why);
    } else {
        /* A new agent process for this host meanwhile counts its batches
         * from 1 again: this batch's number must not mark its as seen. */
        bool same_agent = strcmp(h->agent_instance, ow->agent_instance) == 0;
        c->m.output_lines += ow->nout;
        if (same_agent)
            h->lines_batch_seq = ow->req->batch_seq;
        report_apply(c, h, ow->call, ow->req, same_agent);
    }
    for (size_t i = 0; i < ow->nout; i++)
        if ((i == 0 || ow->out[i].job_id != ow->out[i - 1].job_id) &&
            (j = coord_job_find(c, ow->out[i].job_id)) != NULL)
            coord_job_output_added(c, j);
    out_write_free(ow);
}

/* report_apply applies a report's events, once its lines are stored, and
 * answers it; mark: its batch number is the host's last (false when
 * another agent process speaks for the host by now). */
static void report_apply(struct coord *c, struct host *h, struct rpc_call *call,
                         Kolo__ReportRequest *req, bool mark)
{
    if (req->n_events) {
        store_begin(c->store);
        for (size_t i = 0; i < req->n_events; i++) {
            Kolo__WorkerEvent *e = req->events[i];
            coord_job_worker_event(c, h, e->job_id, e->generation, e->rank, e->worker_id, e->kind,
                                   e->pid, e->exit_code, e->term_signal, e->message);
        }
        if (store_commit(c->store) != 0) {
            /* the events took effect in memory; sent again, they are
             * no-ops there and reach the store then (the lines are not
             * stored twice: lines_batch_seq) */
            coord_store_failed(c, "report commit");
            store_rollback(c->store);
            rpc_call_error(call, KOLO_ESTORE, "the coordinator cannot store events now (%s); "
                           "keep the batch and send it again", store_last_error(c->store));
            return;
        }
    }
    if (mark)
        h->last_batch_seq = req->batch_seq;
    Kolo__ReportReply rep = KOLO__REPORT_REPLY__INIT;
    rep.accepted_events = (uint32_t)req->n_events;
    rep.accepted_lines = (uint32_t)req->n_lines;
    coord_send_pb(call, &rep.base);
}

void coord_rpc_agent_report(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    (void)m;
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__ReportRequest *req = kolo__report_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_AGENT_REPORT]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed ReportRequest");
        return;
    }
    struct host *h = session_host(c, call, M_AGENT_REPORT, req->session);
    if (!h) {
        kolo__report_request__free_unpacked(req, NULL);
        return;
    }
    if (req->batch_seq && req->batch_seq <= h->last_batch_seq) {
        c->m.reports_duplicate++;
        Kolo__ReportReply rep = KOLO__REPORT_REPLY__INIT;
        rep.accepted_events = (uint32_t)req->n_events;
        rep.accepted_lines = (uint32_t)req->n_lines;
        coord_send_pb(call, &rep.base);
        kolo__report_request__free_unpacked(req, NULL);
        return;
    }
    struct out_write *pending = h->out_pending;
    if (pending) {
        if (req->batch_seq && req->batch_seq == pending->req->batch_seq) {
            /* The agent gave up waiting and sent the batch again: the one
             * being written answers this call instead. */
            c->m.reports_duplicate++;
            rpc_call_error(pending->call, KOLO_EBUSY, "superseded by the same batch sent again");
            pending->call = call;
        } else {
            rpc_call_error(call, KOLO_EBUSY, "this host's previous report is still being "
                           "stored; send the batch again");
        }
        kolo__report_request__free_unpacked(req, NULL);
        return;
    }
    /* A batch whose lines were stored but whose events were not is sent
     * again: its events only. */
    bool lines_stored = req->batch_seq && req->batch_seq == h->lines_batch_seq;
    size_t nlines = lines_stored ? 0 : req->n_lines;
    struct out_write *ow = nlines ? calloc(1, sizeof(*ow)) : NULL;
    struct store_output *out = nlines ? calloc(nlines, sizeof(*out)) : NULL;
    if (nlines && (!ow || !out)) {
        free(ow);
        free(out);
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        kolo__report_request__free_unpacked(req, NULL);
        return;
    }
    size_t nout = 0;
    for (size_t i = 0; i < nlines; i++) {
        Kolo__OutputLine *l = req->lines[i];
        struct job *j = coord_job_find(c, l->job_id);
        if (j && l->worker_id)
            l->rank = coord_job_member(j, l->worker_id); /* its rank now */
        if (!j || l->rank < 0 || l->rank >= j->nranks || j->ranks[l->rank].host != h)
            continue; /* only a rank's own host may speak for it */
        size_t len = l->text.len > 65536 ? 65536 : l->text.len;
        out[nout++] =
            (struct store_output){.job_id = j->id,
                                  .seq = ++j->out_seq,
                                  .rank = l->rank,
                                  .stream = l->stream == KOLO__OUTPUT_STREAM__OUTPUT_STDERR ? 2 : 1,
                                  .text = (const char *)l->text.data,
                                  .text_len = len,
                                  .ts_ms = l->ts_ms ? l->ts_ms : now_wall_ms()};
    }
    if (!nout) {
        free(ow);
        free(out);
        report_apply(c, h, call, req, true);
        kolo__report_request__free_unpacked(req, NULL);
        return;
    }
    *ow = (struct out_write){.job = {.write = out_write, .done = out_done},
                             .c = c,
                             .h = h,
                             .call = call,
                             .req = req,
                             .out = out,
                             .nout = nout};
    str_copy(ow->agent_instance, h->agent_instance, sizeof(ow->agent_instance));
    h->out_pending = ow;
    coord_writer_submit(c->out_writer, &ow->job);
}

void coord_hosts_cron(struct coord *c, uint64_t now)
{
    for (struct host *h = c->hosts; h; h = h->next) {
        if (h->parked_hb && now >= h->parked_deadline) {
            /* Parked calls hold the current version (a change answers
             * them at once), so this answer carries no set. */
            char version[64];
            struct rpc_call *call = h->parked_hb;
            h->parked_hb = NULL;
            host_version(c, h, version, sizeof(version));
            heartbeat_answer(c, h, call, version);
        }
        if (h->state == HOST_ALIVE && now > h->lease_deadline) {
            c->m.leases_expired++;
            h->state = HOST_LOST;
            h->session[0] = '\0';
            host_drop_parked(h, KOLO_ESTALE, "lease expired");
            coord_host_persist(c, h);
            uint64_t silent = now - h->last_seen_mono;
            coord_event(c, 0, h->id, "host.lost", "host %s ('%s') lost: no heartbeat for %llu ms",
                        h->id, h->name, (unsigned long long)silent);
            char why[256];
            snprintf(why, sizeof(why), "host %s lost: no heartbeat for %llu ms", h->name,
                     (unsigned long long)silent);
            coord_jobs_host_lost(c, h, why);
        }
    }
}

void coord_hosts_extend_leases(struct coord *c, uint64_t ms)
{
    for (struct host *h = c->hosts; h; h = h->next)
        if (h->state == HOST_ALIVE)
            h->lease_deadline += ms;
}

void coord_hosts_shutdown(struct coord *c)
{
    for (struct host *h = c->hosts; h; h = h->next)
        host_drop_parked(h, KOLO_ESHUTDOWN, "the coordinator is shutting down");
}

void coord_hosts_free(struct coord *c)
{
    struct host *h = c->hosts;
    while (h) {
        struct host *next = h->next;
        free(h->gpu_names_json);
        free(h);
        h = next;
    }
    c->hosts = NULL;
}
