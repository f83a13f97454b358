/*
 * rpc.c - frames, the context-pool server and the deadline-bounded client.
 *
 * Concurrency: each server context (struct rpc_call) moves through
 * RECV -> HANDLER (parked while the owner holds it) -> SEND -> RECV. Only
 * one party touches a call in each state: nng's callback thread while
 * receiving or sending, the handler's owner while parked. That is why the
 * call needs no lock of its own; the shared pieces (stats, the replay
 * cache) sit behind the server mutex.
 */
#include "rpc.h"
#include "tls.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <linux/rtnetlink.h>
#include <linux/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include "errors.h"
#include "creds.h"
#include "hmac.h"
#include "log.h"
#include "util.h"

#define MAC_OFFSET 8

/* ---------------------------------------------------------------- frames */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t get64(const uint8_t *p)
{
    return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

/* The MAC covers the whole frame with the MAC field read as zeros. */
static void frame_mac(const uint8_t *data, size_t len, const char *token, uint8_t out[32])
{
    static const uint8_t zeros[32];
    struct hmac_sha256 h;
    hmac_sha256_init(&h, token, strlen(token));
    hmac_sha256_update(&h, data, MAC_OFFSET);
    hmac_sha256_update(&h, zeros, sizeof(zeros));
    hmac_sha256_update(&h, data + MAC_OFFSET + 32, len - MAC_OFFSET - 32);
    hmac_sha256_final(&h, out);
}

/* The length of f's frame, or 0 when f cannot be framed. */
static size_t frame_len(const struct rpc_frame *f)
{
    size_t mlen = strlen(f->method), ilen = strlen(f->identity);
    if (mlen > RPC_MAX_METHOD || ilen > RPC_MAX_IDENTITY || f->body_len > UINT32_MAX)
        return 0;
    return RPC_HEADER_LEN + mlen + ilen + f->body_len;
}

/* Writes f's frame (frame_len bytes) into p. */
static void frame_write(const struct rpc_frame *f, const char *token, uint8_t *p, size_t len)
{
    size_t mlen = strlen(f->method), ilen = strlen(f->identity);
    memset(p, 0, RPC_HEADER_LEN);
    memcpy(p, "KOLO", 4);
    put16(p + 4, f->version);
    p[6] = f->kind;
    p[7] = token ? (uint8_t)(RPC_FLAG_MAC | (f->flags & RPC_FLAG_JOB_KEY)) : 0;
    put64(p + 40, f->ts_ms);
    memcpy(p + 48, f->nonce, RPC_NONCE_LEN);
    put64(p + 64, f->job_id);
    put64(p + 72, f->generation);
    put32(p + 80, (uint32_t)f->rank);
    put32(p + 84, (uint32_t)f->status);
    put16(p + 88, (uint16_t)mlen);
    put16(p + 90, (uint16_t)ilen);
    put32(p + 92, (uint32_t)f->body_len);
    memcpy(p + RPC_HEADER_LEN, f->method, mlen);
    memcpy(p + RPC_HEADER_LEN + mlen, f->identity, ilen);
    if (f->body_len)
        memcpy(p + RPC_HEADER_LEN + mlen + ilen, f->body, f->body_len);
    if (token)
        frame_mac(p, len, token, p + MAC_OFFSET);
}

int rpc_frame_encode(const struct rpc_frame *f, const char *token, uint8_t **out, size_t *out_len)
{
    size_t len = frame_len(f);
    if (!len)
        return KOLO_EINVAL;
    uint8_t *p = malloc(len);
    if (!p)
        return KOLO_ENOMEM;
    frame_write(f, token, p, len);
    *out = p;
    *out_len = len;
    return 0;
}

/* The frame straight into a new message: a snapshot chunk is copied once
 * (a malloc'd frame and its copy into the message cost two fresh
 * buffers, ~40% of a 644 KB commit's CPU, mostly page faults). */
static int frame_msg(const struct rpc_frame *f, const char *token, nng_msg **out)
{
    size_t len = frame_len(f);
    *out = NULL;
    if (!len)
        return KOLO_EINVAL;
    if (nng_msg_alloc(out, len) != 0)
        return KOLO_ENOMEM;
    frame_write(f, token, nng_msg_body(*out), len);
    return 0;
}

int rpc_frame_decode(const uint8_t *p, size_t len, struct rpc_frame *f)
{
    memset(f, 0, sizeof(*f));
    if (len < RPC_HEADER_LEN || memcmp(p, "KOLO", 4) != 0)
        return KOLO_EPROTO;
    f->version = get16(p + 4);
    f->kind = p[6];
    f->flags = p[7];
    memcpy(f->mac, p + MAC_OFFSET, 32);
    f->ts_ms = get64(p + 40);
    memcpy(f->nonce, p + 48, RPC_NONCE_LEN);
    f->job_id = get64(p + 64);
    f->generation = get64(p + 72);
    f->rank = (int32_t)get32(p + 80);
    f->status = (int32_t)get32(p + 84);
    size_t mlen = get16(p + 88), ilen = get16(p + 90), blen = get32(p + 92);
    if (f->kind != RPC_REQUEST && f->kind != RPC_REPLY)
        return KOLO_EPROTO;
    if (mlen > RPC_MAX_METHOD || ilen > RPC_MAX_IDENTITY)
        return KOLO_EPROTO;
    if (RPC_HEADER_LEN + mlen + ilen + blen != len)
        return KOLO_EPROTO; /* truncated, or trailing bytes */
    memcpy(f->method, p + RPC_HEADER_LEN, mlen);
    memcpy(f->identity, p + RPC_HEADER_LEN + mlen, ilen);
    /* names are printed in logs and errors: refuse control bytes */
    for (size_t i = 0; i < mlen; i++)
        if ((unsigned char)f->method[i] < 0x20 || f->method[i] == 0x7f)
            return KOLO_EPROTO;
    for (size_t i = 0; i < ilen; i++)
        if ((unsigned char)f->identity[i] < 0x20 || f->identity[i] == 0x7f)
            return KOLO_EPROTO;
    f->body = p + RPC_HEADER_LEN + mlen + ilen;
    f->body_len = blen;
    return 0;
}

int rpc_frame_verify(const uint8_t *data, size_t len, const char *token)
{
    uint8_t mac[32];
    if (len < RPC_HEADER_LEN || !(data[7] & RPC_FLAG_MAC))
        return KOLO_EAUTH;
    frame_mac(data, len, token, mac);
    return ct_equal(mac, data + MAC_OFFSET, 32) ? 0 : KOLO_EAUTH;
}

/* ---------------------------------------------------------------- replay cache
 *
 * Authenticated requests are accepted only within RPC_AUTH_WINDOW_MS of the
 * server's clock, and a nonce seen inside that window is refused. The
 * cache is a set-associative table; a bucket evicts its oldest entry, which
 * is only unsafe if more than REPLAY_WAYS requests hash to one bucket inside
 * one window (far beyond any real load at REPLAY_BUCKETS buckets).
 */
#define REPLAY_BUCKETS 8192
#define REPLAY_WAYS    8

struct replay_entry {
    uint8_t nonce[RPC_NONCE_LEN];
    uint64_t seen_ms;
};

static int replay_check_and_add(struct replay_entry *tab, const uint8_t *nonce, uint64_t now)
{
    uint64_t h;
    memcpy(&h, nonce, sizeof(h));
    struct replay_entry *b = tab + (h % REPLAY_BUCKETS) * REPLAY_WAYS;
    struct replay_entry *victim = &b[0];
    for (int i = 0; i < REPLAY_WAYS; i++) {
        if (b[i].seen_ms && now - b[i].seen_ms <= 2 * RPC_AUTH_WINDOW_MS &&
            memcmp(b[i].nonce, nonce, RPC_NONCE_LEN) == 0)
            return KOLO_EAUTH;
        if (b[i].seen_ms < victim->seen_ms)
            victim = &b[i];
    }
    memcpy(victim->nonce, nonce, RPC_NONCE_LEN);
    victim->seen_ms = now;
    return 0;
}

/* ---------------------------------------------------------------- server */

enum call_state { CALL_RECV, CALL_HANDLER, CALL_SEND, CALL_DONE };

struct rpc_call {
    struct rpc_server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    enum call_state state;
    nng_msg *req;
    struct rpc_frame frame;
    /* RPC_FLAG_JOB_KEY calls: the job's credential, which keys the reply */
    char job_key[CREDS_JOB_HEX];
    /* under srv->mtx: the request's connection, and whether the call is
     * counted in its connection's and caller's parked (admitted, not
     * answered yet) */
    uint32_t pipe_id;
    bool parked;
    bool unreserved; /* counted in srv->unreserved_calls until answered */
    int peer_uid;    /* the connection's, from its pipe_rec */
    uint64_t caller; /* caller_key: whose share a parked call counts in */
};

/* A connection's far end: the address nng reports for it (TCP), or the
 * kind of transport. */
struct peer_addr {
    int family;       /* NNG_AF_INET, NNG_AF_INET6, NNG_AF_IPC, NNG_AF_INPROC, 0 */
    uint8_t addr[16]; /* network order; IPv4 in the first 4 */
    uint16_t port;    /* network order */
};

/* What the server knows of one connection (nng pipe), under srv->mtx. */
struct pipe_rec {
    uint32_t id;
    uint64_t since_ms; /* when it connected */
    bool proven;       /* it sent a valid (authenticated) request */
    bool uid_known;    /* uid was asked of the kernel (at the first request) */
    int uid;           /* the caller's uid, -1 unknown */
    int parked;        /* its calls admitted and not answered yet */
    struct peer_addr remote, local;
    struct pipe_rec *next;
};
#define PIPE_BUCKETS 256

/* Parked calls per caller (caller_key), under srv->mtx. */
struct caller_rec {
    uint64_t key;
    int parked;
    struct caller_rec *next;
};
#define CALLER_BUCKETS 256

/* A TCP connection accepted by the TLS listener that is not a pipe yet
 * (its handshake runs): the socket's inode and when a sweep first saw it. */
struct pending_conn {
    uint32_t inode;
    uint64_t seen_ms;
};
struct rpc_server {
    nng_socket sock;
    nng_listener listener;
    char url[256];
    char *token;
    size_t max_msg;
    int ncalls;
    struct rpc_call *calls;
    char *reserved_prefix; /* NULL: nothing reserved */
    int reserved;
    int unreserved_calls; /* under mtx: calls of other methods not yet answered */
    rpc_handler_fn handler;
    void *arg;
    atomic_bool closing;
    nng_mtx *mtx;
    struct rpc_server_stats stats;
    struct replay_entry *replay;
    /* connections (under mtx): bounded before they prove anything */
    struct pipe_rec *pipes[PIPE_BUCKETS];
    int npipes, nunproven;
    int handshake_ms, max_unproven;
    size_t unproven_budget;
    nng_aio *sweep_aio; /* closes connections silent past RPC_HANDSHAKE_MS */
    struct caller_rec *callers[CALLER_BUCKETS];
    int max_parked_caller;
    /* the kernel's answers about peers (peer_uid_of): one netlink socket
     * kept open, so a coordinator out of descriptors still knows its own
     * user; diag_mtx serialises its queries */
    int diag_fd;
    uint32_t diag_seq;
    nng_mtx *diag_mtx;
    /* TLS: handshakes in progress, from the sweep's kernel view (tls_sweep) */
    bool tls;
    uint16_t port; /* host order, the bound port */
    struct pending_conn *pending;
    size_t npending;
    uint64_t tls_swept_ms;
};

/* Closes the connection with that id (nng names pipes by id). */
static void pipe_close_id(uint32_t id)
{
    nng_pipe p;
    memset(&p, 0, sizeof p);
    p.id = id;
    nng_pipe_close(p);
}

static struct pipe_rec *pipe_find(struct rpc_server *srv, uint32_t id)
{
    struct pipe_rec *r = srv->pipes[id % PIPE_BUCKETS];
    while (r && r->id != id)
        r = r->next;
    return r;
}

/* ---------------------------------------------------------------- callers */

/* Who calls. A token-less server trusts the kernel's word for the user at
 * the other end of a connection, and asks it once per connection (at its
 * first request; pipe_identify), never by scanning a table: for TCP a
 * NETLINK_SOCK_DIAG query names exactly one socket by its 4-tuple (the
 * caller's socket is the one whose source is our remote end and whose
 * destination is our local end), IPv4 and IPv6 alike; for ipc:// the
 * socket's peer credentials (SO_PEERCRED, which nng exposes); inproc://
 * callers are this process. The netlink socket stays open for the
 * server's life, so the answer does not depend on free descriptors. A
 * socket of another host, or of another network namespace, is not in
 * our table: -1, unknown. */

static void peer_addr_of(nng_pipe p, const char *opt, struct peer_addr *a)
{
    nng_sockaddr sa;
    memset(a, 0, sizeof *a);
    if (nng_pipe_get_addr(p, opt, &sa) != 0)
        return;
    a->family = sa.s_family;
    if (sa.s_family == NNG_AF_INET) {
        memcpy(a->addr, &sa.s_in.sa_addr, 4);
        a->port = sa.s_in.sa_port;
    } else if (sa.s_family == NNG_AF_INET6) {
        memcpy(a->addr, sa.s_in6.sa_addr, 16);
        a->port = sa.s_in6.sa_port;
    }
}

static int diag_open(void)
{
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return -1;
    /* the kernel answers at once; a bound keeps a surprise from hanging
     * the nng thread that asks */
    struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Sends one sock_diag request for TCP sockets of family (AF_INET or
 * AF_INET6); with id it asks for that socket alone, without it for every
 * socket in states. */
static int diag_send(int fd, int family, const struct inet_diag_sockid *id, uint32_t states,
                     uint8_t ext, uint32_t seq)
{
    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 r;
    } req;
    memset(&req, 0, sizeof req);
    req.nh.nlmsg_len = sizeof req;
    req.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nh.nlmsg_flags = NLM_F_REQUEST | (id ? 0 : NLM_F_DUMP);
    req.nh.nlmsg_seq = seq;
    req.r.sdiag_family = (uint8_t)family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = states;
    req.r.idiag_ext = ext;
    if (id)
        req.r.id = *id;
    struct sockaddr_nl nl = {.nl_family = AF_NETLINK};
    return sendto(fd, &req, sizeof req, 0, (struct sockaddr *)&nl, sizeof nl) == (ssize_t)sizeof req
               ? 0
               : -1;
}

/* The uid owning the caller's end of a loopback TCP connection (see
 * above), or -1. */
static int diag_peer_uid(struct rpc_server *srv, const struct peer_addr *local,
                         const struct peer_addr *remote)
{
    if (remote->family != local->family ||
        (remote->family != NNG_AF_INET && remote->family != NNG_AF_INET6))
        return -1;
    /* A dual-stack listener sees an IPv4 caller as ::ffff:a.b.c.d; the
     * caller's socket is an IPv4 one, in the IPv4 table. */
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    bool mapped = remote->family == NNG_AF_INET6 && memcmp(remote->addr, v4mapped, 12) == 0 &&
                  memcmp(local->addr, v4mapped, 12) == 0;
    size_t alen = remote->family == NNG_AF_INET || mapped ? 4 : 16, skip = mapped ? 12 : 0;
    struct inet_diag_sockid id;
    memset(&id, 0, sizeof id);
    id.idiag_sport = remote->port;
    id.idiag_dport = local->port;
    memcpy(id.idiag_src, remote->addr + skip, alen);
    memcpy(id.idiag_dst, local->addr + skip, alen);
    id.idiag_cookie[0] = id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    int family = alen == 4 ? AF_INET : AF_INET6;
    int uid = -1;
    nng_mtx_lock(srv->diag_mtx);
    if (srv->diag_fd < 0)
        srv->diag_fd = diag_open();
    uint32_t seq = ++srv->diag_seq;
    if (srv->diag_fd >= 0 && diag_send(srv->diag_fd, family, &id, 0, 0, seq) == 0) {
        /* one answer: the socket, or an error (ENOENT: not on this host);
         * what is left of an earlier query that timed out is skipped */
        union {
            struct nlmsghdr nh;
            uint8_t b[1024];
        } buf;
        for (int tries = 0; tries < 64; tries++) {
            ssize_t n = recv(srv->diag_fd, &buf, sizeof buf, 0);
            if (n < 0) {
                if (errno != EINTR) {
                    close(srv->diag_fd); /* opened again by the next query */
                    srv->diag_fd = -1;
                    break;
                }
                continue;
            }
            if (n < (ssize_t)sizeof(struct nlmsghdr) || !NLMSG_OK(&buf.nh, (size_t)n) ||
                buf.nh.nlmsg_seq != seq)
                continue;
            if (buf.nh.nlmsg_type == SOCK_DIAG_BY_FAMILY &&
                buf.nh.nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
                const struct inet_diag_msg *m = NLMSG_DATA(&buf.nh);
                uid = (int)m->idiag_uid;
            }
            break;
        }
    }
    nng_mtx_unlock(srv->diag_mtx);
    return uid;
}

/* The caller's uid for the connection p (see above). */
static int pipe_peer_uid(struct rpc_server *srv, nng_pipe p, const struct peer_addr *remote,
                         const struct peer_addr *local)
{
    if (remote->family == NNG_AF_INPROC)
        return (int)geteuid();
    if (remote->family == NNG_AF_IPC) {
        uint64_t uid;
        return nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) == 0 && uid <= INT32_MAX
                   ? (int)uid
                   : -1;
    }
    return diag_peer_uid(srv, local, remote);
}

