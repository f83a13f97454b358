/*
 * coord_negot.c - tensor negotiation for a job generation (the rendezvous,
 * sessions and process sets are coord_rendezvous.c's; the state both
 * share is coord_negot_int.h; the rules, the response cache's table, the
 * log and resume's logic are negotiation/'s).
 *
 * Negotiation follows Horovod's semantics with the coordinator as the one
 * place that decides the order. Workers send the requests they queued
 * since their last call and a cursor into the generation's response log.
 * A tensor is ready when every rank that has not joined submitted it;
 * ready tensors are checked against each other (Horovod's mismatch rules
 * and error texts), fused (consecutive allreduces of one dtype, op and
 * scaling, up to the fusion threshold) and appended to the log as
 * responses. Every rank executes the log in order, so all ranks run the
 * same collectives in the same sequence. A call with nothing new to read
 * parks until the log grows, which is what makes a small op fast: the
 * last rank's request wakes everyone in one round trip.
 *
 * The log (negotiation/resp_log.h) keeps each entry packed once and
 * builds a rank's reply around the stored bytes; entries every rank has
 * read are trimmed. Retrying a request with the same cursor is harmless:
 * the log is read-only once written.
 *
 * Response cache: an allreduce that completed cleanly gets a cache id.
 * A worker that submits the same name with the same signature again
 * sends only the id; the coordinator takes the stored request as that
 * rank's. A rank that changes the signature sends a full request, which
 * is then checked against the others like any request (a mismatch is
 * reported, a consistent change is negotiated afresh).
 *
 * Timeline: a job with HOROVOD_TIMELINE has n->tl (coord_timeline.c),
 * told of each request, each response and (without readiness rounds) the
 * ranks' cursors; under rounds the ranks report what they ran instead
 * (coord_report.c -> coord_timeline_spans). Without a timeline, that costs
 * a pointer test per request.
 */
#include "coord_negot_int.h"
#include "coord_core.h"
#include "coord_elastic.h"
#include "coord_jobs.h"
#include "coord_stacks.h"
#include "coord_timeline.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "creds.h"
#include "errors.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "mismatch.h"
#include "resp_log.h"
#include "resume.h"
#include "round.h"
#include "util.h"


/* ---------------------------------------------------------------- memory */

static void entry_free(struct negot *n, struct entry *e)
{
    for (int r = 0; r < n->size; r++)
        if (!e->borrowed[r])
            tensor_req_free(e->reqs[r]);
    free(e->reqs); /* and arrive_us, borrowed: one block */
    free(e->name);
    free(e);
}

static void negot_unlink(struct negot *n, struct entry *e)
{
    struct entry **pp = &n->buckets[str_hash(e->name) % NEGOT_BUCKETS];
    while (*pp && *pp != e)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = e->hnext;
    if (e->prev)
        e->prev->next = e->next;
    else
        n->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        n->tail = e->prev;
    if (e->cache_id && n->cache_pending[e->cache_id] == e)
        n->cache_pending[e->cache_id] = NULL;
}

static struct entry *negot_find(struct negot *n, const char *name)
{
    for (struct entry *e = n->buckets[str_hash(name) % NEGOT_BUCKETS]; e; e = e->hnext)
        if (strcmp(e->name, name) == 0)
            return e;
    return NULL;
}

static struct entry *negot_add(struct negot *n, const char *name)
{
    struct entry *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->name = strdup(name);
    /* the per-rank arrays in one block: requests, arrival times, flags */
    size_t per_rank = sizeof(*e->reqs) + sizeof(*e->arrive_us) + sizeof(*e->borrowed);
    e->reqs = calloc((size_t)n->size, per_rank);
    if (!e->name || !e->reqs) {
        free(e->name);
        free(e->reqs);
        free(e);
        return NULL;
    }
    e->arrive_us = (uint64_t *)(e->reqs + n->size);
    e->borrowed = (uint8_t *)(e->arrive_us + n->size);
    e->first_mono = now_mono_ms();
    uint64_t b = str_hash(name) % NEGOT_BUCKETS;
    e->hnext = n->buckets[b];
    n->buckets[b] = e;
    e->prev = n->tail;
    if (n->tail)
        n->tail->next = e;
    else
        n->head = e;
    n->tail = e;
    return e;
}

/* Only named tensors get a cache id: an auto-named op ("allreduce.noname.7",
 * "kolo.barrier.3") never repeats its name, so an id for it would only
 * grow every rank's readiness bitmap. */
static bool cacheable(const char *name)
{
    return strstr(name, ".noname.") == NULL && strncmp(name, "kolo.barrier.", 13) != 0;
}

/* Whether every rank runs readiness rounds: one that does not makes the
 * ids fixed for the generation (cache_evict). */
static void note_rounds(struct negot *n, const Kolo__NegotiateRequest *req)
{
    n->rounds = (n->rounds_known ? n->rounds : true) && req->rounds;
    n->rounds_known = true;
}

/*
 * Every id is taken (1..ROUND_MAX_ID: the ranks' bitmaps cover no more).
 * With readiness rounds no rank ever submits by id to the coordinator, so
 * the id given longest ago (and awaited by no entry) can go to a new name:
 * the log entry that gives it is where every rank drops the old holder
 * (worker fast_evict) and sends that name's op, if one waits, in full.
 * Without rounds ids stay fixed (a rank's by-id request could be older
 * than the entry) and a new name is negotiated without one. 0: none.
 */
static bool cache_busy(const void *arg, uint32_t id)
{
    const struct negot *n = arg;
    return n->cache_pending[id] != NULL;
}

static uint32_t cache_evict(struct negot *n)
{
    if (!n->rounds)
        return 0;
    uint32_t victim = tcache_oldest(n->cache, n->next_id, cache_busy, n);
    if (victim)
        n->evictions++;
    return victim;
}

struct negot *negot_new(const struct coord *c, const struct job *j, int size, int32_t set)
{
    struct negot *n = calloc(1, sizeof(*n));
    if (!n)
        return NULL;
    n->job_id = j->id;
    n->generation = j->generation;
    n->set = set;
    n->size = size;
    if (c->mesh_secret[0])
        creds_job(c->mesh_secret, j->id, n->job_cred);
    n->fusion_threshold = NEGOT_DEFAULT_FUSION;
    n->stall_warning_ms = STALL_WARN_MS;
    /* read at every reply, so an update announced before the ranks' first
     * call of the generation (a drain while they start) reaches them too */
    n->el = set == 0 ? j->el : NULL;
    n->peers = calloc((size_t)size, sizeof(*n->peers));
    n->cursor = calloc((size_t)size, sizeof(*n->cursor));
    n->parked = calloc((size_t)size, sizeof(*n->parked));
    n->parked_deadline = calloc((size_t)size, sizeof(*n->parked_deadline));
    n->rank_joined = calloc((size_t)size, sizeof(*n->rank_joined));
    n->lag_s = calloc((size_t)size, sizeof(*n->lag_s));
    n->round_wait_s = calloc((size_t)size, sizeof(*n->round_wait_s));
    n->cache = tcache_new();
    n->cache_pending = calloc(NEGOT_CACHE_MAX, sizeof(*n->cache_pending));
    n->next_id = 1; /* id 0 means "not cached" */
    if (!n->peers || !n->cursor || !n->parked || !n->parked_deadline || !n->rank_joined || !n->lag_s || !n->round_wait_s ||
        !n->cache || !n->cache_pending) {
        coord_negot_free(n);
        return NULL;
    }
    return n;
}

