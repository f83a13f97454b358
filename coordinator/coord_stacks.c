/*
 * coord_stacks.c - `kolo stacks`: what every rank of a running job is doing.
 *
 * DESIGN. AdminService.Stacks starts a collection for the job (one at a
 * time; a second caller joins the one in progress): each host that runs
 * a live rank of it gets (job, seq) in every heartbeat reply until it
 * answered, and its parked heartbeat is answered at once (coord_host_poke)
 * so the request reaches the agent within a round trip. The agent signals
 * its workers, which write their Python stacks, and sends them with their
 * process states (AgentService.Stacks; agent/stacks.c). The admin call is
 * answered when every host did, or at its deadline with what came: a rank
 * whose host did not answer is listed as such. Each rank also gets the
 * coordinator's own view: the operations of a stall that it waits in, or
 * that the others wait on it for (coord_negot_stalls).
 */
#include "coord_stacks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_core.h"
#include "coord_hosts.h"
#include "coord_jobs.h"
#include "coord_negot.h"
#include "coord_verdict.h"
#include "errors.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "util.h"

#define STACKS_DEFAULT_WAIT_MS 3000
#define STACKS_MAX_WAIT_MS     10000
#define STACKS_MAX_TEXT        (256u << 10)
#define STACKS_OPS_MAX         32   /* stalled ops a collection remembers */
#define STACKS_STALL_MIN_MS    1000 /* younger ops are not a stall yet */
#define STACKS_KEEP            8    /* kept per job (SQLite) */

struct stacks_call {
    struct stacks_call *next;
    struct rpc_call *call;
};

/* A rank as it was when the collection started: the job may change
 * meanwhile (a frozen member leaves, the job ends), the answers are
 * matched against this. */
struct stacks_rank {
    uint64_t wid;
    int pid;
    bool asked;
    char host_id[64], host[64];
    char why[96]; /* said of a rank that was not asked, or did not answer */
    char pending[512];
};

/* An op some ranks had submitted and others not, when it started. */
struct stacks_op {
    char name[128];
    uint64_t waiting_ms;
    bool *missing; /* [nranks] */
};

struct stacks {
    uint64_t seq;
    uint64_t deadline; /* monotonic */
    uint64_t taken_ms; /* wall clock */
    char reason[256];  /* "" asked by a user only: not kept, no verdict */
    int nranks;
    struct stacks_rank *rk;
    Kolo__WorkerStack *got; /* [nranks]: a host's answer, copied */
    bool *have;             /* [nranks] */
    struct stacks_op ops[STACKS_OPS_MAX];
    size_t nops;
    struct stacks_call *calls;
};

static uint64_t stacks_counter;

static void stack_clear(Kolo__WorkerStack *w)
{
    free(w->proc_state);
    free(w->wchan);
    free(w->text);
    kolo__worker_stack__init(w);
}

void coord_stacks_free(struct job *j)
{
    struct stacks *s = j->stacks;
    if (!s)
        return;
    for (int r = 0; r < s->nranks; r++)
        if (s->have[r])
            stack_clear(&s->got[r]);
    for (size_t i = 0; i < s->nops; i++)
        free(s->ops[i].missing);
    while (s->calls) {
        struct stacks_call *next = s->calls->next;
        free(s->calls);
        s->calls = next;
    }
    free(s->rk);
    free(s->got);
    free(s->have);
    free(s);
    j->stacks = NULL;
}

/* The job's stalls now: each rank's part in words (the ops it waits in,
 * or that the others wait on it for) and the ops for the verdict. */
