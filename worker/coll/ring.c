/*
 * ring.c - the "ring" backend: every collective for any placement of the
 * ranks, over the point-to-point transports of transport.h.
 *
 * DESIGN
 *
 * Layers. This file is the algorithm layer. It sees struct xport (tcp or
 * shm, mixed freely) and reduce.h, nothing else. peers[r] is the
 * connection to rank r and the ring order is rank order: next = rank + 1,
 * prev = rank - 1 (mod size).
 *
 * Large buffers: one pipelined flow. The bandwidth-optimal algorithms
 * (ring reduce-scatter, ring allgather, their concatenation allreduce,
 * and the chain broadcast) are all the same shape: a stream of items
 * goes to next while another stream of items comes from prev, and item i
 * of the outgoing stream can only leave once item i - lag of the
 * incoming stream has arrived (and, for reductions, been reduced). An
 * item is one chunk (256 KiB) of one segment in one step. Instead of a
 * blocking sendrecv per chunk - which would leave both links idle while
 * the chunk is being reduced - flow_run() drives both streams with the
 * transports' non-blocking try_send/try_recv and reduces a chunk as soon
 * as it is complete, then goes back to moving bytes. While chunk k is
 * reduced, chunk k+1 is already in the kernel's socket buffers (or the
 * shm ring) on its way in, and the sender side keeps the next rank fed.
 * The chunks of one step and of consecutive steps overlap, so a chunk
 * travels around the ring as soon as its data exists, like NCCL's
 * pipelined ring. Incoming chunks that need reducing land in a small
 * pool of scratch slots that stays in cache; chunks that are final land
 * directly in the output. A window keeps at most a few chunks in flight
 * per link, so that data is copied out while it is still in cache (see
 * flow_send_ready). No stream waits for the other beyond that, so buffer
 * sizes (socket buffers, shm rings) can never deadlock the ring: a rank
 * only ever waits for bytes its neighbour can produce without waiting
 * for it.
 *
 * Small buffers: latency-optimal algorithms on the links of hier_links
 * (r +- 2^k, which a full mesh includes), with the
 * blocking helpers of transport.c: recursive doubling for allreduce
 * (log2(size) exchanges instead of 2 * (size - 1) ring steps), a
 * binomial tree for broadcast, dissemination for barrier, pairwise
 * exchange for alltoallv. The allreduce crossover was measured (TCP
 * loopback, see allreduce_small_max); the broadcast one follows a cost
 * model (bcast_use_tree).
 *
 * Determinism. Every element of an allreduce is reduced in a fixed order
 * that depends only on size, count and the element's index, and it is
 * computed by one rank (the ring) or by both partners from the same
 * operands in the same order (recursive doubling), so every rank gets
 * the same bits.
 *
 * Failure. Any transport error, or the deadline, makes the coll failed
 * (sticky: c->failed, and c->why names the peer) and closes every
 * connection at once. The neighbours that were waiting on us see their
 * connection close and fail with KOLO_EPEER, and so on around the mesh:
 * a dead rank makes every rank fail quickly instead of each one waiting
 * for its own deadline.
 *
 * Threading: one thread at a time calls into a struct coll (the
 * executor's). Buffers passed to a collective must not partly overlap
 * (in == out is fine where the contract says so).
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "hier_plan.h"
#include "reduce.h"
#include "round.h"
#include "transport.h"
#include "util.h"

/* Pipeline chunk. Big enough that a system call moves a lot of data, and
 * that RING_SLOTS of them (the reduction scratch) stay in a 1 MiB L2
 * cache. Measured with 2 processes on 2 cores over TCP loopback (16 MiB
 * .. 256 MiB float32 sums): 64 KiB chunks were clearly slower, 128 KiB a
 * few per cent, 512 KiB and 1 MiB no better; 2 or 8 slots were within the
 * noise of 4. Coalescing neighbouring chunks into one system call did not
 * help either. */
#define RING_CHUNK_BYTES ((size_t)256 << 10)
/* Scratch slots for incoming chunks that still have to be reduced: how
 * far the receiving side may run ahead of the reductions. */
#define RING_SLOTS 4
/* Flow window: outgoing item i waits until incoming item i - RING_WINDOW
 * has arrived (see flow_send_ready). 4 chunks = 1 MiB per link. */
#define RING_WINDOW 4
/* Allreduce crossovers, see allreduce_small_max(). */
#define RING_SMALL_BYTES     ((size_t)256 << 10)
#define RING_SMALL_BYTES_ODD ((size_t)64 << 10)
/* Longest single poll() when no deadline was given; the wait loop just
 * goes round again. */
#define RING_POLL_MAX_MS 1000

struct ring {
    struct coll c;        /* first member: a struct coll * is a struct ring * */
    struct xport **peers; /* peers[r]: connection to rank r, NULL for self */
    bool mesh;            /* every other rank is connected */
    /* the links of hier_links are connected (r +- 2^k): recursive
     * doubling, the binomial tree, the dissemination barrier and rounds
     * work; mesh implies it */
    bool hyper;
    size_t *off, *len;    /* per-rank segment layout of the current call, bytes */
    unsigned char *scratch;
    size_t scratch_cap;
    /* the bell (coll.h): an eventfd next to the peers' fds in idle_wait */
    int bell_fd;
    _Atomic uint64_t bell;
    struct pollfd *pfd; /* size: the bell and every peer */
    /* Liveness, not a time limit: the call's deadline moves on by its
     * whole span (window) whenever data moves, so a slow link that keeps
     * moving never times out, and a peer that stops (frozen, gone) is
     * given up on one window after the last byte. */
    uint64_t deadline, window;
};

static const struct coll_ops ring_ops;

static inline int rmod(long a, int n)
{
    long m = a % n;
    return (int)(m < 0 ? m + n : m);
}

static inline size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

static inline size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* ------------------------------------------------------------------ failure */

static void ring_close_all(struct ring *rg)
{
    for (int r = 0; r < rg->c.size; r++) {
        if (rg->peers[r]) {
            xport_close(rg->peers[r]);
            rg->peers[r] = NULL;
        }
    }
}

