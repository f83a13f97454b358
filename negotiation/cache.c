/*
 * cache.c - the response cache's table (cache.h): ids to names and
 * signatures, names to ids, ages, and the hash the ranks and a restarted
 * coordinator compare.
 */
#include "cache.h"

#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "round.h"
#include "util.h"

#define TCACHE_BUCKETS 4096u
#define FNV_BASIS 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

struct slot {
    uint32_t id;
    char *name;
    struct tensor_req *sig;
    uint64_t born; /* tc->clock when the name took the id */
    struct slot *next; /* name bucket chain */
};

struct tensor_cache {
    struct slot *by_id[ROUND_MAX_ID + 1];
    struct slot *buckets[TCACHE_BUCKETS];
    uint32_t top, count;
    uint64_t clock;
    struct tensor_req **retired;
    size_t nretired, retired_cap;
};

/* ---------------------------------------------------------------- requests */

void tensor_req_free(struct tensor_req *t)
{
    if (!t)
        return;
    free(t->shape);
    free(t->splits);
    free(t);
}

struct tensor_req *tensor_req_copy(const struct tensor_req *s)
{
    struct tensor_req *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    *t = *s;
    t->shape = malloc(((size_t)s->ndim + 1) * sizeof(int64_t));
    t->splits = malloc(((size_t)s->nsplits + 1) * sizeof(int32_t));
    if (!t->shape || !t->splits) {
        free(t->shape);
        free(t->splits);
        free(t);
        return NULL;
    }
    if (s->ndim > 0)
        memcpy(t->shape, s->shape, (size_t)s->ndim * sizeof(int64_t));
    if (s->nsplits > 0)
        memcpy(t->splits, s->splits, (size_t)s->nsplits * sizeof(int32_t));
    return t;
}

bool tensor_sig_equal(const struct tensor_req *a, const struct tensor_req *b)
{
    return a->coll == b->coll && a->dtype == b->dtype && a->op == b->op && a->ndim == b->ndim &&
           (a->ndim <= 0 || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t)) == 0) &&
           a->prescale == b->prescale && a->postscale == b->postscale && a->device == b->device &&
           (a->coll != KOLO_COLL_BROADCAST || a->root == b->root);
}

/* ---------------------------------------------------------------- the table */

struct tensor_cache *tcache_new(void)
{
    return calloc(1, sizeof(struct tensor_cache));
}

/* Puts sig on the retired list. If the list cannot grow, sig is leaked
 * rather than freed: an entry may still borrow it. */
static void retire(struct tensor_cache *tc, struct tensor_req *sig)
{
    if (!sig)
        return;
    if (tc->nretired == tc->retired_cap) {
        size_t cap = tc->retired_cap ? tc->retired_cap * 2 : 16;
        struct tensor_req **r = realloc(tc->retired, cap * sizeof(*r));
        if (!r)
            return;
        tc->retired = r;
        tc->retired_cap = cap;
    }
    tc->retired[tc->nretired++] = sig;
}

static void slot_unlink(struct tensor_cache *tc, struct slot *s)
{
    struct slot **pp = &tc->buckets[str_hash(s->name) % TCACHE_BUCKETS];
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp)
        *pp = s->next;
    tc->by_id[s->id] = NULL;
    tc->count--;
    retire(tc, s->sig);
    free(s->name);
    free(s);
}

void tcache_drop(struct tensor_cache *tc, uint32_t id)
{
    if (id >= 1 && id <= ROUND_MAX_ID && tc->by_id[id])
        slot_unlink(tc, tc->by_id[id]);
}

void tcache_clear(struct tensor_cache *tc)
{
    for (uint32_t id = 1; id <= tc->top; id++)
        tcache_drop(tc, id);
    tc->top = 0;
}

void tcache_reap(struct tensor_cache *tc)
{
    for (size_t i = 0; i < tc->nretired; i++)
        tensor_req_free(tc->retired[i]);
    tc->nretired = 0;
}

void tcache_free(struct tensor_cache *tc)
{
    if (!tc)
        return;
    tcache_clear(tc);
    tcache_reap(tc);
    free(tc->retired);
    free(tc);
}

static struct slot *find_hashed(const struct tensor_cache *tc, const char *name, uint64_t hash)
{
    for (struct slot *s = tc->buckets[hash % TCACHE_BUCKETS]; s; s = s->next)
        if (strcmp(s->name, name) == 0)
            return s;
    return NULL;
}

