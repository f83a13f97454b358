/*
 * coll.h - the collective algorithms behind one interface.
 *
 * A struct coll runs the data movement of one generation's collectives
 * for this rank; the executor (exec.c) only talks to this table. Two
 * implementations:
 *   - shmcoll (shmcoll.c): every rank of the generation on this host; one
 *     shared segment, chunked and pipelined so that intermediate data
 *     stays in cache, futex waits with a short spin.
 *   - ring (ring.c): any placement, over point-to-point transports
 *     (transport.h: shm between local peers, tcp between hosts):
 *     bandwidth-optimal ring (reduce-scatter + allgather, pipelined in
 *     chunks) for large buffers, a latency-optimal algorithm for small
 *     ones.
 *
 * All functions are collective: every rank calls the same function with
 * matching arguments (the negotiation guarantees it), and returns 0 or the
 * same kind of error. Buffers are host memory. "bytes" arrays have one
 * entry per rank. A peer that dies makes every rank's call fail with
 * KOLO_EPEER before the deadline (CLOCK_MONOTONIC ms; 0 = none) - never
 * a hang. After a failure the struct coll is unusable (sticky error).
 */
#ifndef KOLO_WORKER_COLL_H
#define KOLO_WORKER_COLL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kolo.h"

struct coll;

struct coll_ops {
    const char *name;
    /* out[i] = OP over ranks of in[i]; in may equal out; AVERAGE reduces
     * as SUM (the caller divides). count may be 0. */
    int (*allreduce)(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in, void *out,
                     size_t count, uint64_t deadline);
    /* out = concatenation of every rank's in, in rank order; bytes[r] is
     * rank r's contribution (may be 0 and may differ). */
    int (*allgatherv)(struct coll *c, const void *in, void *out, const size_t *bytes,
                      uint64_t deadline);
    /* buf on root is copied to every rank's buf. */
    int (*broadcast)(struct coll *c, void *buf, size_t bytes, int root, uint64_t deadline);
    /* send_bytes[r] bytes of in (consecutive, in rank order) go to rank r;
     * recv_bytes[r] bytes from rank r land in out, in rank order. */
    int (*alltoallv)(struct coll *c, const void *in, const size_t *send_bytes, void *out,
                     const size_t *recv_bytes, uint64_t deadline);
    /* in has sum(counts) elements; rank r receives the reduction of
     * elements [sum(counts[0..r)), +counts[r]) in out. */
    int (*reducescatter)(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in, void *out,
                         const size_t *counts, uint64_t deadline);
    int (*barrier)(struct coll *c, uint64_t deadline);
    void (*destroy)(struct coll *c);
    /* Optional, from any thread: make the collective running on another
     * thread fail now instead of at its deadline (the coordinator closed
     * the generation: a peer is gone or partitioned). The coll is unusable
     * afterwards, except for destroy. */
    void (*interrupt)(struct coll *c);
    /* Optional: ends this rank's part like destroy, but keeps the host's
     * shared segment (shmcoll) mapped and returns it, parked: its peers
     * see this rank as gone, and shmcoll_rearm makes it usable again in a
     * later generation with the same members (worker/runtime/keep.h).
     * NULL when there is none worth keeping (everything is destroyed). */
    struct coll *(*keep_segment)(struct coll *c);

    /* ---- readiness rounds (the fast path, worker/runtime/fastpath.c) ----
     * Optional: a backend without them leaves every op to the coordinator.
     *
     * round reduces vec (nwords 64-bit words, negotiation/round.h's
     * layout) over the ranks in one exchange, in place; like every
     * collective, each rank calls it in the same sequence. A rank that is
     * idle learns that a peer started one through idle_wait. */
    int (*round)(struct coll *c, uint64_t *vec, size_t nwords, uint64_t deadline);
    /* peer_started: a peer began the next collective while this rank is
     * between collectives (it can only be a round). Cheap: no system call
     * on shared memory. */
    bool (*peer_started)(struct coll *c);
    /* The bell: bell_ring (any thread) makes idle_wait return; bell_seen
     * is the value to hand idle_wait, taken before the caller looks at its
     * own state, so a ring in between is never lost. One thread at a time
     * may idle_wait. */
    uint64_t (*bell_seen)(struct coll *c);
    void (*bell_ring)(struct coll *c);
    /* idle_wait returns 1 when the bell rang after seen or a peer started
     * a round, 0 after timeout_ms, or a KOLO_E* code (negated) once the
     * backend failed. With spin it first spins briefly where that is cheap
     * (a waiting user thread); the background thread passes false, since
     * its spin would take the CPU of a rank that computes. */
    int (*idle_wait)(struct coll *c, uint64_t seen, int timeout_ms, bool spin);
};

