/*
 * hier.h - the collectives of a job that spans hosts (issue 29): shared
 * memory inside every host, a lane's few TCP links between hosts
 * (hier_plan.h). A struct coll like shmcoll and ring, built from them.
 */
#ifndef KOLO_WORKER_HIER_H
#define KOLO_WORKER_HIER_H

#include <stdbool.h>

#include "coll.h"
#include "topology.h"
#include "transport.h"

struct hier_spec {
    const struct topology *topo; /* copied */
    int rank;
    /* this host's segment (shmcoll, member index = local index), taken
     * over on success; NULL when the host has one rank */
    struct coll *local;
    /* the data-plane listener, taken over on success (the links an
     * alltoall needs are made on its first use), and where every rank
     * listens (hosts[r], ports[r]) */
    int listen_fd;
    const char *const *hosts;
    const int *ports;
    struct tcp_ident me; /* the generation's identity and key, copied */
    bool spin;           /* spin on the TCP links (transport.h: xport.spin) */
    uint64_t deadline;   /* for making the links */
};

/* hier_create connects this rank's links (every rank at once, in
 * parallel) and builds the coll. 0, or the code with a sentence in err;
 * on failure nothing of spec is taken over. */
int hier_create(const struct hier_spec *spec, struct coll **out, char *err, size_t errlen);

/* Data sockets this rank holds (for tests and the bench's count). */
int hier_sockets(const struct coll *c);

#endif