void resume_drop(struct negot *n, int code, const char *why)
{
    for (int r = 0; n->res && r < n->size; r++) {
        if (n->res[r].call)
            rpc_call_error(n->res[r].call, code, "%s", why);
        n->res[r].call = NULL;
        if (n->res[r].req)
            kolo__negotiate_request__free_unpacked(n->res[r].req, NULL);
        n->res[r].req = NULL;
    }
}

void coord_negot_free(struct negot *n)
{
    if (!n)
        return;
    resume_drop(n, KOLO_ESTALE, "the generation ended");
    free(n->res);
    free(n->resume_failed);
    topology_free(&n->topo);
    if (n->compact_reply) /* it holds the data-plane key */
        explicit_bzero(n->compact_reply, n->compact_len);
    free(n->compact_reply);
    for (int r = 0; n->peers && r < n->size; r++) {
        struct peer *p = &n->peers[r];
        free(p->host_id);
        for (int i = 0; i < p->naddrs; i++)
            free(p->addrs[i]);
        free(p->addrs);
        free(p->shm_name);
        free(p->machine);
        free(p->data_host);
    }
    struct entry *e = n->head;
    while (e) {
        struct entry *next = e->next;
        entry_free(n, e);
        e = next;
    }
    rlog_free(&n->log);
    tcache_free(n->cache);
    free(n->carry_block);
    tcache_free(n->carried);
    free(n->peers);
    free(n->cursor);
    free(n->parked);
    free(n->parked_deadline);
    free(n->rank_joined);
    free(n->lag_s);
    free(n->round_wait_s);
    free(n->cache_pending);
    free(n);
}

/* ---------------------------------------------------------------- the log */

static int log_append(struct negot *n, Kolo__Response *r)
{
    return rlog_append(&n->log, r);
}

/* Drops entries every rank has read. */
static void log_trim(struct negot *n)
{
    uint64_t min = UINT64_MAX;
    for (int r = 0; r < n->size; r++)
        if (n->cursor[r] < min)
            min = n->cursor[r];
    rlog_trim(&n->log, min);
}

/* Answers call with the log from cursor on (resp_log.h), the pending
 * membership update (fields 3 and 4) and whether the timeline runs (6). */
static void negot_answer(struct negot *n, struct rpc_call *call, uint64_t cursor)
{
    size_t len;
    uint8_t *buf = rlog_reply(&n->log, cursor, NEGOT_MAX_REPLY_BYTES, 26, &len), *p;
    if (!buf) {
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return;
    }
    p = buf + len;
    if (n->el && n->el->update_ms) {
        *p++ = (3 << 3) | 0;
        pb_put_varint(&p, n->el->update_ms);
        *p++ = (4 << 3) | 0;
        pb_put_varint(&p, (uint32_t)n->el->update_kind);
    }
    if (n->tl) {
        *p++ = (6 << 3) | 0;
        *p++ = 1;
    }
    rpc_call_reply(call, buf, (size_t)(p - buf));
    free(buf);
}

/* Answers every parked call now: something every rank must hear at once
 * (a membership update, the timeline starting or stopping). */
static void negot_wake_all(struct negot *n)
{
    for (int r = 0; r < n->size; r++) {
        if (n->parked[r]) {
            struct rpc_call *call = n->parked[r];
            n->parked[r] = NULL;
            negot_answer(n, call, n->cursor[r]);
        }
    }
}

static void negot_wake(struct negot *n)
{
    for (int r = 0; r < n->size; r++) {
        if (n->parked[r] && n->cursor[r] < rlog_end(&n->log)) {
            struct rpc_call *call = n->parked[r];
            n->parked[r] = NULL;
            negot_answer(n, call, n->cursor[r]);
        }
    }
}

/* ---------------------------------------------------------------- responses */