struct coll {
    const struct coll_ops *ops;
    int rank, size;
    int failed;     /* sticky KOLO_E* */
    char why[256];  /* e.g. "rank 3 (pid 4242) exited" */
    bool can_round; /* the readiness-round ops work on this instance */
    /* names[i]: the job's rank of member i, for messages; NULL: i. A
     * group inside a bigger job (a host's ranks, a lane) names its
     * members as the job knows them. */
    const int *names;
    /* Whom this rank sleeps on right now, for "waiting on rank j since T"
     * (read by any thread): peer + 1, 0 = nobody; since when (monotonic
     * ms). Backends call coll_waiting before they sleep on a peer and
     * coll_moved once they got on. */
    _Atomic int waiting_on;
    _Atomic uint64_t waiting_since_ms;
    /* A backend whose waits keep `waited` (shmcoll) sets tracks_waits; a
     * wait of its that lasted long enough to read the clock (a spin past
     * its first look at the clock, a yield, a sleep) sets waited. A
     * caller that cleared it and finds it still false after a round knows
     * the round took at most a few microseconds, and reuses its clock
     * reading from before instead of taking another (fastpath.c: a
     * clock read is ~5% of a cached 4-byte allreduce). */
    bool tracks_waits, waited;
};

void coll_waiting(struct coll *c, int peer);

/* True on a thread that is blocked until the collectives it runs are
 * done and has nothing else to do (libkolo sets it for a user thread in
 * kolo_wait): a backend's waits may spin longer there, since no compute
 * of the rank's needs that CPU. A background thread running collectives
 * beside the user's compute leaves it false. */
extern _Thread_local bool coll_thread_idle;
static inline int coll_name(const struct coll *c, int member)
{
    return c->names && member >= 0 && member < c->size ? c->names[member] : member;
}
static inline void coll_moved(struct coll *c)
{
    atomic_store_explicit(&c->waiting_on, 0, memory_order_relaxed);
}

/* A readiness round's payload reduction (round.h, round_pay_fn): the
 * element kernels of reduce.h, which every backend's round passes to
 * round_reduce. */
void coll_round_pay(uint32_t dtype, uint32_t op, void *dst, const void *src, size_t count);

/* ---- shmcoll: all ranks on one host ---- */

/* The leader (rank 0) creates the segment named name before rendezvous;
 * the others attach after it. pids[r] is rank r's pid, watched (pidfd)
 * so a dead rank is noticed within ~10 ms of a wait. slot_bytes is each
 * rank's staging area (0 = a default sized for the cache). */
int shmcoll_create(const char *name, int rank, int size, size_t slot_bytes, struct coll **out);
int shmcoll_attach(const char *name, int rank, int size, size_t slot_bytes, struct coll **out);
/* Once every rank attached (after a first barrier): set the peers' pids
 * and unlink the name. */
int shmcoll_ready(struct coll *c, const int *pids, uint64_t deadline);
/* shmcoll_id: a segment's identity, the same on every member and never
 * 0 (a hash of its unguessable name); 0 for a coll that is no segment. */
uint64_t shmcoll_id(const struct coll *c);
/* shmcoll_rearm makes a parked segment (coll_ops.keep_segment) usable by
 * the same members, in the same order, in a new generation (token: its
 * number's low 32 bits, not 0): every member calls it, and none returns
 * before all have reset their counters and the abort record is clear.
 * Whatever the last generation left (a collective cut off half way, a
 * published failure) is forgotten. 0, or a failure as any collective's
 * (a member that died, the deadline: then destroy it). */
int shmcoll_rearm(struct coll *c, uint32_t token, uint64_t deadline);
/* shmcoll_share_cpus: this machine runs ranks ranks of the job, other
 * hosts' on it (network namespaces, containers) counted; more than its
 * CPUs, and waits sleep without spinning first. */
void shmcoll_share_cpus(struct coll *c, int ranks);
/* shmcoll_abort fails the group now with code and why, for every member:
 * their pending and next collectives fail with why (the thread that runs
 * this rank's collectives; hier.c, when a host's link to the others broke). */
int shmcoll_abort(struct coll *c, int code, const char *why);

/* ---- ring: any placement, over transports ---- */

struct xport;
/* peers[r] is the connection to rank r (NULL for self, and for ranks the
 * algorithms never talk to). The ring order is rank order. */
int ring_create(int rank, int size, struct xport **peers, struct coll **out);

#endif
