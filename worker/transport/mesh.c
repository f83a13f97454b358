/*
 * mesh.c - the authenticated TCP mesh of one generation (see mesh.h).
 *
 * DESIGN. One loop, no blocking call inside it: step every handshake that
 * can move (outbound ones to the ranks below, inbound ones from the
 * listener), take new connections off the listener, then poll() all of
 * their sockets until something moves or a deadline passes. An inbound
 * connection earns a place in peers[] only once its handshake proved the
 * generation's key and named a higher rank that has no connection yet;
 * anything else is closed without touching the mesh. An outbound
 * connection that fails (a refusal, a wrong key on the other side) fails
 * the set-up: the rank we were told to reach is not who answered.
 */
#include "mesh.h"

#include <poll.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "kolo.h"
#include "log.h"
#include "util.h"

static _Atomic uint64_t rejected[MESH_REJECT_N], unreported[MESH_REJECT_N];

static const char *const reject_names[MESH_REJECT_N] = {
    "malformed", "stale", "version", "auth", "closed", "timeout", "duplicate", "crowded", "setting",
};

const char *mesh_reject_name(enum mesh_reject r)
{
    return r >= 0 && r < MESH_REJECT_N ? reject_names[r] : "?";
}

uint64_t mesh_rejections(enum mesh_reject r)
{
    return r >= 0 && r < MESH_REJECT_N ? rejected[r] : 0;
}

uint64_t mesh_rejections_take(enum mesh_reject r)
{
    return r >= 0 && r < MESH_REJECT_N ? atomic_exchange(&unreported[r], 0) : 0;
}

void mesh_rejections_return(enum mesh_reject r, uint64_t n)
{
    if (r >= 0 && r < MESH_REJECT_N)
        unreported[r] += n;
}

/* Hosts already named in a log line: a flood is logged once per source. */
#define LOGGED_HOSTS 32
static pthread_mutex_t logged_mu = PTHREAD_MUTEX_INITIALIZER;
static char logged[LOGGED_HOSTS][64];
static int nlogged, next_slot; /* a ring: the oldest host is forgotten first */

static bool first_from(const char *host)
{
    pthread_mutex_lock(&logged_mu);
    bool first = true;
    for (int i = 0; i < nlogged && first; i++)
        first = strcmp(logged[i], host) != 0;
    if (first) {
        str_copy(logged[next_slot], host, sizeof logged[0]);
        next_slot = (next_slot + 1) % LOGGED_HOSTS;
        if (nlogged < LOGGED_HOSTS)
            nlogged++;
    }
    pthread_mutex_unlock(&logged_mu);
    return first;
}

static enum mesh_reject reason_of(int code)
{
    switch (code) {
    case KOLO_ESTALE:
        return MESH_REJECT_STALE;
    case KOLO_EVERSION:
        return MESH_REJECT_VERSION;
    case KOLO_EAUTH:
        return MESH_REJECT_AUTH;
    case KOLO_EPEER:
        return MESH_REJECT_CLOSED;
    case KOLO_ETIMEDOUT:
        return MESH_REJECT_TIMEOUT;
    case KOLO_EINVAL:
        return MESH_REJECT_SETTING;
    default:
        return MESH_REJECT_MALFORMED;
    }
}

static void reject(struct xport *x, enum mesh_reject why, const char *detail)
{
    rejected[why]++;
    unreported[why]++;
    char addr[80], host[80];
    tcp_peer_addr(x, addr, sizeof addr);
    str_copy(host, addr, sizeof host);
    char *colon = strrchr(host, ':');
    if (colon)
        *colon = '\0';
    if (first_from(host))
        LOGW("xport",
             "refused a data-plane connection from %s (%s): %s; more from %s are only counted "
             "(kolo_dataplane_rejected_total)",
             addr, reject_names[why], detail, host);
    xport_close(x);
}

struct inbound {
    struct xport *x;
    uint64_t expires;
};