static int64_t elems(const struct tensor_req *t, int from_dim)
{
    int64_t n = 1;
    for (int i = from_dim; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

static struct fusion_item fusion_of(const struct tensor_req *t, int64_t bytes)
{
    struct fusion_item f = {.dtype = t->dtype,
                            .op = t->op,
                            .prescale = t->prescale,
                            .postscale = t->postscale,
                            .gpu = t->device >= 0,
                            .bytes = bytes};
    return f;
}

/* Checks the ranks' requests for one tensor against each other
 * (negotiation/mismatch.c): Horovod's text in err, or "". */
static void check_entry(struct negot *n, struct entry *e, char *err, size_t errlen)
{
    mismatch_check(e->name, (const struct tensor_req *const *)e->reqs, n->size, n->njoined, err,
                   errlen);
}

/* The response fields of one checked tensor (sizes, rows). */
static int fill_sizes(struct negot *n, struct entry *e, const struct tensor_req *a, int64_t **sizes,
                      size_t *nsizes)
{
    int64_t *s = NULL;
    size_t k = 0;
    switch (a->coll) {
    case KOLO_COLL_ALLGATHER:
        s = malloc((size_t)n->size * sizeof(int64_t));
        if (!s)
            return KOLO_ENOMEM;
        for (int r = 0; r < n->size; r++)
            s[k++] = e->reqs[r] ? e->reqs[r]->shape[0] : 0;
        break;
    case KOLO_COLL_ALLTOALL:
        s = malloc((size_t)n->size * (size_t)n->size * sizeof(int64_t));
        if (!s)
            return KOLO_ENOMEM;
        for (int src = 0; src < n->size; src++) {
            const struct tensor_req *t = e->reqs[src];
            for (int d = 0; d < n->size; d++) {
                if (!t)
                    s[k++] = 0;
                else if (t->nsplits == n->size)
                    s[k++] = t->splits[d];
                else
                    s[k++] = t->shape[0] / n->size;
            }
        }
        break;
    default:
        s = malloc(sizeof(int64_t));
        if (!s)
            return KOLO_ENOMEM;
        s[k++] = elems(a, 0);
        break;
    }
    *sizes = s;
    *nsizes = k;
    return 0;
}

/* The timeline's view of one response: each tensor's NEGOTIATE ends and
 * its op begins; the args name the dtype, the shape and the fused set. */
static void timeline_ready(struct negot *n, struct entry **ents, size_t k, char **names,
                           uint64_t index)
{
    struct buf b;
    buf_init(&b);
    for (size_t x = 0; x < k; x++) {
        const struct tensor_req *t = NULL;
        for (int r = 0; r < n->size && !t; r++)
            t = ents[x]->reqs[r];
        if (!t)
            continue;
        char shape[256];
        tensor_shape_text(shape, sizeof(shape), t);
        struct jw w;
        buf_reset(&b);
        jw_init(&w, &b);
        jw_obj_begin(&w);
        jw_kstr(&w, "dtype", mismatch_dtype_name(t->dtype));
        jw_kstr(&w, "shape", shape);
        jw_kuint(&w, "log_index", index);
        if (k > 1) {
            jw_key(&w, "fused");
            jw_arr_begin(&w);
            for (size_t y = 0; y < k; y++)
                jw_str(&w, names[y]);
            jw_arr_end(&w);
        }
        jw_obj_end(&w);
        coord_timeline_ready(n->tl, ents[x]->name, mismatch_coll_name(t->coll), index,
                             b.oom ? NULL : buf_cstr(&b), NULL);
    }
    buf_free(&b);
}

/* Emits the responses for a batch of ready entries, fusing consecutive
 * compatible allreduces; frees the entries. */
static void emit_ready(struct coord *c, struct negot *n, struct entry **ready, size_t nready)
{
    size_t i = 0;
    uint64_t now = now_mono_ms();
    for (size_t k = 0; k < nready; k++)
        coord_hist_observe(&c->m.negotiation_wait, (double)(now - ready[k]->first_mono) / 1000.0);
    int32_t *joined = NULL;
    size_t njoined = 0;
    if (n->njoined) {
        joined = malloc((size_t)n->size * sizeof(int32_t));
        for (int r = 0; joined && r < n->size; r++)
            if (n->rank_joined[r])
                joined[njoined++] = r;
    }
    while (i < nready) {
        struct entry *e = ready[i];
        char err[1024];
        check_entry(n, e, err, sizeof(err));
        const struct tensor_req *a = NULL;
        for (int r = 0; r < n->size && !a; r++)
            a = e->reqs[r];
        Kolo__Response resp = KOLO__RESPONSE__INIT;
        resp.coll = a ? a->coll : 0;
        if (err[0]) {
            char *names[1] = {e->name};
            resp.names = names;
            resp.n_names = 1;
            resp.error_code = KOLO_EMISMATCH;
            resp.error = err;
            if (log_append(n, &resp) != 0)
                c->m.store_errors++;
            if (n->tl)
                coord_timeline_ready(n->tl, e->name, mismatch_coll_name(resp.coll), resp.index, NULL, err);
            i++;
            continue;
        }
        /* Take the longest run of fusable allreduces starting at i. */
        size_t j = i + 1;
        int64_t bytes = elems(a, 0) * (int64_t)abi_dtype_size((int)a->dtype);
        if (a->coll == KOLO_COLL_ALLREDUCE) {
            while (j < nready) {
                struct entry *f = ready[j];
                char ferr[1024];
                const struct tensor_req *b = NULL;
                for (int r = 0; r < n->size && !b; r++)
                    b = f->reqs[r];
                if (!b || b->coll != KOLO_COLL_ALLREDUCE)
                    break;
                /* the rule the ranks' own rounds apply too (negotiation/round.h) */
                int64_t fb = elems(b, 0) * (int64_t)abi_dtype_size((int)b->dtype);
                struct fusion_item fa = fusion_of(a, elems(a, 0) * (int64_t)abi_dtype_size((int)a->dtype)),
                                   fi = fusion_of(b, fb);
                if (!fusion_fits(&fa, bytes, &fi, n->fusion_threshold))
                    break;
                check_entry(n, f, ferr, sizeof(ferr));
                if (ferr[0])
                    break;
                bytes += fb;
                j++;
            }
        }
        size_t k = j - i;
        char **names = calloc(k, sizeof(char *));
        int64_t *sizes = NULL, *rows = calloc(k, sizeof(int64_t));
        uint32_t *cids = calloc(k, sizeof(uint32_t));
        size_t nsizes = 0;
        if (!names || !rows || !cids) {
            free(names);
            free(rows);
            free(cids);
            break;
        }
        if (k == 1) {
            fill_sizes(n, e, a, &sizes, &nsizes);
        } else {
            sizes = calloc(k, sizeof(int64_t));
            nsizes = sizes ? k : 0;
        }
        for (size_t x = 0; x < k; x++) {
            struct entry *f = ready[i + x];
            const struct tensor_req *b = NULL;
            for (int r = 0; r < n->size && !b; r++)
                b = f->reqs[r];
            names[x] = f->name;
            rows[x] = b->ndim > 0 ? elems(b, 1) : 1;
            if (k > 1 && sizes)
                sizes[x] = elems(b, 0);
            /* Cache clean allreduces and host broadcasts run by every rank
             * (a GPU broadcast goes to the coordinator every time, as the
             * ranks' rounds take host broadcasts only). */
            if ((b->coll == KOLO_COLL_ALLREDUCE ||
                 (b->coll == KOLO_COLL_BROADCAST && b->device < 0)) &&
                n->njoined == 0 && cacheable(f->name)) {
                uint32_t id = f->cache_id ? f->cache_id : tcache_id(n->cache, f->name);
                if (!id)
                    id = n->next_id < NEGOT_CACHE_MAX ? n->next_id : cache_evict(n);
                if (id && tcache_sig(n->cache, id) == b) {
                    cids[x] = id; /* submitted through the cache: unchanged */
                } else if (id && tcache_bind(n->cache, id, f->name, b) == 0) {
                    /* a new name, or a new signature: the entries of this
                     * batch may still borrow the one replaced (reaped below) */
                    cids[x] = id;
                    if (id == n->next_id)
                        n->next_id++;
                }
            }
        }
        resp.names = names;
        resp.n_names = k;
        resp.dtype = a->dtype;
        resp.op = a->op;
        resp.prescale = a->prescale;
        resp.postscale = a->postscale;
        resp.root = a->root;
        resp.sizes = sizes;
        resp.n_sizes = nsizes;
        resp.row_elems = rows;
        resp.n_row_elems = k;
        resp.cache_ids = cids;
        resp.n_cache_ids = k;
        resp.joined = joined;
        resp.n_joined = njoined;
        if (log_append(n, &resp) != 0)
            c->m.store_errors++;
        else
            c->m.log_ops += k;
        if (n->tl)
            timeline_ready(n, ready + i, k, names, resp.index);
        free(names);
        free(sizes);
        free(rows);
        free(cids);
        i = j;
    }
    free(joined);
    for (size_t x = 0; x < nready; x++)
        entry_free(n, ready[x]);
    tcache_reap(n->cache);
}

/* A ready tensor's arrivals, into each rank's moving average of how long
 * after the first rank it asked. The rank the others keep waiting for is
 * the straggler, whatever the step times say (in a synchronous job every
 * rank's step takes as long as the slowest one's). */
#define LAG_ALPHA 0.05
static void lag_update(struct negot *n, const struct entry *e)
{
    uint64_t first = UINT64_MAX;
    for (int r = 0; r < n->size; r++)
        if (e->arrive_us[r] && e->arrive_us[r] < first)
            first = e->arrive_us[r];
    for (int r = 0; r < n->size && first != UINT64_MAX; r++)
        if (e->arrive_us[r]) {
            double lag = (double)(e->arrive_us[r] - first) / 1e6;
            n->lag_s[r] += LAG_ALPHA * (lag - n->lag_s[r]);
        }
}

int coord_negot_lags(const struct job *j, double *lag_s, int max)
{
    const struct negot *n = j->negot;
    if (!n || !n->complete)
        return 0;
    int k = n->size < max ? n->size : max;
    memcpy(lag_s, n->lag_s, (size_t)k * sizeof(*lag_s));
    if (!n->round_waits)
        return k;
    /* Rounds: every rank waits for the same ops to be agreed, so the one
     * the others wait for waits least; its lag is how much less. The ops
     * that still came here (first-time, stalled) keep their say: the
     * larger of the two. */
    double most = 0;
    for (int r = 0; r < n->size; r++)
        if (n->round_wait_s[r] > most)
            most = n->round_wait_s[r];
    for (int r = 0; r < k; r++)
        if (most - n->round_wait_s[r] > lag_s[r])
            lag_s[r] = most - n->round_wait_s[r];
    return k;
}

void coord_negot_round_wait(struct job *j, int rank, double wait_avg_s)
{
    struct negot *n = j->negot;
    if (!n || rank < 0 || rank >= n->size)
        return;
    n->round_wait_s[rank] = wait_avg_s;
    n->round_waits = true;
}

/* Collects every pending entry that is now ready, in arrival order. */
static void negot_progress(struct coord *c, struct negot *n)
{
    size_t cap = 0, nready = 0;
    struct entry **ready = NULL;
    struct entry *e = n->head;
    while (e) {
        struct entry *next = e->next;
        if (e->count >= n->size - n->njoined) {
            if (nready == cap) {
                cap = cap ? cap * 2 : 64;
                struct entry **nr = realloc(ready, cap * sizeof(*nr));
                if (!nr)
                    break;
                ready = nr;
            }
            negot_unlink(n, e);
            lag_update(n, e);
            ready[nready++] = e;
        }
        e = next;
    }
    if (nready)
        emit_ready(c, n, ready, nready);
    free(ready);
    if (n->njoined == n->size) {
        Kolo__Response resp = KOLO__RESPONSE__INIT;
        resp.coll = KOLO_COLL_JOIN;
        resp.last_joined = n->last_joined;
        log_append(n, &resp);
        memset(n->rank_joined, 0, (size_t)n->size * sizeof(*n->rank_joined));
        n->njoined = 0;
    }
}

static void negot_shutdown(struct coord *c, struct negot *n, int code, const char *why)
{
    if (n->shut)
        return;
    n->shut = true;
    Kolo__Response resp = KOLO__RESPONSE__INIT;
    resp.shutdown = 1;
    resp.error_code = code;
    resp.error = (char *)why;
    log_append(n, &resp);
    struct entry *e = n->head;
    while (e) {
        struct entry *next = e->next;
        negot_unlink(n, e);
        entry_free(n, e);
        e = next;
    }
    negot_wake(n);
}

/* ---------------------------------------------------------------- RPC handlers */

/* An elastic job's new generation n starts with the response cache of
 * the last one, old (whose cache it takes): the rendezvous reply hands
 * every rank the same table, so the first step after a reset is agreed
 * in readiness rounds instead of negotiated tensor by tensor (60-190 ms
 * of a 64-rank reset here, docs/performance.md). Out of memory, or a
 * table too large for a reply, it starts empty, as before. */
#define NEGOT_CARRY_MAX_BYTES (4u << 20)
static void negot_carry_cache(struct negot *n, struct negot *old)
{
    if (tcache_count(old->cache) == 0)
        return;
    n->carried = old->cache;
    old->cache = NULL; /* old is freed next */
    n->carry_block = resume_table_of(n->carried, &n->carry, &n->ncarry);
    size_t bytes = 0, bad = 0;
    for (size_t i = 0; i < n->ncarry; i++)
        bytes += kolo__cache_entry__get_packed_size(n->carry[i]);
    struct tensor_cache *live = tcache_new();
    if (!n->carry_block || bytes > NEGOT_CARRY_MAX_BYTES || !live ||
        resume_table_load(live, n->carry, n->ncarry, &bad) != 0) {
        tcache_free(live);
        free(n->carry_block);
        n->carry_block = NULL;
        n->carry = NULL;
        n->ncarry = 0;
        return; /* n->carried goes with n */
    }
    tcache_free(n->cache);
    n->cache = live;
    n->next_id = old->next_id;
}

struct job *worker_job(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    struct job *j = coord_worker_fence(c, call, m);
    if (!j)
        return NULL;
    if (!j->negot || j->negot->generation != j->generation) {
        struct negot *n = negot_new(c, j, j->nranks, 0);
        if (!n) {
            rpc_call_error(call, KOLO_ENOMEM, "out of memory");
            return NULL;
        }
        if (j->negot && j->negot->generation < j->generation) {
            negot_carry_cache(n, j->negot);
            c->m.carried_ids += n->ncarry;
        }
        coord_negot_free_job(j);
        j->negot = n;
        if (!j->tl_checked) {
            j->tl_checked = true;
            j->tl = coord_timeline_open(c, j);
        }
        if (j->tl) /* ops of the previous generation end with it */
            coord_timeline_fetched(j->tl, UINT64_MAX);
        j->negot->tl = j->tl;
    }
    return j;
}

void coord_negot_free_job(struct job *j)
{
    coord_negot_free(j->negot);
    j->negot = NULL;
    for (int i = 0; i < j->nsets; i++) {
        negot_drop_parked(j->sets[i].n, KOLO_ESTALE, "the generation ended");
        coord_negot_free(j->sets[i].n);
    }
    free(j->sets);
    j->sets = NULL;
    j->nsets = 0;
}

/* Every negotiation of the job's generation: its own, then its process
 * sets'. Returns how many (at most max). */
static int job_negots(struct job *j, struct negot **out, int max)
{
    int n = 0;
    if (j->negot && n < max)
        out[n++] = j->negot;
    for (int i = 0; i < j->nsets && n < max; i++)
        out[n++] = j->sets[i].n;
    return n;
}

/* Takes one rank's full request into the table; NULL or what is wrong. */
static const char *submit_one(struct negot *n, int rank, const Kolo__TensorRequest *tr)
{
    if (tr->coll == KOLO_COLL_JOIN) {
        if (!n->rank_joined[rank]) {
            n->rank_joined[rank] = true;
            n->njoined++;
        }
        n->last_joined = rank;
        return NULL;
    }
    if (!tr->name[0] || tr->n_shape > 64)
        return "a request without a name, or with too many dimensions";
    struct entry *e = negot_find(n, tr->name);
    if (!e && !(e = negot_add(n, tr->name)))
        return "out of memory";
    if (e->reqs[rank])
        return "a tensor was submitted twice";
    e->reqs[rank] = tensor_req_from_msg(tr);
    if (!e->reqs[rank])
        return "out of memory";
    e->count++;
    e->arrive_us[rank] = now_mono_us();
    if (n->tl)
        coord_timeline_request(n->tl, e->name, mismatch_coll_name(tr->coll), rank, e->count == 1);
    return NULL;
}

/* ---------------------------------------------------------------- resuming
 *
 * After a restart the coordinator has the job and its generation (SQLite)
 * but not the generation's negotiation: the log, the cursors, the tensors
 * in flight. Its first answer to each rank's Negotiate asks for a resume;
 * each rank then sends its cursor, every operation it has in flight with
 * no response yet, in full, and the packed responses it received lately.
 * Once every rank is in, the log is rebuilt from the slowest cursor to the
 * fastest out of those copies (negotiation/resume.h: the same entry is
 * identical on every rank that has it), a rank's in-flight operations that
 * the rebuilt log answers past its cursor are left out, the others are
 * submitted again, and every rank gets its answer: the job goes on without
 * a reset and without losing a step.
 *
 * The response cache: ranks with readiness rounds keep theirs (cached
 * training goes on while the coordinator is away) and send it, with its
 * hash; the id map is rebuilt from those tables and the rebuilt entries
 * keep their ids. Tables that disagree beyond what entries some rank has
 * not run explain get a cache_reset entry after the rebuilt ones: every
 * rank clears its cache there. Ranks without rounds drop their caches and
 * the rebuilt entries' ids.
 *
 * If a rank does not resume within NEGOT_RESUME_MS, or an entry some rank
 * still needs is nowhere, the generation fails with the reason, which an
 * elastic job turns into a reset from the last commit.
 */

#define NEGOT_RESUME_MS  30000
#define NEGOT_RESUME_GAP 4096 /* most log entries a resume rebuilds */

static void resume_fail(struct coord *c, struct job *j, struct negot *n, const char *why)
{
    n->resume_failed = strdup(why);
    coord_event(c, j->id, NULL, "job.resume_failed", "generation %llu: %s",
                (unsigned long long)n->generation, why);
    resume_drop(n, KOLO_EPEER, why);
}

static void resume_rebuild(struct coord *c, struct job *j, struct negot *n)
{
    struct resume_rank *ranks = calloc((size_t)n->size, sizeof(*ranks));
    if (!ranks) {
        resume_fail(c, j, n, "out of memory resuming");
        return;
    }
    for (int r = 0; r < n->size; r++) {
        const Kolo__NegotiateRequest *q = n->res[r].req;
        ranks[r] = (struct resume_rank){.cursor = q->cursor, .executed = q->executed,
                                        .held = q->held, .nheld = q->n_held,
                                        .cache = q->cache, .ncache = q->n_cache,
                                        .cache_hash = q->cache_hash, .rounds = q->rounds};
    }
    /* With readiness rounds the ranks keep their caches, so the entries
     * keep their ids: every rank then runs the same entries and holds the
     * same table. Without, the ranks drop their caches and the ids go. */
    char why[300];
    struct resume_log rl;
    int rc = resume_log_rebuild(ranks, n->size, NEGOT_RESUME_GAP, n->rounds, &rl, why, sizeof why);
    if (rc) {
        free(ranks);
        resume_fail(c, j, n, rc == KOLO_ENOMEM ? "out of memory resuming" : why);
        return;
    }
    uint32_t next_id = 1;
    char cache_why[300] = "";
    int cache_rc = n->rounds ? resume_cache(n->cache, ranks, n->size, &next_id, cache_why,
                                            sizeof cache_why)
                             : 0;
    free(ranks);
    if (next_id > n->next_id)
        n->next_id = next_id < NEGOT_CACHE_MAX ? next_id : NEGOT_CACHE_MAX;
    rlog_restart(&n->log, rl.base);
    /* an entry that does not go in would shift every later one's index */
    bool stored = true;
    for (uint64_t i = 0; i < rl.top - rl.base && stored; i++)
        stored = log_append(n, rl.ents[i]) == 0;
    /* every rank clears its cache at this entry, in the same round */
    Kolo__Response reset = KOLO__RESPONSE__INIT;
    reset.cache_reset = true;
    if (stored && cache_rc != 0)
        stored = log_append(n, &reset) == 0;
    if (!stored) {
        resume_log_free(&rl);
        resume_fail(c, j, n, "out of memory rebuilding the log");
        return;
    }
    if (cache_rc != 0) {
        tcache_clear(n->cache);
        tcache_reap(n->cache);
        n->next_id = 1;
        LOGW("coord", "job %llu generation %llu: %s; every rank clears its response cache at "
             "log index %llu", (unsigned long long)j->id, (unsigned long long)n->generation,
             cache_rc == KOLO_ENOMEM ? "out of memory restoring the response cache" : cache_why,
             (unsigned long long)reset.index);
        coord_event(c, j->id, NULL, "job.cache_reset",
                    "generation %llu: the ranks' response caches disagreed after the coordinator "
                    "restart (%s); every rank cleared its cache at log index %llu",
                    (unsigned long long)n->generation,
                    cache_rc == KOLO_ENOMEM ? "out of memory" : cache_why,
                    (unsigned long long)reset.index);
    }
    int resubmitted = 0;
    for (int r = 0; r < n->size; r++) {
        Kolo__NegotiateRequest *q = n->res[r].req;
        n->cursor[r] = q->cursor;
        n->peers[r].joined = true;
        for (size_t i = 0; i < q->n_requests; i++) {
            const char *name = q->requests[i]->name;
            if (resume_log_answers(&rl, q->cursor, name))
                continue;
            const char *bad = submit_one(n, r, q->requests[i]);
            if (bad)
                LOGW("coord", "job %llu: resuming rank %d's %s: %s", (unsigned long long)j->id, r,
                     name, bad);
            resubmitted++;
        }
    }
    n->joined = n->size;
    n->complete = true;
    c->m.resumes++;
    negot_progress(c, n);
    coord_event(c, j->id, NULL, "job.resumed",
                "generation %llu resumed after a coordinator restart: log %llu..%llu rebuilt, "
                "%d request(s) submitted again, %u response cache id(s) restored",
                (unsigned long long)n->generation, (unsigned long long)rl.base,
                (unsigned long long)rl.top, resubmitted, tcache_count(n->cache));
    for (int r = 0; r < n->size; r++) {
        negot_answer(n, n->res[r].call, n->cursor[r]);
        n->res[r].call = NULL;
        kolo__negotiate_request__free_unpacked(n->res[r].req, NULL);
        n->res[r].req = NULL;
    }
    resume_log_free(&rl);
}

/* A Negotiate for a generation whose negotiation this coordinator does not
 * have (it restarted): ask for a resume, or take one. */
static void negotiate_resume(struct coord *c, struct job *j, struct negot *n,
                             struct rpc_call *call, int rank, Kolo__NegotiateRequest *req)
{
    if (n->resume_failed) {
        kolo__negotiate_request__free_unpacked(req, NULL);
        c->m.rpc_errors[M_WORKER_NEGOTIATE]++;
        rpc_call_error(call, KOLO_EPEER, "%s", n->resume_failed);
        return;
    }
    if (n->nresumed == 0 || !n->res)
        n->session = req->session; /* the session the ranks were in */
    if (req->session != n->session) {
        c->m.rpc_errors[M_WORKER_NEGOTIATE]++;
        rpc_call_error(call, KOLO_ESTALE, "rank %d resumes session %u; the others session %u",
                       rank, req->session, n->session);
        kolo__negotiate_request__free_unpacked(req, NULL);
        return;
    }
    note_rounds(n, req);
    if (!n->res && !(n->res = calloc((size_t)n->size, sizeof(*n->res)))) {
        kolo__negotiate_request__free_unpacked(req, NULL);
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return;
    }
    if (!n->resume_deadline)
        n->resume_deadline = now_mono_ms() + NEGOT_RESUME_MS;
    if (!req->resume) {
        kolo__negotiate_request__free_unpacked(req, NULL);
        Kolo__NegotiateReply rep = KOLO__NEGOTIATE_REPLY__INIT;
        rep.resume = true;
        coord_send_pb(call, &rep.base);
        return;
    }
    struct resume_in *in = &n->res[rank];
    if (in->call) {
        Kolo__NegotiateReply rep = KOLO__NEGOTIATE_REPLY__INIT;
        rep.resume = true; /* superseded by this newer resume */
        coord_send_pb(in->call, &rep.base);
    }
    if (in->req)
        kolo__negotiate_request__free_unpacked(in->req, NULL);
    else
        n->nresumed++;
    in->req = req;
    in->call = call;
    /* The ranks keep the ids the old coordinator gave for their own
     * readiness rounds: new ids start above all of them, so no id ever
     * means two tensors. */
    if (req->max_cache_id >= n->next_id && req->max_cache_id < NEGOT_CACHE_MAX)
        n->next_id = req->max_cache_id + 1;
    LOGI("coord", "job %llu generation %llu: rank %d resumes at log index %llu (%d of %d)",
         (unsigned long long)j->id, (unsigned long long)n->generation, rank,
         (unsigned long long)req->cursor, n->nresumed, n->size);
    if (n->nresumed == n->size)
        resume_rebuild(c, j, n);
}

static void rpc_negotiate(struct coord *c, struct rpc_call *call)
{
    struct job *j = worker_job(c, call, M_WORKER_NEGOTIATE);
    if (!j)
        return;
    const struct rpc_frame *f = rpc_call_frame(call);
    int rank = f->rank;
    Kolo__NegotiateRequest *req = kolo__negotiate_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_WORKER_NEGOTIATE]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed NegotiateRequest");
        return;
    }
    struct negot **slot = negot_slot(c, j, call, req->process_set, 0, M_WORKER_NEGOTIATE);
    if (!slot) {
        kolo__negotiate_request__free_unpacked(req, NULL);
        return;
    }
    struct negot *n = *slot;
    if (!n->complete && n->joined == 0) {
        negotiate_resume(c, j, n, call, rank, req);
        return;
    }
    const char *bad_state = NULL;
    int bad_code = KOLO_ESTATE;
    char why[200];
    if (req->session != n->session) {
        snprintf(why, sizeof(why), "rank %d negotiates in session %u of generation %llu; the "
                 "ranks are in session %u (init after shutdown)", rank, req->session,
                 (unsigned long long)n->generation, n->session);
        bad_state = why;
        bad_code = KOLO_ESTALE;
    } else if (!n->complete) {
        snprintf(why, sizeof(why), "rendezvous of generation %llu is not complete",
                 (unsigned long long)n->generation);
        bad_state = why;
    }
    if (bad_state) {
        kolo__negotiate_request__free_unpacked(req, NULL);
        c->m.rpc_errors[M_WORKER_NEGOTIATE]++;
        rpc_call_error(call, bad_code, "%s", bad_state);
        return;
    }
    if (!req->shutdown) /* a leave says nothing about the rounds */
        note_rounds(n, req);
    uint64_t log_end_before = rlog_end(&n->log);
    if (n->parked[rank]) {
        /* The worker has something new; its older call ends now. */
        struct rpc_call *old = n->parked[rank];
        n->parked[rank] = NULL;
        negot_answer(n, old, n->cursor[rank]);
    }
    if (req->cursor > n->cursor[rank] && req->cursor <= rlog_end(&n->log))
        n->cursor[rank] = req->cursor;
    /* under readiness rounds the ranks report when their ops ended
     * (coord_timeline_spans): a fetched entry may not have run yet */
    if (n->tl && !n->rounds && coord_timeline_waiting(n->tl)) {
        uint64_t min = UINT64_MAX;
        for (int r = 0; r < n->size; r++)
            min = n->cursor[r] < min ? n->cursor[r] : min;
        coord_timeline_fetched(n->tl, min);
    }
    const char *bad = NULL;
    if (!n->shut) {
        for (size_t i = 0; i < req->n_cached && !bad; i++) {
            uint32_t id = req->cached[i];
            const struct tensor_req *sig = tcache_sig(n->cache, id);
            if (!sig) {
                bad = "unknown cache id";
                break;
            }
            struct entry *e = n->cache_pending[id];
            if (!e)
                e = negot_find(n, tcache_name(n->cache, id));
            if (!e && !(e = negot_add(n, tcache_name(n->cache, id))))
                break;
            e->cache_id = id;
            n->cache_pending[id] = e;
            if (e->reqs[rank]) {
                bad = "a tensor was submitted twice";
                break;
            }
            e->reqs[rank] = (struct tensor_req *)sig; /* lent: never written or freed */
            e->borrowed[rank] = 1;
            e->count++;
            e->arrive_us[rank] = now_mono_us();
            if (n->tl)
                coord_timeline_request(n->tl, e->name, mismatch_coll_name(e->reqs[rank]->coll), rank,
                                       e->count == 1);
        }
        for (size_t i = 0; i < req->n_requests && !bad; i++)
            bad = submit_one(n, rank, req->requests[i]);
        if (req->shutdown) {
            char why[600];
            mismatch_shutdown_text(why, sizeof why, rank, req->reason);
            negot_shutdown(c, n, KOLO_ESHUTDOWN, why);
        } else {
            negot_progress(c, n);
        }
    }
    bool leaving = req->shutdown;
    uint32_t wait = req->wait_ms > NEGOT_MAX_WAIT_MS ? NEGOT_MAX_WAIT_MS : req->wait_ms;
    kolo__negotiate_request__free_unpacked(req, NULL);
    if (leaving && !n->peers[rank].left) {
        n->peers[rank].left = true;
        n->nleft++;
    }
    if (bad) {
        c->m.rpc_errors[M_WORKER_NEGOTIATE]++;
        rpc_call_error(call, KOLO_EPROTO, "rank %d: %s", rank, bad);
        return;
    }
    /* Waking and trimming scan every rank: do it only when the log grew
     * (and trim now and then), or a step would cost O(ranks^2). */
    uint64_t log_end = rlog_end(&n->log);
    if (log_end != log_end_before)
        negot_wake(n);
    if (n->cursor[rank] < log_end || wait == 0) {
        negot_answer(n, call, n->cursor[rank]);
    } else {
        n->parked[rank] = call;
        n->parked_deadline[rank] = now_mono_ms() + wait;
    }
    if (++n->calls_since_trim >= 64 || n->log.len >= 4096) {
        n->calls_since_trim = 0;
        log_trim(n);
    }
    if (leaving && n->nleft == n->size) {
        if (slot == &j->negot)
            session_drained(c, j, slot);
        else
            set_drained(j, slot); /* set ids are not reused: it is over */
    }
}