/* Fills in the call's caller uid from its connection, asking the kernel
 * at the connection's first request only. */
static void pipe_identify(struct rpc_call *c, nng_pipe p)
{
    struct rpc_server *srv = c->srv;
    struct peer_addr remote, local;
    nng_mtx_lock(srv->mtx);
    struct pipe_rec *r = pipe_find(srv, c->pipe_id);
    if (r && r->uid_known) {
        c->peer_uid = r->uid;
        nng_mtx_unlock(srv->mtx);
        return;
    }
    if (r) {
        remote = r->remote;
        local = r->local;
    }
    nng_mtx_unlock(srv->mtx);
    if (!r) {
        peer_addr_of(p, NNG_OPT_REMADDR, &remote);
        peer_addr_of(p, NNG_OPT_LOCADDR, &local);
    }
    c->peer_uid = pipe_peer_uid(srv, p, &remote, &local);
    nng_mtx_lock(srv->mtx);
    if ((r = pipe_find(srv, c->pipe_id)) != NULL) {
        r->uid = c->peer_uid;
        r->uid_known = true;
    }
    nng_mtx_unlock(srv->mtx);
}

/* Whose share of the contexts a call counts in. Always the caller's
 * address and user (what the kernel says), so a client cannot escape it
 * by opening more connections. Then, for a training process that holds
 * only its job's credential (its frames prove the job), that job: all
 * the job's ranks on one host together. For every other caller (cluster
 * token holders: agents, kolo run, admin tools; and everyone on a
 * token-less server, which admits only its own user) the name, job and
 * rank its frame gives, so that `kolo run` following its job and a
 * runaway tool of the same user on the same host are held apart. Those
 * names prove nothing: the share bounds runaway clients of the token's
 * holders, who could stop any job anyway. */
static uint64_t caller_key(const struct pipe_rec *r, int uid, const struct rpc_call *c)
{
    uint64_t h = 1469598103934665603ull;
    uint8_t b[16 + 4 + 4 + 8 + 4];
    memset(b, 0, sizeof b);
    if (r) {
        memcpy(b, r->remote.addr, 16);
        b[16] = (uint8_t)r->remote.family;
    }
    memcpy(b + 20, &uid, 4);
    memcpy(b + 24, &c->frame.job_id, 8);
    if (!c->job_key[0])
        memcpy(b + 32, &c->frame.rank, 4);
    for (size_t i = 0; i < sizeof b; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    if (!c->job_key[0])
        for (const char *p = c->frame.identity; *p; p++)
            h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return h;
}

static struct caller_rec *caller_find(struct rpc_server *srv, uint64_t key, bool add)
{
    struct caller_rec **pp = &srv->callers[key % CALLER_BUCKETS];
    while (*pp && (*pp)->key != key)
        pp = &(*pp)->next;
    if (!*pp && add && (*pp = calloc(1, sizeof **pp)) != NULL)
        (*pp)->key = key;
    return *pp;
}

/* One parked call of key fewer (under srv->mtx); the record goes at 0. */
static void caller_unpark(struct rpc_server *srv, uint64_t key)
{
    struct caller_rec **pp = &srv->callers[key % CALLER_BUCKETS];
    while (*pp && (*pp)->key != key)
        pp = &(*pp)->next;
    if (*pp && --(*pp)->parked <= 0) {
        struct caller_rec *q = *pp;
        *pp = q->next;
        free(q);
    }
}

/* ---------------------------------------------------------------- TLS handshakes */

/* nng makes a pipe of a TLS connection only after the TLS handshake and
 * its own greeting, and nng 1.5.2 puts no time limit on the handshake: a
 * connection that never sends a ClientHello is held forever, out of
 * pipe_cb's sight. So the sweep asks the kernel for the TCP sockets on
 * our port (a sock_diag dump), keeps those that are not a pipe yet with
 * the time it first saw them, and shuts down (shutdown(2) on nng's own
 * descriptor, found through /proc/self/fd by the socket's inode: nng then
 * sees the connection end and frees it) the ones still there after
 * handshake_ms. The descriptor is checked against the inode just before
 * the shutdown; the window in which nng could have closed and reused it
 * is a few microseconds, and the worst it could do is end another fresh
 * connection, which its client redials. */

#define TLS_SWEEP_MAX 16384

struct diag_seen {
    uint32_t inode;
    uint64_t peer;     /* hash of the remote address and port */
    uint64_t bytes_in; /* tcp_info's bytes received, when asked (0: unknown) */
};

#define DIAG_TCP_ESTABLISHED 1 /* the kernel's TCP states */
#define DIAG_TCP_CLOSE_WAIT  8

static uint64_t addr_hash(int family4or6, const uint8_t *addr, uint16_t port)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)family4or6;
    size_t n = family4or6 == 4 ? 4 : 16;
    for (size_t i = 0; i < n; i++)
        h = (h ^ addr[i]) * 1099511628211ull;
    h = (h ^ (port & 0xff)) * 1099511628211ull;
    return (h ^ (port >> 8)) * 1099511628211ull;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_pending(const void *a, const void *b)
{
    uint32_t x = ((const struct pending_conn *)a)->inode,
             y = ((const struct pending_conn *)b)->inode;
    return x < y ? -1 : x > y;
}