/* ring_fail makes err sticky on the coll with a reason that names the
 * peer (-1 when no peer is involved). The connections are closed by
 * ring_done() once the collective has unwound, so nothing below the
 * public entry points ever touches a closed xport. Returns the sticky
 * code. */
static int ring_fail(struct ring *rg, int err, int peer, const char *what)
{
    if (err < 0)
        err = -err;
    if (err == 0)
        err = KOLO_EINTERNAL;
    if (!rg->c.failed) {
        const struct xport *x = peer >= 0 ? rg->peers[peer] : NULL;
        const char *detail = x && x->why[0] ? x->why : kolo_strerror(err);
        /* bounded so that the reason always fits in why[] */
        if (peer >= 0)
            snprintf(rg->c.why, sizeof rg->c.why, "ring: %.40s rank %d: %.90s", what,
                     coll_name(&rg->c, peer), detail);
        else
            snprintf(rg->c.why, sizeof rg->c.why, "ring: %.40s: %.90s", what, detail);
        rg->c.failed = err;
    }
    return rg->c.failed;
}

/* The peer that a failed two-sided transfer should be blamed on: the
 * connection that recorded a failure, else the receiving side (a
 * timeout while receiving means that peer did not send). */
static int blame(const struct xport *xs, int srank, const struct xport *xr, int rrank)
{
    if (xs && xs->failed)
        return srank;
    if (xr && xr->failed)
        return rrank;
    return xr ? rrank : srank;
}

/* Every public entry point ends here: a failure closes every connection
 * so that the other ranks notice at once (see DESIGN). */
static int ring_done(struct ring *rg, int err)
{
    if (err && rg->c.failed)
        ring_close_all(rg);
    return err;
}

static int ring_start(struct ring *rg, uint64_t deadline)
{
    if (rg->c.failed)
        return rg->c.failed;
    uint64_t now = now_mono_ms();
    if (deadline && now >= deadline)
        return ring_fail(rg, KOLO_ETIMEDOUT, -1, "deadline passed before the start");
    rg->deadline = deadline;
    rg->window = deadline ? deadline - now : 0;
    return 0;
}

/* Scratch memory, kept between calls and grown on demand; 64-byte
 * aligned so the reductions vectorise. NULL only when bytes > 0 and the
 * allocation failed. */
static unsigned char *ring_scratch(struct ring *rg, size_t bytes)
{
    if (bytes <= rg->scratch_cap)
        return rg->scratch;
    size_t cap = (bytes + 63) & ~(size_t)63;
    free(rg->scratch);
    rg->scratch = aligned_alloc(64, cap);
    rg->scratch_cap = rg->scratch ? cap : 0;
    return rg->scratch;
}

/* -------------------------------------------------------------------- flows */

enum flow_kind {
    FLOW_ALLREDUCE,     /* reduce-scatter steps into out, then allgather steps */
    FLOW_REDUCESCATTER, /* reduce-scatter steps, partials in acc, own segment to out */
    FLOW_ALLGATHER,     /* allgather steps */
    FLOW_CHAIN,         /* broadcast: one segment passed down the chain */
};

/* One pipelined exchange with the ring neighbours (see DESIGN). Items are
 * numbered i = step * K + chunk on both streams; the two streams of a
 * rank and its neighbours agree on every item's length because a rank's
 * outgoing item i is the next rank's incoming item i. */
struct flow {
    struct ring *rg;
    enum flow_kind kind;
    kolo_dtype dtype;
    kolo_op op;
    const unsigned char *in;
    unsigned char *out;
    size_t total; /* FLOW_CHAIN: bytes of the buffer */
    size_t chunk; /* bytes per chunk, a multiple of the element size */
    size_t K;     /* chunks per step (of the longest segment) */
    int rs_steps; /* how many of the steps are reduce-scatter steps */
    struct xport *tx, *rx;
    int tx_rank, rx_rank;
    size_t nsend, nrecv;   /* items on each stream */
    size_t lag;            /* outgoing i waits for incoming i - lag (SIZE_MAX: never) */
    unsigned char *slots;  /* RING_SLOTS chunks of reduction scratch */
    unsigned char *acc[2]; /* FLOW_REDUCESCATTER: partial sums, by step parity */
    size_t esz;

    size_t sent, received, processed; /* items done on each stream */
    const unsigned char *sp;          /* current outgoing item */
    size_t slen, spos;
    bool sbusy;
    unsigned char *rp; /* current incoming item */
    size_t rlen, rpos;
    bool rbusy;
};

/* Bytes [*off, *off + *len) of segment s that chunk j covers (len 0 past
 * the segment's end). */
static void flow_piece(const struct flow *f, size_t seglen, size_t j, size_t *off, size_t *len)
{
    size_t o = j * f->chunk;
    *off = o;
    *len = o < seglen ? min_size(f->chunk, seglen - o) : 0;
}

/* Which segment a step sends and receives. In reduce-scatter step t a
 * rank sends the partial of segment rank-t-1 and receives segment
 * rank-t-2, so that after size-1 steps it holds the full reduction of its
 * own segment. In allgather step u it sends segment rank-u (its own
 * first) and receives rank-u-1. */
static int flow_send_seg(const struct flow *f, size_t t)
{
    int n = f->rg->c.size, r = f->rg->c.rank;
    if ((int)t < f->rs_steps)
        return rmod((long)r - (long)t - 1, n);
    return rmod((long)r - (long)(t - (size_t)f->rs_steps), n);
}

static int flow_recv_seg(const struct flow *f, size_t t)
{
    return rmod((long)flow_send_seg(f, t) - 1, f->rg->c.size);
}

static void flow_send_span(const struct flow *f, size_t i, const unsigned char **p, size_t *len)
{
    size_t t = i / f->K, j = i % f->K, o;
    if (f->kind == FLOW_CHAIN) {
        flow_piece(f, f->total, j, &o, len);
        *p = f->out + o;
        return;
    }
    int s = flow_send_seg(f, t);
    flow_piece(f, f->rg->len[s], j, &o, len);
    if ((int)t < f->rs_steps) {
        if (t == 0)
            *p = f->in + f->rg->off[s] + o;
        else if (f->kind == FLOW_ALLREDUCE)
            *p = f->out + f->rg->off[s] + o;
        else
            *p = f->acc[(t - 1) & 1] + o;
    } else if (t == (size_t)f->rs_steps && f->kind == FLOW_ALLGATHER) {
        *p = f->in + o; /* our own contribution */
    } else {
        *p = f->out + f->rg->off[s] + o;
    }
}

