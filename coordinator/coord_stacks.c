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
#include "errors.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "util.h"

#define STACKS_DEFAULT_WAIT_MS 3000
#define STACKS_MAX_WAIT_MS     10000
#define STACKS_MAX_TEXT        (256u << 10)

struct stacks_call {
    struct stacks_call *next;
    struct rpc_call *call;
};

struct stacks {
    uint64_t seq;
    uint64_t deadline; /* monotonic */
    uint64_t taken_ms; /* wall clock */
    int nranks;
    Kolo__WorkerStack *got; /* [nranks]: a host's answer, copied */
    bool *have;             /* [nranks] */
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
    while (s->calls) {
        struct stacks_call *next = s->calls->next;
        free(s->calls);
        s->calls = next;
    }
    free(s->got);
    free(s->have);
    free(s);
    j->stacks = NULL;
}

/* Rank r's part in the job's stalls: the ops it waits in, or that the
 * others wait on it for. */
static void rank_pending(const struct negot_stall *st, size_t n, int r, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && used + 64 < size; i++) {
        bool missing = coord_negot_stall_missing(&st[i], r);
        int k = snprintf(out + used, size - used, "%s%s '%s' (%.0f s)", used ? "; " : "",
                         missing ? "never submitted" : "waits in", st[i].name,
                         (double)st[i].waiting_ms / 1000.0);
        if (k < 0 || (size_t)k >= size - used)
            break;
        used += (size_t)k;
    }
}

/* Answers every parked call with what came and ends the collection. */
void coord_stacks_finish(struct coord *c, struct job *j)
{
    struct stacks *s = j->stacks;
    if (!s)
        return;
    for (struct host *h = c->hosts; h; h = h->next)
        if (h->stacks_seq == s->seq)
            h->stacks_job = h->stacks_seq = 0; /* heartbeats stop asking */
    size_t nst = j->negot ? coord_negot_stalls(j, 0, NULL, 0) : 0;
    struct negot_stall *st = nst ? calloc(nst, sizeof *st) : NULL;
    if (st)
        nst = coord_negot_stalls(j, 0, st, nst);
    else
        nst = 0;
    int n = s->nranks < j->nranks ? s->nranks : j->nranks;
    Kolo__WorkerStack *out = calloc(n ? (size_t)n : 1, sizeof *out);
    Kolo__WorkerStack **ptrs = calloc(n ? (size_t)n : 1, sizeof *ptrs);
    char (*pend)[512] = calloc(n ? (size_t)n : 1, sizeof *pend);
    char (*why)[96] = calloc(n ? (size_t)n : 1, sizeof *why);
    for (int r = 0; out && ptrs && pend && why && r < n; r++) {
        const struct rank *rk = &j->ranks[r];
        if (s->have[r]) {
            out[r] = s->got[r];
        } else {
            kolo__worker_stack__init(&out[r]);
            out[r].job_id = j->id;
            out[r].rank = r;
            out[r].worker_id = rk->wid;
            out[r].pid = rk->pid;
            snprintf(why[r], sizeof why[r], "%s",
                     rk->state == RANK_RUNNING || rk->state == RANK_ASSIGNED
                         ? "no answer from its host's agent in time"
                         : coord_rank_state_name(rk->state));
            out[r].proc_state = why[r];
            out[r].wchan = "";
            out[r].text = "";
        }
        out[r].rank = r;
        out[r].host = (char *)(rk->host ? rk->host->name : rk->host_id);
        rank_pending(st, nst, r, pend[r], sizeof pend[r]);
        out[r].pending = pend[r];
        ptrs[r] = &out[r];
    }
    Kolo__StacksReply rep = KOLO__STACKS_REPLY__INIT;
    rep.workers = ptrs;
    rep.n_workers = out && ptrs && pend && why ? (size_t)n : 0;
    rep.taken_ms = s->taken_ms;
    for (struct stacks_call *x = s->calls; x; x = x->next)
        coord_send_pb(x->call, &rep.base);
    free(out);
    free(ptrs);
    free(pend);
    free(why);
    free(st);
    coord_stacks_free(j);
}

void coord_stacks_cron(struct coord *c, struct job *j, uint64_t now)
{
    if (j->stacks && now >= j->stacks->deadline)
        coord_stacks_finish(c, j);
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
    if (!s || !(s->got = calloc(n ? (size_t)n : 1, sizeof *s->got)) ||
        !(s->have = calloc(n ? (size_t)n : 1, sizeof *s->have))) {
        if (s)
            free(s->got);
        free(s);
        return NULL;
    }
    s->seq = ++stacks_counter;
    s->nranks = n;
    s->taken_ms = now_wall_ms();
    s->deadline = now_mono_ms() + wait_ms;
    j->stacks = s;
    for (int r = 0; r < n; r++) {
        struct host *h = j->ranks[r].host;
        bool live = j->ranks[r].state == RANK_RUNNING || j->ranks[r].state == RANK_ASSIGNED;
        if (!h || !live || h->stacks_seq == s->seq)
            continue;
        h->stacks_job = j->id;
        h->stacks_seq = s->seq;
        coord_host_poke(c, h);
    }
    return s;
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
    if (j->state != JOB_RUNNING) {
        c->m.rpc_errors[M_ADMIN_STACKS]++;
        rpc_call_error(call, KOLO_ESTATE, "job %llu is %s: only a running job's ranks have stacks",
                       (unsigned long long)j->id, coord_job_state_name(j->state));
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
        coord_stacks_finish(c, j); /* no host to ask */
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
            int r = w->worker_id ? coord_job_member(j, w->worker_id) : w->rank;
            /* only a rank's own host speaks for it */
            if (r < 0 || r >= s->nranks || r >= j->nranks || j->ranks[r].host != h ||
                s->have[r])
                continue;
            s->have[r] = stack_copy(&s->got[r], w);
        }
        if (!hosts_pending(c, s->seq))
            coord_stacks_finish(c, j);
    }
    kolo__stacks_report__free_unpacked(rep, NULL);
}

void coord_rpc_stacks(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    if (m == M_ADMIN_STACKS)
        admin_stacks(c, call);
    else
        agent_stacks(c, call);
}