/* The established TCP sockets whose local port is port (network order),
 * both families; returns how many it wrote to out. */
static size_t diag_sockets_on_port(struct rpc_server *srv, uint16_t port, struct diag_seen *out,
                                   size_t max, bool with_info)
{
    size_t n = 0;
    int fd = srv->diag_fd;
    union nlbuf {
        struct nlmsghdr nh;
        uint8_t b[32768];
    } *buf = malloc(sizeof *buf);
    if (!buf)
        return 0;
    uint32_t states = (1u << DIAG_TCP_ESTABLISHED) | (1u << DIAG_TCP_CLOSE_WAIT);
    uint8_t ext = with_info ? (uint8_t)(1u << (INET_DIAG_INFO - 1)) : 0;
    for (int fam = 0; fam < 2; fam++) {
        int family = fam ? AF_INET6 : AF_INET;
        uint32_t seq = ++srv->diag_seq;
        if (diag_send(fd, family, NULL, states, ext, seq) != 0)
            continue;
        for (bool done = false; !done;) {
            ssize_t len = recv(fd, buf, sizeof *buf, 0);
            if (len <= 0)
                break;
            for (struct nlmsghdr *h = &buf->nh; NLMSG_OK(h, (size_t)len);
                 h = NLMSG_NEXT(h, len)) {
                if (h->nlmsg_seq != seq)
                    continue;
                if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
                    done = true;
                    break;
                }
                if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
                    continue;
                const struct inet_diag_msg *m = NLMSG_DATA(h);
                if (m->id.idiag_sport != port || n >= max || m->idiag_inode == 0)
                    continue;
                out[n].inode = m->idiag_inode;
                out[n].peer = addr_hash(family == AF_INET ? 4 : 6,
                                        (const uint8_t *)m->id.idiag_dst, m->id.idiag_dport);
                out[n].bytes_in = 0;
                int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof *m));
                for (struct rtattr *a = (struct rtattr *)(m + 1); with_info && RTA_OK(a, alen);
                     a = RTA_NEXT(a, alen)) {
                    size_t want = offsetof(struct tcp_info, tcpi_bytes_received) + 8;
                    if (a->rta_type == INET_DIAG_INFO && RTA_PAYLOAD(a) >= want)
                        memcpy(&out[n].bytes_in,
                               (const uint8_t *)RTA_DATA(a) +
                                   offsetof(struct tcp_info, tcpi_bytes_received),
                               8);
                }
                n++;
            }
        }
    }
    free(buf);
    return n;
}

/* Calls fn(fd, inode, arg) for each socket descriptor of this process
 * (/proc/self/fd); returns for how many it returned true. */
static int each_socket_fd(bool (*fn)(int fd, uint32_t ino, void *arg), void *arg)
{
    DIR *d = opendir("/proc/self/fd");
    int done = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[300], link[64];
        int fd = atoi(e->d_name);
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d))
            continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t l = readlink(path, link, sizeof link - 1);
        unsigned long ino;
        if (l <= 0)
            continue;
        link[l] = '\0';
        if (sscanf(link, "socket:[%lu]", &ino) == 1 && fn(fd, (uint32_t)ino, arg))
            done++;
    }
    closedir(d);
    return done;
}

/* A copy of descriptor fd while it is still the socket with inode ino,
 * else -1. The descriptor may be nng's, and another thread may close it
 * (and the number be reused) at any moment: the copy pins whatever it is
 * now, so the descriptor's owner no longer matters. The calls are raw
 * syscalls because ThreadSanitizer would still see nng's close and this
 * read of the same number as a race on it. Closed with fd_copy_close. */
static int fd_copy(int fd, uint32_t ino)
{
    int copyfd = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 0);
    struct stat st;
    if (copyfd >= 0 && (syscall(SYS_newfstatat, copyfd, "", &st, AT_EMPTY_PATH) != 0 ||
                        !S_ISSOCK(st.st_mode) || (uint32_t)st.st_ino != ino)) {
        syscall(SYS_close, copyfd);
        copyfd = -1;
    }
    return copyfd;
}

static void fd_copy_close(int copyfd)
{
    syscall(SYS_close, copyfd);
}

struct inode_set {
    const uint32_t *inodes; /* sorted */
    size_t n;
};

static bool shutdown_if_listed(int fd, uint32_t ino, void *arg)
{
    const struct inode_set *set = arg;
    size_t lo = 0, hi = set->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (set->inodes[mid] < ino)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= set->n || set->inodes[lo] != ino)
        return false;
    int copyfd = fd_copy(fd, ino);
    bool done = copyfd >= 0 && syscall(SYS_shutdown, copyfd, SHUT_RDWR) == 0;
    if (copyfd >= 0)
        fd_copy_close(copyfd);
    return done;
}

/* Shuts down our descriptors for the sockets with these inodes (sorted);
 * returns how many. */
static int shutdown_inodes(const uint32_t *inodes, size_t n)
{
    struct inode_set set = {inodes, n};
    return each_socket_fd(shutdown_if_listed, &set);
}

/* See above: ends TLS connections whose handshake outlived handshake_ms. */
static void tls_sweep(struct rpc_server *srv, uint64_t now)
{
    struct diag_seen *seen = malloc(TLS_SWEEP_MAX * sizeof *seen);
    if (!seen)
        return;
    size_t n = 0;
    nng_mtx_lock(srv->diag_mtx);
    if (srv->diag_fd < 0)
        srv->diag_fd = diag_open();
    if (srv->diag_fd >= 0)
        n = diag_sockets_on_port(srv, htons(srv->port), seen, TLS_SWEEP_MAX, false);
    nng_mtx_unlock(srv->diag_mtx);
    /* the pipes' peers, sorted, to tell connections from handshakes */
    nng_mtx_lock(srv->mtx);
    uint64_t *pipes = malloc(((size_t)srv->npipes + 1) * sizeof *pipes);
    size_t np = 0;
    for (int b = 0; pipes && b < PIPE_BUCKETS; b++)
        for (struct pipe_rec *q = srv->pipes[b]; q && np < (size_t)srv->npipes; q = q->next)
            if (q->remote.family == NNG_AF_INET || q->remote.family == NNG_AF_INET6)
                pipes[np++] = addr_hash(q->remote.family == NNG_AF_INET ? 4 : 6,
                                        q->remote.addr, q->remote.port);
    nng_mtx_unlock(srv->mtx);
    struct pending_conn *next = calloc(n + 1, sizeof *next);
    uint32_t *late = calloc(n + 1, sizeof *late);
    if (!pipes || !next || !late) {
        free(seen);
        free(pipes);
        free(next);
        free(late);
        return;
    }
    qsort(pipes, np, sizeof *pipes, cmp_u64);
    size_t nn = 0, nl = 0;
    for (size_t i = 0; i < n; i++) {
        if (bsearch(&seen[i].peer, pipes, np, sizeof *pipes, cmp_u64))
            continue;
        struct pending_conn key = {.inode = seen[i].inode};
        const struct pending_conn *old =
            srv->pending ? bsearch(&key, srv->pending, srv->npending, sizeof key, cmp_pending)
                         : NULL;
        next[nn].inode = seen[i].inode;
        next[nn].seen_ms = old ? old->seen_ms : now;
        if (now - next[nn].seen_ms > (uint64_t)srv->handshake_ms)
            late[nl++] = seen[i].inode;
        nn++;
    }
    qsort(next, nn, sizeof *next, cmp_pending);
    free(srv->pending);
    srv->pending = next;
    srv->npending = nn;
    if (nl) {
        qsort(late, nl, sizeof *late, cmp_u32);
        int closed = shutdown_inodes(late, nl);
        if (closed) {
            nng_mtx_lock(srv->mtx);
            srv->stats.conns_timed_out += (uint64_t)closed;
            nng_mtx_unlock(srv->mtx);
            LOGI("rpc", "closed %d TLS connection%s whose handshake did not end within %d ms",
                 closed, closed == 1 ? "" : "s", srv->handshake_ms);
        }
    }
    free(late);
    free(seen);
    free(pipes);
}

/* Connection hygiene (issue 15, F4 F5): a connection that has not sent a
 * valid request within RPC_HANDSHAKE_MS is closed, and at most
 * RPC_MAX_UNPROVEN such connections are held at once (the oldest goes
 * when another arrives), so held-open or trickling connections cannot
 * exhaust descriptors or buffer memory before anything is authenticated. */
static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct rpc_server *srv = arg;
    uint32_t id = (uint32_t)nng_pipe_id(p);
    nng_mtx_lock(srv->mtx);
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        struct pipe_rec *r = calloc(1, sizeof *r);
        if (!r) {
            nng_mtx_unlock(srv->mtx);
            nng_pipe_close(p);
            return;
        }
        r->id = id;
        r->since_ms = now_mono_ms();
        r->uid = -1;
        peer_addr_of(p, NNG_OPT_REMADDR, &r->remote);
        peer_addr_of(p, NNG_OPT_LOCADDR, &r->local);
        r->next = srv->pipes[id % PIPE_BUCKETS];
        srv->pipes[id % PIPE_BUCKETS] = r;
        srv->npipes++;
        if (++srv->nunproven > srv->max_unproven) {
            struct pipe_rec *oldest = NULL;
            for (int b = 0; b < PIPE_BUCKETS; b++)
                for (struct pipe_rec *q = srv->pipes[b]; q; q = q->next)
                    if (!q->proven && q != r && (!oldest || q->since_ms < oldest->since_ms))
                        oldest = q;
            if (oldest) {
                srv->stats.conns_evicted++;
                uint32_t victim = oldest->id;
                oldest->proven = true; /* no longer counted while it closes */
                srv->nunproven--;
                nng_mtx_unlock(srv->mtx);
                pipe_close_id(victim);
                return;
            }
        }
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        struct pipe_rec **pp = &srv->pipes[id % PIPE_BUCKETS];
        while (*pp && (*pp)->id != id)
            pp = &(*pp)->next;
        if (*pp) {
            struct pipe_rec *r = *pp;
            *pp = r->next;
            srv->npipes--;
            if (!r->proven)
                srv->nunproven--;
            free(r);
        }
    }
    nng_mtx_unlock(srv->mtx);
}

struct unproven_held {
    uint64_t peer; /* addr_hash of its remote end */
    uint64_t held; /* bytes received past the greeting */
    uint32_t id;
};

static int cmp_seen_peer(const void *a, const void *b)
{
    return cmp_u64(&((const struct diag_seen *)a)->peer, &((const struct diag_seen *)b)->peer);
}

static int cmp_held_desc(const void *a, const void *b)
{
    uint64_t x = ((const struct unproven_held *)a)->held;
    uint64_t y = ((const struct unproven_held *)b)->held;
    return x > y ? -1 : x < y;
}

/* Memory before authentication (rpc.h): while more than unproven_budget
 * bytes sit on unproven connections, by the kernel's count of what each
 * received (a sock_diag dump of our port with tcp_info), the heaviest
 * are closed. Looked at only when the unproven connections could hold
 * more than the budget at all (each holds at most max_msg). */