static void flow_recv_span(const struct flow *f, size_t i, unsigned char **p, size_t *len)
{
    size_t t = i / f->K, j = i % f->K, o;
    if (f->kind == FLOW_CHAIN) {
        flow_piece(f, f->total, j, &o, len);
        *p = f->out + o;
        return;
    }
    int s = flow_recv_seg(f, t);
    flow_piece(f, f->rg->len[s], j, &o, len);
    if ((int)t < f->rs_steps)
        *p = f->slots + (i % RING_SLOTS) * f->chunk;
    else
        *p = f->out + f->rg->off[s] + o;
}

static bool flow_needs_slot(const struct flow *f, size_t i)
{
    return f->kind != FLOW_CHAIN && (int)(i / f->K) < f->rs_steps;
}

/* Outgoing item i may leave when its data exists (incoming item i - lag
 * processed) and when the window allows it: incoming item i - RING_WINDOW
 * has arrived. Without the window, a reduce-scatter sender pushes a whole
 * segment into the socket buffers (4 MiB on each side) while its
 * neighbour, slowed down by its reductions, reads behind; the data then
 * sits in kernel buffers long enough to leave the cache, and copying it
 * out costs a trip to memory. Measured over TCP loopback with 2
 * processes on 2 cores, a window of 4 chunks cut the CPU time of 16 MiB
 * to 256 MiB allreduces by 20-30% (2 and 8 chunks did less) and the
 * 16 MiB latency by a third. The window clocks itself and cannot
 * deadlock: item i waits for item i - W of the previous rank, which waits
 * for item i - 2W of the one before it, and so on down to the first W
 * items, which wait for nobody. A chain root receives nothing and has no
 * window. 1 MiB in flight per link also covers the bandwidth-delay
 * product of ordinary data-centre links. */
static bool flow_send_ready(const struct flow *f)
{
    size_t i = f->sent;
    if (f->nrecv && i >= RING_WINDOW && f->received <= i - RING_WINDOW)
        return false;
    return f->lag == SIZE_MAX || i < f->lag || f->processed > i - f->lag;
}

static bool flow_recv_ready(const struct flow *f)
{
    size_t i = f->received;
    return !flow_needs_slot(f, i) || i - f->processed < RING_SLOTS;
}

/* In a reducescatter, reducing item i overwrites acc[t & 1], which held
 * the partials that outgoing item i - K (one step earlier) sends; so it
 * waits until that item has left. */
static bool flow_process_ready(const struct flow *f)
{
    size_t i = f->processed;
    if (i >= f->received)
        return false;
    return f->kind != FLOW_REDUCESCATTER || i < f->K || f->sent > i - f->K;
}

/* Finishes incoming item `processed`: a reduce-scatter item is combined
 * with our own input (upstream partial first, then ours: a fixed order);
 * anything else already sits where it belongs. */
static void flow_process(struct flow *f)
{
    size_t i = f->processed, t = i / f->K, j = i % f->K;
    if (flow_needs_slot(f, i)) {
        int s = flow_recv_seg(f, t);
        size_t o, len;
        flow_piece(f, f->rg->len[s], j, &o, &len);
        if (len) {
            unsigned char *dst;
            if (f->kind == FLOW_ALLREDUCE)
                dst = f->out + f->rg->off[s] + o;
            else if ((int)t == f->rs_steps - 1)
                dst = f->out + o; /* our own segment: the result */
            else
                dst = f->acc[t & 1] + o;
            reduce_two(f->dtype, f->op, dst, f->slots + (i % RING_SLOTS) * f->chunk,
                       f->in + f->rg->off[s] + o, len / f->esz);
        }
    }
    f->processed++;
}

/* Moves bytes of the outgoing stream until the transport would block or
 * the next item is not ready yet. 0 or the sticky error. */
static int flow_push(struct flow *f, bool *moved)
{
    while (f->sent < f->nsend && flow_send_ready(f)) {
        if (!f->sbusy) {
            flow_send_span(f, f->sent, &f->sp, &f->slen);
            f->spos = 0;
            f->sbusy = true;
        }
        if (f->spos < f->slen) {
            ssize_t k = f->tx->ops->try_send(f->tx, f->sp + f->spos, f->slen - f->spos);
            if (k < 0)
                return ring_fail(f->rg, (int)-k, f->tx_rank, "sending to");
            if (k == 0)
                return 0;
            f->spos += (size_t)k;
            *moved = true;
            if (f->spos < f->slen)
                return 0; /* the transport is full for now */
        }
        f->sent++;
        f->sbusy = false;
        *moved = true;
    }
    return 0;
}

/* The incoming side of flow_push: fills items while scratch slots are
 * free. */
static int flow_pull(struct flow *f, bool *moved)
{
    while (f->received < f->nrecv && flow_recv_ready(f)) {
        if (!f->rbusy) {
            flow_recv_span(f, f->received, &f->rp, &f->rlen);
            f->rpos = 0;
            f->rbusy = true;
        }
        if (f->rpos < f->rlen) {
            ssize_t k = f->rx->ops->try_recv(f->rx, f->rp + f->rpos, f->rlen - f->rpos);
            if (k < 0)
                return ring_fail(f->rg, (int)-k, f->rx_rank, "receiving from");
            if (k == 0)
                return 0;
            f->rpos += (size_t)k;
            *moved = true;
            if (f->rpos < f->rlen)
                return 0;
        }
        f->received++;
        f->rbusy = false;
        *moved = true;
    }
    return 0;
}

/* The connections a sleeping flow waits on: at most two. */
struct flow_wait {
    struct pollfd pfd[2];
    struct xport *x[2];
    int rank[2];
    int n;
};

static int flow_arm(struct flow *f, struct flow_wait *w, struct xport *x, int rank, bool want_send,
                    bool want_recv)
{
    short events = 0;
    int fd = x->ops->arm(x, want_send, want_recv, &events);
    if (fd < 0)
        return ring_fail(f->rg, x->failed ? x->failed : KOLO_ESYS, rank, "waiting for");
    w->pfd[w->n] = (struct pollfd){.fd = fd, .events = events};
    w->x[w->n] = x;
    w->rank[w->n++] = rank;
    return 0;
}

