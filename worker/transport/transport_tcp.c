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
 * Handshake. A data port is reachable by anyone who can reach the host,
 * so before a byte of tensor data moves both ends prove they hold the
 * generation's key (struct tcp_ident; derived from the job's credential,
 * see common/creds.h). Three records, integers little-endian:
 *
 *   hello  (connector, 56 B): magic "KOLX" u32 | version u16 | kind 1 u16 |
 *          status u32 | flags u32 | job u64 | generation u64 |
 *          from rank i32 | to rank i32 | connector nonce [16]
 *   answer (acceptor, 88 B):  the same 56-byte layout, kind 2, carrying
 *          the acceptor's status (0 or the KOLO_E* code of its refusal),
 *          job, generation, rank and its own nonce, then
 *          HMAC-SHA256(key, "kolo-acceptor" | hello | acceptor nonce)
 *   proof  (connector, 32 B): HMAC-SHA256(key, "kolo-connector" | hello |
 *          acceptor nonce)
 *
 * Both MACs cover both nonces, so neither can be replayed into another
 * connection; the acceptor takes no data before the proof checked out, a
 * connector sends none before the answer did. A refusal (another job,
 * another generation, another rank, another version) is answered
 * without a MAC and the connection closed; a wrong proof is closed
 * without an answer. Every step is a state of one machine (enum hs) run
 * by tcp_handshake, so a caller can drive many handshakes from one poll
 * loop (mesh.c) and a stranger who connects and says nothing holds only
 * its own socket. The blocking tcp_connect / tcp_accept leave the last
 * step to the first try_send/try_recv on the connection:
 * a connector never waits for the acceptor, so ranks may connect and
 * accept in any order.
 *
 * Encryption. Flag bit 0 of a hello says the connector seals the stream
 * (KOLO_DATA_ENCRYPT); an acceptor whose own setting differs refuses the
 * connection (KOLO_EINVAL), and since both MACs cover the hello nobody
 * between them can turn the flag off. Once the handshake is done, a
 * sealed connection carries AES-256-GCM records (seal.h) under two keys
 * derived from the handshake, one per direction:
 *   HMAC-SHA256(key, "kolo-seal-c2a" | hello | acceptor nonce) and "-a2c".
 * Without the flag the bytes go on the socket as they are.
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
#include "kolo.h"
#include "hmac.h"
#include "log.h"
#include "seal.h"
#include "util.h"

#define HELLO_MAGIC       0x584c4f4bu /* "KOLX" as little-endian bytes */
#define HELLO_VERSION     2
#define HELLO_KIND_HELLO  1
#define HELLO_KIND_ANSWER 2
#define HELLO_NONCE       16
#define HELLO_FLAG_SEALED 1u
#define HELLO_LEN         56
#define ANSWER_LEN        (HELLO_LEN + SHA256_LEN)
#define PROOF_LEN         SHA256_LEN
#define SOCK_BUF_BYTES    (4 << 20)
/* a rank's data listener: its lane links come at once at init, and an
 * alltoall's first use may bring a link from every other rank */
#define TCP_LISTEN_BACKLOG 4096

struct hello {
    uint32_t magic;
    uint16_t version, kind;
    uint32_t status, flags;
    uint64_t job, generation;
    int32_t from, to;
    unsigned char nonce[HELLO_NONCE];
};

/* Where a connection's handshake stands. */
enum hs {
    HS_DIALING,      /* connector: non-blocking connect in progress */
    HS_SEND_HELLO,   /* connector */
    HS_WAIT_ANSWER,  /* connector */
    HS_SEND_PROOF,   /* connector */
    HS_WAIT_HELLO,   /* acceptor */
    HS_SEND_ANSWER,  /* acceptor */
    HS_WAIT_PROOF,   /* acceptor */
    HS_DONE,
};

struct tcp_conn {
    struct xport base;
    int fd;
    enum hs hs;
    struct tcp_ident me;
    int refusal; /* acceptor: the code its answer carries (0 = accepted) */
    /* the hello as sent or received, and the acceptor's nonce: what both
     * MACs cover */
    unsigned char hello[HELLO_LEN];
    unsigned char nonce_a[HELLO_NONCE];
    /* the record being sent or received and how far it got */
    unsigned char io[ANSWER_LEN];
    size_t io_len, io_done;
    /* the record layer once the handshake is done, when me.encrypt */
    struct seal *seal;
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
    put_le(p + 12, h->flags, 4);
    put_le(p + 16, h->job, 8);
    put_le(p + 24, h->generation, 8);
    put_le(p + 32, (uint32_t)h->from, 4);
    put_le(p + 36, (uint32_t)h->to, 4);
    memcpy(p + 40, h->nonce, HELLO_NONCE);
}

