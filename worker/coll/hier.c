/*
 * hier.c - the collectives of a job that spans hosts (see hier.h and
 * hier_plan.h for the shape).
 *
 * DESIGN
 *
 * Composition. A struct hier holds two collectives of its own: local,
 * the host's shared segment (shmcoll; absent on a host of one rank), and
 * lane, a ring backend (ring.c) over this rank's lane links, whose
 * members are the lane's ranks in the hosts' ring order (absent beyond
 * the lanes, and with one host). Every operation is a fixed sequence of
 * calls on those two, the same on every rank of a host, so the ranks of
 * one host always meet in the same local operation, and the members of a
 * lane in the same lane operation:
 *
 *   allreduce, small   local allreduce; leaders: lane allreduce; local broadcast
 *   allreduce, large   local reducescatter into one shard per lane; every
 *                      lane: allreduce of its shard; local allgather
 *   broadcast          the root's host: local broadcast from the root;
 *                      leaders: lane broadcast from the root's host;
 *                      the other hosts: local broadcast from the leader
 *   allgatherv         local allgather into the host's block; leaders:
 *                      lane allgather of the blocks; local broadcast
 *                      (then, if ranks are not numbered host after host,
 *                      each block is copied to its ranks' places)
 *   reducescatter      the allreduce above, each rank keeps its part
 *   barrier            local barrier; leaders: lane barrier; local barrier
 *   round              local round; leaders: lane round; local broadcast
 *   alltoallv          local alltoall in the segment; the pairs on other
 *                      hosts: pairwise exchange over links made at the
 *                      first alltoall (authenticated like every other,
 *                      kept for the generation)
 *
 * Waking. A rank between collectives learns that a round started from
 * its segment (a local peer began one). A leader must also learn it from
 * its lane's sockets, where another host's leader begins; it sleeps on
 * the segment's bell, and a watcher thread polls the lane's sockets
 * while (and only while) it sleeps, ringing the bell when one turns
 * readable. The round then starts on this host through the segment.
 *
 * Failure: the first failure of a part is this coll's (sticky), its
 * reason the part's with the ranks named as the job knows them
 * (coll.names). A part that failed has already told its own peers (the
 * segment's abort record, closed sockets), and they fail their parts in
 * turn, so a dead rank fails every rank's pending collective.
 */
#include "hier.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "hier_plan.h"
#include "mesh.h"
#include "settings.h"
#include "util.h"

struct hier {
    struct coll c;
    struct topology t;
    struct hier_plan p;
    struct coll *local; /* NULL: one rank on this host */
    struct coll *lane;  /* NULL: no lane, or one host */
    /* alltoall's links to every rank of another host, made on first use */
    struct xport **a2a;
    bool a2a_made;
    int listen_fd;
    char **hosts;
    int *ports;
    struct tcp_ident me;
    bool spin;
    /* per-call layout, [size] each */
    size_t *soff, *roff, *sb;
    size_t *hb; /* [max(nhosts, nlocal)] */
    unsigned char *scratch;
    size_t scratch_cap;
    /* the leader's lane watcher (see DESIGN) */
    pthread_t watcher;
    bool watcher_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool armed, stopping;
    int ctl_fd; /* eventfd: leave the poll */
    int lane_fd[64]; /* the lane links' sockets */
    struct pollfd *wfd;
    int nwfd;
};

static const struct coll_ops hier_ops;

/* ------------------------------------------------------------------ failure */

/* Makes part's failure (or err) this coll's, once; returns the sticky code. */
static int hier_fail(struct hier *h, int err, const struct coll *part, const char *what)
{
    if (err < 0)
        err = -err;
    if (!err)
        err = KOLO_EINTERNAL;
    if (!h->c.failed) {
        const char *where = part == h->local ? "on this host" : "between hosts";
        if (part && part->why[0])
            snprintf(h->c.why, sizeof h->c.why, "%.30s %s: %.200s", what, where, part->why);
        else
            snprintf(h->c.why, sizeof h->c.why, "%.30s %s: %.60s", what, where,
                     kolo_strerror(err));
        h->c.failed = err;
        /* the other part's peers learn it from their own part: the host's
         * ranks from the segment's abort record (with this reason, so that
         * they name the rank or link that broke, not the leader they were
         * waiting for), the lane's from its sockets closing */
        if (h->local && part != h->local) {
            char why[sizeof h->c.why + 16];
            snprintf(why, sizeof why, "rank %d: %s", h->c.rank, h->c.why);
            shmcoll_abort(h->local, err, why);
        }
        if (h->lane && part != h->lane && h->lane->ops->interrupt)
            h->lane->ops->interrupt(h->lane);
    }
    return h->c.failed;
}