static void budget_sweep(struct rpc_server *srv)
{
    nng_mtx_lock(srv->mtx);
    bool could = srv->port && (uint64_t)srv->nunproven * srv->max_msg > srv->unproven_budget;
    int cap = srv->nunproven;
    nng_mtx_unlock(srv->mtx);
    if (!could)
        return;
    struct diag_seen *seen = malloc(TLS_SWEEP_MAX * sizeof *seen);
    struct unproven_held *un = malloc(((size_t)cap + 1) * sizeof *un);
    size_t n = 0, nu = 0;
    if (!seen || !un)
        goto out;
    nng_mtx_lock(srv->diag_mtx);
    if (srv->diag_fd < 0)
        srv->diag_fd = diag_open();
    if (srv->diag_fd >= 0)
        n = diag_sockets_on_port(srv, htons(srv->port), seen, TLS_SWEEP_MAX, true);
    nng_mtx_unlock(srv->diag_mtx);
    qsort(seen, n, sizeof *seen, cmp_seen_peer);
    nng_mtx_lock(srv->mtx);
    for (int b = 0; b < PIPE_BUCKETS; b++)
        for (struct pipe_rec *q = srv->pipes[b]; q && nu < (size_t)cap; q = q->next)
            if (!q->proven &&
                (q->remote.family == NNG_AF_INET || q->remote.family == NNG_AF_INET6)) {
                un[nu].peer = addr_hash(q->remote.family == NNG_AF_INET ? 4 : 6, q->remote.addr,
                                        q->remote.port);
                un[nu].id = q->id;
                un[nu++].held = 0;
            }
    nng_mtx_unlock(srv->mtx);
    uint64_t total = 0;
    for (size_t i = 0; i < nu; i++) {
        struct diag_seen key = {.peer = un[i].peer};
        const struct diag_seen *d = bsearch(&key, seen, n, sizeof key, cmp_seen_peer);
        un[i].held = d && d->bytes_in > 8 ? d->bytes_in - 8 : 0; /* past nng's greeting */
        total += un[i].held;
    }
    if (total <= srv->unproven_budget)
        goto out;
    qsort(un, nu, sizeof *un, cmp_held_desc);
    int closed = 0;
    for (size_t i = 0; i < nu && total > srv->unproven_budget && un[i].held > 0; i++) {
        nng_mtx_lock(srv->mtx);
        struct pipe_rec *q = pipe_find(srv, un[i].id);
        bool go = q && !q->proven;
        if (go) {
            q->proven = true; /* no longer counted while it closes */
            srv->nunproven--;
            srv->stats.conns_evicted++;
        }
        nng_mtx_unlock(srv->mtx);
        if (go) {
            pipe_close_id(un[i].id);
            total -= un[i].held;
            closed++;
        }
    }
    if (closed)
        LOGW("rpc", "closed %d unauthenticated connection%s holding the most data: more than "
             "%zu bytes sat on connections that proved nothing", closed, closed == 1 ? "" : "s",
             srv->unproven_budget);
out:
    free(seen);
    free(un);
}

/* The period of the sweep: a quarter of the handshake time, at most
 * RPC_SWEEP_MS. */
static int sweep_period(const struct rpc_server *srv)
{
    int p = srv->handshake_ms / 4 + 1;
    return p < RPC_SWEEP_MS ? p : RPC_SWEEP_MS;
}

/* Closes connections silent past handshake_ms, then those over the
 * budget of unauthenticated bytes (budget_sweep) and, on a TLS port,
 * handshakes that outlived handshake_ms (tls_sweep). */
static void sweep_cb(void *arg)
{
    struct rpc_server *srv = arg;
    if (nng_aio_result(srv->sweep_aio) != 0 || atomic_load(&srv->closing))
        return;
    uint64_t now = now_mono_ms();
    uint32_t late[64];
    int n = 0;
    nng_mtx_lock(srv->mtx);
    for (int b = 0; b < PIPE_BUCKETS && n < 64; b++)
        for (struct pipe_rec *q = srv->pipes[b]; q && n < 64; q = q->next)
            if (!q->proven && now - q->since_ms > (uint64_t)srv->handshake_ms) {
                q->proven = true; /* no longer counted while it closes */
                srv->nunproven--;
                srv->stats.conns_timed_out++;
                late[n++] = q->id;
            }
    nng_mtx_unlock(srv->mtx);
    for (int i = 0; i < n; i++)
        pipe_close_id(late[i]);
    budget_sweep(srv);
    if (srv->tls && now - srv->tls_swept_ms >= (uint64_t)sweep_period(srv) * 4) {
        srv->tls_swept_ms = now;
        tls_sweep(srv, now);
    }
    nng_sleep_aio(n == 64 ? 10 : sweep_period(srv), srv->sweep_aio);
}

static void call_recv(struct rpc_call *c)
{
    c->state = CALL_RECV;
    if (!atomic_load(&c->srv->closing))
        nng_ctx_recv(c->ctx, c->aio);
}

static void call_send_frame(struct rpc_call *c, int status, const void *body, size_t len)
{
    struct rpc_server *srv = c->srv;
    struct rpc_frame rf = {0};
    rf.version = KOLO_PROTO_VERSION;
    rf.kind = RPC_REPLY;
    rf.ts_ms = now_stepless_ms();
    memcpy(rf.nonce, c->frame.nonce, RPC_NONCE_LEN);
    rf.status = status;
    rf.body = body;
    rf.body_len = len;
    const char *key = srv->token;
    if (c->job_key[0]) {
        rf.flags = RPC_FLAG_JOB_KEY;
        key = c->job_key;
    }
    nng_msg *m = NULL;
    int enc = frame_msg(&rf, key, &m);
    memset(c->job_key, 0, sizeof c->job_key);
    nng_mtx_lock(srv->mtx);
    struct pipe_rec *pr = c->parked ? pipe_find(srv, c->pipe_id) : NULL;
    if (pr)
        pr->parked--;
    if (c->parked)
        caller_unpark(srv, c->caller);
    if (c->unreserved)
        srv->unreserved_calls--;
    c->parked = c->unreserved = false;
    nng_mtx_unlock(srv->mtx);
    if (enc != 0)
        m = NULL;
    /* Only now: the body may point into the request (an echo). */
    if (c->req) {
        nng_msg_free(c->req);
        c->req = NULL;
    }
    if (!m) {
        nng_mtx_lock(srv->mtx);
        srv->stats.replies_failed++;
        nng_mtx_unlock(srv->mtx);
        call_recv(c);
        return;
    }
    c->state = CALL_SEND;
    nng_aio_set_msg(c->aio, m);
    nng_ctx_send(c->ctx, c->aio);
}

static void count(struct rpc_server *srv, uint64_t *field)
{
    nng_mtx_lock(srv->mtx);
    (*field)++;
    nng_mtx_unlock(srv->mtx);
}

/* Validates a received frame; answers and returns non-zero when invalid. */
static int call_validate(struct rpc_call *c)
{
    struct rpc_server *srv = c->srv;
    const uint8_t *data = nng_msg_body(c->req);
    size_t len = nng_msg_len(c->req);
    char msg[200];

    if (len > srv->max_msg) {
        count(srv, &srv->stats.too_big);
        snprintf(msg, sizeof(msg), "request of %zu bytes exceeds the %zu-byte message cap", len,
                 srv->max_msg);
        call_send_frame(c, KOLO_ETOOBIG, msg, strlen(msg));
        return -1;
    }
    if (rpc_frame_decode(data, len, &c->frame) != 0 || c->frame.kind != RPC_REQUEST) {
        count(srv, &srv->stats.malformed);
        memset(&c->frame, 0, sizeof(c->frame));
        snprintf(msg, sizeof(msg), "malformed request frame (%zu bytes)", len);
        call_send_frame(c, KOLO_EPROTO, msg, strlen(msg));
        return -1;
    }
    if (c->frame.version != KOLO_PROTO_VERSION) {
        count(srv, &srv->stats.bad_version);
        snprintf(msg, sizeof(msg),
                 "protocol version mismatch: the client speaks version %u, this server speaks %u",
                 c->frame.version, KOLO_PROTO_VERSION);
        call_send_frame(c, KOLO_EVERSION, msg, strlen(msg));
        return -1;
    }
    const char *why = NULL;
    bool authentic = false; /* the MAC verified: the refusal may use the caller's key */
    c->job_key[0] = '\0';
    if (srv->token) {
        uint64_t now = now_stepless_ms();
        uint64_t skew = c->frame.ts_ms > now ? c->frame.ts_ms - now : now - c->frame.ts_ms;
        bool job_key = (c->frame.flags & RPC_FLAG_JOB_KEY) && c->frame.job_id != 0;
        if (job_key)
            creds_job(srv->token, c->frame.job_id, c->job_key);
        if (!(c->frame.flags & RPC_FLAG_MAC))
            why = "this server requires the cluster token (configure --token-file)";
        else if (rpc_frame_verify(data, len, job_key ? c->job_key : srv->token) != 0)
            why = job_key ? "wrong job credential" : "wrong cluster token";
        else if ((authentic = true, skew > RPC_AUTH_WINDOW_MS))
            why = "request timestamp outside the accepted window (clock skew?)";
        else {
            nng_mtx_lock(srv->mtx);
            int rv = replay_check_and_add(srv->replay, c->frame.nonce, now);
            nng_mtx_unlock(srv->mtx);
            if (rv)
                why = "replayed request";
        }
    } else if (c->frame.flags & RPC_FLAG_MAC) {
        why = "the client sent a cluster token but this server has none configured";
    }
    if (why) {
        /* The refusal is answered with the key the request proved (the
         * client learns our time from it: a stale request), else with the
         * cluster key (or none). */
        if (!authentic)
            memset(c->job_key, 0, sizeof c->job_key);
        count(srv, &srv->stats.auth_failed);
        LOGW("rpc", "refused %s from '%s': %s", c->frame.method, c->frame.identity, why);
        call_send_frame(c, KOLO_EAUTH, why, strlen(why));
        return -1;
    }
    return 0;
}

static bool is_reserved(const struct rpc_server *srv, const char *method)
{
    return srv->reserved_prefix &&
           strncmp(method, srv->reserved_prefix, strlen(srv->reserved_prefix)) == 0;
}

/* A valid request proves its connection: with a token, the request's MAC
 * did; without one, only a request of the server's own user (or root)
 * does, so another local user's connections stay under the bounds of
 * unproven ones (rpc.h). The calls the handler keeps (long polls) are
 * bounded three times, so no client takes every receive context: one
 * connection may hold RPC_MAX_PARKED_PER_CONN of them, one caller
 * (caller_key) max_parked_caller over all its connections, and calls
 * outside the reserved methods (the agents'), kept or running, all
 * together ncalls - reserved. */