static void hello_decode(const unsigned char *p, struct hello *h)
{
    h->magic = (uint32_t)get_le(p, 4);
    h->version = (uint16_t)get_le(p + 4, 2);
    h->kind = (uint16_t)get_le(p + 6, 2);
    h->status = (uint32_t)get_le(p + 8, 4);
    h->flags = (uint32_t)get_le(p + 12, 4);
    h->job = get_le(p + 16, 8);
    h->generation = get_le(p + 24, 8);
    h->from = (int32_t)(uint32_t)get_le(p + 32, 4);
    h->to = (int32_t)(uint32_t)get_le(p + 36, 4);
    memcpy(h->nonce, p + 40, HELLO_NONCE);
}

/* HMAC(key, label | hello | acceptor nonce): the answer's and the proof's
 * MAC, told apart by the label. */
static void transcript_mac(const struct tcp_conn *c, const char *label, unsigned char *out)
{
    struct hmac_sha256 h;
    hmac_sha256_init(&h, c->me.key, sizeof c->me.key);
    hmac_sha256_update(&h, label, strlen(label));
    hmac_sha256_update(&h, c->hello, HELLO_LEN);
    hmac_sha256_update(&h, c->nonce_a, HELLO_NONCE);
    hmac_sha256_final(&h, out);
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
    case KOLO_EINVAL:
        return "another data-plane encryption setting (KOLO_DATA_ENCRYPT)";
    default:
        return "another job or rank";
    }
}

/* The peer as messages name it: the rank once known. */
static const char *who(const struct tcp_conn *c, char *buf, size_t len)
{
    if (c->base.peer >= 0)
        snprintf(buf, len, "rank %d", c->base.peer);
    else
        snprintf(buf, len, "a connecting peer");
    return buf;
}

static void io_put(struct tcp_conn *c, const void *p, size_t len)
{
    memcpy(c->io, p, len);
    c->io_len = len;
    c->io_done = 0;
}

static void io_expect(struct tcp_conn *c, size_t len)
{
    c->io_len = len;
    c->io_done = 0;
}

/* Sends the rest of c->io: 1 once all of it went, 0 when the socket is
 * full, -KOLO_E* on failure. */