/* Sleeps until a stream we wait on can move: arm the connections (once
 * for both directions when prev and next are the same rank), retry once
 * so that nothing that arrived before the arm is slept on, poll(),
 * disarm. The same protocol as transport.c's waits. */
static int flow_sleep(struct flow *f)
{
    uint64_t deadline = f->rg->deadline;
    bool ws = f->sent < f->nsend && flow_send_ready(f);
    bool wr = f->received < f->nrecv && flow_recv_ready(f);
    if (!ws && !wr)
        return ring_fail(f->rg, KOLO_EINTERNAL, -1, "flow stalled");

    struct flow_wait w = {.n = 0};
    int err = 0;
    if (ws && wr && f->tx == f->rx) {
        err = flow_arm(f, &w, f->tx, f->tx_rank, true, true);
    } else {
        if (ws)
            err = flow_arm(f, &w, f->tx, f->tx_rank, true, false);
        if (wr && !err)
            err = flow_arm(f, &w, f->rx, f->rx_rank, false, true);
    }

    bool moved = false;
    if (!err)
        err = flow_push(f, &moved);
    if (!err)
        err = flow_pull(f, &moved);
    if (!err && !moved) {
        coll_waiting(&f->rg->c, wr ? f->rx_rank : f->tx_rank);
        int timeout = RING_POLL_MAX_MS;
        if (deadline) {
            uint64_t now = now_mono_ms();
            timeout = now >= deadline ? 0 : (int)min_size(deadline - now, RING_POLL_MAX_MS);
        }
        if (poll(w.pfd, (nfds_t)w.n, timeout) < 0 && errno != EINTR)
            err = ring_fail(f->rg, KOLO_ESYS, w.rank[0], "waiting for");
    }
    for (int k = 0; k < w.n; k++)
        if (w.x[k]->ops->disarm)
            w.x[k]->ops->disarm(w.x[k]);
    return err;
}

/* flow_run drives a flow to its end. Each pass moves what both streams
 * can move without blocking, then reduces at most one complete chunk (so
 * that the links are serviced between chunks), and checks the deadline
 * even while data moves. When nothing moved: on a memory transport spin
 * briefly (the neighbour is probably mid-copy on another core), else, or
 * after the spin window, sleep in flow_sleep. */
static int flow_run(struct flow *f)
{
    struct ring *rg = f->rg;
    bool spin = (f->tx && xport_spins(f->tx)) || (f->rx && xport_spins(f->rx));
    uint64_t spin_ns = spin ? (uint64_t)xport_spin_us() * 1000u : 0;
    uint64_t idle_since = 0;
    bool slept = false;
    int err;

    while (f->processed < f->nrecv || f->sent < f->nsend) {
        bool moved = false;
        if ((err = flow_push(f, &moved)) || (err = flow_pull(f, &moved)))
            return err;
        if (flow_process_ready(f)) {
            flow_process(f);
            moved = true;
        }
        if (rg->deadline) {
            uint64_t now = now_mono_ms();
            if (moved)
                rg->deadline = now + rg->window; /* alive: progress-based */
            else if (now >= rg->deadline)
                return ring_fail(rg, KOLO_ETIMEDOUT, f->rx ? f->rx_rank : f->tx_rank,
                                 "no progress within the deadline from");
        }
        if (moved) {
            if (slept) { /* flow_sleep noted whom it waited on */
                coll_moved(&f->rg->c);
                slept = false;
            }
            idle_since = 0;
            continue;
        }
        if (spin_ns) {
            uint64_t t = now_mono_ns();
            if (!idle_since)
                idle_since = t;
            if (t - idle_since < spin_ns)
                continue;
        }
        if ((err = flow_sleep(f)))
            return err;
        slept = true;
        idle_since = 0;
    }
    if (slept)
        coll_moved(&f->rg->c);
    return 0;
}

/* Common set-up of a ring flow over the segment layout in rg->off/len:
 * chunk size, chunks per step, neighbours, scratch. */
static int flow_ring_init(struct flow *f, struct ring *rg, enum flow_kind kind, size_t esz,
                          int rs_steps, int steps)
{
    int n = rg->c.size, r = rg->c.rank;
    size_t maxseg = 0;
    for (int s = 0; s < n; s++)
        if (rg->len[s] > maxseg)
            maxseg = rg->len[s];
    f->rg = rg;
    f->kind = kind;
    f->esz = esz;
    f->chunk = min_size(RING_CHUNK_BYTES - RING_CHUNK_BYTES % esz, maxseg);
    f->K = f->chunk ? div_up(maxseg, f->chunk) : 0;
    f->rs_steps = rs_steps;
    f->tx_rank = (r + 1) % n;
    f->rx_rank = (r + n - 1) % n;
    f->tx = rg->peers[f->tx_rank];
    f->rx = rg->peers[f->rx_rank];
    f->nsend = f->nrecv = f->K * (size_t)steps;
    f->lag = f->K;
    if (!f->K)
        return 0;
    size_t slot_bytes = rs_steps ? RING_SLOTS * f->chunk : 0;
    size_t acc_bytes = kind == FLOW_REDUCESCATTER ? f->K * f->chunk : 0;
    unsigned char *mem = ring_scratch(rg, slot_bytes + 2 * acc_bytes);
    if (!mem && slot_bytes + acc_bytes)
        return ring_fail(rg, KOLO_ENOMEM, -1, "scratch");
    f->slots = mem;
    f->acc[0] = mem ? mem + slot_bytes : NULL;
    f->acc[1] = mem ? mem + slot_bytes + acc_bytes : NULL;
    return 0;
}

/* ----------------------------------------------------------------- allreduce */

/* Recursive doubling, for small buffers on the links of hier_links; out
 * already holds our input.
 *
 * With size = p + rem (p the largest power of two not above size), ranks
 * p + i (i < rem) first fold into rank i: rank i reduces "its own OP
 * p + i" and p + i sits out. In round k (mask = 2^k) every rank below p
 * trades its partial result with rank ^ mask and both compute "lower
 * partial OP higher partial" from the same two operands: the same bits on
 * both sides. After log2(p) rounds ranks 0..p-1 hold the total, and ranks
 * below rem hand it back to p + i. Every partner is at a distance that is
 * a power of two, so a lane's +-2^k links suffice. */