static int call_admit(struct rpc_call *c)
{
    struct rpc_server *srv = c->srv;
    bool reserved = is_reserved(srv, c->frame.method);
    bool owner = c->peer_uid == 0 || c->peer_uid == (int)geteuid();
    nng_mtx_lock(srv->mtx);
    struct pipe_rec *r = pipe_find(srv, c->pipe_id);
    if (r && !r->proven && (srv->token || owner)) {
        r->proven = true;
        srv->nunproven--;
    }
    c->caller = caller_key(r, c->peer_uid, c);
    struct caller_rec *who = caller_find(srv, c->caller, false);
    bool conn_full = r && r->parked >= RPC_MAX_PARKED_PER_CONN;
    bool caller_full = !conn_full && who && who->parked >= srv->max_parked_caller;
    bool all_full = !reserved && srv->reserved &&
                    srv->unreserved_calls >= srv->ncalls - srv->reserved;
    if (conn_full || caller_full || all_full) {
        srv->stats.busy_refused++;
    } else {
        srv->stats.requests++;
        /* counted from here, not from when the handler keeps it: calls
         * admitted together (on other receive contexts) cannot overshoot;
         * an answer releases them (call_send_frame) */
        if (srv->reserved && !reserved) {
            srv->unreserved_calls++;
            c->unreserved = true;
        }
        who = r ? caller_find(srv, c->caller, true) : NULL;
        if (r && who) {
            r->parked++;
            who->parked++;
            c->parked = true;
        }
    }
    nng_mtx_unlock(srv->mtx);
    char msg[240];
    if (conn_full)
        snprintf(msg, sizeof msg, "this connection already has %d calls waiting (the most one "
                 "connection may hold); try again when one returns", RPC_MAX_PARKED_PER_CONN);
    else if (caller_full)
        snprintf(msg, sizeof msg, "you already have %d calls waiting over all your connections "
                 "(the most one caller may hold); try again when one returns",
                 srv->max_parked_caller);
    else if (all_full)
        snprintf(msg, sizeof msg, "the server holds %d waiting calls, all it takes besides the "
                 "%d kept for %s calls; try again when one returns (or raise --rpc-contexts)",
                 srv->ncalls - srv->reserved, srv->reserved, srv->reserved_prefix);
    else
        return 0;
    call_send_frame(c, KOLO_EBUSY, msg, strlen(msg));
    return -1;
}

static void call_cb(void *arg)
{
    struct rpc_call *c = arg;
    struct rpc_server *srv = c->srv;
    int rv = nng_aio_result(c->aio);

    switch (c->state) {
    case CALL_RECV:
        if (rv != 0) {
            if (rv == NNG_ECLOSED || atomic_load(&srv->closing)) {
                c->state = CALL_DONE;
                return;
            }
            call_recv(c);
            return;
        }
        c->req = nng_aio_get_msg(c->aio);
        c->pipe_id = (uint32_t)nng_pipe_id(nng_msg_get_pipe(c->req));
        c->parked = c->unreserved = false;
        pipe_identify(c, nng_msg_get_pipe(c->req));
        if (call_validate(c) != 0)
            return;
        if (call_admit(c) != 0)
            return;
        c->state = CALL_HANDLER;
        /* a call the handler keeps (a long poll) stays counted against
         * its connection and caller until it is answered */
        srv->handler(c, srv->arg);
        return;
    case CALL_SEND:
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(c->aio));
            count(srv, &srv->stats.replies_failed);
        }
        call_recv(c);
        return;
    default:
        return;
    }
}

const struct rpc_frame *rpc_call_frame(const struct rpc_call *call)
{
    return &call->frame;
}

bool rpc_call_job_scoped(const struct rpc_call *call)
{
    return call->job_key[0] != '\0';
}

int rpc_call_peer_uid(const struct rpc_call *call)
{
    return call->peer_uid;
}

void rpc_call_reply(struct rpc_call *call, const void *body, size_t len)
{
    call_send_frame(call, 0, body, len);
}

void rpc_call_error(struct rpc_call *call, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    call_send_frame(call, code ? code : KOLO_EINTERNAL, msg, strlen(msg));
}

/* Rewrites "tcp://host:0" into the URL with the port the kernel chose. */
static void server_resolve_url(struct rpc_server *srv, const char *url)
{
    str_copy(srv->url, url, sizeof(srv->url));
    if (strncmp(url, "tcp://", 6) != 0 && strncmp(url, "tls+tcp://", 10) != 0)
        return;
    int port = 0;
    if (nng_listener_get_int(srv->listener, NNG_OPT_TCP_BOUND_PORT, &port) != 0)
        return;
    srv->port = (uint16_t)port;
    char *colon = strrchr(srv->url, ':');
    if (colon && colon > srv->url + 5)
        snprintf(colon, sizeof(srv->url) - (size_t)(colon - srv->url), ":%d", port);
}

/* The listener's queue of connections not yet accepted. nng listens
 * with 128, and a job's ranks connect at once (at 1,024 ranks, 2,048
 * connections: each rank's and its report sender's): the kernel drops
 * what overflows and the clients' SYNs come back after 1, 3, 7 s, which
 * was most of a 1,024-rank kolo_init (1,630 overflows, 779 SYN
 * retransmissions in one). The kernel caps it at net.core.somaxconn. */
#define RPC_LISTEN_BACKLOG 4096

/* Widens the backlog of nng's listening socket on *port (nng does not
 * hand out its descriptor): listen() on a listening socket changes only
 * its backlog. */
static bool widen_if_listener(int fd, uint32_t ino, void *arg)
{
    int copyfd = fd_copy(fd, ino), listening = 0;
    if (copyfd < 0)
        return false;
    socklen_t len = sizeof listening;
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    bool widened = false;
    if (getsockopt(copyfd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening &&
        getsockname(copyfd, (struct sockaddr *)&sa, &salen) == 0) {
        int port = sa.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&sa)->sin_port)
                   : sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                                              : 0;
        widened = port == *(const int *)arg && listen(copyfd, RPC_LISTEN_BACKLOG) == 0;
    }
    fd_copy_close(copyfd);
    return widened;
}

static void server_widen_backlog(struct rpc_server *srv)
{
    int port = srv->port;
    if (port && each_socket_fd(widen_if_listener, &port) == 0)
        LOGD("rpc", "listener on port %d: its backlog stays nng's", port);
}

/* Listens on cfg->url, over TLS when cfg->tls asks for it (tls.h). */
static int server_listen(struct rpc_server *srv, const struct rpc_server_config *cfg)
{
    char url[256], err[512];
    nng_tls_config *tc = NULL;
    int rv;
    if (tls_url(url, sizeof url, cfg->url, cfg->tls, err, sizeof err) != 0 ||
        (tls_files_on(cfg->tls) &&
         tls_config_new(&tc, TLS_RPC_SERVER, cfg->tls, NULL, err, sizeof err) != 0)) {
        LOGE("rpc", "cannot listen on %s: %s", cfg->url, err);
        return KOLO_EINVAL;
    }
    if ((rv = nng_listener_create(&srv->listener, srv->sock, url)) == 0 &&
        (!tc || (rv = nng_listener_set_ptr(srv->listener, NNG_OPT_TLS_CONFIG, tc)) == 0))
        rv = nng_listener_start(srv->listener, 0);
    if (tc)
        nng_tls_config_free(tc); /* the listener holds its own reference */
    if (rv != 0) {
        LOGE("rpc", "cannot listen on %s: %s", url, nng_strerror(rv));
        return rv == NNG_EADDRINUSE ? KOLO_EBUSY : KOLO_EINVAL;
    }
    server_resolve_url(srv, url);
    server_widen_backlog(srv);
    return 0;
}

int rpc_server_open(struct rpc_server **out, const struct rpc_server_config *cfg)
{
    struct rpc_server *srv = calloc(1, sizeof(*srv));
    int rv;
    if (!srv)
        return KOLO_ENOMEM;
    srv->handler = cfg->handler;
    srv->arg = cfg->arg;
    srv->max_msg = cfg->max_msg && cfg->max_msg < RPC_MAX_REQUEST ? cfg->max_msg : RPC_MAX_REQUEST;
    srv->ncalls = cfg->contexts > 0 ? cfg->contexts : 256;
    srv->handshake_ms = cfg->handshake_ms > 0 ? cfg->handshake_ms : RPC_HANDSHAKE_MS;
    srv->max_unproven = cfg->max_unproven > 0 ? cfg->max_unproven : RPC_MAX_UNPROVEN;
    srv->unproven_budget = cfg->unproven_budget ? cfg->unproven_budget : RPC_UNPROVEN_BUDGET;
    srv->max_parked_caller = srv->ncalls / 4 > 2 * RPC_MAX_PARKED_PER_CONN
                                 ? srv->ncalls / 4
                                 : 2 * RPC_MAX_PARKED_PER_CONN;
    srv->diag_fd = -1;
    srv->tls = tls_files_on(cfg->tls) || strncmp(cfg->url, "tls+", 4) == 0;
    srv->token = cfg->token ? strdup(cfg->token) : NULL;
    if (cfg->reserved_prefix && cfg->reserved > 0 && cfg->reserved < srv->ncalls) {
        srv->reserved_prefix = strdup(cfg->reserved_prefix);
        srv->reserved = srv->reserved_prefix ? cfg->reserved : 0;
    }
    srv->calls = calloc((size_t)srv->ncalls, sizeof(*srv->calls));
    srv->replay = srv->token ? calloc(REPLAY_BUCKETS * REPLAY_WAYS, sizeof(*srv->replay)) : NULL;
    if (!srv->calls || (cfg->token && (!srv->token || !srv->replay)) ||
        nng_mtx_alloc(&srv->mtx) != 0 || nng_mtx_alloc(&srv->diag_mtx) != 0) {
        if (srv->mtx)
            nng_mtx_free(srv->mtx);
        free(srv->calls);
        free(srv->replay);
        free(srv->token);
        free(srv->reserved_prefix);
        free(srv);
        return KOLO_ENOMEM;
    }
    if ((rv = nng_rep0_open(&srv->sock)) != 0) {
        LOGE("rpc", "cannot open socket: %s", nng_strerror(rv));
        nng_mtx_free(srv->mtx);
        nng_mtx_free(srv->diag_mtx);
        free(srv->calls);
        free(srv->replay);
        free(srv->token);
        free(srv->reserved_prefix);
        free(srv);
        return KOLO_EIO;
    }
    /* nng allocates a whole frame as soon as it has read its length, so
     * the cap is what one connection may make us hold before anything is
     * authenticated: a longer length header is refused (the connection
     * closed) before any allocation. The slack is nng's request id. */
    nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, srv->max_msg + 64);
    if (nng_pipe_notify(srv->sock, NNG_PIPE_EV_ADD_PRE, pipe_cb, srv) != 0 ||
        nng_pipe_notify(srv->sock, NNG_PIPE_EV_REM_POST, pipe_cb, srv) != 0 ||
        nng_aio_alloc(&srv->sweep_aio, sweep_cb, srv) != 0) {
        rpc_server_close(srv);
        return KOLO_ENOMEM;
    }
    for (int i = 0; i < srv->ncalls; i++) {
        struct rpc_call *c = &srv->calls[i];
        c->srv = srv;
        if (nng_aio_alloc(&c->aio, call_cb, c) != 0 || nng_ctx_open(&c->ctx, srv->sock) != 0) {
            srv->ncalls = i + (c->aio ? 1 : 0);
            rpc_server_close(srv);
            return KOLO_ENOMEM;
        }
    }
    if ((rv = server_listen(srv, cfg)) != 0) {
        rpc_server_close(srv);
        return rv;
    }
    for (int i = 0; i < srv->ncalls; i++)
        call_recv(&srv->calls[i]);
    nng_sleep_aio(sweep_period(srv), srv->sweep_aio);
    *out = srv;
    return 0;
}

const char *rpc_server_url(const struct rpc_server *srv)
{
    return srv->url;
}

void rpc_server_get_stats(struct rpc_server *srv, struct rpc_server_stats *st)
{
    nng_mtx_lock(srv->mtx);
    *st = srv->stats;
    nng_mtx_unlock(srv->mtx);
}

/* How long rpc_server_close waits for nng to close the server's socket. */
#define RPC_SERVER_CLOSE_MS 5000

static bool close_bounded(nng_socket sock, int wait_ms, const char *what,
                          void (*leftover)(void *), void *arg);