static void stacks_note_stalls(struct stacks *s, const struct job *j)
{
    size_t n = j->negot ? coord_negot_stalls(j, STACKS_STALL_MIN_MS, NULL, 0) : 0;
    struct negot_stall *st = n ? calloc(n, sizeof *st) : NULL;
    n = st ? coord_negot_stalls(j, STACKS_STALL_MIN_MS, st, n) : 0;
    for (size_t i = 0; i < n; i++) {
        for (int r = 0; r < s->nranks && r < st[i].size; r++) {
            char *out = s->rk[r].pending;
            size_t used = strlen(out), size = sizeof s->rk[r].pending;
            if (used + 64 < size)
                snprintf(out + used, size - used, "%s%s '%s' (%.0f s)", used ? "; " : "",
                         coord_negot_stall_missing(&st[i], r) ? "never submitted" : "waits in",
                         st[i].name, (double)st[i].waiting_ms / 1000.0);
        }
        if (s->nops == STACKS_OPS_MAX)
            continue;
        struct stacks_op *op = &s->ops[s->nops];
        op->missing = calloc(s->nranks ? (size_t)s->nranks : 1, sizeof *op->missing);
        if (!op->missing)
            continue;
        str_copy(op->name, st[i].name, sizeof op->name);
        op->waiting_ms = st[i].waiting_ms;
        for (int r = 0; r < s->nranks; r++)
            op->missing[r] = r < st[i].size && coord_negot_stall_missing(&st[i], r);
        s->nops++;
    }
    free(st);
}

/* Where rank r is, in words, for the verdict. */
static void rank_where(const struct stacks *s, int r, char *out, size_t size)
{
    const Kolo__WorkerStack *w = &s->got[r];
    if (!s->have[r])
        snprintf(out, size, "%s", s->rk[r].why);
    else if (w->answered && verdict_where(w->text, out, size))
        return;
    else if (w->answered)
        snprintf(out, size, "no Python frame in its stacks");
    else
        snprintf(out, size, "no Python stack, process %s%s%s", w->proc_state,
                 w->wchan[0] ? " in " : "", w->wchan);
}

/* The verdict, the stacks kept with the job and the notice kolo run
 * prints. */
static void stacks_keep(struct coord *c, struct job *j, Kolo__StacksReply *rep, char *verdict,
                        size_t vsize)
{
    struct stacks *s = j->stacks;
    struct verdict_rank *vr = calloc(s->nranks ? (size_t)s->nranks : 1, sizeof *vr);
    char (*where)[256] = calloc(s->nranks ? (size_t)s->nranks : 1, sizeof *where);
    struct verdict_op ops[STACKS_OPS_MAX];
    for (size_t i = 0; i < s->nops; i++)
        ops[i] = (struct verdict_op){s->ops[i].name, s->ops[i].waiting_ms, s->ops[i].missing};
    for (int r = 0; vr && where && r < s->nranks; r++) {
        rank_where(s, r, where[r], sizeof where[r]);
        vr[r] = (struct verdict_rank){s->rk[r].host, where[r]};
    }
    if (vr && where)
        verdict_build(ops, s->nops, vr, s->nranks, verdict, vsize);
    free(vr);
    free(where);
    rep->reason = s->reason;
    rep->verdict = verdict;
    size_t len = kolo__stacks_reply__get_packed_size(rep);
    uint8_t *data = malloc(len ? len : 1);
    if (data) {
        kolo__stacks_reply__pack(rep, data);
        struct store_stacks x = {.job_id = j->id,
                                 .taken_ms = s->taken_ms,
                                 .reason = s->reason,
                                 .verdict = verdict,
                                 .reply = data,
                                 .reply_len = len};
        if (store_stacks_add(c->store, &x, STACKS_KEEP) != 0)
            coord_store_failed(c, "stacks add");
    }
    free(data);
    coord_event(c, j->id, NULL, "stacks.taken", "%s: %s (every rank's stacks: kolo stacks %llu)",
                s->reason, verdict[0] ? verdict : "no rank answered",
                (unsigned long long)j->id);
}

/* Answers every parked call with what came, keeps the stacks when the
 * coordinator took them for a reason, and ends the collection. */
