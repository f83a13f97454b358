/*
 * topology.h - a generation's hosts (issue 29): which ranks share a host,
 * the hosts in ring order, and each host's ranks in local order, the
 * first of them the host's leader.
 *
 * The coordinator makes it once per generation from what the ranks
 * reported at rendezvous (their host ids, and which rank created its
 * host's shared segment) and sends it in the rendezvous reply
 * (RendezvousReply.hosts); a rank whose coordinator sent none derives it
 * from the peer table by the same function, so both always agree. The
 * rule: hosts in the order of their lowest rank; inside a host the rank
 * that created the shared segment first (it is local index 0 of the
 * segment), then the others by rank.
 *
 * Pure: no I/O, no locks; tests/negotiation/test_topology.c is a table.
 */
#ifndef KOLO_NEGOTIATION_TOPOLOGY_H
#define KOLO_NEGOTIATION_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>

struct topology {
    int size;    /* ranks */
    int nhosts;
    int *first;  /* [nhosts]: host h's ranks are ranks[first[h] .. first[h] + count[h]) */
    int *count;  /* [nhosts] */
    int *ranks;  /* [size]: host by host in ring order, each in local order */
    int *host;   /* [size]: rank r's host */
    int *local;  /* [size]: rank r's index on its host (0: the leader) */
    int min_local, max_local; /* the smallest and largest host */
};

/* topology_derive: from each rank's host id (host_ids[size]) and whether
 * it created its host's segment (leads[size], NULL: none did), by the
 * rule above. 0, KOLO_EINVAL (an empty or missing host id) or
 * KOLO_ENOMEM, with why. */
int topology_derive(struct topology *t, int size, const char *const *host_ids, const bool *leads,
                    char *why, size_t whylen);
/* topology_set: from a list the coordinator sent: nhosts hosts, host h
 * holding counts[h] ranks, all listed one host after the other in ranks
 * (sum(counts) entries). Refused (KOLO_EPROTO, with why) unless every
 * rank of 0..size-1 appears exactly once and no host is empty. */
int topology_set(struct topology *t, int size, int nhosts, const int *counts, const int *ranks,
                 char *why, size_t whylen);
void topology_free(struct topology *t);

/* Host h's rank at local index i (i < count[h]). */
static inline int topology_rank(const struct topology *t, int h, int i)
{
    return t->ranks[t->first[h] + i];
}

/* true when ranks are numbered host after host in ring order (ranks[r]
 * == r): a block of the hosts' concatenation is then the same block in
 * rank order. */
bool topology_contiguous(const struct topology *t);

#endif