struct mesh {
    const struct mesh_spec *s;
    struct xport **peers;
    struct xport **out; /* outbound handshakes still running, by rank */
    struct inbound in[MESH_PENDING];
    int nin;
    int missing;      /* peers not connected yet */
    int higher_missing; /* of them, ranks above me (they dial us) */
    bool fd_warned;
};

static bool wanted(const struct mesh_spec *s, int r)
{
    return r != s->me.rank && (!s->want || s->want[r]);
}

static void inbound_drop(struct mesh *m, int i)
{
    m->in[i] = m->in[--m->nin];
}

static void accept_waiting(struct mesh *m, uint64_t now)
{
    for (;;) {
        struct xport *x = NULL;
        int rc = tcp_accept_start(m->s->listen_fd, &m->s->me, &x);
        if (rc == KOLO_EBUSY && !m->fd_warned) {
            m->fd_warned = true;
            LOGW("xport", "out of file descriptors while accepting peers; retrying");
        }
        if (rc || !x)
            return;
        if (m->nin == MESH_PENDING) { /* the oldest makes room */
            int oldest = 0;
            for (int i = 1; i < m->nin; i++)
                if (m->in[i].expires < m->in[oldest].expires)
                    oldest = i;
            reject(m->in[oldest].x, MESH_REJECT_CROWDED,
                   "too many unfinished handshakes at once");
            inbound_drop(m, oldest);
        }
        m->in[m->nin++] = (struct inbound){x, now + MESH_HANDSHAKE_MS};
    }
}

/* Moves every handshake; returns 0 or the code of an outbound failure. */
static int step_all(struct mesh *m, uint64_t now, char *err, size_t errlen)
{
    int me = m->s->me.rank;
    for (int r = 0; r < me; r++) {
        if (!m->out[r])
            continue;
        bool done = false;
        int rc = tcp_handshake(m->out[r], &done);
        if (rc == KOLO_EPEER && now + 100 < m->s->deadline) {
            /* closed before it finished: the rank had more handshakes
             * waiting than it keeps (MESH_PENDING, the oldest goes), as
             * when a whole job dials it at once (alltoall's links). Again;
             * a refusal (another key, job or generation) is not closed
             * but answered, and fails below. */
            xport_close(m->out[r]);
            m->out[r] = NULL;
            if ((rc = tcp_dial_start(m->s->hosts[r], m->s->ports[r], &m->s->me, r,
                                     &m->out[r])) == 0)
                continue;
        }
        if (rc) {
            snprintf(err, errlen, "connecting to rank %d at %s:%d: %s", r, m->s->hosts[r],
                     m->s->ports[r],
                     m->out[r] && m->out[r]->why[0] ? m->out[r]->why : kolo_strerror(rc));
            return rc;
        }
        if (done) {
            m->peers[r] = m->out[r];
            m->out[r] = NULL;
            m->missing--;
        }
    }
    if (m->higher_missing > 0)
        accept_waiting(m, now);
    for (int i = 0; i < m->nin;) {
        struct xport *x = m->in[i].x;
        bool done = false;
        int rc = tcp_handshake(x, &done);
        if (rc) {
            reject(x, reason_of(rc), x->why[0] ? x->why : kolo_strerror(rc));
            inbound_drop(m, i);
        } else if (done) {
            int p = x->peer;
            if (p <= me || p >= m->s->size || m->peers[p] || !wanted(m->s, p)) {
                char why[96];
                snprintf(why, sizeof why, "rank %d is %s", p,
                         p > me && p < m->s->size && wanted(m->s, p) ? "already connected"
                                                                     : "not a rank that dials us");
                reject(x, MESH_REJECT_DUPLICATE, why);
            } else {
                m->peers[p] = x;
                m->missing--;
                m->higher_missing--;
            }
            inbound_drop(m, i);
        } else if (now >= m->in[i].expires) {
            reject(x, MESH_REJECT_TIMEOUT, "no handshake within the time allowed");
            inbound_drop(m, i);
        } else {
            i++;
        }
    }
    return 0;
}