/* An elastic worker asking for its place (rank, size, generation) by its
 * worker id. The frame's generation is whatever the worker last knew, so
 * it is not fenced here; the job, its state and the worker id are checked
 * instead (coord_elastic.c). */
static bool rpc_assign(struct coord *c, struct rpc_call *call)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__RendezvousRequest *req = kolo__rendezvous_request__unpack(NULL, f->body_len, f->body);
    if (!req || !req->worker_id) {
        if (req)
            kolo__rendezvous_request__free_unpacked(req, NULL);
        return false; /* the ordinary rendezvous path answers */
    }
    uint64_t wid = req->worker_id;
    uint32_t wait = req->wait_ms;
    kolo__rendezvous_request__free_unpacked(req, NULL);
    struct job *j = coord_job_find(c, f->job_id);
    if (!j || !j->el) {
        c->m.rpc_errors[M_WORKER_RENDEZVOUS]++;
        rpc_call_error(call, KOLO_EINVAL, "job %llu is not a running elastic job",
                       (unsigned long long)f->job_id);
    } else if (j->state != JOB_RUNNING) {
        c->m.rpc_errors[M_WORKER_RENDEZVOUS]++;
        rpc_call_error(call, KOLO_ESHUTDOWN, "the job is not running: %s",
                       j->reason ? j->reason : "");
    } else {
        coord_elastic_assign(c, j, call, wid, wait);
    }
    return true;
}

