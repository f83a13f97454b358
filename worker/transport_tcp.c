/*
 * transport_tcp.c - one TCP connection per pair of ranks.
 *
 * DESIGN. Sockets are non-blocking from the start; the blocking helpers
 * in transport.c poll() them, so one wait can cover tcp and shm
 * connections together. TCP_NODELAY because the ring sends a chunk and
 * then waits for one: Nagle would hold back the tail of every chunk.
 * Buffers of 4 MiB each way keep a ring step's pipeline full on fast
 * links; they are set only where the kernel grants that much
 * (net.core.wmem_max / rmem_max), because asking for a buffer turns off
 * the kernel's own tuning and a clamped request would leave us with less
 * than it gives. All sends use MSG_NOSIGNAL: a dead peer must be an
 * error code, not a SIGPIPE that kills the training process.
 *
 * Hello. A 40-byte record, little-endian:
 *
 *   magic "KOLX" u32 | version u16 | kind u16 | status u32 | reserved u32
 *   job u64 | generation u64 | from rank i32 | to rank i32
 *
 * The connector sends kind 1 right after connecting; the acceptor checks
 * it and answers with kind 2 carrying a status (0 or the KOLO_E* code of
 * its refusal) and its own job, generation and rank. A refused
 * connection is closed after the answer, so a rank from an old
 * generation (elastic reset) or another job cannot inject bytes into a
 * ring. The connector does not wait for the answer: it reads it in-band,
 * ahead of the first data, in try_send/try_recv. That keeps tcp_connect
 * from depending on the peer being in tcp_accept at the same moment,
 * which would otherwise force every caller to order its connects and
 * accepts to avoid a cycle of ranks each waiting for the next.
 *
 * Failure. EOF, ECONNRESET, EPIPE and the like become KOLO_EPEER with the
 * peer's rank in the message; the failure is sticky.
 */
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "errors.h"
#include "log.h"
#include "util.h"

#define HELLO_MAGIC       0x584c4f4bu /* "KOLX" as little-endian bytes */
#define HELLO_VERSION     1
#define HELLO_KIND_HELLO  1
#define HELLO_KIND_ANSWER 2
#define HELLO_LEN         40
#define SOCK_BUF_BYTES    (4 << 20)

struct hello {
    uint32_t magic;
    uint16_t version, kind;
    uint32_t status;
    uint64_t job, generation;
    int32_t from, to;
};

struct tcp_conn {
    struct xport base;
    int fd;
    /* Connector side: the acceptor's answer still to be read (it comes
     * before any data on the stream). */
    bool answer_pending;
    size_t answer_got;
    unsigned char answer[HELLO_LEN];
};

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void hello_encode(const struct hello *h, unsigned char *p)
{
    put_le(p, h->magic, 4);
    put_le(p + 4, h->version, 2);
    put_le(p + 6, h->kind, 2);
    put_le(p + 8, h->status, 4);
    put_le(p + 12, 0, 4);
    put_le(p + 16, h->job, 8);
    put_le(p + 24, h->generation, 8);
    put_le(p + 32, (uint32_t)h->from, 4);
    put_le(p + 36, (uint32_t)h->to, 4);
}

static void hello_decode(const unsigned char *p, struct hello *h)
{
    h->magic = (uint32_t)get_le(p, 4);
    h->version = (uint16_t)get_le(p + 4, 2);
    h->kind = (uint16_t)get_le(p + 6, 2);
    h->status = (uint32_t)get_le(p + 8, 4);
    h->job = get_le(p + 16, 8);
    h->generation = get_le(p + 24, 8);
    h->from = (int32_t)(uint32_t)get_le(p + 32, 4);
    h->to = (int32_t)(uint32_t)get_le(p + 36, 4);
}

/* Whether the kernel lets an unprivileged socket have a buffer of
 * SOCK_BUF_BYTES. Read once; an unreadable file means "do not ask". */
static bool sysctl_allows(const char *path)
{
    char *text = NULL;
    size_t len = 0;
    bool ok = false;
    if (read_file_all(path, &text, &len, 64) == 0) {
        ok = strtoll(text, NULL, 10) >= SOCK_BUF_BYTES;
        free(text);
    }
    return ok;
}

