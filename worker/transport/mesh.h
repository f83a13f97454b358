/*
 * mesh.h - the TCP mesh of one generation: a connection between every
 * pair of ranks, each one authenticated (transport_tcp.c's handshake).
 *
 * Every rank dials the ranks below it and accepts the ranks above it, all
 * handshakes at once in one poll loop, so no rank waits on another's
 * order and a connection that never finishes its handshake holds up
 * nothing but itself. Whatever reaches the listener without the
 * generation's key (a stranger, a rank of another job or generation, a
 * port scanner, garbage) is refused and closed, counted by reason
 * (mesh_rejections) and logged once per address; the mesh forms around
 * it. At most MESH_PENDING unfinished inbound connections are kept (the
 * oldest goes first) and each gets MESH_HANDSHAKE_MS to finish.
 */
#ifndef KOLO_WORKER_MESH_H
#define KOLO_WORKER_MESH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define MESH_PENDING      64
#define MESH_HANDSHAKE_MS 10000

struct mesh_spec {
    struct tcp_ident me;
    int size;
    int listen_fd;
    /* where each rank below me listens: hosts[r], ports[r] for r < me.rank */
    const char *const *hosts;
    const int *ports;
    /* want[r]: connect with rank r (NULL: with every rank). Both ends of a
     * pair must want it; a rank that dials without being wanted is
     * refused like a duplicate. */
    const bool *want;
    uint64_t deadline; /* CLOCK_MONOTONIC ms */
};

/* Fills peers[r] for every wanted r != me.rank (peers has size entries;
 * entries already set are left alone and not connected again): 0, or
 * the code that stopped it with a sentence in err (nothing is left open
 * then). */
int mesh_connect(const struct mesh_spec *s, struct xport **peers, char *err, size_t errlen);

/* Refused inbound connections since the process started, by reason. */
enum mesh_reject {
    MESH_REJECT_MALFORMED, /* not a kolo hello, or another job or rank */
    MESH_REJECT_STALE,     /* another generation */
    MESH_REJECT_VERSION,   /* another transport version */
    MESH_REJECT_AUTH,      /* no proof of the generation's key */
    MESH_REJECT_CLOSED,    /* closed or reset during the handshake */
    MESH_REJECT_TIMEOUT,   /* no handshake within MESH_HANDSHAKE_MS */
    MESH_REJECT_DUPLICATE, /* a rank already connected, or not a higher rank */
    MESH_REJECT_CROWDED,   /* evicted: MESH_PENDING others were waiting */
    MESH_REJECT_SETTING,   /* another data-plane encryption setting */
    MESH_REJECT_N
};
const char *mesh_reject_name(enum mesh_reject r);
uint64_t mesh_rejections(enum mesh_reject r);
/* For the telemetry (report.c): the refusals not yet reported, which are
 * then reported; _return gives back what could not be sent. */
uint64_t mesh_rejections_take(enum mesh_reject r);
void mesh_rejections_return(enum mesh_reject r, uint64_t n);

#endif
