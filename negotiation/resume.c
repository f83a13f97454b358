/*
 * resume.c - the log and the response cache rebuilt from what the ranks
 * hold after a coordinator restart (resume.h).
 */
#include "resume.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "round.h"

/* ---------------------------------------------------------------- requests */

struct tensor_req *tensor_req_from_msg(const Kolo__TensorRequest *m)
{
    struct tensor_req t = {
        .coll = m->coll,
        .dtype = m->dtype,
        .op = m->op,
        .ndim = (int)m->n_shape,
        .shape = m->shape,
        .prescale = m->prescale == 0 ? 1.0 : m->prescale,
        .postscale = m->postscale == 0 ? 1.0 : m->postscale,
        .root = m->root,
        .device = m->device,
        .splits = m->splits,
        .nsplits = (int)m->n_splits,
    };
    return tensor_req_copy(&t);
}

void tensor_req_to_msg(const struct tensor_req *t, const char *name, Kolo__TensorRequest *m)
{
    m->name = (char *)name;
    m->coll = t->coll;
    m->dtype = t->dtype;
    m->op = t->op;
    m->shape = t->shape;
    m->n_shape = (size_t)(t->ndim > 0 ? t->ndim : 0);
    m->prescale = t->prescale;
    m->postscale = t->postscale;
    m->root = t->root;
    m->device = t->device;
    m->splits = t->splits;
    m->n_splits = (size_t)(t->nsplits > 0 ? t->nsplits : 0);
}

/* ---------------------------------------------------------------- the log */

/* Calls take(arg, x) with every entry the ranks hold, unpacked (a copy
 * that does not unpack is skipped); take returns true when it keeps x,
 * else x is freed. */
static void each_held(const struct resume_rank *ranks, int size,
                      bool (*take)(void *arg, Kolo__Response *x), void *arg)
{
    for (int r = 0; r < size; r++) {
        for (size_t i = 0; i < ranks[r].nheld; i++) {
            const ProtobufCBinaryData *h = &ranks[r].held[i];
            Kolo__Response *x = kolo__response__unpack(NULL, h->len, h->data);
            if (x && !take(arg, x))
                kolo__response__free_unpacked(x, NULL);
        }
    }
}

/* each_held: the first copy of each entry of the rebuilt part */
static bool take_entry(void *arg, Kolo__Response *x)
{
    struct resume_log *l = arg;
    if (x->index < l->base || x->index >= l->top || l->ents[x->index - l->base])
        return false;
    l->ents[x->index - l->base] = x;
    return true;
}

void resume_log_free(struct resume_log *l)
{
    for (uint64_t i = 0; l->ents && i < l->top - l->base; i++)
        if (l->ents[i])
            kolo__response__free_unpacked(l->ents[i], NULL);
    free(l->ents);
    memset(l, 0, sizeof(*l));
}

int resume_log_rebuild(const struct resume_rank *ranks, int size, uint64_t max_gap,
                       bool keep_cache_ids, struct resume_log *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof(*out));
    uint64_t base = UINT64_MAX, top = 0;
    for (int r = 0; r < size; r++) {
        base = ranks[r].cursor < base ? ranks[r].cursor : base;
        top = ranks[r].cursor > top ? ranks[r].cursor : top;
    }
    if (size <= 0)
        base = top = 0;
    if (top - base > max_gap) {
        snprintf(why, whylen, "cannot resume after the coordinator restart: the ranks are %llu "
                 "log entries apart", (unsigned long long)(top - base));
        return KOLO_EPEER;
    }
    out->base = base;
    out->top = top;
    out->ents = calloc((size_t)(top - base) + 1, sizeof(*out->ents));
    if (!out->ents)
        return KOLO_ENOMEM;
    each_held(ranks, size, take_entry, out);
    for (uint64_t i = 0; i < top - base; i++) {
        if (!out->ents[i]) {
            snprintf(why, whylen, "cannot resume after the coordinator restart: log entry %llu "
                     "was lost with it", (unsigned long long)(base + i));
            resume_log_free(out);
            return KOLO_EPEER;
        }
        for (size_t k = 0; !keep_cache_ids && k < out->ents[i]->n_cache_ids; k++)
            out->ents[i]->cache_ids[k] = 0;
    }
    return 0;
}

bool resume_log_answers(const struct resume_log *l, uint64_t cursor, const char *name)
{
    for (uint64_t k = cursor < l->base ? l->base : cursor; k < l->top; k++)
        for (size_t m = 0; m < l->ents[k - l->base]->n_names; m++)
            if (strcmp(l->ents[k - l->base]->names[m], name) == 0)
                return true;
    return false;
}

/* ---------------------------------------------------------------- the cache */

int resume_table_load(struct tensor_cache *tc, Kolo__CacheEntry *const *cache, size_t n,
                      size_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        const Kolo__CacheEntry *e = cache[i];
        if (!e->tensor || e->id < 1 || e->id > ROUND_MAX_ID || !e->tensor->name[0] ||
            tcache_name(tc, e->id) || tcache_id(tc, e->tensor->name)) {
            *bad = i;
            return 1;
        }
        struct tensor_req *t = tensor_req_from_msg(e->tensor);
        int rc = t ? tcache_bind(tc, e->id, e->tensor->name, t) : KOLO_ENOMEM;
        tensor_req_free(t);
        if (rc)
            return rc;
    }
    return 0;
}