static void tune_buffers(int fd)
{
    /* 0 unknown, 1 ask, 2 leave to the kernel; racing first readers
     * compute the same answer. */
    static _Atomic int snd_policy, rcv_policy;
    if (!snd_policy)
        snd_policy = sysctl_allows("/proc/sys/net/core/wmem_max") ? 1 : 2;
    if (!rcv_policy)
        rcv_policy = sysctl_allows("/proc/sys/net/core/rmem_max") ? 1 : 2;
    int size = SOCK_BUF_BYTES;
    if (snd_policy == 1)
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    if (rcv_policy == 1)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
}

static void set_nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Waits until fd has one of events or the deadline passes. */
static int io_wait(int fd, short events, uint64_t deadline)
{
    for (;;) {
        int timeout = -1;
        if (deadline) {
            uint64_t now = now_mono_ms();
            if (now >= deadline)
                return KOLO_ETIMEDOUT;
            timeout = deadline - now > INT32_MAX ? INT32_MAX : (int)(deadline - now);
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, timeout);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return KOLO_ESYS;
    }
}

/* Blocking (to the deadline) exchange of a whole hello record during
 * setup, before the connection is an xport. EOF is KOLO_EPEER. */
static int write_record(int fd, const unsigned char *p, size_t len, uint64_t deadline)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = send(fd, p + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return KOLO_EPEER;
        int rc = io_wait(fd, POLLOUT, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

static int read_record(int fd, unsigned char *p, size_t len, uint64_t deadline)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = recv(fd, p + done, len - done, MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0)
            return KOLO_EPEER;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return KOLO_EPEER;
        int rc = io_wait(fd, POLLIN, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

/* A socket error on an established connection: lost peers are
 * KOLO_EPEER, anything else is our own system's failure. */
static ssize_t sock_fail(struct tcp_conn *c, int err, const char *doing)
{
    int code = KOLO_EPEER;
    switch (err) {
    case EBADF:
    case EFAULT:
    case EINVAL:
    case ENOTSOCK:
    case ENOMEM:
    case ENOBUFS:
        code = KOLO_ESYS;
        break;
    default:
        break;
    }
    if (err == EPIPE || err == ECONNRESET)
        return xport_fail(&c->base, code, "rank %d closed the connection (%s while %s)",
                          c->base.peer, strerror(err), doing);
    return xport_fail(&c->base, code, "connection to rank %d failed (%s while %s)", c->base.peer,
                      strerror(err), doing);
}

static const char *refusal_text(uint32_t status)
{
    switch (status) {
    case KOLO_ESTALE:
        return "another generation";
    case KOLO_EVERSION:
        return "another protocol version";
    default:
        return "another job or rank";
    }
}

/* Reads as much of the acceptor's answer as is there and checks it once
 * whole: 0 (done or still coming) or -KOLO_E*. */
static ssize_t pump_answer(struct tcp_conn *c)
{
    while (c->answer_got < HELLO_LEN) {
        ssize_t n = recv(c->fd, c->answer + c->answer_got, HELLO_LEN - c->answer_got, MSG_DONTWAIT);
        if (n > 0) {
            c->answer_got += (size_t)n;
            continue;
        }
        if (n == 0)
            return xport_fail(&c->base, KOLO_EPEER,
                              "rank %d closed the connection before answering the hello",
                              c->base.peer);
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return sock_fail(c, errno, "reading the hello answer");
    }
    c->answer_pending = false;
    struct hello h;
    hello_decode(c->answer, &h);
    if (h.magic != HELLO_MAGIC || h.kind != HELLO_KIND_ANSWER)
        return xport_fail(&c->base, KOLO_EPROTO, "rank %d answered the hello with garbage",
                          c->base.peer);
    if (h.version != HELLO_VERSION)
        return xport_fail(&c->base, KOLO_EVERSION, "rank %d speaks transport version %u, not %u",
                          c->base.peer, h.version, HELLO_VERSION);
    if (h.status != 0) {
        int code =
            h.status == KOLO_ESTALE || h.status == KOLO_EVERSION ? (int)h.status : KOLO_EPROTO;
        return xport_fail(&c->base, code,
                          "rank %d refused the connection: %s (it runs job %llu generation "
                          "%llu)",
                          c->base.peer, refusal_text(h.status), (unsigned long long)h.job,
                          (unsigned long long)h.generation);
    }
    if (h.from != c->base.peer)
        return xport_fail(&c->base, KOLO_EPROTO, "dialled rank %d but rank %d answered",
                          c->base.peer, h.from);
    return 0;
}

static ssize_t tcp_try_send(struct xport *x, const void *buf, size_t len)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    if (x->failed)
        return -x->failed;
    if (c->answer_pending) {
        ssize_t rc = pump_answer(c);
        if (rc < 0)
            return rc;
    }
    if (len == 0)
        return 0;
    ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0)
        return n;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 0;
    return sock_fail(c, errno, "sending");
}

static ssize_t tcp_try_recv(struct xport *x, void *buf, size_t len)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    if (x->failed)
        return -x->failed;
    if (c->answer_pending) {
        ssize_t rc = pump_answer(c);
        if (rc < 0 || c->answer_pending)
            return rc;
    }
    if (len == 0)
        return 0;
    ssize_t n = recv(c->fd, buf, len, MSG_DONTWAIT);
    if (n > 0)
        return n;
    if (n == 0)
        return xport_fail(x, KOLO_EPEER, "rank %d closed the connection", x->peer);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 0;
    return sock_fail(c, errno, "receiving");
}