/* What recursive doubling reduces: elements of a dtype with an op, or
 * (round set) a readiness round's vector of count 64-bit words with
 * round_reduce, whose fields are exact and commutative. */
struct rd_op {
    kolo_dtype dtype;
    kolo_op op;
    bool round;
};

/* out = lower OP higher, where one of them is out. */
static void rd_combine(const struct rd_op *o, unsigned char *out, const unsigned char *lower,
                       const unsigned char *higher, size_t count)
{
    if (o->round)
        round_reduce((uint64_t *)out, (const uint64_t *)(lower == out ? higher : lower), count,
                     coll_round_pay); /* two operands commute exactly */
    else
        reduce_two(o->dtype, o->op, out, lower, higher, count);
}

static int allreduce_rd(struct ring *rg, const struct rd_op *o, unsigned char *out, size_t count,
                        uint64_t deadline)
{
    int n = rg->c.size, r = rg->c.rank, err;
    size_t bytes = count * (o->round ? sizeof(uint64_t) : kolo_dtype_size(o->dtype));
    unsigned char *tmp = ring_scratch(rg, bytes);
    if (!tmp)
        return ring_fail(rg, KOLO_ENOMEM, -1, "scratch");
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    /* The ranks from p up first fold into rank - p (a distance of p, a
     * power of two: a link of hier_links), recursive doubling runs among
     * ranks 0..p-1 (partners r ^ mask = r +- mask), and the folded ranks
     * get the result back. */
    int rem = n - p;

    if (r >= p || r < rem) {
        int peer = r >= p ? r - p : r + p;
        struct xport *x = rg->peers[peer];
        if (o->round) {
            /* A round may find the partner idle, and only a message wakes
             * it: both sides of the fold send (the lower one reduces what
             * it received, the higher one drops it). */
            if ((err = xport_sendrecv(x, out, bytes, x, tmp, bytes, deadline)))
                return ring_fail(rg, err, peer, "round exchanging with");
            if (r < p)
                rd_combine(o, out, out, tmp, count);
        } else if (r >= p) {
            if ((err = xport_send(x, out, bytes, deadline)))
                return ring_fail(rg, err, peer, "allreduce sending to");
        } else {
            if ((err = xport_recv(x, tmp, bytes, deadline)))
                return ring_fail(rg, err, peer, "allreduce receiving from");
            rd_combine(o, out, out, tmp, count);
        }
    }

    for (int mask = 1; r < p && mask < p; mask <<= 1) {
        int peer = r ^ mask;
        struct xport *x = rg->peers[peer];
        if ((err = xport_sendrecv(x, out, bytes, x, tmp, bytes, deadline)))
            return ring_fail(rg, err, peer, "allreduce exchanging with");
        if (peer < r)
            rd_combine(o, out, tmp, out, count);
        else
            rd_combine(o, out, out, tmp, count);
    }

    if (r >= p || r < rem) {
        int peer = r >= p ? r - p : r + p;
        if (r >= p)
            err = xport_recv(rg->peers[peer], out, bytes, deadline);
        else
            err = xport_send(rg->peers[peer], out, bytes, deadline);
        if (err)
            return ring_fail(rg, err, peer, "allreduce result with");
    }
    return 0;
}

/* The ring: segments of count/size elements (the first count%size one
 * element longer), size-1 reduce-scatter steps that leave each rank with
 * the total of its own segment, then size-1 allgather steps that pass the
 * totals around - all one pipelined flow. */
static int allreduce_ring(struct ring *rg, kolo_dtype dtype, kolo_op op, const unsigned char *in,
                          unsigned char *out, size_t count, uint64_t deadline)
{
    int n = rg->c.size;
    size_t esz = kolo_dtype_size(dtype), base = count / (size_t)n, extra = count % (size_t)n;
    size_t o = 0;
    for (int s = 0; s < n; s++) {
        rg->off[s] = o;
        rg->len[s] = (base + ((size_t)s < extra)) * esz;
        o += rg->len[s];
    }
    struct flow f = {.dtype = dtype, .op = op, .in = in, .out = out};
    int err = flow_ring_init(&f, rg, FLOW_ALLREDUCE, esz, n - 1, 2 * (n - 1));
    return err ? err : flow_run(&f);
}

/* Up to how many bytes recursive doubling beats the ring. Measured,
 * float32 sum over TCP loopback, one core per rank (two cores for two to
 * four ranks), medians: recursive doubling is ahead up to 256 KiB and
 * the ring from 512 KiB with 2, 3, 4 and 8 ranks (2 ranks, 256 KiB: 73-80
 * us against 82-84 us; 512 KiB: 155-182 us against 149-155 us). When
 * size is not a power of two and above 4, the fold costs two more
 * full-buffer transfers and the ring wins from about 100 KiB (5 ranks:
 * 101 against 122 us at 64 KiB, 163 against 131 us at 128 KiB). */
static size_t allreduce_small_max(int n)
{
    bool pow2 = (n & (n - 1)) == 0;
    return pow2 || n <= 4 ? RING_SMALL_BYTES : RING_SMALL_BYTES_ODD;
}

static bool valid_dtype_op(kolo_dtype dtype, kolo_op op)
{
    return (unsigned)dtype < KOLO_DTYPE_COUNT && (unsigned)op < KOLO_OP_COUNT;
}

static int ring_allreduce(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in, void *out,
                          size_t count, uint64_t deadline)
{
    struct ring *rg = (struct ring *)c;
    if (!valid_dtype_op(dtype, op) || (count && (!in || !out)))
        return KOLO_EINVAL;
    size_t esz = kolo_dtype_size(dtype);
    if (count > SIZE_MAX / esz)
        return KOLO_EINVAL;
    size_t bytes = count * esz;
    int err = ring_start(rg, deadline);
    if (err)
        return ring_done(rg, err);
    if (c->size == 1 || count == 0) {
        if (in != out && bytes)
            memcpy(out, in, bytes);
        return 0;
    }
    if (rg->hyper && bytes <= allreduce_small_max(c->size)) {
        if (in != out)
            memcpy(out, in, bytes);
        struct rd_op o = {.dtype = dtype, .op = op};
        err = allreduce_rd(rg, &o, out, count, deadline);
    } else {
        err = allreduce_ring(rg, dtype, op, in, out, count, deadline);
    }
    return ring_done(rg, err);
}