static void stacks_end(struct coord *c, struct job *j)
{
    struct stacks *s = j->stacks;
    for (struct host *h = c->hosts; h; h = h->next)
        if (h->stacks_seq == s->seq)
            h->stacks_job = h->stacks_seq = 0; /* heartbeats stop asking */
    int n = s->nranks;
    Kolo__WorkerStack *out = calloc(n ? (size_t)n : 1, sizeof *out);
    Kolo__WorkerStack **ptrs = calloc(n ? (size_t)n : 1, sizeof *ptrs);
    for (int r = 0; out && ptrs && r < n; r++) {
        const struct stacks_rank *rk = &s->rk[r];
        if (s->have[r]) {
            out[r] = s->got[r];
        } else {
            kolo__worker_stack__init(&out[r]);
            out[r].job_id = j->id;
            out[r].worker_id = rk->wid;
            out[r].pid = rk->pid;
            out[r].proc_state = (char *)rk->why;
            out[r].wchan = "";
            out[r].text = "";
        }
        out[r].rank = r;
        out[r].host = (char *)rk->host;
        out[r].pending = (char *)rk->pending;
        ptrs[r] = &out[r];
    }
    Kolo__StacksReply rep = KOLO__STACKS_REPLY__INIT;
    rep.workers = ptrs;
    rep.n_workers = out && ptrs ? (size_t)n : 0;
    rep.taken_ms = s->taken_ms;
    char verdict[1024] = "";
    if (s->reason[0] && out && ptrs)
        stacks_keep(c, j, &rep, verdict, sizeof verdict);
    for (struct stacks_call *x = s->calls; x; x = x->next)
        coord_send_pb(x->call, &rep.base);
    free(out);
    free(ptrs);
    coord_stacks_free(j);
}

void coord_stacks_finish(struct coord *c, struct job *j)
{
    if (j->stacks)
        stacks_end(c, j);
}

void coord_stacks_job_ended(struct coord *c, struct job *j)
{
    /* taken for a reason (a stop): the agents answer before they stop
     * the workers, so the collection runs on to its end */
    if (j->stacks && !j->stacks->reason[0])
        stacks_end(c, j);
}

void coord_stacks_cron(struct coord *c, struct job *j, uint64_t now)
{
    if (j->stacks && now >= j->stacks->deadline)
        stacks_end(c, j);
}

/* Whether a host asked has yet to answer: each one asked carries the
 * collection's seq until its answer clears it. */
static bool hosts_pending(const struct coord *c, uint64_t seq)
{
    for (const struct host *h = c->hosts; h; h = h->next)
        if (h->stacks_seq == seq)
            return true;
    return false;
}

/* A new collection for the job: its live ranks' hosts are asked. */
static struct stacks *stacks_start(struct coord *c, struct job *j, uint32_t wait_ms)
{
    struct stacks *s = calloc(1, sizeof *s);
    int n = j->nranks;
    size_t cnt = n ? (size_t)n : 1;
    if (!s || !(s->got = calloc(cnt, sizeof *s->got)) || !(s->have = calloc(cnt, sizeof *s->have)) ||
        !(s->rk = calloc(cnt, sizeof *s->rk))) {
        if (s) {
            free(s->got);
            free(s->have);
        }
        free(s);
        return NULL;
    }
    s->seq = ++stacks_counter;
    s->nranks = n;
    s->taken_ms = now_wall_ms();
    s->deadline = now_mono_ms() + wait_ms;
    j->stacks = s;
    stacks_note_stalls(s, j);
    for (int r = 0; r < n; r++) {
        const struct rank *rk = &j->ranks[r];
        struct stacks_rank *x = &s->rk[r];
        struct host *h = rk->host;
        x->wid = rk->wid;
        x->pid = rk->pid;
        str_copy(x->host, h ? h->name : rk->host_id[0] ? rk->host_id : "?", sizeof x->host);
        str_copy(x->host_id, h ? h->id : "", sizeof x->host_id);
        x->asked = h && (rk->state == RANK_RUNNING || rk->state == RANK_ASSIGNED);
        str_copy(x->why, x->asked ? "no answer from its host's agent in time"
                                  : coord_rank_state_name(rk->state),
                 sizeof x->why);
        if (!x->asked || h->stacks_seq == s->seq)
            continue;
        h->stacks_job = j->id;
        h->stacks_seq = s->seq;
        coord_host_poke(c, h);
    }
    return s;
}

