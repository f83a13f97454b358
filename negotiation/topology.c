/*
 * topology.c - a generation's hosts in ring order (see topology.h).
 */
#include "topology.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kolo/abi.h"

static int alloc(struct topology *t, int size, int nhosts)
{
    memset(t, 0, sizeof *t);
    t->size = size;
    t->nhosts = nhosts;
    t->first = calloc((size_t)nhosts + 1, sizeof(int));
    t->count = calloc((size_t)nhosts + 1, sizeof(int));
    t->ranks = calloc((size_t)size + 1, sizeof(int));
    t->host = calloc((size_t)size + 1, sizeof(int));
    t->local = calloc((size_t)size + 1, sizeof(int));
    if (!t->first || !t->count || !t->ranks || !t->host || !t->local) {
        topology_free(t);
        return KOLO_ENOMEM;
    }
    return 0;
}

/* host, local, min_local and max_local from first, count and ranks */
static void index_ranks(struct topology *t)
{
    t->min_local = t->size;
    t->max_local = 0;
    for (int h = 0; h < t->nhosts; h++) {
        for (int i = 0; i < t->count[h]; i++) {
            int r = t->ranks[t->first[h] + i];
            t->host[r] = h;
            t->local[r] = i;
        }
        if (t->count[h] < t->min_local)
            t->min_local = t->count[h];
        if (t->count[h] > t->max_local)
            t->max_local = t->count[h];
    }
}

int topology_derive(struct topology *t, int size, const char *const *host_ids, const bool *leads,
                    char *why, size_t whylen)
{
    memset(t, 0, sizeof *t);
    if (size < 1 || !host_ids) {
        snprintf(why, whylen, "no ranks");
        return KOLO_EINVAL;
    }
    /* hostof[r]: the lowest rank with r's host id, found by a scan that
     * is quadratic only in the number of hosts */
    int *hostof = calloc((size_t)size, sizeof(int));
    int *firsts = calloc((size_t)size, sizeof(int)); /* lowest rank of each host so far */
    if (!hostof || !firsts) {
        free(hostof);
        free(firsts);
        return KOLO_ENOMEM;
    }
    int nhosts = 0, code = 0;
    for (int r = 0; r < size && !code; r++) {
        if (!host_ids[r] || !host_ids[r][0]) {
            snprintf(why, whylen, "rank %d reported no host id", r);
            code = KOLO_EINVAL;
            break;
        }
        int h = 0;
        while (h < nhosts && strcmp(host_ids[firsts[h]], host_ids[r]) != 0)
            h++;
        if (h == nhosts)
            firsts[nhosts++] = r;
        hostof[r] = h;
    }
    if (!code && (code = alloc(t, size, nhosts)) == 0) {
        for (int r = 0; r < size; r++)
            t->count[hostof[r]]++;
        for (int h = 1; h < nhosts; h++)
            t->first[h] = t->first[h - 1] + t->count[h - 1];
        /* the leader of each host first, then the rest by rank */
        int *fill = calloc((size_t)nhosts, sizeof(int));
        int *leader = calloc((size_t)nhosts, sizeof(int));
        if (!fill || !leader) {
            code = KOLO_ENOMEM;
        } else {
            for (int h = 0; h < nhosts; h++)
                leader[h] = -1;
            for (int r = 0; r < size && leads; r++)
                if (leads[r] && leader[hostof[r]] < 0)
                    leader[hostof[r]] = r;
            for (int h = 0; h < nhosts; h++)
                if (leader[h] >= 0)
                    t->ranks[t->first[h] + fill[h]++] = leader[h];
            for (int r = 0; r < size; r++)
                if (r != leader[hostof[r]])
                    t->ranks[t->first[hostof[r]] + fill[hostof[r]]++] = r;
            index_ranks(t);
        }
        free(fill);
        free(leader);
        if (code)
            topology_free(t);
    }
    free(hostof);
    free(firsts);
    return code;
}

int topology_set(struct topology *t, int size, int nhosts, const int *counts, const int *ranks,
                 char *why, size_t whylen)
{
    memset(t, 0, sizeof *t);
    if (size < 1 || nhosts < 1 || nhosts > size || !counts || !ranks) {
        snprintf(why, whylen, "%d host(s) for %d rank(s)", nhosts, size);
        return KOLO_EPROTO;
    }
    long total = 0;
    for (int h = 0; h < nhosts; h++) {
        if (counts[h] < 1) {
            snprintf(why, whylen, "host %d of the topology has no ranks", h);
            return KOLO_EPROTO;
        }
        total += counts[h];
    }
    if (total != size) {
        snprintf(why, whylen, "the topology lists %ld ranks of %d", total, size);
        return KOLO_EPROTO;
    }
    int code = alloc(t, size, nhosts);
    if (code)
        return code;
    for (int r = 0; r < size; r++)
        t->host[r] = -1;
    for (int h = 0, k = 0; h < nhosts; h++) {
        t->first[h] = k;
        t->count[h] = counts[h];
        for (int i = 0; i < counts[h]; i++, k++) {
            int r = ranks[k];
            if (r < 0 || r >= size || t->host[r] >= 0) {
                snprintf(why, whylen, "rank %d is %s in the topology", r,
                         r < 0 || r >= size ? "out of range" : "twice");
                topology_free(t);
                return KOLO_EPROTO;
            }
            t->host[r] = h;
            t->ranks[k] = r;
        }
    }
    index_ranks(t);
    return 0;
}

void topology_free(struct topology *t)
{
    free(t->first);
    free(t->count);
    free(t->ranks);
    free(t->host);
    free(t->local);
    memset(t, 0, sizeof *t);
}

bool topology_contiguous(const struct topology *t)
{
    for (int r = 0; r < t->size; r++)
        if (t->ranks[r] != r)
            return false;
    return true;
}