/* ------------------------------------------------------------ reducescatter */

/* Ring reduce-scatter with the caller's segment sizes: size-1 steps of
 * one pipelined flow, partials kept in two step-parity buffers, the last
 * step reducing straight into out. */
static int ring_reducescatter(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in,
                              void *out, const size_t *counts, uint64_t deadline)
{
    struct ring *rg = (struct ring *)c;
    int n = c->size, r = c->rank;
    if (!valid_dtype_op(dtype, op) || !counts)
        return KOLO_EINVAL;
    size_t esz = kolo_dtype_size(dtype), o = 0;
    for (int s = 0; s < n; s++) {
        if (counts[s] > (SIZE_MAX - o) / esz)
            return KOLO_EINVAL;
        rg->off[s] = o;
        rg->len[s] = counts[s] * esz;
        o += rg->len[s];
    }
    if ((o && !in) || (rg->len[r] && !out))
        return KOLO_EINVAL;
    int err = ring_start(rg, deadline);
    if (err)
        return ring_done(rg, err);
    if (n == 1) {
        if (in != out && o)
            memcpy(out, in, o);
        return 0;
    }
    struct flow f = {.dtype = dtype, .op = op, .in = in, .out = out};
    err = flow_ring_init(&f, rg, FLOW_REDUCESCATTER, esz, n - 1, n - 1);
    if (!err)
        err = flow_run(&f);
    return ring_done(rg, err);
}

/* --------------------------------------------------------------- allgatherv */

/* Ring allgather of variable-sized pieces: our piece goes into place
 * locally, then size-1 steps of one pipelined flow pass every piece
 * around, each landing straight in out. */
static int ring_allgatherv(struct coll *c, const void *in, void *out, const size_t *bytes,
                           uint64_t deadline)
{
    struct ring *rg = (struct ring *)c;
    int n = c->size, r = c->rank;
    if (!bytes)
        return KOLO_EINVAL;
    size_t o = 0;
    for (int s = 0; s < n; s++) {
        if (bytes[s] > SIZE_MAX - o)
            return KOLO_EINVAL;
        rg->off[s] = o;
        rg->len[s] = bytes[s];
        o += bytes[s];
    }
    if ((o && !out) || (bytes[r] && !in))
        return KOLO_EINVAL;
    int err = ring_start(rg, deadline);
    if (err)
        return ring_done(rg, err);
    unsigned char *mine = (unsigned char *)out + rg->off[r];
    if (bytes[r] && (const void *)mine != in)
        memmove(mine, in, bytes[r]);
    if (n == 1)
        return 0;
    struct flow f = {.in = in, .out = out};
    err = flow_ring_init(&f, rg, FLOW_ALLGATHER, 1, 0, n - 1);
    if (!err)
        err = flow_run(&f);
    return ring_done(rg, err);
}

/* ---------------------------------------------------------------- broadcast */

/* Binomial tree from root. With v = (rank - root) mod size, a rank
 * receives from v minus its lowest set bit, then sends to v + m for each
 * power of two m below that bit, largest first (so the deepest subtree
 * starts first); the root starts from the largest power of two below
 * size. Every round doubles the ranks that hold the data: ceil(log2 size)
 * rounds. */
static int bcast_tree(struct ring *rg, unsigned char *buf, size_t bytes, int root,
                      uint64_t deadline)
{
    int n = rg->c.size, v = rmod((long)rg->c.rank - root, n), m = 1, err;
    if (v == 0) {
        while (m < n)
            m <<= 1;
    } else {
        m = v & -v;
        int from = rmod((long)root + v - m, n);
        if ((err = xport_recv(rg->peers[from], buf, bytes, deadline)))
            return ring_fail(rg, err, from, "broadcast receiving from");
    }
    for (m >>= 1; m > 0; m >>= 1) {
        if (v + m >= n)
            continue;
        int to = rmod((long)root + v + m, n);
        if ((err = xport_send(rg->peers[to], buf, bytes, deadline)))
            return ring_fail(rg, err, to, "broadcast sending to");
    }
    return 0;
}

/* Pipelined chain along the ring from root: every rank but the last
 * forwards each chunk to next as soon as it has it. */
static int bcast_chain(struct ring *rg, unsigned char *buf, size_t bytes, int root,
                       uint64_t deadline)
{
    int n = rg->c.size, r = rg->c.rank, v = rmod((long)r - root, n);
    struct flow f = {.rg = rg, .kind = FLOW_CHAIN, .esz = 1, .in = buf, .out = buf};
    f.total = bytes;
    f.chunk = min_size(RING_CHUNK_BYTES, bytes);
    f.K = div_up(bytes, f.chunk);
    f.tx_rank = (r + 1) % n;
    f.rx_rank = (r + n - 1) % n;
    f.tx = v < n - 1 ? rg->peers[f.tx_rank] : NULL;
    f.rx = v > 0 ? rg->peers[f.rx_rank] : NULL;
    f.nsend = f.tx ? f.K : 0;
    f.nrecv = f.rx ? f.K : 0;
    f.lag = v == 0 ? SIZE_MAX : 0;
    return flow_run(&f);
}

/* Tree or chain, by a cost model in units of one chunk's transfer time:
 * the tree takes rounds * K (rounds = ceil(log2 size), K = chunks in the
 * buffer), the pipelined chain (size - 2) + K: its first chunk needs
 * size - 1 hops, every further one a single hop more. The tree is chosen
 * while rounds * K <= size - 2 + K. With 2 ranks both are one transfer
 * and the tree's single blocking send is the simpler. */
static bool bcast_use_tree(int n, size_t bytes)
{
    size_t rounds = 0, k = div_up(bytes, RING_CHUNK_BYTES);
    while (((size_t)1 << rounds) < (size_t)n)
        rounds++;
    return rounds <= 1 || k * (rounds - 1) <= (size_t)n - 2;
}