void coord_stacks_take(struct coord *c, struct job *j, const char *reason)
{
    if (j->state != JOB_RUNNING)
        return;
    if (!j->stacks && !stacks_start(c, j, STACKS_DEFAULT_WAIT_MS)) {
        LOGW("coord", "job %llu: no memory to take its stacks", (unsigned long long)j->id);
        return;
    }
    if (!j->stacks->reason[0])
        str_copy(j->stacks->reason, reason, sizeof j->stacks->reason);
    if (!hosts_pending(c, j->stacks->seq))
        stacks_end(c, j); /* no host to ask */
}

/* A job that is no longer running: the last stacks kept with it. */
static int read_kept(const struct store_stacks *x, void *arg)
{
    Kolo__StacksReply **out = arg;
    *out = kolo__stacks_reply__unpack(NULL, x->reply_len, x->reply ? x->reply : (const void *)"");
    return 1;
}

struct kept_json {
    struct jw *w;
    uint64_t job_id;
    int n;
};

static int kept_json_row(const struct store_stacks *x, void *arg)
{
    struct kept_json *k = arg;
    Kolo__StacksReply *rep =
        kolo__stacks_reply__unpack(NULL, x->reply_len, x->reply ? x->reply : (const void *)"");
    if (!rep)
        return 0; /* not ours to judge: skipped */
    rep->kept = true;
    coord_stacks_json(k->w, k->job_id, rep, -1);
    kolo__stacks_reply__free_unpacked(rep, NULL);
    k->n++;
    return 0;
}

static void admin_stacks_kept(struct coord *c, struct rpc_call *call, struct job *j)
{
    Kolo__StacksReply *rep = NULL;
    if (store_stacks_each(c->store, j->id, 1, read_kept, &rep) < 0)
        coord_store_failed(c, "stacks read");
    if (!rep) {
        c->m.rpc_errors[M_ADMIN_STACKS]++;
        rpc_call_error(call, KOLO_ESTATE,
                       "job %llu is %s and no stacks were taken of it: only a running job's "
                       "ranks have stacks (kolo takes them before a stop, a stall or a frozen "
                       "rank)",
                       (unsigned long long)j->id, coord_job_state_name(j->state));
        return;
    }
    rep->kept = true;
    coord_send_pb(call, &rep->base);
    kolo__stacks_reply__free_unpacked(rep, NULL);
}

static void admin_stacks(struct coord *c, struct rpc_call *call)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__StacksRequest *req = kolo__stacks_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_ADMIN_STACKS]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed StacksRequest");
        return;
    }
    struct job *j = coord_job_find(c, req->job_id);
    uint32_t wait = req->wait_ms ? req->wait_ms : STACKS_DEFAULT_WAIT_MS;
    kolo__stacks_request__free_unpacked(req, NULL);
    if (wait > STACKS_MAX_WAIT_MS)
        wait = STACKS_MAX_WAIT_MS;
    if (!j) {
        c->m.rpc_errors[M_ADMIN_STACKS]++;
        rpc_call_error(call, KOLO_ENOTFOUND, "no such job");
        return;
    }
    if (j->state != JOB_RUNNING && !j->stacks) {
        admin_stacks_kept(c, call, j);
        return;
    }
    struct stacks_call *x = calloc(1, sizeof *x);
    if (!x || (!j->stacks && !stacks_start(c, j, wait))) {
        free(x);
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return;
    }
    x->call = call;
    x->next = j->stacks->calls;
    j->stacks->calls = x;
    if (!hosts_pending(c, j->stacks->seq))
        stacks_end(c, j); /* no host to ask */
}

/* A copy of what an agent sent, within bounds; false when out of memory
 * (the rank is then listed as not answered). */