static struct slot *find(const struct tensor_cache *tc, const char *name)
{
    return find_hashed(tc, name, str_hash(name));
}

uint32_t tcache_id_hashed(const struct tensor_cache *tc, const char *name, uint64_t hash)
{
    const struct slot *s = find_hashed(tc, name, hash);
    return s ? s->id : 0;
}

uint32_t tcache_id(const struct tensor_cache *tc, const char *name)
{
    return tcache_id_hashed(tc, name, str_hash(name));
}

const char *tcache_name(const struct tensor_cache *tc, uint32_t id)
{
    return id >= 1 && id <= ROUND_MAX_ID && tc->by_id[id] ? tc->by_id[id]->name : NULL;
}

const struct tensor_req *tcache_sig(const struct tensor_cache *tc, uint32_t id)
{
    return id >= 1 && id <= ROUND_MAX_ID && tc->by_id[id] ? tc->by_id[id]->sig : NULL;
}

uint32_t tcache_top(const struct tensor_cache *tc)
{
    return tc->top;
}

uint32_t tcache_count(const struct tensor_cache *tc)
{
    return tc->count;
}

int tcache_bind(struct tensor_cache *tc, uint32_t id, const char *name,
                const struct tensor_req *sig)
{
    if (id < 1 || id > ROUND_MAX_ID || !name || !name[0] || !sig)
        return KOLO_EINVAL;
    struct tensor_req *copy = tensor_req_copy(sig);
    if (!copy)
        return KOLO_ENOMEM;
    struct slot *s = tc->by_id[id];
    if (s && strcmp(s->name, name) == 0) { /* same name: a new signature */
        retire(tc, s->sig);
        s->sig = copy;
        return 0;
    }
    struct slot *fresh = calloc(1, sizeof(*fresh));
    if (!fresh || !(fresh->name = strdup(name))) {
        free(fresh);
        tensor_req_free(copy);
        return KOLO_ENOMEM;
    }
    if (s)
        slot_unlink(tc, s);
    struct slot *old = find(tc, name);
    if (old)
        slot_unlink(tc, old);
    fresh->id = id;
    fresh->sig = copy;
    fresh->born = ++tc->clock;
    uint64_t b = str_hash(name) % TCACHE_BUCKETS;
    fresh->next = tc->buckets[b];
    tc->buckets[b] = fresh;
    tc->by_id[id] = fresh;
    tc->count++;
    if (id > tc->top)
        tc->top = id;
    return 0;
}

uint32_t tcache_oldest(const struct tensor_cache *tc, uint32_t below,
                       bool (*busy)(const void *arg, uint32_t id), const void *arg)
{
    uint32_t victim = 0;
    uint64_t victim_born = UINT64_MAX;
    if (below > ROUND_MAX_ID + 1)
        below = ROUND_MAX_ID + 1;
    for (uint32_t id = 1; id < below; id++) {
        if (busy && busy(arg, id))
            continue;
        uint64_t born = tc->by_id[id] ? tc->by_id[id]->born : 0;
        if (born < victim_born) {
            victim = id;
            victim_born = born;
            if (born == 0)
                break; /* free: nothing older */
        }
    }
    return victim;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= FNV_PRIME;
    }
    return h;
}

uint64_t tcache_hash(const struct tensor_cache *tc)
{
    uint64_t h = FNV_BASIS;
    for (uint32_t id = 1; id <= tc->top; id++) {
        const struct slot *s = tc->by_id[id];
        if (!s)
            continue;
        const struct tensor_req *t = s->sig;
        uint32_t words[5] = {id, t->coll, t->dtype, t->op, (uint32_t)t->ndim};
        int32_t device = t->device;
        h = fnv(h, words, sizeof(words));
        h = fnv(h, s->name, strlen(s->name) + 1);
        if (t->ndim > 0)
            h = fnv(h, t->shape, (size_t)t->ndim * sizeof(int64_t));
        h = fnv(h, &t->prescale, sizeof(t->prescale));
        h = fnv(h, &t->postscale, sizeof(t->postscale));
        h = fnv(h, &device, sizeof(device));
        if (t->coll == KOLO_COLL_BROADCAST) {
            int32_t root = t->root;
            h = fnv(h, &root, sizeof(root));
        }
    }
    return h;
}
