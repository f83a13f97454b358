/*
 * hier_plan.c - one rank's part in a job that spans hosts (see hier_plan.h).
 */
#include "hier_plan.h"

#include <stdlib.h>
#include <string.h>

#include "kolo/abi.h"

int hier_links(int m, int n, int *out)
{
    int k = 0;
    for (long d = 1; d < n; d <<= 1) {
        int cand[2] = {(int)((m + d) % n), (int)(((long)m - d % n + n) % n)};
        for (int j = 0; j < 2; j++) {
            int x = cand[j];
            bool seen = x == m;
            for (int i = 0; i < k && !seen; i++)
                seen = out[i] == x;
            if (!seen)
                out[k++] = x;
        }
    }
    /* increasing order: insertion sort of at most 64 */
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return k;
}

int hier_plan_make(struct hier_plan *p, const struct topology *t, int rank)
{
    memset(p, 0, sizeof *p);
    if (!t || rank < 0 || rank >= t->size)
        return KOLO_EINVAL;
    p->rank = rank;
    p->size = t->size;
    p->nhosts = t->nhosts;
    p->host = t->host[rank];
    p->local = t->local[rank];
    p->nlocal = t->count[p->host];
    p->lanes = t->min_local;
    p->lane = p->local < p->lanes ? p->local : -1;
    p->lane_size = t->nhosts;
    p->contiguous = topology_contiguous(t);
    p->lanes_min = HIER_LANES_MIN_BYTES;
    p->host_ranks = calloc((size_t)p->nlocal, sizeof(int));
    if (!p->host_ranks)
        goto nomem;
    for (int i = 0; i < p->nlocal; i++)
        p->host_ranks[i] = topology_rank(t, p->host, i);
    if (p->lane >= 0 && t->nhosts > 1) {
        int members[64];
        p->lane_ranks = calloc((size_t)t->nhosts, sizeof(int));
        p->links = calloc(64, sizeof(int));
        if (!p->lane_ranks || !p->links)
            goto nomem;
        for (int h = 0; h < t->nhosts; h++)
            p->lane_ranks[h] = topology_rank(t, h, p->lane);
        p->nlinks = hier_links(p->host, t->nhosts, members);
        for (int i = 0; i < p->nlinks; i++)
            p->links[i] = p->lane_ranks[members[i]];
    }
    return 0;
nomem:
    hier_plan_free(p);
    return KOLO_ENOMEM;
}

void hier_plan_free(struct hier_plan *p)
{
    free(p->lane_ranks);
    free(p->host_ranks);
    free(p->links);
    memset(p, 0, sizeof *p);
}

enum hier_algo hier_allreduce_algo(const struct hier_plan *p, size_t count, size_t esz)
{
    if (p->nhosts < 2 || p->lanes < 2 || count < (size_t)p->lanes ||
        count * esz < p->lanes_min)
        return HIER_LEADERS;
    return HIER_LANES;
}