static ssize_t io_send(struct tcp_conn *c)
{
    while (c->io_done < c->io_len) {
        ssize_t n = send(c->fd, c->io + c->io_done, c->io_len - c->io_done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->io_done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return sock_fail(c, errno, "sending the handshake");
    }
    return 1;
}

/* Receives the rest of c->io: 1 once whole, 0 when nothing more is there
 * yet, -KOLO_E* on failure (EOF included: a handshake never ends early). */
static ssize_t io_recv(struct tcp_conn *c)
{
    while (c->io_done < c->io_len) {
        ssize_t n = recv(c->fd, c->io + c->io_done, c->io_len - c->io_done, MSG_DONTWAIT);
        if (n > 0) {
            c->io_done += (size_t)n;
            continue;
        }
        char peer[32];
        if (n == 0)
            return xport_fail(&c->base, KOLO_EPEER,
                              "%s closed the connection during the handshake",
                              who(c, peer, sizeof peer));
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return sock_fail(c, errno, "reading the handshake");
    }
    return 1;
}

/* Connector: has the non-blocking connect finished? 1 yes, 0 not yet. */
static ssize_t dial_settled(struct tcp_conn *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLOUT};
    int n = poll(&p, 1, 0);
    if (n == 0 || (n < 0 && errno == EINTR))
        return 0;
    int err = 0;
    socklen_t len = sizeof err;
    if (n < 0 || getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (!err)
        return 1;
    int code = err == ECONNREFUSED ? KOLO_ECONNREFUSED
               : err == ETIMEDOUT  ? KOLO_ETIMEDOUT
                                   : KOLO_EPEER;
    return xport_fail(&c->base, code, "cannot connect to rank %d: %s", c->base.peer,
                      strerror(err));
}

static ssize_t hello_start(struct tcp_conn *c)
{
    struct hello h = {.magic = HELLO_MAGIC,
                      .version = HELLO_VERSION,
                      .kind = HELLO_KIND_HELLO,
                      .flags = c->me.encrypt ? HELLO_FLAG_SEALED : 0,
                      .job = c->me.job,
                      .generation = c->me.generation,
                      .from = c->me.rank,
                      .to = c->base.peer};
    if (random_bytes(h.nonce, sizeof h.nonce) != 0)
        return xport_fail(&c->base, KOLO_ESYS, "no random bytes for the handshake");
    hello_encode(&h, c->hello);
    io_put(c, c->hello, HELLO_LEN);
    return 0;
}

/* Connector: checks the acceptor's answer and queues the proof. */
static ssize_t answer_check(struct tcp_conn *c)
{
    struct hello h;
    hello_decode(c->io, &h);
    int peer = c->base.peer;
    if (h.magic != HELLO_MAGIC || h.kind != HELLO_KIND_ANSWER)
        return xport_fail(&c->base, KOLO_EPROTO, "rank %d answered the hello with garbage", peer);
    if (h.version != HELLO_VERSION)
        return xport_fail(&c->base, KOLO_EVERSION, "rank %d speaks transport version %u, not %u",
                          peer, h.version, HELLO_VERSION);
    if (h.status != 0) {
        int code = h.status == KOLO_ESTALE || h.status == KOLO_EVERSION || h.status == KOLO_EINVAL
                       ? (int)h.status
                       : KOLO_EPROTO;
        return xport_fail(&c->base, code,
                          "rank %d refused the connection: %s (it runs job %llu generation %llu)",
                          peer, refusal_text(h.status), (unsigned long long)h.job,
                          (unsigned long long)h.generation);
    }
    if (h.from != peer)
        return xport_fail(&c->base, KOLO_EPROTO, "dialled rank %d but rank %d answered", peer,
                          h.from);
    memcpy(c->nonce_a, h.nonce, HELLO_NONCE);
    unsigned char mac[SHA256_LEN];
    transcript_mac(c, "kolo-acceptor", mac);
    if (!ct_equal(mac, c->io + HELLO_LEN, SHA256_LEN))
        return xport_fail(&c->base, KOLO_EAUTH,
                          "the process answering as rank %d does not hold this generation's "
                          "key: not a member of this job",
                          peer);
    transcript_mac(c, "kolo-connector", mac);
    io_put(c, mac, PROOF_LEN);
    return 0;
}

/* Acceptor: the code its answer to a hello carries (0 = accepted). */
static int hello_verdict(const struct hello *h, const struct tcp_ident *me)
{
    if (h->kind != HELLO_KIND_HELLO)
        return KOLO_EPROTO;
    if (h->job != me->job || h->to != me->rank || h->from == me->rank || h->from < 0)
        return KOLO_EPROTO;
    if (h->generation != me->generation)
        return KOLO_ESTALE;
    if (((h->flags & HELLO_FLAG_SEALED) != 0) != me->encrypt)
        return KOLO_EINVAL;
    return 0;
}

/* Acceptor: the first 8 bytes say whether this is a kolo rank at all and
 * which version it speaks (another version's hello may have another
 * length, so it is answered at once). Returns -code to drop the
 * connection, 0 to read the rest of the hello, 1 when the answer is
 * queued. */
static ssize_t answer_start(struct tcp_conn *c);
static ssize_t header_check(struct tcp_conn *c)
{
    if ((uint32_t)get_le(c->io, 4) != HELLO_MAGIC)
        return xport_fail(&c->base, KOLO_EPROTO, "a connecting peer is not a kolo rank (no hello)");
    if (get_le(c->io + 4, 2) == HELLO_VERSION)
        return 0;
    c->refusal = KOLO_EVERSION;
    memset(c->io + 8, 0, HELLO_LEN - 8);
    ssize_t r = answer_start(c);
    return r < 0 ? r : 1;
}

/* Acceptor: judges the whole hello and queues the answer. */
static ssize_t answer_start(struct tcp_conn *c)
{
    struct hello h;
    hello_decode(c->io, &h);
    if (!c->refusal)
        c->refusal = hello_verdict(&h, &c->me);
    struct hello a = {.magic = HELLO_MAGIC,
                      .version = HELLO_VERSION,
                      .kind = HELLO_KIND_ANSWER,
                      .status = (uint32_t)c->refusal,
                      .flags = c->me.encrypt ? HELLO_FLAG_SEALED : 0,
                      .job = c->me.job,
                      .generation = c->me.generation,
                      .from = c->me.rank,
                      .to = h.from};
    unsigned char rec[ANSWER_LEN] = {0};
    if (!c->refusal) {
        c->base.peer = h.from;
        memcpy(c->hello, c->io, HELLO_LEN);
        if (random_bytes(c->nonce_a, HELLO_NONCE) != 0)
            return xport_fail(&c->base, KOLO_ESYS, "no random bytes for the handshake");
        memcpy(a.nonce, c->nonce_a, HELLO_NONCE);
        transcript_mac(c, "kolo-acceptor", rec + HELLO_LEN);
    } else if (c->refusal == KOLO_EVERSION) {
        snprintf(c->base.why, sizeof c->base.why,
                 "refused a peer speaking transport version %u (this is version %u)",
                 (unsigned)get_le(c->io + 4, 2), HELLO_VERSION);
    } else {
        snprintf(c->base.why, sizeof c->base.why,
                 "refused rank %d of job %llu generation %llu (to rank %d): %s", h.from,
                 (unsigned long long)h.job, (unsigned long long)h.generation, h.to,
                 refusal_text((uint32_t)c->refusal));
    }
    hello_encode(&a, rec);
    io_put(c, rec, ANSWER_LEN);
    return 0;
}

static ssize_t proof_check(struct tcp_conn *c)
{
    unsigned char mac[SHA256_LEN];
    transcript_mac(c, "kolo-connector", mac);
    if (!ct_equal(mac, c->io, SHA256_LEN))
        return xport_fail(&c->base, KOLO_EAUTH,
                          "a peer claiming to be rank %d does not hold this generation's key: "
                          "not a member of this job",
                          c->base.peer);
    return 0;
}

/* The handshake is done: a sealed connection starts its record layer,
 * keyed from the transcript both ends now share. */
static ssize_t seal_start(struct tcp_conn *c)
{
    if (!c->me.encrypt)
        return 0;
    unsigned char c2a[SHA256_LEN], a2c[SHA256_LEN];
    transcript_mac(c, "kolo-seal-c2a", c2a);
    transcript_mac(c, "kolo-seal-a2c", a2c);
    bool connector = c->hs == HS_SEND_PROOF;
    char err[256];
    int rc = connector ? seal_new(c2a, a2c, &c->seal, err, sizeof err)
                       : seal_new(a2c, c2a, &c->seal, err, sizeof err);
    memset(c2a, 0, sizeof c2a);
    memset(a2c, 0, sizeof a2c);
    if (rc)
        return xport_fail(&c->base, rc, "cannot encrypt the connection to rank %d: %s",
                          c->base.peer, err);
    return 0;
}

/* Runs the handshake as far as it goes without blocking, or up to state
 * stop: 0 (there, or waiting for the socket: c->hs says which) or
 * -KOLO_E* (failed). */
static ssize_t hs_run(struct tcp_conn *c, enum hs stop)
{
    ssize_t r;
    for (;;) {
        if (c->base.failed)
            return -c->base.failed;
        if (c->hs == stop)
            return 0;
        switch (c->hs) {
        case HS_DIALING:
            if ((r = dial_settled(c)) <= 0 || (r = hello_start(c)) < 0)
                return r;
            c->hs = HS_SEND_HELLO;
            break;
        case HS_SEND_HELLO:
            if ((r = io_send(c)) <= 0)
                return r;
            io_expect(c, ANSWER_LEN);
            c->hs = HS_WAIT_ANSWER;
            break;
        case HS_WAIT_ANSWER:
            if ((r = io_recv(c)) <= 0 || (r = answer_check(c)) < 0)
                return r;
            c->hs = HS_SEND_PROOF;
            break;
        case HS_SEND_PROOF:
            if ((r = io_send(c)) <= 0 || (r = seal_start(c)) < 0)
                return r;
            c->hs = HS_DONE;
            break;
        case HS_WAIT_HELLO:
            if ((r = io_recv(c)) <= 0)
                return r;
            if (c->io_len < HELLO_LEN) { /* the header is in */
                if ((r = header_check(c)) < 0)
                    return r;
                if (r == 0)
                    c->io_len = HELLO_LEN;
                else
                    c->hs = HS_SEND_ANSWER;
                break;
            }
            if ((r = answer_start(c)) < 0)
                return r;
            c->hs = HS_SEND_ANSWER;
            break;
        case HS_SEND_ANSWER:
            if ((r = io_send(c)) <= 0)
                return r;
            if (c->refusal) {
                /* FIN after the answer, so the connector reads it first */
                shutdown(c->fd, SHUT_WR);
                char why[sizeof c->base.why];
                memcpy(why, c->base.why, sizeof why);
                return xport_fail(&c->base, c->refusal, "%s", why);
            }
            io_expect(c, PROOF_LEN);
            c->hs = HS_WAIT_PROOF;
            break;
        case HS_WAIT_PROOF:
            if ((r = io_recv(c)) <= 0 || (r = proof_check(c)) < 0 ||
                (r = seal_start(c)) < 0)
                return r;
            c->hs = HS_DONE;
            break;
        case HS_DONE:
            return 0;
        }
    }
}

/* For try_*: 0 when the handshake is over, -KOLO_E* when it failed, 1
 * while it still runs (the caller moves no data). */
static ssize_t hs_pending(struct tcp_conn *c)
{
    if (c->hs == HS_DONE)
        return 0;
    ssize_t r = hs_run(c, HS_DONE);
    return r < 0 ? r : c->hs == HS_DONE ? 0 : 1;
}

static short hs_events(const struct tcp_conn *c)
{
    switch (c->hs) {
    case HS_WAIT_ANSWER:
    case HS_WAIT_HELLO:
    case HS_WAIT_PROOF:
        return POLLIN;
    default:
        return POLLOUT;
    }
}

/* A record layer's result as try_* returns it: the count, or the
 * connection's failure. */
static ssize_t sealed_result(struct tcp_conn *c, ssize_t r, const char *doing)
{
    if (r >= 0)
        return r;
    switch ((enum seal_error)r) {
    case SEAL_ERRNO:
        return sock_fail(c, errno, doing);
    case SEAL_EOF:
        return xport_fail(&c->base, KOLO_EPEER, "rank %d closed the connection", c->base.peer);
    case SEAL_FORGED:
    case SEAL_GARBLED:
        return xport_fail(&c->base, KOLO_EAUTH, "encrypted stream from rank %d: %s", c->base.peer,
                          seal_error_text((enum seal_error)r));
    case SEAL_MISUSE:
    case SEAL_CRYPTO:
        break;
    }
    return xport_fail(&c->base, KOLO_ESYS, "encrypted stream to rank %d: %s", c->base.peer,
                      seal_error_text((enum seal_error)r));
}

static bool tcp_mid_send(const struct xport *x)
{
    const struct tcp_conn *c = (const struct tcp_conn *)x;
    return c->seal && seal_midrecord(c->seal);
}

static bool tcp_buffered(const struct xport *x)
{
    const struct tcp_conn *c = (const struct tcp_conn *)x;
    return c->seal && seal_buffered(c->seal);
}

static ssize_t tcp_try_send(struct xport *x, const void *buf, size_t len)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    if (x->failed)
        return -x->failed;
    ssize_t r = hs_pending(c);
    if (r)
        return r < 0 ? r : 0;
    if (len == 0)
        return 0;
    if (c->seal)
        return sealed_result(c, seal_send(c->seal, c->fd, buf, len), "sending");
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
    ssize_t r = hs_pending(c);
    if (r)
        return r < 0 ? r : 0;
    if (len == 0)
        return 0;
    if (c->seal)
        return sealed_result(c, seal_recv(c->seal, c->fd, buf, len), "receiving");
    ssize_t n = recv(c->fd, buf, len, MSG_DONTWAIT);
    if (n > 0)
        return n;
    if (n == 0)
        return xport_fail(x, KOLO_EPEER, "rank %d closed the connection", x->peer);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 0;
    return sock_fail(c, errno, "receiving");
}