/* Each step below is one call on a part; a failure ends the collective. */
#define STEP(h, part, what, call)                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_)                                                                                   \
            return hier_fail((h), rc_, (part), (what));                                            \
    } while (0)

/* Never NULL but out of memory, even for 0 bytes. */
static unsigned char *scratch(struct hier *h, size_t bytes)
{
    if (bytes <= h->scratch_cap && h->scratch)
        return h->scratch;
    size_t cap = bytes < 4096 ? 4096 : bytes;
    void *p = NULL;
    if (posix_memalign(&p, 64, cap) != 0)
        return NULL;
    free(h->scratch);
    h->scratch = p;
    h->scratch_cap = cap;
    return p;
}

static bool leader(const struct hier *h)
{
    return h->p.local == 0;
}

/* ---------------------------------------------------------------- allreduce */

static int hier_allreduce(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in, void *out,
                          size_t count, uint64_t deadline)
{
    struct hier *h = (struct hier *)c;
    if ((unsigned)dtype >= KOLO_DTYPE_COUNT || (unsigned)op >= KOLO_OP_COUNT ||
        (count && (!in || !out)))
        return KOLO_EINVAL;
    if (c->failed)
        return c->failed;
    size_t es = kolo_dtype_size(dtype);
    if (count > SIZE_MAX / es)
        return KOLO_EINVAL;
    if (count == 0)
        return 0;
    size_t bytes = count * es;
    if (hier_allreduce_algo(&h->p, count, es) == HIER_LEADERS) {
        if (h->local)
            STEP(h, h->local, "allreduce", h->local->ops->allreduce(h->local, dtype, op, in, out,
                                                                    count, deadline));
        else if (in != out)
            memcpy(out, in, bytes);
        if (h->lane && leader(h))
            STEP(h, h->lane, "allreduce",
                 h->lane->ops->allreduce(h->lane, dtype, op, out, out, count, deadline));
        if (h->local)
            STEP(h, h->local, "allreduce", h->local->ops->broadcast(h->local, out, bytes, 0,
                                                                    deadline));
        return 0;
    }
    /* one shard per lane: counts by local index, 0 beyond the lanes */
    int L = h->p.nlocal, P = h->p.lanes;
    size_t *counts = h->hb, *sbytes = h->sb;
    for (int i = 0; i < L; i++) {
        counts[i] = i < P ? count / (size_t)P + ((size_t)i < count % (size_t)P) : 0;
        sbytes[i] = counts[i] * es;
    }
    /* This rank's shard is reduced where it ends up, in out: the lane
     * works on it in place, and the allgather finds it there (no copy). */
    size_t mine = counts[h->p.local], my_off = 0;
    for (int i = 0; i < h->p.local; i++)
        my_off += sbytes[i];
    unsigned char *shard = (unsigned char *)out + my_off;
    STEP(h, h->local, "allreduce",
         h->local->ops->reducescatter(h->local, dtype, op, in, shard, counts, deadline));
    if (h->lane && mine)
        STEP(h, h->lane, "allreduce",
             h->lane->ops->allreduce(h->lane, dtype, op, shard, shard, mine, deadline));
    STEP(h, h->local, "allreduce",
         h->local->ops->allgatherv(h->local, shard, out, sbytes, deadline));
    return 0;
}

/* ------------------------------------------------------------ reducescatter */

static int hier_reducescatter(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in,
                              void *out, const size_t *counts, uint64_t deadline)
{
    struct hier *h = (struct hier *)c;
    if ((unsigned)dtype >= KOLO_DTYPE_COUNT || !counts)
        return KOLO_EINVAL;
    size_t es = kolo_dtype_size(dtype), total = 0, before = 0;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] > (SIZE_MAX / es - total))
            return KOLO_EINVAL;
        if (r == c->rank)
            before = total;
        total += counts[r];
    }
    if ((total && !in) || (counts[c->rank] && !out))
        return KOLO_EINVAL;
    /* the whole reduction in a buffer of our own (the allreduce's own
     * scratch holds a shard, so this one is separate), then our part */
    unsigned char *all = total ? malloc(total * es) : NULL;
    if (total && !all)
        return hier_fail(h, KOLO_ENOMEM, NULL, "reducescatter");
    int rc = hier_allreduce(c, dtype, op, in, all, total, deadline);
    if (!rc && counts[c->rank])
        memcpy(out, all + before * es, counts[c->rank] * es);
    free(all);
    return rc;
}