void coord_rpc_worker(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    if (m == M_WORKER_RENDEZVOUS) {
        if (!rpc_assign(c, call))
            coord_rpc_rendezvous(c, call);
    } else {
        rpc_negotiate(c, call);
    }
}

void coord_negot_hosts_updated(struct coord *c, struct job *j)
{
    (void)c;
    struct negot *n = j->negot;
    if (n && n->generation == j->generation)
        negot_wake_all(n);
}

/* The negotiation borrows j->tl: call after changing it. */
static void negot_set_timeline(struct job *j)
{
    if (!j->negot)
        return;
    bool was = j->negot->tl != NULL;
    j->negot->tl = j->tl;
    if (was != (j->tl != NULL))
        negot_wake_all(j->negot); /* the ranks start (or stop) tracing their rounds */
}

/* WorkerService.Timeline: start or stop the job's timeline at run time;
 * the negotiation, which writes it, learns at once. */
void coord_rpc_timeline(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    (void)m;
    struct job *j = coord_worker_fence(c, call, M_WORKER_TIMELINE);
    if (!j)
        return;
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__TimelineRequest *req = kolo__timeline_request__unpack(NULL, f->body_len, f->body);
    if (!req || strlen(req->path) >= 4096) {
        c->m.rpc_errors[M_WORKER_TIMELINE]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed TimelineRequest");
        if (req)
            kolo__timeline_request__free_unpacked(req, NULL);
        return;
    }
    j->tl_checked = true;
    char want[8192] = "";
    if (req->path[0] == '/' || !j->cwd || !j->cwd[0])
        snprintf(want, sizeof(want), "%s", req->path);
    else if (req->path[0])
        snprintf(want, sizeof(want), "%s/%s", j->cwd, req->path);
    bool same = j->tl && want[0] && strcmp(coord_timeline_label(j->tl), want) == 0;
    if (!same && j->tl) {
        struct timeline *old = j->tl;
        j->tl = NULL;
        /* REST keeps serving the stopped file until another one starts */
        char *last = coord_timeline_path(old)[0] ? strdup(coord_timeline_path(old)) : NULL;
        if (last) {
            free(j->tl_last);
            j->tl_last = last;
        }
        negot_set_timeline(j); /* the negotiation borrowed it */
        coord_timeline_free(j->tl_draining);
        j->tl_draining = NULL;
        if (j->negot && j->negot->rounds) {
            /* the ranks' spans of its last ops are still on their way */
            coord_timeline_stop(old);
            j->tl_draining = old;
        } else {
            coord_timeline_free(old);
        }
    }
    if (!same && want[0]) {
        /* one writer per file: a drain of the same path (stop, then start
         * again) must be over before the file is truncated */
        coord_timeline_free(j->tl_draining);
        j->tl_draining = NULL;
        j->tl = coord_timeline_open_path(c, j, req->path);
        if (!j->tl) {
            c->m.rpc_errors[M_WORKER_TIMELINE]++;
            rpc_call_error(call, KOLO_EIO, "cannot write the timeline %s: %s", want,
                           coord_timeline_why(errno));
            kolo__timeline_request__free_unpacked(req, NULL);
            return;
        }
        negot_set_timeline(j);
    }
    Kolo__TimelineReply rep = KOLO__TIMELINE_REPLY__INIT;
    rep.path = j->tl ? (char *)coord_timeline_label(j->tl) : "";
    coord_send_pb(call, &rep.base);
    kolo__timeline_request__free_unpacked(req, NULL);
}