static int tcp_arm(struct xport *x, bool want_send, bool want_recv, short *events)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    /* During the handshake only its own next step can make progress. */
    if (c->hs != HS_DONE)
        *events = hs_events(c);
    else
        *events = (short)((want_send ? POLLOUT : 0) | (want_recv ? POLLIN : 0));
    return c->fd;
}

static void tcp_close(struct xport *x)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    close(c->fd);
    seal_free(c->seal);
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
    .mid_send = tcp_mid_send,
    .buffered = tcp_buffered,
};

static int conn_new(int fd, const struct tcp_ident *me, int peer, enum hs hs, struct xport **out)
{
    struct tcp_conn *c = calloc(1, sizeof *c);
    if (!c)
        return KOLO_ENOMEM;
    c->base.ops = &tcp_ops;
    c->base.peer = peer;
    c->fd = fd;
    c->me = *me;
    c->hs = hs;
    if (hs == HS_WAIT_HELLO)
        io_expect(c, 8); /* the header first: is it a kolo rank at all? */
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
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, TCP_LISTEN_BACKLOG) == 0 &&
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

/* Starts a non-blocking connect to the first address that takes one. */
static int dial_start(const char *addr, int port, int *fd)
{
    struct addrinfo *res;
    int rc = resolve(addr, port, false, &res);
    if (rc)
        return rc;
    rc = KOLO_ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int s = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s < 0) {
            rc = KOLO_ESYS;
            continue;
        }
        tune_buffers(s);
        set_nodelay(s);
        if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS ||
            errno == EINTR) {
            *fd = s;
            rc = 0;
            break;
        }
        rc = errno == ECONNREFUSED ? KOLO_ECONNREFUSED : KOLO_ESYS;
        close(s);
    }
    freeaddrinfo(res);
    return rc;
}