bool rpc_server_close(struct rpc_server *srv)
{
    if (!srv)
        return true;
    atomic_store(&srv->closing, true);
    if (srv->sweep_aio)
        nng_aio_stop(srv->sweep_aio);
    char what[300];
    snprintf(what, sizeof what, "the RPC server on %s", srv->url);
    if (!close_bounded(srv->sock, RPC_SERVER_CLOSE_MS, what, NULL, NULL))
        return false; /* its callbacks may still run: everything stays */
    for (int i = 0; i < srv->ncalls; i++) {
        struct rpc_call *c = &srv->calls[i];
        if (c->aio)
            nng_aio_stop(c->aio);
    }
    for (int i = 0; i < srv->ncalls; i++) {
        struct rpc_call *c = &srv->calls[i];
        if (c->req)
            nng_msg_free(c->req);
        if (c->aio)
            nng_aio_free(c->aio);
    }
    if (srv->sweep_aio)
        nng_aio_free(srv->sweep_aio);
    for (int b = 0; b < PIPE_BUCKETS; b++)
        while (srv->pipes[b]) {
            struct pipe_rec *r = srv->pipes[b];
            srv->pipes[b] = r->next;
            free(r);
        }
    for (int b = 0; b < CALLER_BUCKETS; b++)
        while (srv->callers[b]) {
            struct caller_rec *r = srv->callers[b];
            srv->callers[b] = r->next;
            free(r);
        }
    free(srv->pending);
    if (srv->diag_fd >= 0)
        close(srv->diag_fd);
    nng_mtx_free(srv->diag_mtx);
    nng_mtx_free(srv->mtx);
    free(srv->calls);
    free(srv->replay);
    free(srv->token);
    free(srv->reserved_prefix);
    free(srv);
    return true;
}

/* ---------------------------------------------------------------- client */

struct rpc_client {
    nng_socket sock;
    char url[256];
    char *token;
    bool token_is_job;
    size_t max_msg;
    nng_mtx *mtx;
    char identity[RPC_MAX_IDENTITY + 1];
    uint64_t job_id, generation;
    int32_t rank;
    atomic_int pipes; /* connected pipes; 0 means "cannot connect" on timeout */
    /* the server's clock less ours, learned from its authenticated replies:
     * requests carry our time plus this, so they are fresh by its clock */
    _Atomic int64_t clock_offset_ms;
    nng_cv *idle;     /* signalled when async_calls drops to 0 */
    int async_calls;  /* under mtx */
    struct acall *dead; /* finished async calls, freed outside callbacks */
    struct acall *live; /* async calls in flight */
    nng_aio *sync_aio[64]; /* synchronous calls in flight, for shutdown */
    bool closed;        /* rpc_client_shutdown ran */
    bool retry_busy;    /* KOLO_EBUSY is tried again until the deadline */
    nng_cv *wake;       /* ends busy backoffs at shutdown */
    /* kept for reuse (rpc_client_config.reuse): what an open must match */
    bool reuse;
    char asked_url[256];
    struct tls_files tls;
    bool tls_given;
};

static void reap_dead(struct rpc_client *cli);

struct acall {
    struct acall *next; /* on the client's dead list */
    struct acall *live_next, *live_prev;
    struct rpc_client *cli;
    nng_ctx ctx;
    nng_aio *aio;
    bool receiving;
    nng_aio *sleep_aio; /* backing off after KOLO_EBUSY (retry_busy): an aio of
                         * its own, since one that slept misbehaves when
                         * reused for a send in this nng version */
    int backoff_ms;
    uint8_t *body;    /* retry_busy: the request body, to send again */
    size_t body_len;
    struct rpc_frame f;
    char method[RPC_MAX_METHOD + 1];
    int timeout_ms;
    uint64_t deadline;
    rpc_done_fn done;
    void *arg;
};


static void client_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct rpc_client *cli = arg;
    if (ev == NNG_PIPE_EV_ADD_POST)
        atomic_fetch_add(&cli->pipes, 1);
    else if (ev == NNG_PIPE_EV_REM_POST)
        atomic_fetch_sub(&cli->pipes, 1);
}

/* Dials cfg->url in the background, over TLS when cfg->tls asks for it or
 * the URL is tls+tcp://; cli->url becomes the URL dialed. */
static int client_dial(struct rpc_client *cli, const struct rpc_client_config *cfg)
{
    char url[256], host[256], err[512];
    nng_tls_config *tc = NULL;
    nng_dialer d;
    int rv;
    if (tls_url(url, sizeof url, cfg->url, cfg->tls, err, sizeof err) != 0 ||
        (tls_files_on(cfg->tls) &&
         (tls_url_host(url, host, sizeof host) != 0 ||
          tls_config_new(&tc, TLS_CLIENT, cfg->tls, host, err, sizeof err) != 0))) {
        LOGE("rpc", "cannot dial %s: %s", cfg->url, err);
        return KOLO_EINVAL;
    }
    str_copy(cli->url, url, sizeof(cli->url));
    if ((rv = nng_dialer_create(&d, cli->sock, url)) == 0 &&
        (!tc || (rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, tc)) == 0))
        rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK);
    if (tc)
        nng_tls_config_free(tc); /* the dialer holds its own reference */
    if (rv != 0) {
        LOGE("rpc", "cannot dial %s: %s", url, nng_strerror(rv));
        return KOLO_EINVAL;
    }
    return 0;
}

/* Frees a client rpc_client_open gave up on after its lock and condition
 * variable were made (no call ever ran on it). */
static void client_free_unopened(struct rpc_client *cli)
{
    if (cli->wake)
        nng_cv_free(cli->wake);
    nng_cv_free(cli->idle);
    nng_mtx_free(cli->mtx);
    free(cli->token);
    free(cli);
}

/* ---- clients kept for reuse (rpc_client_config.reuse) */

static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rpc_client *kept[RPC_CLIENTS_KEPT];
static int nkept;

static bool same_config(const struct rpc_client *cli, const struct rpc_client_config *cfg)
{
    const char *token = cfg->token ? cfg->token : "";
    bool tls_given = cfg->tls != NULL;
    return strcmp(cli->asked_url, cfg->url) == 0 && strcmp(cli->token ? cli->token : "", token) == 0 &&
           cli->token_is_job == (cfg->token && cfg->token_is_job) &&
           cli->max_msg == (cfg->max_msg ? cfg->max_msg : RPC_DEFAULT_MAX_MSG) &&
           cli->retry_busy == cfg->retry_busy && cli->tls_given == tls_given &&
           (!tls_given || memcmp(&cli->tls, cfg->tls, sizeof cli->tls) == 0);
}

/* A kept client for cfg, taken out of the keep (NULL: none). */
static struct rpc_client *kept_take(const struct rpc_client_config *cfg)
{
    struct rpc_client *cli = NULL;
    pthread_mutex_lock(&kept_mu);
    for (int i = 0; i < nkept && !cli; i++)
        if (same_config(kept[i], cfg)) {
            cli = kept[i];
            kept[i] = kept[--nkept];
        }
    pthread_mutex_unlock(&kept_mu);
    if (cli) {
        nng_mtx_lock(cli->mtx);
        cli->closed = false;
        nng_mtx_unlock(cli->mtx);
        rpc_client_set_identity(cli, cfg->identity, cfg->job_id, cfg->generation, cfg->rank);
    }
    return cli;
}

/* Keeps a shut-down client with nothing in flight; false: no room. */
static bool kept_put(struct rpc_client *cli)
{
    nng_mtx_lock(cli->mtx);
    bool idle = !cli->live && !cli->dead && cli->async_calls == 0;
    for (int i = 0; i < 64 && idle; i++)
        idle = !cli->sync_aio[i];
    nng_mtx_unlock(cli->mtx);
    if (!cli->reuse || !idle)
        return false;
    pthread_mutex_lock(&kept_mu);
    bool room = nkept < RPC_CLIENTS_KEPT;
    if (room)
        kept[nkept++] = cli;
    pthread_mutex_unlock(&kept_mu);
    return room;
}

int rpc_client_open(struct rpc_client **out, const struct rpc_client_config *cfg)
{
    struct rpc_client *cli = cfg->reuse ? kept_take(cfg) : NULL;
    if (cli) {
        *out = cli;
        return 0;
    }
    cli = calloc(1, sizeof(*cli));
    int rv;
    if (!cli)
        return KOLO_ENOMEM;
    cli->reuse = cfg->reuse;
    str_copy(cli->asked_url, cfg->url, sizeof(cli->asked_url));
    cli->tls_given = cfg->tls != NULL;
    if (cfg->tls)
        cli->tls = *cfg->tls;
    str_copy(cli->url, cfg->url, sizeof(cli->url));
    cli->token = cfg->token ? strdup(cfg->token) : NULL;
    cli->token_is_job = cfg->token && cfg->token_is_job;
    cli->max_msg = cfg->max_msg ? cfg->max_msg : RPC_DEFAULT_MAX_MSG;
    if (nng_mtx_alloc(&cli->mtx) != 0) {
        free(cli->token);
        free(cli);
        return KOLO_ENOMEM;
    }
    if (nng_cv_alloc(&cli->idle, cli->mtx) != 0) {
        nng_mtx_free(cli->mtx);
        free(cli->token);
        free(cli);
        return KOLO_ENOMEM;
    }
    if (nng_cv_alloc(&cli->wake, cli->mtx) != 0) {
        client_free_unopened(cli);
        return KOLO_ENOMEM;
    }
    cli->retry_busy = cfg->retry_busy;
    rpc_client_set_identity(cli, cfg->identity, cfg->job_id, cfg->generation, cfg->rank);
    if ((rv = nng_req0_open(&cli->sock)) != 0) {
        client_free_unopened(cli);
        return KOLO_EIO;
    }
    nng_socket_set_size(cli->sock, NNG_OPT_RECVMAXSZ, cli->max_msg + RPC_HEADER_LEN + 512);
    /* Resend only when the connection carrying a request drops (nng does
     * that by itself); a timer-driven resend would run slow, parked calls
     * twice. Callers bound every call with their own deadline. */
    nng_socket_set_ms(cli->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_ms(cli->sock, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(cli->sock, NNG_OPT_RECONNMAXT, 1000);
    nng_pipe_notify(cli->sock, NNG_PIPE_EV_ADD_POST, client_pipe_cb, cli);
    nng_pipe_notify(cli->sock, NNG_PIPE_EV_REM_POST, client_pipe_cb, cli);
    if ((rv = client_dial(cli, cfg)) != 0) {
        nng_close(cli->sock);
        client_free_unopened(cli);
        return KOLO_EINVAL;
    }
    *out = cli;
    return 0;
}

void rpc_client_shutdown(struct rpc_client *cli)
{
    if (!cli)
        return;
    /* Cancel the async calls and wait for their callbacks before closing
     * the socket: nng_close racing with those callbacks can hang in this
     * nng version. Calls that start later fail at once. */
    nng_mtx_lock(cli->mtx);
    cli->closed = true;
    nng_cv_wake(cli->wake);
    for (struct acall *a = cli->live; a; a = a->live_next) {
        nng_aio_cancel(a->aio);
        if (a->sleep_aio)
            nng_aio_cancel(a->sleep_aio);
    }
    for (int i = 0; i < 64; i++)
        if (cli->sync_aio[i])
            nng_aio_cancel(cli->sync_aio[i]);
    while (cli->async_calls > 0)
        nng_cv_wait(cli->idle);
    nng_mtx_unlock(cli->mtx);
    reap_dead(cli);
    /* The socket itself is closed by rpc_client_close, once no thread
     * uses the client: closing it under a call in flight can hang. */
}

int rpc_close_wait_ms = 3000;
int rpc_close_test_delay_ms = 0;

/* The close of one socket, on a thread of its own (close_bounded): done
 * says nng returned; orphaned that the caller stopped waiting, so the
 * thread frees what the caller left (leftover(arg), when set). */
struct closer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, orphaned;
    nng_socket sock;
    void (*leftover)(void *);
    void *arg;
};

static void client_free(struct rpc_client *cli)
{
    nng_cv_free(cli->wake);
    nng_cv_free(cli->idle);
    nng_mtx_free(cli->mtx);
    free(cli->token);
    free(cli);
}

static void closer_free(struct closer *k)
{
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k);
}