static int ring_broadcast(struct coll *c, void *buf, size_t bytes, int root, uint64_t deadline)
{
    struct ring *rg = (struct ring *)c;
    if (root < 0 || root >= c->size || (bytes && !buf))
        return KOLO_EINVAL;
    int err = ring_start(rg, deadline);
    if (err)
        return ring_done(rg, err);
    if (c->size == 1 || bytes == 0)
        return 0;
    if (rg->hyper && bcast_use_tree(c->size, bytes))
        err = bcast_tree(rg, buf, bytes, root, deadline);
    else
        err = bcast_chain(rg, buf, bytes, root, deadline);
    return ring_done(rg, err);
}

/* ---------------------------------------------------------------- alltoallv */

/* Pairwise exchange: in step k (1..size-1) a rank sends its block for
 * rank+k while receiving the block of rank-k, one sendrecv per step, so
 * every pair meets exactly once and no rank is sent to by two ranks at
 * the same time. Needs the full mesh. */
static int ring_alltoallv(struct coll *c, const void *in, const size_t *send_bytes, void *out,
                          const size_t *recv_bytes, uint64_t deadline)
{
    struct ring *rg = (struct ring *)c;
    int n = c->size, r = c->rank, err;
    if (!send_bytes || !recv_bytes)
        return KOLO_EINVAL;
    /* the per-rank layout arrays hold the send and receive offsets here */
    size_t *soff = rg->off, *roff = rg->len, so = 0, ro = 0;
    for (int s = 0; s < n; s++) {
        if (send_bytes[s] > SIZE_MAX - so || recv_bytes[s] > SIZE_MAX - ro)
            return KOLO_EINVAL;
        soff[s] = so;
        roff[s] = ro;
        so += send_bytes[s];
        ro += recv_bytes[s];
    }
    if ((so && !in) || (ro && !out) || send_bytes[r] != recv_bytes[r])
        return KOLO_EINVAL;
    if ((err = ring_start(rg, deadline)))
        return ring_done(rg, err);
    for (int s = 0; s < n; s++)
        if (s != r && !rg->peers[s] && (send_bytes[s] || recv_bytes[s]))
            return KOLO_ENOTSUP; /* not a full mesh */
    if (send_bytes[r])
        memmove((unsigned char *)out + roff[r], (const unsigned char *)in + soff[r], send_bytes[r]);
    for (int k = 1; k < n; k++) {
        int to = (r + k) % n, from = (r + n - k) % n;
        struct xport *xs = rg->peers[to], *xr = rg->peers[from];
        err = xport_sendrecv(xs, (const unsigned char *)in + soff[to], send_bytes[to], xr,
                             (unsigned char *)out + roff[from], recv_bytes[from], deadline);
        if (err) {
            err = ring_fail(rg, err, blame(xs, to, xr, from), "alltoall with");
            break;
        }
    }
    return ring_done(rg, err);
}

/* ------------------------------------------------------------------ barrier */

/* Dissemination: in round k a rank signals rank + 2^k and waits for the
 * signal of rank - 2^k; after ceil(log2 size) rounds every rank has
 * heard, directly or through others, from every rank. Without a full
 * mesh, a ring allgather of one byte per rank does the same in size-1
 * steps. */
static int ring_barrier(struct coll *c, uint64_t deadline)
{
    struct ring *rg = (struct ring *)c;
    int n = c->size, r = c->rank;
    int err = ring_start(rg, deadline);
    if (err || n == 1)
        return ring_done(rg, err);
    if (rg->hyper) {
        for (int d = 1; d < n && !err; d <<= 1) {
            int to = (r + d) % n, from = (r + n - d) % n;
            unsigned char token = 1, got = 0;
            struct xport *xs = rg->peers[to], *xr = rg->peers[from];
            if ((err = xport_sendrecv(xs, &token, 1, xr, &got, 1, deadline)))
                err = ring_fail(rg, err, blame(xs, to, xr, from), "barrier with");
        }
        return ring_done(rg, err);
    }
    unsigned char *tokens = ring_scratch(rg, (size_t)n);
    if (!tokens)
        return ring_done(rg, ring_fail(rg, KOLO_ENOMEM, -1, "scratch"));
    for (int s = 0; s < n; s++) {
        rg->off[s] = (size_t)s;
        rg->len[s] = 1;
    }
    tokens[r] = 1;
    struct flow f = {.in = tokens + r, .out = tokens};
    err = flow_ring_init(&f, rg, FLOW_ALLGATHER, 1, 0, n - 1);
    if (!err)
        err = flow_run(&f);
    return ring_done(rg, err);
}

/* ------------------------------------------------------------ readiness rounds */

/* A readiness round is recursive doubling of the vector with
 * round_reduce. An idle peer learns of it from the first round message
 * that reaches it (idle_wait polls every connection): it joins the round
 * and runs the schedule from its first step, which is the message it was
 * woken by. Between collectives nothing else can arrive, because every
 * rank runs the same sequence of rounds and operations. */
static int ring_round(struct coll *c, uint64_t *vec, size_t nwords, uint64_t deadline)
{
    struct ring *rg = (struct ring *)c;
    if (!vec || nwords < ROUND_HDR || !rg->hyper)
        return KOLO_EINVAL;
    int err = ring_start(rg, deadline);
    if (err || c->size == 1)
        return ring_done(rg, err);
    struct rd_op o = {.round = true};
    return ring_done(rg, allreduce_rd(rg, &o, (unsigned char *)vec, nwords, deadline));
}

/* Arms every peer connection for reading into rg->pfd[1..]; returns how
 * many pollfds (the bell first) are set. */
static int ring_arm_all(struct ring *rg)
{
    int m = 0;
    rg->pfd[m].fd = rg->bell_fd;
    rg->pfd[m].events = POLLIN;
    rg->pfd[m++].revents = 0;
    for (int r = 0; r < rg->c.size; r++) {
        struct xport *x = rg->peers[r];
        if (!x)
            continue;
        short ev = POLLIN;
        int fd = x->ops->arm(x, false, true, &ev);
        if (fd < 0)
            continue;
        rg->pfd[m].fd = fd;
        rg->pfd[m].events = ev;
        rg->pfd[m++].revents = 0;
    }
    return m;
}