int tcp_dial_start(const char *addr, int port, const struct tcp_ident *me, int to_rank,
                   struct xport **out)
{
    *out = NULL;
    int fd, rc = dial_start(addr, port, &fd);
    if (rc) {
        LOGD("xport", "cannot connect to rank %d at %s:%d: %s", to_rank, addr, port,
             kolo_errname(rc));
        return rc;
    }
    if ((rc = conn_new(fd, me, to_rank, HS_DIALING, out)) != 0)
        close(fd);
    return rc;
}

int tcp_accept_start(int listen_fd, const struct tcp_ident *me, struct xport **out)
{
    *out = NULL;
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            set_nodelay(fd);
            int rc = conn_new(fd, me, -1, HS_WAIT_HELLO, out);
            if (rc)
                close(fd);
            return rc;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue; /* a connector gave up while queued */
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        /* out of descriptors and the like: the caller retries later */
        return errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM
                   ? KOLO_EBUSY
                   : KOLO_ESYS;
    }
}

int tcp_handshake(struct xport *x, bool *done)
{
    struct tcp_conn *c = (struct tcp_conn *)x;
    ssize_t r = hs_run(c, HS_DONE);
    *done = c->hs == HS_DONE;
    return r < 0 ? (int)-r : 0;
}

/* Runs the handshake until it reaches `until` (or finishes), waiting on
 * the socket to the deadline: 0 or the failure's code. */