void *resume_table_of(const struct tensor_cache *tc, Kolo__CacheEntry ***out, size_t *n)
{
    size_t count = tcache_count(tc), k = 0;
    *n = 0;
    *out = NULL;
    if (count == 0)
        return NULL;
    void *block = calloc(count, sizeof(Kolo__CacheEntry *) + sizeof(Kolo__CacheEntry) +
                                    sizeof(Kolo__TensorRequest));
    if (!block)
        return NULL;
    Kolo__CacheEntry **ptrs = block;
    Kolo__CacheEntry *ents = (Kolo__CacheEntry *)(ptrs + count);
    Kolo__TensorRequest *ts = (Kolo__TensorRequest *)(ents + count);
    for (uint32_t id = 1; id <= tcache_top(tc) && k < count; id++) {
        const char *name = tcache_name(tc, id);
        if (!name)
            continue;
        kolo__cache_entry__init(&ents[k]);
        kolo__tensor_request__init(&ts[k]);
        tensor_req_to_msg(tcache_sig(tc, id), name, &ts[k]);
        ents[k].id = id;
        ents[k].tensor = &ts[k];
        ptrs[k] = &ents[k];
        k++;
    }
    *out = ptrs;
    *n = k;
    return block;
}

/* One rank's table as a cache (0), checked against its hash; 1 with why
 * when it is malformed or does not hash to what the rank said. */
static int load_table(const struct resume_rank *rk, int rank, struct tensor_cache *tc,
                      char *why, size_t whylen)
{
    size_t bad = 0;
    int rc = resume_table_load(tc, rk->cache, rk->ncache, &bad);
    if (rc == 1)
        snprintf(why, whylen, "rank %d's response cache is malformed (entry %zu, id %u)", rank,
                 bad, rk->cache[bad]->id);
    if (rc)
        return rc;
    if (tcache_hash(tc) != rk->cache_hash) {
        snprintf(why, whylen, "rank %d's response cache (%zu ids) does not match its hash",
                 rank, rk->ncache);
        return 1;
    }
    return 0;
}

/* each_held: the ids the entries give; those at or after `from` (some
 * rank has not run them) are unsettled. */
struct given_ids {
    uint64_t from;
    bool *unsettled; /* [ROUND_MAX_ID + 1] */
    uint32_t max;
};

static bool note_ids(void *arg, Kolo__Response *x)
{
    struct given_ids *g = arg;
    for (size_t k = 0; k < x->n_cache_ids; k++) {
        uint32_t id = x->cache_ids[k];
        if (id < 1 || id > ROUND_MAX_ID)
            continue;
        g->max = id > g->max ? id : g->max;
        if (x->index >= g->from)
            g->unsettled[id] = true;
    }
    return false;
}

int resume_cache(struct tensor_cache *into, const struct resume_rank *ranks, int size,
                 uint32_t *next_id, char *why, size_t whylen)
{
    why[0] = '\0';
    *next_id = 1;
    struct tensor_cache **tables = calloc((size_t)size + 1, sizeof(*tables));
    bool *given = calloc(ROUND_MAX_ID + 1, sizeof(*given));
    int rc = tables && given ? 0 : KOLO_ENOMEM;
    uint64_t from = UINT64_MAX;
    uint32_t top = 0;
    for (int r = 0; r < size && rc == 0; r++) {
        if (!ranks[r].rounds)
            continue;
        from = ranks[r].executed < from ? ranks[r].executed : from;
        if (!(tables[r] = tcache_new()))
            rc = KOLO_ENOMEM;
        else
            rc = load_table(&ranks[r], r, tables[r], why, whylen);
        if (tables[r] && tcache_top(tables[r]) > top)
            top = tcache_top(tables[r]);
    }
    if (rc == 0) {
        struct given_ids g = {.from = from, .unsettled = given};
        each_held(ranks, size, note_ids, &g);
        top = g.max > top ? g.max : top;
    }
    /* each id: every rank that holds it must agree, or an entry some rank
     * has not run must explain the difference */
    for (uint32_t id = 1; id <= top && rc == 0; id++) {
        int first = -1;
        bool differs = false;
        for (int r = 0; r < size && !differs; r++) {
            if (!tables[r] || !tcache_name(tables[r], id))
                continue;
            if (first < 0) {
                first = r;
                continue;
            }
            differs = strcmp(tcache_name(tables[r], id), tcache_name(tables[first], id)) != 0 ||
                      !tensor_sig_equal(tcache_sig(tables[r], id), tcache_sig(tables[first], id));
            if (differs && !given[id])
                snprintf(why, whylen, "ranks %d and %d disagree on response cache id %u (%s "
                         "against %s)", first, r, id, tcache_name(tables[first], id),
                         tcache_name(tables[r], id));
        }
        if (differs && !given[id]) {
            rc = 1;
        } else if (first >= 0 && !differs && !given[id]) {
            /* a name under two ids (on two ranks), nothing to explain it */
            const char *name = tcache_name(tables[first], id);
            uint32_t other = tcache_id(into, name);
            if (other) {
                snprintf(why, whylen, "the ranks disagree on the response cache id of %s (%u "
                         "and %u)", name, other, id);
                rc = 1;
            } else {
                rc = tcache_bind(into, id, name, tcache_sig(tables[first], id));
            }
        }
    }
    *next_id = top + 1;
    for (int r = 0; tables && r < size; r++)
        tcache_free(tables[r]);
    free(tables);
    free(given);
    if (rc != 0)
        tcache_clear(into);
    tcache_reap(into);
    return rc;
}