/* --------------------------------------------------------------- allgatherv */

static int hier_allgatherv(struct coll *c, const void *in, void *out_, const size_t *bytes,
                           uint64_t deadline)
{
    struct hier *h = (struct hier *)c;
    const struct topology *t = &h->t;
    unsigned char *out = out_;
    if (!bytes)
        return KOLO_EINVAL;
    if (c->failed)
        return c->failed;
    size_t total = 0;
    for (int r = 0; r < c->size; r++) {
        if (bytes[r] > SIZE_MAX - total)
            return KOLO_EINVAL;
        total += bytes[r];
    }
    if ((total && !out) || (bytes[c->rank] && !in))
        return KOLO_EINVAL;
    /* the hosts' blocks, one after the other in ring order */
    size_t *hb = h->hb, *lb = h->sb, hoff = 0;
    for (int x = 0; x < t->nhosts; x++) {
        hb[x] = 0;
        for (int i = 0; i < t->count[x]; i++)
            hb[x] += bytes[topology_rank(t, x, i)];
        if (x < h->p.host)
            hoff += hb[x];
    }
    for (int i = 0; i < h->p.nlocal; i++)
        lb[i] = bytes[h->p.host_ranks[i]];
    unsigned char *all = out;
    if (!h->p.contiguous && !(all = scratch(h, total)))
        return hier_fail(h, KOLO_ENOMEM, NULL, "allgather");
    if (h->local)
        STEP(h, h->local, "allgather",
             h->local->ops->allgatherv(h->local, in, all + hoff, lb, deadline));
    else if (bytes[c->rank] && all + hoff != in)
        memmove(all + hoff, in, bytes[c->rank]);
    if (h->lane && leader(h))
        STEP(h, h->lane, "allgather",
             h->lane->ops->allgatherv(h->lane, all + hoff, all, hb, deadline));
    if (h->local && total)
        STEP(h, h->local, "allgather", h->local->ops->broadcast(h->local, all, total, 0, deadline));
    if (!h->p.contiguous) {
        /* from host order to rank order */
        size_t *roff = h->roff, o = 0;
        for (int r = 0; r < c->size; r++) {
            roff[r] = o;
            o += bytes[r];
        }
        size_t from = 0;
        for (int k = 0; k < c->size; k++) {
            int r = t->ranks[k];
            if (bytes[r])
                memcpy(out + roff[r], all + from, bytes[r]);
            from += bytes[r];
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- broadcast */

static int hier_broadcast(struct coll *c, void *buf, size_t bytes, int root, uint64_t deadline)
{
    struct hier *h = (struct hier *)c;
    if (root < 0 || root >= c->size || (bytes && !buf))
        return KOLO_EINVAL;
    if (c->failed)
        return c->failed;
    if (bytes == 0)
        return 0;
    int rh = h->t.host[root], ri = h->t.local[root];
    bool here = rh == h->p.host;
    if (here && h->local)
        STEP(h, h->local, "broadcast", h->local->ops->broadcast(h->local, buf, bytes, ri, deadline));
    if (h->lane && leader(h))
        STEP(h, h->lane, "broadcast", h->lane->ops->broadcast(h->lane, buf, bytes, rh, deadline));
    if (!here && h->local)
        STEP(h, h->local, "broadcast", h->local->ops->broadcast(h->local, buf, bytes, 0, deadline));
    return 0;
}

/* ------------------------------------------------------------------ barrier */

static int hier_barrier(struct coll *c, uint64_t deadline)
{
    struct hier *h = (struct hier *)c;
    if (c->failed)
        return c->failed;
    if (h->local)
        STEP(h, h->local, "barrier", h->local->ops->barrier(h->local, deadline));
    if (h->lane && leader(h))
        STEP(h, h->lane, "barrier", h->lane->ops->barrier(h->lane, deadline));
    if (h->local)
        STEP(h, h->local, "barrier", h->local->ops->barrier(h->local, deadline));
    return 0;
}

/* ---------------------------------------------------------------- alltoallv */

/* The links to every rank of another host, made by every rank in the
 * same (first) alltoall, so both ends of each pair dial or accept now. */
static int a2a_links(struct hier *h, uint64_t deadline)
{
    if (h->a2a_made)
        return 0;
    bool *want = calloc((size_t)h->c.size, sizeof *want);
    if (!want)
        return hier_fail(h, KOLO_ENOMEM, NULL, "alltoall");
    for (int r = 0; r < h->c.size; r++)
        want[r] = h->t.host[r] != h->p.host;
    struct mesh_spec spec = {.me = h->me,
                             .size = h->c.size,
                             .listen_fd = h->listen_fd,
                             .hosts = (const char *const *)h->hosts,
                             .ports = h->ports,
                             .want = want,
                             .deadline = deadline ? deadline : now_mono_ms() + MESH_HANDSHAKE_MS};
    char err[160];
    int rc = mesh_connect(&spec, h->a2a, err, sizeof err);
    free(want);
    if (rc) {
        if (!h->c.failed) {
            snprintf(h->c.why, sizeof h->c.why, "alltoall links: %.140s", err);
            h->c.failed = rc;
        }
        return h->c.failed;
    }
    for (int r = 0; r < h->c.size; r++)
        if (h->a2a[r])
            h->a2a[r]->spin = h->spin;
    h->a2a_made = true;
    return 0;
}

static void a2a_close(struct hier *h)
{
    for (int r = 0; h->a2a && r < h->c.size; r++)
        if (h->a2a[r]) {
            xport_close(h->a2a[r]);
            h->a2a[r] = NULL;
        }
}

static int hier_alltoallv(struct coll *c, const void *in_, const size_t *send_bytes, void *out_,
                          const size_t *recv_bytes, uint64_t deadline)
{
    struct hier *h = (struct hier *)c;
    const unsigned char *in = in_;
    unsigned char *out = out_;
    int n = c->size, r = c->rank;
    if (!send_bytes || !recv_bytes)
        return KOLO_EINVAL;
    if (c->failed)
        return c->failed;
    size_t so = 0, ro = 0;
    for (int s = 0; s < n; s++) {
        if (send_bytes[s] > SIZE_MAX - so || recv_bytes[s] > SIZE_MAX - ro)
            return KOLO_EINVAL;
        h->soff[s] = so;
        h->roff[s] = ro;
        so += send_bytes[s];
        ro += recv_bytes[s];
    }
    if ((so && !in) || (ro && !out) || send_bytes[r] != recv_bytes[r])
        return KOLO_EINVAL;
    /* this host's pairs, in the segment: packed by local index */
    int L = h->p.nlocal;
    if (h->local) {
        size_t *lsb = h->sb, *lrb = h->hb, ls = 0, lr = 0;
        for (int i = 0; i < L; i++) {
            int x = h->p.host_ranks[i];
            lsb[i] = send_bytes[x];
            lrb[i] = recv_bytes[x];
            ls += lsb[i];
            lr += lrb[i];
        }
        unsigned char *sbuf = scratch(h, ls + lr);
        if (ls + lr && !sbuf)
            return hier_fail(h, KOLO_ENOMEM, NULL, "alltoall");
        unsigned char *rbuf = sbuf + ls;
        for (int i = 0, o = 0; i < L; o += (int)lsb[i], i++)
            memcpy(sbuf + o, in + h->soff[h->p.host_ranks[i]], lsb[i]);
        STEP(h, h->local, "alltoall",
             h->local->ops->alltoallv(h->local, sbuf, lsb, rbuf, lrb, deadline));
        for (int i = 0, o = 0; i < L; o += (int)lrb[i], i++)
            memcpy(out + h->roff[h->p.host_ranks[i]], rbuf + o, lrb[i]);
    } else if (send_bytes[r]) {
        memmove(out + h->roff[r], in + h->soff[r], send_bytes[r]);
    }
    if (h->t.nhosts == 1)
        return 0;
    int rc = a2a_links(h, deadline);
    if (rc)
        return rc;
    /* the other hosts' ranks: pairwise exchange (step k: send to r + k,
     * receive from r - k), a pair on one host moving nothing */
    for (int k = 1; k < n; k++) {
        int to = (r + k) % n, from = (r + n - k) % n;
        struct xport *xs = h->a2a[to], *xr = h->a2a[from];
        size_t sl = xs ? send_bytes[to] : 0, rl = xr ? recv_bytes[from] : 0;
        if (!xs && !xr)
            continue;
        rc = xport_sendrecv(xs, in + h->soff[to], sl, xr, out + h->roff[from], rl, deadline);
        if (rc) {
            const struct xport *bad = xs && xs->failed ? xs : xr;
            if (!c->failed) {
                snprintf(c->why, sizeof c->why, "alltoall with rank %d: %.120s",
                         bad == xs ? to : from, bad && bad->why[0] ? bad->why : kolo_strerror(rc));
                c->failed = rc;
            }
            a2a_close(h); /* the peers waiting on us notice */
            return c->failed;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ readiness rounds */

static int hier_round(struct coll *c, uint64_t *vec, size_t nwords, uint64_t deadline)
{
    struct hier *h = (struct hier *)c;
    if (c->failed)
        return c->failed;
    if (h->local)
        STEP(h, h->local, "round", h->local->ops->round(h->local, vec, nwords, deadline));
    if (h->lane && leader(h))
        STEP(h, h->lane, "round", h->lane->ops->round(h->lane, vec, nwords, deadline));
    if (h->local)
        STEP(h, h->local, "round",
             h->local->ops->broadcast(h->local, vec, nwords * sizeof *vec, 0, deadline));
    return 0;
}

static bool hier_peer_started(struct coll *c)
{
    struct hier *h = (struct hier *)c;
    if (c->failed)
        return false;
    if (h->local && h->local->ops->peer_started(h->local))
        return true;
    return h->lane && leader(h) && h->lane->ops->peer_started(h->lane);
}

/* The bell is the segment's (or, alone on a host, the lane's). */
static struct coll *bell_part(struct hier *h)
{
    return h->local ? h->local : h->lane;
}

static uint64_t hier_bell_seen(struct coll *c)
{
    struct coll *b = bell_part((struct hier *)c);
    return b ? b->ops->bell_seen(b) : 0;
}

static void hier_bell_ring(struct coll *c)
{
    struct coll *b = bell_part((struct hier *)c);
    if (b)
        b->ops->bell_ring(b);
}

static void *watcher_main(void *arg)
{
    struct hier *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->armed && !h->stopping)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->stopping)
            break;
        pthread_mutex_unlock(&h->mu);
        for (int i = 0; i < h->nwfd; i++)
            h->wfd[i].revents = 0;
        int n = poll(h->wfd, (nfds_t)h->nwfd, -1);
        uint64_t drain;
        while (read(h->ctl_fd, &drain, sizeof drain) > 0) {
        }
        bool lane_moved = false;
        for (int i = 1; n > 0 && i < h->nwfd; i++)
            lane_moved |= h->wfd[i].revents != 0;
        pthread_mutex_lock(&h->mu);
        if (lane_moved && h->armed) {
            h->armed = false; /* once per sleep: the data stays until the round reads it */
            h->local->ops->bell_ring(h->local);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void watcher_set(struct hier *h, bool armed)
{
    pthread_mutex_lock(&h->mu);
    h->armed = armed;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (!armed) {
        uint64_t one = 1;
        ssize_t w = write(h->ctl_fd, &one, sizeof one);
        (void)w; /* EAGAIN: already signalled */
    }
}

static int hier_idle_wait(struct coll *c, uint64_t seen, int timeout_ms, bool spin)
{
    struct hier *h = (struct hier *)c;
    if (c->failed)
        return -c->failed;
    if (!h->local)
        return h->lane ? h->lane->ops->idle_wait(h->lane, seen, timeout_ms, spin) : 0;
    if (!h->watcher_running)
        return h->local->ops->idle_wait(h->local, seen, timeout_ms, spin);
    if (h->lane->ops->peer_started(h->lane))
        return 1;
    watcher_set(h, true);
    int rc = h->local->ops->idle_wait(h->local, seen, timeout_ms, spin);
    watcher_set(h, false);
    return rc;
}

/* -------------------------------------------------------------------- setup */

static void hier_interrupt(struct coll *c)
{
    struct hier *h = (struct hier *)c;
    if (h->local && h->local->ops->interrupt)
        h->local->ops->interrupt(h->local);
    if (h->lane && h->lane->ops->interrupt)
        h->lane->ops->interrupt(h->lane);
    for (int r = 0; h->a2a && r < c->size; r++)
        if (h->a2a[r] && h->a2a[r]->ops->interrupt)
            h->a2a[r]->ops->interrupt(h->a2a[r]);
}

static void stop_watcher(struct hier *h)
{
    if (h->watcher_running) {
        pthread_mutex_lock(&h->mu);
        h->stopping = true;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        uint64_t one = 1;
        ssize_t w = write(h->ctl_fd, &one, sizeof one);
        (void)w;
        pthread_join(h->watcher, NULL);
        h->watcher_running = false;
    }
}

static void hier_destroy(struct coll *c)
{
    struct hier *h = (struct hier *)c;
    if (!h)
        return;
    stop_watcher(h);
    if (h->local)
        h->local->ops->destroy(h->local);
    if (h->lane)
        h->lane->ops->destroy(h->lane);
    a2a_close(h);
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    if (h->ctl_fd >= 0)
        close(h->ctl_fd);
    free(h->hosts);
    free(h->ports);
    free(h->a2a);
    free(h->soff);
    free(h->roff);
    free(h->sb);
    free(h->hb);
    free(h->wfd);
    free(h->scratch);
    hier_plan_free(&h->p);
    topology_free(&h->t);
    memset(h->me.key, 0, sizeof h->me.key);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

/* The host's segment outlives the rest (coll_ops.keep_segment). */
static struct coll *hier_keep_segment(struct coll *c)
{
    struct hier *h = (struct hier *)c;
    stop_watcher(h); /* it may abort local */
    struct coll *local = h->local;
    h->local = NULL;
    hier_destroy(c);
    return local && local->ops->keep_segment ? local->ops->keep_segment(local) : NULL;
}

int hier_sockets(const struct coll *c)
{
    if (!c || c->ops != &hier_ops)
        return 0;
    const struct hier *h = (const struct hier *)c;
    int n = h->lane ? h->p.nlinks : 0;
    for (int r = 0; h->a2a && r < c->size; r++)
        n += h->a2a[r] != NULL;
    return n;
}

static const struct coll_ops hier_ops = {
    .name = "hier",
    .interrupt = hier_interrupt,
    .allreduce = hier_allreduce,
    .allgatherv = hier_allgatherv,
    .broadcast = hier_broadcast,
    .alltoallv = hier_alltoallv,
    .reducescatter = hier_reducescatter,
    .barrier = hier_barrier,
    .destroy = hier_destroy,
    .keep_segment = hier_keep_segment,
    .round = hier_round,
    .peer_started = hier_peer_started,
    .bell_seen = hier_bell_seen,
    .bell_ring = hier_bell_ring,
    .idle_wait = hier_idle_wait,
};

/* The lane: its links connected (every rank at once), then a ring over
 * them whose members are the lane's ranks in the hosts' ring order. */
static int make_lane(struct hier *h, const struct hier_spec *s, char *err, size_t errlen)
{
    int n = h->c.size, H = h->p.nhosts;
    struct xport **peers = calloc((size_t)n, sizeof *peers);
    struct xport **members = calloc((size_t)H, sizeof *members);
    bool *want = calloc((size_t)n, sizeof *want);
    int code = 0;
    if (!peers || !members || !want) {
        code = KOLO_ENOMEM;
        goto out;
    }
    for (int i = 0; i < h->p.nlinks; i++)
        want[h->p.links[i]] = true;
    struct mesh_spec ms = {.me = s->me,
                           .size = n,
                           .listen_fd = s->listen_fd,
                           .hosts = s->hosts,
                           .ports = s->ports,
                           .want = want,
                           .deadline = s->deadline};
    if ((code = mesh_connect(&ms, peers, err, errlen)) != 0)
        goto out;
    memset(ms.me.key, 0, sizeof ms.me.key);
    for (int x = 0; x < H; x++) {
        int r = h->p.lane_ranks[x];
        members[x] = r == h->c.rank ? NULL : peers[r];
        if (members[x])
            members[x]->spin = s->spin;
    }
    /* the sockets' fds, for the watcher: the ring owns the connections,
     * whose fds stay the same until it closes them */
    for (int i = 0; i < h->p.nlinks; i++) {
        struct xport *x = peers[h->p.links[i]];
        short ev;
        h->lane_fd[i] = x->ops->arm(x, false, true, &ev);
        if (x->ops->disarm)
            x->ops->disarm(x);
    }
    if ((code = ring_create(h->p.host, H, members, &h->lane)) != 0) {
        snprintf(err, errlen, "cannot set up the lane between hosts: %s", kolo_strerror(code));
        for (int r = 0; r < n; r++)
            if (peers[r])
                xport_close(peers[r]);
        goto out;
    }
    h->lane->names = h->p.lane_ranks;
out:
    free(peers);
    free(members);
    free(want);
    return code;
}

static int copy_topology(struct topology *dst, const struct topology *src)
{
    char why[64];
    return topology_set(dst, src->size, src->nhosts, src->count, src->ranks, why, sizeof why);
}

int hier_create(const struct hier_spec *s, struct coll **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!s || !s->topo || s->rank < 0 || s->rank >= s->topo->size || !s->hosts || !s->ports)
        return KOLO_EINVAL;
    int n = s->topo->size;
    struct hier *h = calloc(1, sizeof *h);
    if (!h)
        return KOLO_ENOMEM;
    h->c.ops = &hier_ops;
    h->c.rank = s->rank;
    h->c.size = n;
    h->listen_fd = -1;
    h->ctl_fd = -1;
    h->me = s->me;
    h->spin = s->spin;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    int code = copy_topology(&h->t, s->topo);
    if (!code)
        code = hier_plan_make(&h->p, &h->t, s->rank);
    /* every rank must take the same path: the knob is the job's (kolo run
     * gives every worker the same environment) */
    h->p.lanes_min = (size_t)settings_int(SET_HIER_LANES, (int64_t)HIER_LANES_MIN_BYTES);
    size_t most = (size_t)(n > h->t.nhosts ? n : h->t.nhosts);
    if (!code) {
        h->a2a = calloc((size_t)n, sizeof *h->a2a);
        h->hosts = str_table(s->hosts, n); /* one block: alltoall's links made later */
        h->ports = calloc((size_t)n, sizeof *h->ports);
        h->soff = calloc((size_t)n, sizeof(size_t));
        h->roff = calloc((size_t)n, sizeof(size_t));
        h->sb = calloc(most, sizeof(size_t));
        h->hb = calloc(most, sizeof(size_t));
        if (!h->a2a || !h->hosts || !h->ports || !h->soff || !h->roff || !h->sb ||
            !h->hb)
            code = KOLO_ENOMEM;
        for (int r = 0; !code && r < n; r++)
            h->ports[r] = s->ports[r];
    }
    if (code) {
        snprintf(err, errlen, "cannot plan the data plane: %s", kolo_strerror(code));
        h->c.ops->destroy(&h->c);
        return code;
    }
    if (h->p.lane >= 0 && h->p.nhosts > 1 && (code = make_lane(h, s, err, errlen)) != 0) {
        h->c.ops->destroy(&h->c);
        return code;
    }
    /* a leader with local peers watches its lane while it sleeps */
    if (h->lane && leader(h) && s->local) {
        h->ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        h->wfd = calloc((size_t)h->p.nlinks + 1, sizeof *h->wfd);
        if (h->ctl_fd < 0 || !h->wfd) {
            snprintf(err, errlen, "cannot watch the lane: out of resources");
            h->c.ops->destroy(&h->c);
            return KOLO_ENOMEM;
        }
        h->wfd[h->nwfd++] = (struct pollfd){.fd = h->ctl_fd, .events = POLLIN};
        for (int i = 0; i < h->p.nlinks; i++)
            h->wfd[h->nwfd++] = (struct pollfd){.fd = h->lane_fd[i], .events = POLLIN};
        if (pthread_create(&h->watcher, NULL, watcher_main, h) != 0) {
            snprintf(err, errlen, "cannot start the lane watcher");
            h->c.ops->destroy(&h->c);
            return KOLO_ENOMEM;
        }
        h->watcher_running = true;
    }
    h->local = s->local;
    if (h->local)
        h->local->names = h->p.host_ranks;
    h->listen_fd = s->listen_fd;
    h->c.can_round = (!h->local || h->local->can_round) && (!h->lane || h->lane->can_round);
    *out = &h->c;
    return 0;
}