static void *closer_main(void *arg)
{
    struct closer *k = arg;
    thread_name("kolo-rpcclose");
    if (rpc_close_test_delay_ms > 0)
        usleep((useconds_t)rpc_close_test_delay_ms * 1000);
    nng_close(k->sock);
    pthread_mutex_lock(&k->mu);
    k->done = true;
    bool orphaned = k->orphaned;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    if (orphaned) { /* nobody waits any more: ours to free */
        if (k->leftover)
            k->leftover(k->arg);
        closer_free(k);
    }
    return NULL;
}

/* close_bounded closes sock, waiting at most wait_ms for nng (whose close
 * has no deadline: it waits for every pipe and callback of the socket,
 * and once saw 2,048 client sockets and their server in one process never
 * return). true: closed. false: the close goes on on a thread of its own,
 * which calls leftover(arg) (when set) once nng returns; until then the
 * caller must not free anything the socket's callbacks use. */
static bool close_bounded(nng_socket sock, int wait_ms, const char *what,
                          void (*leftover)(void *), void *arg)
{
    struct closer *k = calloc(1, sizeof *k);
    pthread_t t;
    if (k) {
        k->sock = sock;
        k->leftover = leftover;
        k->arg = arg;
        pthread_mutex_init(&k->mu, NULL);
        cond_init_monotonic(&k->cv);
    }
    if (!k || pthread_create(&t, NULL, closer_main, k) != 0) {
        if (k)
            closer_free(k);
        nng_close(sock); /* no thread to spare: unbounded, as nng is */
        return true;
    }
    struct timespec until;
    mono_deadline(&until, (uint64_t)(wait_ms > 0 ? wait_ms : 1));
    pthread_mutex_lock(&k->mu);
    while (!k->done && pthread_cond_timedwait(&k->cv, &k->mu, &until) != ETIMEDOUT) {
    }
    bool done = k->done;
    k->orphaned = !done;
    pthread_mutex_unlock(&k->mu);
    if (!done) {
        pthread_detach(t);
        LOGW("rpc", "closing %s did not end within %d ms; going on without waiting for it", what,
             wait_ms);
        return false;
    }
    pthread_join(t, NULL); /* it only returns now: no thread is left behind */
    closer_free(k);
    return true;
}

static void client_leftover(void *cli)
{
    client_free(cli);
}

void rpc_client_close(struct rpc_client *cli)
{
    if (!cli)
        return;
    /* End whatever is still in flight first, then close the socket (or
     * keep it for the next open: rpc_client_config.reuse). */
    rpc_client_shutdown(cli);
    if (kept_put(cli))
        return;
    char what[300];
    snprintf(what, sizeof what, "the connection to %s", cli->url);
    if (close_bounded(cli->sock, rpc_close_wait_ms, what, client_leftover, cli))
        client_free(cli);
}

void rpc_client_set_identity(struct rpc_client *cli, const char *identity, uint64_t job_id,
                             uint64_t generation, int32_t rank)
{
    nng_mtx_lock(cli->mtx);
    str_copy(cli->identity, identity ? identity : "", sizeof(cli->identity));
    cli->job_id = job_id;
    cli->generation = generation;
    cli->rank = rank;
    nng_mtx_unlock(cli->mtx);
}

/* Encodes a request frame with the client's identity and a fresh nonce. */
static int client_encode(struct rpc_client *cli, const char *method, const void *req,
                         size_t req_len, struct rpc_frame *f, nng_msg **out, char *err,
                         size_t errlen)
{
    int rv;
    if (strlen(method) > RPC_MAX_METHOD)
        return errf(err, errlen, KOLO_EINVAL, "method name too long");
    /* no server takes more (rpc.h): larger payloads go in chunks */
    if (req_len + RPC_HEADER_LEN + RPC_MAX_METHOD + RPC_MAX_IDENTITY > RPC_MAX_REQUEST)
        return errf(err, errlen, KOLO_ETOOBIG,
                    "request of %zu bytes exceeds the %u-byte cap of a request", req_len,
                    RPC_MAX_REQUEST - RPC_HEADER_LEN - RPC_MAX_METHOD - RPC_MAX_IDENTITY);
    memset(f, 0, sizeof(*f));
    f->version = KOLO_PROTO_VERSION;
    f->kind = RPC_REQUEST;
    f->ts_ms = now_stepless_ms() + (uint64_t)atomic_load(&cli->clock_offset_ms);
    random_bytes(f->nonce, sizeof(f->nonce));
    str_copy(f->method, method, sizeof(f->method));
    nng_mtx_lock(cli->mtx);
    memcpy(f->identity, cli->identity, sizeof(f->identity));
    f->job_id = cli->job_id;
    f->generation = cli->generation;
    f->rank = cli->rank;
    nng_mtx_unlock(cli->mtx);
    f->body = req;
    f->body_len = req_len;
    if (cli->token_is_job)
        f->flags = RPC_FLAG_JOB_KEY;
    if ((rv = frame_msg(f, cli->token, out)) != 0)
        return errf(err, errlen, rv, rv == KOLO_ENOMEM ? "out of memory" : "cannot encode request");
    return 0;
}

/* The server's time, from a reply it authenticated: when our clock and
 * its differ by more than a quarter of the freshness window, requests
 * carry its time from now on (freshness does not rest on agreeing wall
 * clocks: issue 15, F9). True when the offset moved. */
static bool client_learn_clock(struct rpc_client *cli, uint64_t server_ms)
{
    int64_t off = (int64_t)(server_ms - now_stepless_ms());
    int64_t cur = atomic_load(&cli->clock_offset_ms);
    if (llabs(off - cur) <= RPC_AUTH_WINDOW_MS / 4)
        return false;
    atomic_store(&cli->clock_offset_ms, off);
    LOGW("rpc", "the clock of %s differs from ours by %+lld ms: requests use its time", cli->url,
         (long long)off);
    return true;
}

/* Checks a reply against its request; on success *rf describes it.
 * *clock_moved (may be NULL): the reply taught us the server's time. */
static int client_check_reply(struct rpc_client *cli, nng_msg *m, const struct rpc_frame *req,
                              struct rpc_frame *rf, bool *clock_moved, char *err, size_t errlen)
{
    const uint8_t *body = nng_msg_body(m);
    size_t blen = nng_msg_len(m);
    if (clock_moved)
        *clock_moved = false;
    if (rpc_frame_decode(body, blen, rf) != 0 || rf->kind != RPC_REPLY)
        return errf(err, errlen, KOLO_EPROTO, "malformed reply from %s", cli->url);
    if (memcmp(rf->nonce, req->nonce, RPC_NONCE_LEN) != 0)
        return errf(err, errlen, KOLO_EPROTO, "reply does not match the request");
    if (rf->status == KOLO_EVERSION || rf->version != KOLO_PROTO_VERSION)
        return errf(err, errlen, KOLO_EVERSION,
                       "protocol version mismatch: this client speaks version %u, %s speaks %u",
                       KOLO_PROTO_VERSION, cli->url, rf->version);
    /* only the key's holder can have written a verified reply, and it
     * echoes our nonce: its time is the server's, now */
    bool verified = cli->token && rpc_frame_verify(body, blen, cli->token) == 0;
    if (verified) {
        bool moved = client_learn_clock(cli, rf->ts_ms);
        if (clock_moved)
            *clock_moved = moved;
    }
    if (cli->token && rf->status != KOLO_EAUTH && !verified)
        return errf(err, errlen, KOLO_EAUTH,
                       "reply from %s is not authenticated with the cluster token", cli->url);
    if (rf->status != 0)
        return errf(err, errlen, rf->status, "%.*s",
                       (int)(rf->body_len > 900 ? 900 : rf->body_len), (const char *)rf->body);
    return 0;
}

/* A transport failure as a kolo code. sent: the request was handed to a
 * connection (the send completed), so the server may have it. One that
 * was not - no connection took it by the deadline: none was up, or the
 * one up stayed busy with earlier requests - is KOLO_ECONNREFUSED, and
 * only it (rpc.h): its caller may send the request again. */
static int transport_err(struct rpc_client *cli, int rv, bool sent, const char *method,
                         int timeout_ms, char *err, size_t errlen)
{
    if (rv == NNG_ETIMEDOUT && !sent) {
        if (atomic_load(&cli->pipes) == 0)
            return errf(err, errlen, KOLO_ECONNREFUSED,
                           "cannot connect to %s within %d ms (is the coordinator running%s?)",
                           cli->url, timeout_ms,
                           strncmp(cli->url, "tls+", 4) == 0
                               ? ", and did one CA sign its certificate and ours"
                               : "");
        return errf(err, errlen, KOLO_ECONNREFUSED,
                       "%s: not sent to %s within %d ms (the connection stayed busy)", method,
                       cli->url, timeout_ms);
    }
    if (rv == NNG_ETIMEDOUT)
        return errf(err, errlen, KOLO_ETIMEDOUT, "%s: no reply from %s within %d ms", method,
                       cli->url, timeout_ms);
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
        return errf(err, errlen, KOLO_ECLOSED, "client closed");
    return errf(err, errlen, KOLO_EIO, "%s: %s", method, nng_strerror(rv));
}