bool coord_negot_rank_joined(const struct job *j, int rank)
{
    const struct negot *n = j->negot;
    return n && n->generation == j->generation && rank >= 0 && rank < n->size &&
           n->peers[rank].joined;
}

/* ---------------------------------------------------------------- lifecycle */

/* One stall warning: the ops missing the same ranks, some of their names. */
#define STALL_GROUPS 8
struct stall_group {
    char missing[512];
    char names[400];
    int count, listed;
    uint64_t age_ms; /* the oldest */
};

static void stall_group_add(struct stall_group *gs, int *n, const char *missing, const char *name,
                            uint64_t age_ms)
{
    struct stall_group *g = NULL;
    for (int i = 0; i < *n && !g; i++)
        if (strcmp(gs[i].missing, missing) == 0)
            g = &gs[i];
    if (!g && *n < STALL_GROUPS) {
        g = &gs[(*n)++];
        memset(g, 0, sizeof *g);
        str_copy(g->missing, missing, sizeof g->missing);
    } else if (!g) { /* more sets of missing ranks than groups: the last takes the rest */
        g = &gs[STALL_GROUPS - 1];
        str_copy(g->missing, "several sets of ranks", sizeof g->missing);
    }
    size_t used = strlen(g->names);
    if (used + strlen(name) + 3 < sizeof g->names) {
        snprintf(g->names + used, sizeof g->names - used, "%s%s", used ? ", " : "", name);
        g->listed++;
    }
    g->count++;
    if (age_ms > g->age_ms)
        g->age_ms = age_ms;
}