static void ring_disarm_all(struct ring *rg)
{
    for (int r = 0; r < rg->c.size; r++) {
        struct xport *x = rg->peers[r];
        if (x && x->ops->disarm)
            x->ops->disarm(x);
    }
}

/* idle_wait's poll: 1 when a peer connection has something (data, or a
 * close: the round that follows fails and names it), 2 when the bell
 * rang, 0 on timeout. */
static int ring_poll(struct ring *rg, int timeout_ms)
{
    /* a round message the transport already read ahead: no poll sees it */
    for (int r = 0; r < rg->c.size; r++)
        if (rg->peers[r] && xport_buffered(rg->peers[r]))
            return 1;
    int m = ring_arm_all(rg);
    int n = poll(rg->pfd, (nfds_t)m, timeout_ms);
    ring_disarm_all(rg);
    if (n <= 0)
        return 0;
    for (int i = 1; i < m; i++)
        if (rg->pfd[i].revents)
            return 1;
    return rg->pfd[0].revents ? 2 : 0;
}

static bool ring_peer_started(struct coll *c)
{
    struct ring *rg = (struct ring *)c;
    return !c->failed && c->size > 1 && ring_poll(rg, 0) == 1;
}

static uint64_t ring_bell_seen(struct coll *c)
{
    struct ring *rg = (struct ring *)c;
    uint64_t drain;
    /* Only the one idle waiter reads the eventfd, so draining it here
     * cannot steal another waiter's wake-up. */
    while (read(rg->bell_fd, &drain, sizeof drain) > 0) {
    }
    return atomic_load(&rg->bell);
}

static void ring_bell_ring(struct coll *c)
{
    struct ring *rg = (struct ring *)c;
    uint64_t one = 1;
    atomic_fetch_add(&rg->bell, 1);
    ssize_t w = write(rg->bell_fd, &one, sizeof one);
    (void)w; /* EAGAIN: the counter is already non-zero, which is all that matters */
}

/* A waiter (spin) on spinning connections looks at the sockets for the
 * spin window before it sleeps in poll: the peer's round message usually
 * comes sooner than a wake-up would. The background thread never spins. */
static int ring_idle_wait(struct coll *c, uint64_t seen, int timeout_ms, bool spin)
{
    struct ring *rg = (struct ring *)c;
    if (c->failed)
        return -c->failed;
    if (atomic_load(&rg->bell) != seen)
        return 1;
    int next = (c->rank + 1) % c->size;
    if (spin && c->size > 1 && rg->peers[next] && xport_spins(rg->peers[next])) {
        uint64_t end = now_mono_ns() + (uint64_t)xport_spin_us() * 1000u;
        do {
            if (ring_poll(rg, 0) || atomic_load(&rg->bell) != seen)
                return 1;
        } while (now_mono_ns() < end);
    }
    return ring_poll(rg, timeout_ms) ? 1 : 0;
}

/* -------------------------------------------------------------------- setup */

static void ring_destroy(struct coll *c)
{
    struct ring *rg = (struct ring *)c;
    if (!rg)
        return;
    ring_close_all(rg);
    if (rg->bell_fd >= 0)
        close(rg->bell_fd);
    free(rg->pfd);
    free(rg->peers);
    free(rg->off);
    free(rg->len);
    free(rg->scratch);
    free(rg);
}

static void ring_interrupt(struct coll *c)
{
    struct ring *rg = (struct ring *)c;
    for (int r = 0; r < c->size; r++)
        if (rg->peers[r] && rg->peers[r]->ops->interrupt)
            rg->peers[r]->ops->interrupt(rg->peers[r]);
}

static const struct coll_ops ring_ops = {
    .name = "ring",
    .interrupt = ring_interrupt,
    .allreduce = ring_allreduce,
    .allgatherv = ring_allgatherv,
    .broadcast = ring_broadcast,
    .alltoallv = ring_alltoallv,
    .reducescatter = ring_reducescatter,
    .barrier = ring_barrier,
    .destroy = ring_destroy,
    .round = ring_round,
    .peer_started = ring_peer_started,
    .bell_seen = ring_bell_seen,
    .bell_ring = ring_bell_ring,
    .idle_wait = ring_idle_wait,
};

/* ring_create needs at least the ring neighbours; with every other rank
 * connected (a full mesh) it also uses the small-message algorithms.
 * The xports become the ring's only on success. */
int ring_create(int rank, int size, struct xport **peers, struct coll **out)
{
    if (!out || size < 1 || rank < 0 || rank >= size || (size > 1 && !peers))
        return KOLO_EINVAL;
    *out = NULL;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    if (size > 1 && (!peers[next] || !peers[prev]))
        return KOLO_EINVAL;
    struct ring *rg = calloc(1, sizeof *rg);
    if (!rg)
        return KOLO_ENOMEM;
    rg->peers = calloc((size_t)size, sizeof *rg->peers);
    rg->off = calloc((size_t)size, sizeof *rg->off);
    rg->len = calloc((size_t)size, sizeof *rg->len);
    rg->pfd = calloc((size_t)size + 1, sizeof *rg->pfd);
    rg->bell_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!rg->peers || !rg->off || !rg->len || !rg->pfd || rg->bell_fd < 0) {
        if (rg->bell_fd >= 0)
            close(rg->bell_fd);
        free(rg->pfd);
        free(rg->peers);
        free(rg->off);
        free(rg->len);
        free(rg);
        return KOLO_ENOMEM;
    }
    rg->c.ops = &ring_ops;
    rg->c.rank = rank;
    rg->c.size = size;
    rg->mesh = true;
    for (int r = 0; r < size; r++) {
        rg->peers[r] = r == rank ? NULL : peers[r];
        if (r != rank && !peers[r])
            rg->mesh = false;
    }
    rg->hyper = rg->mesh;
    if (!rg->mesh && size > 1) {
        int links[64], nl = hier_links(rank, size, links);
        rg->hyper = true;
        for (int i = 0; i < nl; i++)
            if (!peers[links[i]])
                rg->hyper = false;
    }
    rg->c.can_round = rg->hyper; /* rounds use recursive doubling */
    *out = &rg->c;
    return 0;
}
