/*
 * keep.c - the segments kept across elastic generations (keep.h): a
 * short list of parked ones, and the rule that decides what a host does
 * with them.
 */
#include "keep.h"

#include <pthread.h>
#include <stdlib.h>

#define KEEP_MEMBER_BITS 12 /* member indices below 4096, shmcoll's limit */
#define KEEP_MEMBER_MASK ((UINT64_C(1) << KEEP_MEMBER_BITS) - 1)

struct parked {
    uint64_t job, worker;
    struct coll *seg;
    struct parked *next;
};

/* Ranks as threads of one process park one each: a list, under a lock. */
static pthread_mutex_t parked_mu = PTHREAD_MUTEX_INITIALIZER;
static struct parked *parked_list;

void keep_park(uint64_t job, uint64_t worker, struct coll *seg)
{
    struct parked *gone = NULL, *p = malloc(sizeof *p);
    pthread_mutex_lock(&parked_mu);
    for (struct parked **pp = &parked_list; *pp;) {
        struct parked *q = *pp;
        if (q->job != job || q->worker == worker) {
            *pp = q->next;
            q->next = gone;
            gone = q;
        } else {
            pp = &q->next;
        }
    }
    if (p) {
        *p = (struct parked){.job = job, .worker = worker, .seg = seg, .next = parked_list};
        parked_list = p;
    }
    pthread_mutex_unlock(&parked_mu);
    if (!p)
        seg->ops->destroy(seg);
    while (gone) {
        struct parked *next = gone->next;
        gone->seg->ops->destroy(gone->seg);
        free(gone);
        gone = next;
    }
}

struct coll *keep_take(uint64_t job, uint64_t worker)
{
    struct coll *seg = NULL;
    pthread_mutex_lock(&parked_mu);
    for (struct parked **pp = &parked_list; *pp; pp = &(*pp)->next) {
        struct parked *q = *pp;
        if (q->job == job && q->worker == worker) {
            *pp = q->next;
            seg = q->seg;
            free(q);
            break;
        }
    }
    pthread_mutex_unlock(&parked_mu);
    return seg;
}

uint64_t keep_code(const struct coll *seg)
{
    return (shmcoll_id(seg) << KEEP_MEMBER_BITS) | (UINT64_C(1) << 63) |
           ((uint64_t)seg->rank & KEEP_MEMBER_MASK);
}

enum keep_plan keep_plan(const uint64_t *codes, int n, int held_size)
{
    if (n < 1 || codes[0] == 0)
        return KEEP_NONE;
    uint64_t seg = codes[0] & ~KEEP_MEMBER_MASK;
    bool same = (codes[0] & KEEP_MEMBER_MASK) == 0 && held_size == n;
    for (int i = 1; same && i < n; i++)
        same = codes[i] == (seg | (uint64_t)i);
    return same ? KEEP_REUSE : KEEP_FRESH;
}