static void stall_missing(struct negot *n, struct entry *e, char *out, size_t size)
{
    size_t o = 0;
    int nmiss = 0;
    out[0] = '\0';
    for (int r = 0; r < n->size && o + 16 < size; r++) {
        if (!e->reqs[r] && !n->rank_joined[r]) {
            o += (size_t)snprintf(out + o, size - o, "%s%d", nmiss ? ", " : "", r);
            nmiss++;
        }
    }
}

static void negot_ended(struct coord *c, struct negot *n, int code, const char *why)
{
    resume_drop(n, code, why);
    negot_shutdown(c, n, code, why);
    for (int r = 0; r < n->size; r++) {
        if (n->peers[r].parked) {
            rpc_call_error(n->peers[r].parked, code, "%s", why);
            n->peers[r].parked = NULL;
        }
        if (n->parked[r]) {
            negot_answer(n, n->parked[r], n->cursor[r]);
            n->parked[r] = NULL;
        }
    }
}

void coord_negot_job_ended(struct coord *c, struct job *j, int code, const char *why)
{
    struct negot *all[1 + NEGOT_MAX_SETS];
    int k = job_negots(j, all, 1 + NEGOT_MAX_SETS);
    for (int i = 0; i < k; i++)
        negot_ended(c, all[i], code, why);
}