int tcp_settle(struct xport *x, uint64_t deadline)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    while (!x->failed && c->answer_pending) {
        ssize_t rc = pump_answer(c);
        if (rc < 0)
            return (int)-rc;
        if (!c->answer_pending)
            break;
        int err = io_wait(c->fd, POLLIN, deadline);
        if (err)
            return (int)-xport_fail(x, err, "rank %d did not answer the hello in time", x->peer);
    }
    return x->failed;
}

static int tcp_arm(struct xport *x, bool want_send, bool want_recv, short *events)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    /* An answer still to come is read by either try_*, so a sender also
     * wakes for it (a refusal must not wait for a full send buffer). */
    *events = (short)((want_send ? POLLOUT : 0) | (want_recv || c->answer_pending ? POLLIN : 0));
    return c->fd;
}

static void tcp_close(struct xport *x)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    close(c->fd);
    free(c);
}

/* shutdown(2) is safe while another thread polls the socket: its poll
 * wakes with POLLHUP and its next send or receive fails. */
static void tcp_interrupt(struct xport *x)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    shutdown(c->fd, SHUT_RDWR);
}

static const struct xport_ops tcp_ops = {
    .name = "tcp",
    .try_send = tcp_try_send,
    .try_recv = tcp_try_recv,
    .arm = tcp_arm,
    .disarm = NULL,
    .close = tcp_close,
    .interrupt = tcp_interrupt,
    .spin = false,
};

static int conn_new(int fd, int peer, bool answer_pending, struct xport **out)
{
    struct tcp_conn *c = calloc(1, sizeof *c);
    if (!c)
        return KOLO_ENOMEM;
    c->base.ops = &tcp_ops;
    c->base.peer = peer;
    c->fd = fd;
    c->answer_pending = answer_pending;
    *out = &c->base;
    return 0;
}

static int resolve(const char *addr, int port, bool passive, struct addrinfo **res)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC,
        .ai_socktype = SOCK_STREAM,
        .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0),
    };
    int rc = getaddrinfo(addr && *addr ? addr : NULL, service, &hints, res);
    if (rc != 0) {
        LOGD("xport", "cannot resolve %s: %s", addr ? addr : "(any)", gai_strerror(rc));
        return KOLO_EINVAL;
    }
    return 0;
}

int tcp_listen(const char *addr, int *fd, int *port)
{
    struct addrinfo *res;
    int rc = resolve(addr, 0, true, &res);
    if (rc)
        return rc;
    rc = KOLO_ESYS;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int s = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s < 0)
            continue;
        int one = 1;
        (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        /* Accepted sockets inherit the buffers; the receive buffer must
         * be set before the handshake, which fixes the window scale. */
        tune_buffers(s);
        struct sockaddr_storage sa;
        socklen_t salen = sizeof sa;
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, 128) == 0 &&
            getsockname(s, (struct sockaddr *)&sa, &salen) == 0) {
            *port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                   : ((struct sockaddr_in *)&sa)->sin_port);
            *fd = s;
            rc = 0;
            break;
        }
        LOGD("xport", "cannot listen on %s: %s", addr ? addr : "(any)", strerror(errno));
        close(s);
    }
    freeaddrinfo(res);
    return rc;
}

