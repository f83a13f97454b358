/*
 * coord_http_guard.c - limits on the HTTP port's connections, which nng's
 * HTTP server does not have (issue 15, F5): a connection that moved no
 * byte either way for --http-idle-timeout (60 s) is closed, one source address may hold
 * HTTP_MAX_PER_SOURCE connections and the port HTTP_MAX_CONNS; beyond a
 * cap, the connections idle longest go first.
 *
 * nng owns the sockets, so the guard finds them the way the kernel lists
 * them: the process's descriptors whose local port is the HTTP port and
 * that have a peer. TCP_INFO says how long each has been idle. The guard
 * only shuts a socket down (never closes the descriptor): nng then sees
 * the end of the stream, as if the client had gone, and cleans up itself.
 * A descriptor nng closed and reused between the two checks could only be
 * another connection to the same port, which its client would open again.
 */
#include "coord_api.h"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

struct hconn {
    int fd;
    unsigned char peer[16]; /* IPv4 mapped into IPv6 */
    uint32_t idle_ms;
    bool closed;
};

/* by peer, then longest idle first */
static int by_peer_idle(const void *a, const void *b)
{
    const struct hconn *x = a, *y = b;
    int d = memcmp(x->peer, y->peer, sizeof x->peer);
    if (d)
        return d;
    return (x->idle_ms < y->idle_ms) - (x->idle_ms > y->idle_ms);
}

static int by_idle(const void *a, const void *b)
{
    const struct hconn *x = a, *y = b;
    return (x->idle_ms < y->idle_ms) - (x->idle_ms > y->idle_ms);
}

/* fd is a connection to port: its peer and idle time. */
static bool http_conn(int fd, int port, struct hconn *h)
{
    struct sockaddr_storage local, peer;
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&local, &ll) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return false;
    memset(h->peer, 0, sizeof h->peer);
    if (local.ss_family == AF_INET && peer.ss_family == AF_INET) {
        if (ntohs(((struct sockaddr_in *)&local)->sin_port) != port)
            return false;
        h->peer[10] = h->peer[11] = 0xff;
        memcpy(h->peer + 12, &((struct sockaddr_in *)&peer)->sin_addr, 4);
    } else if (local.ss_family == AF_INET6 && peer.ss_family == AF_INET6) {
        if (ntohs(((struct sockaddr_in6 *)&local)->sin6_port) != port)
            return false;
        memcpy(h->peer, &((struct sockaddr_in6 *)&peer)->sin6_addr, 16);
    } else {
        return false;
    }
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0)
        return false;
    h->fd = fd;
    h->idle_ms = ti.tcpi_last_data_recv < ti.tcpi_last_data_sent ? ti.tcpi_last_data_recv
                                                                 : ti.tcpi_last_data_sent;
    h->closed = false;
    return true;
}

static void shut(struct coord *c, struct hconn *h, int reason)
{
    if (h->closed)
        return;
    shutdown(h->fd, SHUT_RDWR);
    h->closed = true;
    c->m.http_closed[reason]++;
}

void coord_http_guard(struct coord *c, uint64_t now)
{
    if (!c->http || c->http_port <= 0 || now - c->http_guarded < HTTP_GUARD_MS)
        return;
    c->http_guarded = now;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    size_t n = 0, cap = 0;
    struct hconn *hs = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (fd <= 2 || fd == dirfd(d))
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            struct hconn *g = realloc(hs, ncap * sizeof *hs);
            if (!g)
                break;
            hs = g;
            cap = ncap;
        }
        if (http_conn(fd, c->http_port, &hs[n]))
            n++;
    }
    closedir(d);
    c->m.http_conns = n;
    size_t open = n;
    int64_t idle = c->cfg.http_idle_ms > 0 ? c->cfg.http_idle_ms : HTTP_IDLE_MS;
    for (size_t i = 0; i < n; i++)
        if (hs[i].idle_ms >= idle) {
            shut(c, &hs[i], HTTP_CLOSED_IDLE);
            open--;
        }
    /* per source: beyond the cap, the longest idle go */
    qsort(hs, n, sizeof *hs, by_peer_idle);
    for (size_t i = 0; i < n;) {
        size_t j = i, live = 0;
        while (j < n && memcmp(hs[j].peer, hs[i].peer, sizeof hs[i].peer) == 0)
            j++;
        for (size_t k = j; k-- > i;) /* shortest idle first: those stay */
            if (!hs[k].closed && ++live > HTTP_MAX_PER_SOURCE) {
                shut(c, &hs[k], HTTP_CLOSED_PER_SOURCE);
                open--;
            }
        i = j;
    }
    if (open > HTTP_MAX_CONNS) {
        qsort(hs, n, sizeof *hs, by_idle);
        for (size_t i = 0; i < n && open > HTTP_MAX_CONNS; i++)
            if (!hs[i].closed) {
                shut(c, &hs[i], HTTP_CLOSED_TOTAL);
                open--;
            }
    }
    if (open < n)
        LOGD("coord", "HTTP guard: %zu connections, %zu shut down", n, n - open);
    free(hs);
}