static void negot_cron(struct coord *c, struct job *j, struct negot *n, uint64_t now)
{
    if (n->resume_deadline && !n->complete && !n->resume_failed && now >= n->resume_deadline) {
        char missing[200] = "";
        size_t o = 0;
        for (int r = 0; r < n->size && o + 16 < sizeof(missing); r++)
            if (!n->res || !n->res[r].req)
                o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%s%d", o ? ", " : "", r);
        char why[300];
        snprintf(why, sizeof(why),
                 "the coordinator restarted and rank(s) %s did not resume within %d s", missing,
                 NEGOT_RESUME_MS / 1000);
        resume_fail(c, j, n, why);
    }
    for (int r = 0; r < n->size; r++) {
        struct peer *p = &n->peers[r];
        if (p->parked && now >= p->deadline) {
            rendezvous_answer(n, p->parked);
            p->parked = NULL;
        }
        if (p->next && now >= p->next_deadline) {
            rendezvous_not_yet(p->next);
            p->next = NULL;
        }
        if (n->parked[r] && now >= n->parked_deadline[r]) {
            negot_answer(n, n->parked[r], n->cursor[r]);
            n->parked[r] = NULL;
        }
    }
    /* Stall inspector: an op some ranks submitted and others did not. The
     * ops that pass the warning age together and miss the same ranks make
     * one warning (Horovod's lists the tensors of each missing rank). */
    struct stall_group groups[STALL_GROUPS];
    int ngroups = 0;
    for (struct entry *e = n->head; e && !n->shut; e = e->next) {
        uint64_t age = now - e->first_mono;
        bool warn = !e->warned && n->stall_warning_ms >= 0 && age >= (uint64_t)n->stall_warning_ms;
        bool kill = n->stall_shutdown_ms > 0 && age >= (uint64_t)n->stall_shutdown_ms;
        if (!warn && !kill)
            continue;
        char missing[512];
        stall_missing(n, e, missing, sizeof(missing));
        if (warn) {
            e->warned = true;
            stall_group_add(groups, &ngroups, missing, e->name, age);
        }
        if (kill) {
            char why[800];
            snprintf(why, sizeof(why),
                     "stall shutdown: tensor %s waited %llu s for rank(s) %s (stall shutdown "
                     "time %lld s)",
                     e->name, (unsigned long long)(age / 1000), missing,
                     (long long)(n->stall_shutdown_ms / 1000));
            coord_event(c, j->id, NULL, "op.stall_shutdown", "%s", why);
            coord_stacks_take(c, j, "at the stall shutdown");
            negot_shutdown(c, n, KOLO_ETIMEDOUT, why);
            break;
        }
    }
    for (int g = 0; g < ngroups; g++) {
        struct stall_group *x = &groups[g];
        coord_event(c, j->id, NULL, "op.stalled",
                    "stall: %d tensor(s) waited %llu s for rank(s) %s, which never submitted "
                    "them while the others wait (a rank diverged, hung or is slow): %s%s",
                    x->count, (unsigned long long)(x->age_ms / 1000), x->missing, x->names,
                    x->count > x->listed ? " ..." : "");
    }
    if (ngroups) /* what the ranks are doing meanwhile: the verdict */
        coord_stacks_take(c, j, "at the stall");
}

void coord_negot_cron(struct coord *c, struct job *j, uint64_t now)
{
    struct negot *all[1 + NEGOT_MAX_SETS];
    int k = job_negots(j, all, 1 + NEGOT_MAX_SETS);
    for (int i = 0; i < k; i++)
        negot_cron(c, j, all[i], now);
}

/* Ops that some ranks submitted and others not, as JSON (REST /stalls). */
size_t coord_negot_stalls(const struct job *j, uint64_t min_age_ms, struct negot_stall *out,
                          size_t max)
{
    const struct negot *n = j->negot;
    uint64_t now = now_mono_ms();
    size_t k = 0;
    for (const struct entry *e = n ? n->head : NULL; e; e = e->next) {
        uint64_t age = now - e->first_mono;
        if (age < min_age_ms || k++ >= max)
            continue;
        out[k - 1] = (struct negot_stall){.name = e->name,
                                        .waiting_ms = age,
                                        .submitted = e->count,
                                        .reqs = (const void *const *)e->reqs,
                                        .rank_joined = n->rank_joined,
                                        .size = n->size};
    }
    return k;
}

bool coord_negot_stall_missing(const struct negot_stall *s, int rank)
{
    return !s->reqs[rank] && !s->rank_joined[rank];
}

/* The coordinator stops: its workers' parked calls get KOLO_EIO, which
 * they retry as they do a lost connection, so a restart (systemctl
 * restart, an upgrade) is resumed like a kill -9 and ends no job. */
void coord_negot_drop_parked(struct coord *c, struct job *j)
{
    struct negot *all[1 + NEGOT_MAX_SETS];
    int k = job_negots(j, all, 1 + NEGOT_MAX_SETS);
    for (int i = 0; i < k; i++)
        negot_drop_parked(all[i], KOLO_EIO, COORD_STOPPING_WHY);
    (void)c;
}