/* Connects one socket to ai before the deadline: the fd or -KOLO_E*. */
static int dial(const struct addrinfo *ai, uint64_t deadline)
{
    int s = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -KOLO_ESYS;
    tune_buffers(s);
    set_nodelay(s);
    int err = 0;
    if (connect(s, ai->ai_addr, ai->ai_addrlen) < 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
            int rc = io_wait(s, POLLOUT, deadline);
            if (rc) {
                close(s);
                return -rc;
            }
            socklen_t len = sizeof err;
            if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
                err = errno;
        }
    }
    if (err) {
        close(s);
        return err == ECONNREFUSED ? -KOLO_ECONNREFUSED
               : err == ETIMEDOUT  ? -KOLO_ETIMEDOUT
                                   : -KOLO_ESYS;
    }
    return s;
}

int tcp_connect(const char *addr, int port, uint64_t job, uint64_t generation, int from_rank,
                int to_rank, uint64_t deadline, struct xport **out)
{
    *out = NULL;
    struct addrinfo *res;
    int rc = resolve(addr, port, false, &res);
    if (rc)
        return rc;
    int fd = -KOLO_ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = dial(ai, deadline);
        if (fd >= 0 || fd == -KOLO_ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        LOGD("xport", "cannot connect to rank %d at %s:%d: %s", to_rank, addr, port,
             kolo_errname(-fd));
        return -fd;
    }

    struct hello h = {.magic = HELLO_MAGIC,
                      .version = HELLO_VERSION,
                      .kind = HELLO_KIND_HELLO,
                      .job = job,
                      .generation = generation,
                      .from = from_rank,
                      .to = to_rank};
    unsigned char rec[HELLO_LEN];
    hello_encode(&h, rec);
    rc = write_record(fd, rec, sizeof rec, deadline);
    if (rc == 0)
        rc = conn_new(fd, to_rank, true, out);
    if (rc)
        close(fd);
    return rc;
}

/* Checks a connector's hello against what this rank expects: 0 or the
 * code the refusal carries. */
static int hello_check(const struct hello *h, uint64_t job, uint64_t generation, int my_rank)
{
    if (h->magic != HELLO_MAGIC || h->kind != HELLO_KIND_HELLO)
        return KOLO_EPROTO;
    if (h->version != HELLO_VERSION)
        return KOLO_EVERSION;
    if (h->job != job || h->to != my_rank)
        return KOLO_EPROTO;
    if (h->generation != generation)
        return KOLO_ESTALE;
    return 0;
}

int tcp_accept(int listen_fd, uint64_t job, uint64_t generation, int my_rank, uint64_t deadline,
               struct xport **out)
{
    *out = NULL;
    int fd;
    for (;;) {
        fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0)
            break;
        /* ECONNABORTED: a connector gave up while queued; wait for the
         * next one. */
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return KOLO_ESYS;
        int rc = io_wait(listen_fd, POLLIN, deadline);
        if (rc)
            return rc;
    }
    set_nodelay(fd);

    unsigned char rec[HELLO_LEN];
    int rc = read_record(fd, rec, sizeof rec, deadline);
    if (rc) {
        close(fd);
        /* A connection that closed before a whole hello was not a kolo
         * rank (or one that died at once): malformed, not a lost peer. */
        return rc == KOLO_EPEER ? KOLO_EPROTO : rc;
    }
    struct hello h;
    hello_decode(rec, &h);
    int verdict = hello_check(&h, job, generation, my_rank);

    struct hello answer = {.magic = HELLO_MAGIC,
                           .version = HELLO_VERSION,
                           .kind = HELLO_KIND_ANSWER,
                           .status = (uint32_t)verdict,
                           .job = job,
                           .generation = generation,
                           .from = my_rank,
                           .to = h.from};
    hello_encode(&answer, rec);
    rc = write_record(fd, rec, sizeof rec, deadline);
    if (verdict) {
        if (h.magic != HELLO_MAGIC)
            LOGW("xport", "refused a connection that is not a kolo rank (no hello)");
        else
            LOGW("xport",
                 "refused a connection from rank %d (job %llu generation %llu, to rank %d): "
                 "%s",
                 h.from, (unsigned long long)h.job, (unsigned long long)h.generation, h.to,
                 kolo_errname(verdict));
        /* FIN after the answer, so the connector reads it before EOF. */
        shutdown(fd, SHUT_WR);
        close(fd);
        return verdict;
    }
    if (rc == 0)
        rc = conn_new(fd, h.from, false, out);
    if (rc)
        close(fd);
    return rc;
}