static int client_call_once(struct rpc_client *cli, const char *method, const void *req,
                            size_t req_len, void **rep, size_t *rep_len, int timeout_ms,
                            bool *clock_moved, char *err, size_t errlen)
{
    struct rpc_frame f, rf;
    nng_ctx ctx;
    nng_aio *aio = NULL;
    nng_msg *m = NULL;
    int rv, code;

    if (rep)
        *rep = NULL;
    if (rep_len)
        *rep_len = 0;
    if (err && errlen)
        err[0] = '\0';
    if ((code = client_encode(cli, method, req, req_len, &f, &m, err, errlen)) != 0)
        return code;
    uint64_t deadline = now_mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    if (nng_ctx_open(&ctx, cli->sock) != 0) {
        nng_msg_free(m);
        return errf(err, errlen, KOLO_ECLOSED, "client closed");
    }
    if (nng_aio_alloc(&aio, NULL, NULL) != 0) {
        nng_msg_free(m);
        nng_ctx_close(ctx);
        return errf(err, errlen, KOLO_ENOMEM, "out of memory");
    }
    int slot = -1;
    nng_mtx_lock(cli->mtx);
    if (cli->closed) {
        nng_mtx_unlock(cli->mtx);
        nng_msg_free(m);
        nng_aio_free(aio);
        nng_ctx_close(ctx);
        return errf(err, errlen, KOLO_ECLOSED, "client closed");
    }
    for (int i = 0; i < 64 && slot < 0; i++)
        if (!cli->sync_aio[i])
            cli->sync_aio[slot = i] = aio;
    nng_mtx_unlock(cli->mtx);
    nng_aio_set_timeout(aio, timeout_ms > 0 ? timeout_ms : 1);
    nng_aio_set_msg(aio, m);
    nng_ctx_send(ctx, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) != 0) {
        nng_msg_free(m);
        m = NULL;
        code = transport_err(cli, rv, false, method, timeout_ms, err, errlen);
        goto out;
    }
    m = NULL;
    uint64_t now = now_mono_ms();
    nng_aio_set_timeout(aio, now < deadline ? (nng_duration)(deadline - now) : 1);
    nng_ctx_recv(ctx, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) != 0) {
        code = transport_err(cli, rv, true, method, timeout_ms, err, errlen);
        goto out;
    }
    m = nng_aio_get_msg(aio);
    if ((code = client_check_reply(cli, m, &f, &rf, clock_moved, err, errlen)) != 0)
        goto out;
    if (rf.body_len && rep) {
        *rep = malloc(rf.body_len);
        if (!*rep) {
            code = errf(err, errlen, KOLO_ENOMEM, "out of memory");
            goto out;
        }
        memcpy(*rep, rf.body, rf.body_len);
    }
    if (rep_len)
        *rep_len = rf.body_len;
    code = 0;
out:
    if (m)
        nng_msg_free(m);
    nng_mtx_lock(cli->mtx);
    if (slot >= 0)
        cli->sync_aio[slot] = NULL;
    nng_mtx_unlock(cli->mtx);
    nng_aio_free(aio);
    nng_ctx_close(ctx);
    return code;
}

/* The next wait after KOLO_EBUSY: doubling from 10 ms to 500 ms, less a
 * random part, so callers refused together do not come back together. */
static int busy_backoff(int *backoff_ms)
{
    int b = *backoff_ms > 0 ? *backoff_ms : 10;
    *backoff_ms = b * 2 < 500 ? b * 2 : 500;
    uint8_t r;
    random_bytes(&r, 1);
    return b / 2 + (int)((unsigned)r * (unsigned)b / 512u);
}

int rpc_client_call(struct rpc_client *cli, const char *method, const void *req, size_t req_len,
                    void **rep, size_t *rep_len, int timeout_ms, char *err, size_t errlen)
{
    bool moved = false;
    uint64_t t0 = now_mono_ms();
    int backoff = 0, code, left = timeout_ms;
    for (;;) {
        code = client_call_once(cli, method, req, req_len, rep, rep_len, left, &moved, err,
                                errlen);
        /* refused as stale by a server whose clock is not ours: once more, on
         * its time, within what is left of the caller's time */
        if (code == KOLO_EAUTH && moved) {
            uint64_t spent = now_mono_ms() - t0;
            left = timeout_ms > (int)spent ? timeout_ms - (int)spent : 1;
            code = client_call_once(cli, method, req, req_len, rep, rep_len, left, &moved, err,
                                    errlen);
        }
        if (code != KOLO_EBUSY || !cli->retry_busy)
            return code;
        /* busy: the server holds all the calls it takes (from us); again,
         * after a backoff, while the deadline allows */
        int wait = busy_backoff(&backoff);
        uint64_t spent = now_mono_ms() - t0;
        if ((int64_t)spent + wait >= timeout_ms)
            return code;
        nng_mtx_lock(cli->mtx);
        nng_time until = nng_clock() + (nng_duration)wait;
        while (!cli->closed && nng_cv_until(cli->wake, until) != NNG_ETIMEDOUT)
            ;
        bool closed = cli->closed;
        nng_mtx_unlock(cli->mtx);
        if (closed)
            return errf(err, errlen, KOLO_ECLOSED, "client closed");
        spent = now_mono_ms() - t0;
        left = timeout_ms > (int)spent ? timeout_ms - (int)spent : 1;
    }
}

/* ---------------------------------------------------------------- async calls */


/* Freeing an aio or closing a context from inside its own callback can
 * deadlock against a concurrent nng_close in this nng version, so a
 * finished call goes on a list and is freed by the next call or by
 * rpc_client_close, on an ordinary thread. */
static void reap_dead(struct rpc_client *cli)
{
    nng_mtx_lock(cli->mtx);
    struct acall *a = cli->dead;
    cli->dead = NULL;
    nng_mtx_unlock(cli->mtx);
    while (a) {
        struct acall *next = a->next;
        nng_aio_free(a->aio); /* waits for the callback to return */
        if (a->sleep_aio)
            nng_aio_free(a->sleep_aio);
        nng_ctx_close(a->ctx);
        free(a->body);
        free(a);
        a = next;
    }
}

static void acall_finish(struct acall *a, int code, const void *rep, size_t len, const char *err)
{
    struct rpc_client *cli = a->cli;
    a->done(a->arg, code, rep, len, err);
    nng_mtx_lock(cli->mtx);
    if (a->live_prev)
        a->live_prev->live_next = a->live_next;
    else
        cli->live = a->live_next;
    if (a->live_next)
        a->live_next->live_prev = a->live_prev;
    a->next = cli->dead;
    cli->dead = a;
    if (--cli->async_calls == 0)
        nng_cv_wake(cli->idle);
    nng_mtx_unlock(cli->mtx);
}

/* After a backoff (retry_busy): the request again, with a fresh nonce. */
static void acall_resend(struct acall *a)
{
    struct rpc_client *cli = a->cli;
    char err[256];
    nng_msg *m = NULL;
    int code = client_encode(cli, a->method, a->body, a->body_len, &a->f, &m, err, sizeof err);
    a->f.body = NULL;
    if (code) {
        acall_finish(a, code, NULL, 0, err);
        return;
    }
    nng_mtx_lock(cli->mtx);
    bool closed = cli->closed;
    if (!closed) {
        uint64_t now = now_mono_ms();
        nng_aio_set_timeout(a->aio, now < a->deadline ? (nng_duration)(a->deadline - now) : 1);
        nng_aio_set_msg(a->aio, m);
        nng_ctx_send(a->ctx, a->aio);
    }
    nng_mtx_unlock(cli->mtx);
    if (closed) {
        nng_msg_free(m);
        acall_finish(a, KOLO_ECLOSED, NULL, 0, "the client was closed");
    }
}

/* The end of a busy backoff: the request again, unless shut down. */
static void acall_sleep_cb(void *arg)
{
    struct acall *a = arg;
    if (nng_aio_result(a->sleep_aio) != 0)
        acall_finish(a, KOLO_ECLOSED, NULL, 0, "the client was closed");
    else
        acall_resend(a);
}

static void acall_cb(void *arg)
{
    struct acall *a = arg;
    char err[1024];
    int rv = nng_aio_result(a->aio);
    if (!a->receiving) {
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(a->aio));
            int code =
                transport_err(a->cli, rv, false, a->method, a->timeout_ms, err, sizeof(err));
            acall_finish(a, code, NULL, 0, err);
            return;
        }
        /* The receive starts under the client's lock, after a look at
         * closed: a shutdown that cancelled the send just after it
         * completed would otherwise miss this new receive, and
         * rpc_client_close would wait out its whole timeout (a reset
         * worker sat ~45 s in kolo_fini). */
        nng_mtx_lock(a->cli->mtx);
        bool closed = a->cli->closed;
        if (!closed) {
            a->receiving = true;
            uint64_t now = now_mono_ms();
            nng_aio_set_timeout(a->aio, now < a->deadline ? (nng_duration)(a->deadline - now) : 1);
            nng_ctx_recv(a->ctx, a->aio);
        }
        nng_mtx_unlock(a->cli->mtx);
        if (closed)
            acall_finish(a, KOLO_ECLOSED, NULL, 0, "the client was closed");
        return;
    }
    if (rv != 0) {
        int code = transport_err(a->cli, rv, true, a->method, a->timeout_ms, err, sizeof(err));
        acall_finish(a, code, NULL, 0, err);
        return;
    }
    nng_msg *m = nng_aio_get_msg(a->aio);
    struct rpc_frame rf;
    int code = client_check_reply(a->cli, m, &a->f, &rf, NULL, err, sizeof(err));
    if (code == KOLO_EBUSY && a->cli->retry_busy) {
        /* busy: again after a backoff, while the deadline allows */
        int wait = busy_backoff(&a->backoff_ms);
        nng_msg_free(m);
        nng_mtx_lock(a->cli->mtx);
        bool go = !a->cli->closed && now_mono_ms() + (uint64_t)wait < a->deadline &&
                  (a->sleep_aio || nng_aio_alloc(&a->sleep_aio, acall_sleep_cb, a) == 0);
        if (go) {
            a->receiving = false;
            nng_sleep_aio(wait, a->sleep_aio);
        }
        nng_mtx_unlock(a->cli->mtx);
        if (!go)
            acall_finish(a, code, NULL, 0, err);
        return;
    }
    if (code == 0)
        acall_finish(a, 0, rf.body, rf.body_len, "");
    else
        acall_finish(a, code, NULL, 0, err);
    nng_msg_free(m); /* still ours: the reply message, not the call */
}

int rpc_client_call_async(struct rpc_client *cli, const char *method, const void *req,
                          size_t req_len, int timeout_ms, rpc_done_fn done, void *arg)
{
    char err[256];
    nng_msg *m = NULL;
    reap_dead(cli);
    struct acall *a = calloc(1, sizeof(*a));
    if (!a)
        return KOLO_ENOMEM;
    int code = client_encode(cli, method, req, req_len, &a->f, &m, err, sizeof(err));
    if (code) {
        free(a);
        return code;
    }
    a->f.body = NULL; /* the request body is the caller's: keep a copy only to retry */
    if (cli->retry_busy && req_len) {
        if (!(a->body = malloc(req_len))) {
            nng_msg_free(m);
            free(a);
            return KOLO_ENOMEM;
        }
        memcpy(a->body, req, req_len);
        a->body_len = req_len;
    }
    a->cli = cli;
    a->done = done;
    a->arg = arg;
    a->timeout_ms = timeout_ms;
    a->deadline = now_mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    str_copy(a->method, method, sizeof(a->method));
    if (nng_ctx_open(&a->ctx, cli->sock) != 0) {
        nng_msg_free(m);
        free(a->body);
        free(a);
        return KOLO_ECLOSED;
    }
    if (nng_aio_alloc(&a->aio, acall_cb, a) != 0) {
        nng_msg_free(m);
        nng_ctx_close(a->ctx);
        free(a->body);
        free(a);
        return KOLO_ENOMEM;
    }
    nng_mtx_lock(cli->mtx);
    if (cli->closed) {
        nng_mtx_unlock(cli->mtx);
        nng_msg_free(m);
        nng_aio_free(a->aio);
        nng_ctx_close(a->ctx);
        free(a->body);
        free(a);
        return KOLO_ECLOSED;
    }
    cli->async_calls++;
    a->live_next = cli->live;
    if (cli->live)
        cli->live->live_prev = a;
    cli->live = a;
    nng_aio_set_timeout(a->aio, timeout_ms > 0 ? timeout_ms : 1);
    nng_aio_set_msg(a->aio, m);
    nng_ctx_send(a->ctx, a->aio);
    nng_mtx_unlock(cli->mtx);
    return 0;
}