static bool stack_copy(Kolo__WorkerStack *dst, const Kolo__WorkerStack *src)
{
    *dst = *src;
    size_t len = strlen(src->text);
    dst->text = strndup(src->text, len < STACKS_MAX_TEXT ? len : STACKS_MAX_TEXT);
    dst->proc_state = strndup(src->proc_state, 64);
    dst->wchan = strndup(src->wchan, 64);
    dst->host = NULL;
    dst->pending = NULL;
    if (dst->text && dst->proc_state && dst->wchan)
        return true;
    stack_clear(dst);
    return false;
}

/* The rank of the collection an agent's worker was, -1 none. */
static int stacks_rank_of(const struct stacks *s, const Kolo__WorkerStack *w)
{
    if (!w->worker_id)
        return w->rank >= 0 && w->rank < s->nranks ? w->rank : -1;
    for (int r = 0; r < s->nranks; r++)
        if (s->rk[r].wid == w->worker_id)
            return r;
    return -1;
}

static void agent_stacks(struct coord *c, struct rpc_call *call)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__StacksReport *rep = kolo__stacks_report__unpack(NULL, f->body_len, f->body);
    if (!rep) {
        c->m.rpc_errors[M_AGENT_STACKS]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed StacksReport");
        return;
    }
    struct host *h = coord_host_by_session(c, rep->session);
    if (!h) {
        c->m.rpc_errors[M_AGENT_STACKS]++;
        rpc_call_error(call, KOLO_ESTALE, "unknown or expired agent session");
        kolo__stacks_report__free_unpacked(rep, NULL);
        return;
    }
    Kolo__StacksAck ack = KOLO__STACKS_ACK__INIT;
    coord_send_pb(call, &ack.base);
    if (h->stacks_seq == rep->seq)
        h->stacks_job = h->stacks_seq = 0;
    struct job *j = coord_job_find(c, rep->job_id);
    struct stacks *s = j ? j->stacks : NULL;
    if (s && s->seq == rep->seq) {
        for (size_t i = 0; i < rep->n_workers; i++) {
            const Kolo__WorkerStack *w = rep->workers[i];
            int r = stacks_rank_of(s, w);
            /* only a rank's own host speaks for it */
            if (r < 0 || !s->rk[r].asked || strcmp(s->rk[r].host_id, h->id) != 0 || s->have[r])
                continue;
            s->have[r] = stack_copy(&s->got[r], w);
        }
        if (!hosts_pending(c, s->seq))
            stacks_end(c, j);
    }
    kolo__stacks_report__free_unpacked(rep, NULL);
}

void coord_stacks_json(struct jw *w, uint64_t job_id, const Kolo__StacksReply *rep, int rank)
{
    jw_obj_begin(w);
    jw_kuint(w, "job", job_id);
    jw_kuint(w, "taken_ms", rep->taken_ms);
    jw_kstr(w, "reason", rep->reason);
    jw_kstr(w, "verdict", rep->verdict);
    jw_kbool(w, "kept", rep->kept);
    jw_key(w, "ranks");
    jw_arr_begin(w);
    for (size_t i = 0; i < rep->n_workers; i++) {
        const Kolo__WorkerStack *x = rep->workers[i];
        if (rank >= 0 && x->rank != rank)
            continue;
        jw_obj_begin(w);
        jw_kint(w, "rank", x->rank);
        jw_kstr(w, "host", x->host);
        jw_kint(w, "pid", x->pid);
        jw_kuint(w, "worker_id", x->worker_id);
        jw_kstr(w, "state", x->proc_state);
        jw_kstr(w, "wchan", x->wchan);
        jw_kbool(w, "answered", x->answered);
        jw_kstr(w, "pending", x->pending);
        jw_kstr(w, "stacks", x->text);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
}

int coord_stacks_kept_json(struct store *st, struct jw *w, uint64_t job_id, int limit)
{
    struct kept_json k = {w, job_id, 0};
    jw_arr_begin(w);
    int rc = store_stacks_each(st, job_id, limit, kept_json_row, &k);
    jw_arr_end(w);
    return rc < 0 ? rc : k.n;
}

void coord_rpc_stacks(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    if (m == M_ADMIN_STACKS)
        admin_stacks(c, call);
    else
        agent_stacks(c, call);
}
