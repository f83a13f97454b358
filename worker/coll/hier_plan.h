/*
 * hier_plan.h - what one rank does in a job that spans hosts (issue 29):
 * from the generation's topology (negotiation/topology.h), which ranks it
 * meets in shared memory, which it keeps a TCP link with, and which
 * algorithm a collective of a given size takes.
 *
 * The shape. Every host's ranks share one segment (shmcoll). Across
 * hosts, ranks meet in lanes: lane i is local index i of every host, in
 * the hosts' ring order, for i below the smallest host's size (so every
 * lane has a member on every host). Lane 0 is the hosts' leaders. Inside
 * a lane of n members, member m links only with m +- 2^k (mod n) for
 * 2^k < n: at most 2 ceil(log2 n) links, which carry a ring (k = 0),
 * recursive doubling, a dissemination barrier and a binomial tree from
 * any root (hier_links). A rank of a bigger host beyond the lanes keeps
 * no TCP link at all.
 *
 * Algorithms (hier.c): an allreduce of at least HIER_LANES_MIN_BYTES
 * (and of at least one element per lane) is reduce-scattered in shared
 * memory into one shard per lane, each lane allreduces its shard between
 * the hosts (all lanes at once: every link and core busy), and the
 * shards are allgathered in shared memory; a smaller one is reduced in
 * shared memory, allreduced among the leaders and broadcast in shared
 * memory. The crossover was measured (bench/run.sh "hosts"), see
 * HIER_LANES_MIN_BYTES.
 *
 * Pure: no I/O; tests/worker/test_hier_plan.c checks it as a table.
 */
#ifndef KOLO_WORKER_HIER_PLAN_H
#define KOLO_WORKER_HIER_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "topology.h"

/* From this many bytes an allreduce uses every lane (see above). 2 hosts
 * x 2 ranks on a bridge on 2 quiet vCPUs (bench/run.sh hosts with
 * KOLO_HIER_LANES=0 and =1 GiB, one launch each, 2026-11-28 12:55 UTC),
 * p50 µs lanes / leaders: 4 KiB 243 / 248, 16 KiB 271 / 279, 32 KiB
 * 245 / 255, 64 KiB 261 / 305 (225 / 245 in another launch), 256 KiB
 * 309 / 451, 1 MiB 1,569 / 2,803, 16 MiB 24,851 / 33,474. Below 32 KiB
 * the two are within noise; the leaders' path keeps the tiny sizes,
 * which cannot fill a shard per lane anyway. */
#define HIER_LANES_MIN_BYTES ((size_t)32 << 10)

struct hier_plan {
    int rank, size;
    int nhosts, host;   /* hosts, and mine (ring order) */
    int local, nlocal;  /* my index on my host, my host's ranks */
    int lanes;          /* lanes across the hosts: the smallest host's ranks */
    int lane;           /* mine (== local), -1 beyond the lanes */
    int lane_size;      /* nhosts; my place in my lane is host */
    int *lane_ranks;    /* [nhosts]: my lane's member on each host (NULL: no lane) */
    int *host_ranks;    /* [nlocal]: my host's ranks in local order */
    int nlinks;
    int *links;         /* [nlinks]: the ranks this rank keeps a TCP link with */
    bool contiguous;    /* ranks numbered host after host (topology_contiguous) */
    size_t lanes_min;   /* HIER_LANES_MIN_BYTES, or KOLO_HIER_LANES (hier.c) */
};

/* hier_plan_make: rank's plan in topology t. 0, KOLO_EINVAL or KOLO_ENOMEM. */
int hier_plan_make(struct hier_plan *p, const struct topology *t, int rank);
void hier_plan_free(struct hier_plan *p);

/* hier_links: the members of a lane of n that member m links with
 * (m +- 2^k mod n for 2^k < n, without m and without repeats), written to
 * out (room for 2 * 32) in increasing order; returns how many. */
int hier_links(int m, int n, int *out);

enum hier_algo {
    HIER_LEADERS, /* reduce on the host, leaders across, broadcast on the host */
    HIER_LANES,   /* reduce-scatter on the host, every lane across, allgather on the host */
};
/* The allreduce of count elements of esz bytes: by the leaders below
 * p->lanes_min bytes, by every lane from there. */
enum hier_algo hier_allreduce_algo(const struct hier_plan *p, size_t count, size_t esz);

#endif