static int hs_drive(struct tcp_conn *c, enum hs until, uint64_t deadline)
{
    for (;;) {
        ssize_t r = hs_run(c, until);
        if (r < 0)
            return (int)-r;
        if (c->hs == HS_DONE || c->hs == until)
            return 0;
        int err = io_wait(c->fd, hs_events(c), deadline);
        if (err) {
            char peer[32];
            return (int)-xport_fail(&c->base, err, "%s did not finish the handshake in time",
                                    who(c, peer, sizeof peer));
        }
    }
}

int tcp_connect(const char *addr, int port, const struct tcp_ident *me, int to_rank,
                uint64_t deadline, struct xport **out)
{
    int rc = tcp_dial_start(addr, port, me, to_rank, out);
    if (rc)
        return rc;
    if ((rc = hs_drive((struct tcp_conn *)*out, HS_WAIT_ANSWER, deadline)) != 0) {
        xport_close(*out);
        *out = NULL;
    }
    return rc;
}

int tcp_accept(int listen_fd, const struct tcp_ident *me, uint64_t deadline, struct xport **out)
{
    *out = NULL;
    for (;;) {
        int rc = tcp_accept_start(listen_fd, me, out);
        if (rc && rc != KOLO_EBUSY)
            return rc;
        if (*out)
            break;
        if ((rc = io_wait(listen_fd, POLLIN, deadline)) != 0)
            return rc;
    }
    int rc = hs_drive((struct tcp_conn *)*out, HS_WAIT_PROOF, deadline);
    if (rc) {
        xport_close(*out);
        *out = NULL;
        /* closed before a whole hello: not a kolo rank (or one that died
         * at once): malformed, not a lost peer */
        return rc == KOLO_EPEER ? KOLO_EPROTO : rc;
    }
    return 0;
}

void tcp_peer_addr(const struct xport *x, char *buf, size_t len)
{
    const struct tcp_conn *c = (const struct tcp_conn *)x;
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getpeername(c->fd, (struct sockaddr *)&sa, &salen) != 0 ||
        getnameinfo((struct sockaddr *)&sa, salen, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(buf, len, "(unknown address)");
        return;
    }
    snprintf(buf, len, "%s:%s", host, port);
}