/* Waits for any socket of the set-up to be ready, or the next deadline. */
static void wait_any(struct mesh *m, struct pollfd *pfd, uint64_t now)
{
    int n = 0, me = m->s->me.rank;
    uint64_t until = m->s->deadline;
    if (m->higher_missing > 0)
        pfd[n++] = (struct pollfd){.fd = m->s->listen_fd, .events = POLLIN};
    for (int r = 0; r < me; r++) {
        if (!m->out[r])
            continue;
        short ev;
        int fd = m->out[r]->ops->arm(m->out[r], false, false, &ev);
        pfd[n++] = (struct pollfd){.fd = fd, .events = ev};
    }
    for (int i = 0; i < m->nin; i++) {
        short ev;
        int fd = m->in[i].x->ops->arm(m->in[i].x, false, false, &ev);
        pfd[n++] = (struct pollfd){.fd = fd, .events = ev};
        if (m->in[i].expires < until)
            until = m->in[i].expires;
    }
    uint64_t wait = until > now ? until - now : 0;
    /* out of descriptors: the listener stays readable, so retry slowly */
    if (m->fd_warned && wait > 100)
        wait = 100;
    (void)poll(pfd, (nfds_t)n, wait > INT32_MAX ? INT32_MAX : (int)wait);
}

static void missing_text(const struct mesh *m, char *buf, size_t len)
{
    size_t used = 0;
    int shown = 0;
    buf[0] = '\0';
    for (int r = 0; r < m->s->size && shown < 8; r++) {
        if (!wanted(m->s, r) || m->peers[r])
            continue;
        int n = snprintf(buf + used, len - used, "%s%d", shown ? ", " : "", r);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
        shown++;
    }
}

int mesh_connect(const struct mesh_spec *s, struct xport **peers, char *err, size_t errlen)
{
    int me = s->me.rank, code = 0;
    struct mesh m = {.s = s, .peers = peers};
    bool *made = calloc((size_t)s->size, sizeof *made); /* set before the call: kept on failure */
    for (int r = 0; made && r < s->size; r++) {
        made[r] = peers[r] != NULL;
        if (wanted(s, r) && !peers[r]) {
            m.missing++;
            m.higher_missing += r > me;
        }
    }
    struct pollfd *pfd = calloc((size_t)s->size + MESH_PENDING + 1, sizeof *pfd);
    m.out = calloc((size_t)s->size, sizeof *m.out);
    if (!pfd || !m.out || !made) {
        code = KOLO_ENOMEM;
        snprintf(err, errlen, "out of memory setting up the mesh");
        goto out;
    }
    for (int r = 0; r < me && !code; r++)
        if (wanted(s, r) && !peers[r] &&
            (code = tcp_dial_start(s->hosts[r], s->ports[r], &s->me, r, &m.out[r])) != 0)
            snprintf(err, errlen, "cannot connect to rank %d at %s:%d: %s", r, s->hosts[r],
                     s->ports[r], kolo_strerror(code));
    while (!code && m.missing > 0) {
        uint64_t now = now_mono_ms();
        if ((code = step_all(&m, now, err, errlen)) != 0 || m.missing == 0)
            break;
        if (now >= s->deadline) {
            char who[64];
            missing_text(&m, who, sizeof who);
            code = KOLO_ETIMEDOUT;
            snprintf(err, errlen, "the data-plane mesh did not form in time: no connection with "
                     "rank(s) %s", who);
            break;
        }
        wait_any(&m, pfd, now);
    }
out:
    for (int i = 0; i < m.nin; i++)
        xport_close(m.in[i].x);
    for (int r = 0; m.out && r < me; r++)
        if (m.out[r])
            xport_close(m.out[r]);
    if (code)
        for (int r = 0; made && r < s->size; r++)
            if (peers[r] && !made[r]) {
                xport_close(peers[r]);
                peers[r] = NULL;
            }
    free(m.out);
    free(pfd);
    free(made);
    return code;
}
