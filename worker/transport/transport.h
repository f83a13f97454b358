/*
 * transport.h - point-to-point byte streams between two ranks.
 *
 * A transport is a table of functions (struct xport_ops); a connection is
 * a struct xport. Two transports exist: tcp (transport_tcp.c: one
 * connected socket per peer pair, TCP_NODELAY, large buffers) and shm
 * (transport_shm.c: a pair of single-producer single-consumer ring
 * buffers in a shared mapping, one per direction). Algorithms (ring.c)
 * only see this interface, so a new transport is a new file.
 *
 * Everything is non-blocking underneath and every connection exposes a
 * pollable fd (the socket; for shm a per-rank doorbell, e.g. an
 * abstract-namespace unix datagram socket that peers poke when they add
 * data or free space while we wait), so one poll() can wait on a mix of
 * transports. xport_sendrecv moves data both ways at once, which a
 * ring step needs to avoid the classic deadlock of two blocking sends.
 *
 * Failure: a peer that closes, crashes or stops answering makes the call
 * return KOLO_EPEER (or KOLO_ETIMEDOUT at the deadline), never hang. A
 * connection that failed stays failed.
 */
#ifndef KOLO_WORKER_TRANSPORT_H
#define KOLO_WORKER_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct xport;

struct xport_ops {
    const char *name;
    /* Move up to len bytes without blocking: returns the number moved
     * (0 if it would block), or -KOLO_E* on failure. */
    ssize_t (*try_send)(struct xport *x, const void *buf, size_t len);
    ssize_t (*try_recv)(struct xport *x, void *buf, size_t len);
    /* Arm the fd for waiting: want_send / want_recv say what the caller
     * waits for; returns the fd and the poll events to wait for. The shm
     * transport tells its peer to poke its doorbell, then the caller must
     * retry try_* once before sleeping (no lost wake-ups). For shm the fd
     * is an epoll fd that also turns readable when the peer process dies,
     * so a plain poll() on it notices a dead local peer. */
    int (*arm)(struct xport *x, bool want_send, bool want_recv, short *events);
    /* Disarm after waking (optional, may be NULL). Must be called before
     * the next try_* that follows a poll on the armed fd: it consumes the
     * wake-up and notices a dead peer. */
    void (*disarm)(struct xport *x);
    void (*close)(struct xport *x);
    /* Optional, from any thread: make waits on this connection end with
     * an error now (see coll_ops.interrupt). */
    void (*interrupt)(struct xport *x);
    /* true when try_* costs no system call while nothing moves (shm), so
     * a waiter spins for KOLO_SPIN_US before it arms and sleeps. */
    bool spin;
    /* Optional: true while a send is part-way through a unit the
     * transport cannot split (an encrypted record, seal.h) although
     * try_send has not counted its bytes yet. A caller that gives up then
     * leaves the stream out of step, as if bytes had moved. */
    bool (*mid_send)(const struct xport *x);
    /* Optional: true when bytes the transport already took off the wire
     * wait in it (an encrypted record read ahead): try_recv returns them
     * at once, and a poll() on the fd would not say they are there. */
    bool (*buffered)(const struct xport *x);
};

struct xport {
    const struct xport_ops *ops;
    /* spin on this connection before sleeping, as ops->spin does for a
     * transport: set on TCP connections when every local rank has a CPU
     * (a socket wake-up costs tens of µs; a peer on another CPU or host
     * usually answers sooner) */
    bool spin;
    int peer;      /* peer rank */
    int failed;    /* sticky KOLO_E* once the connection broke */
    char why[200]; /* what broke it */
};

/* Blocking helpers built on the table; deadline is CLOCK_MONOTONIC ms
 * (now_mono_ms() + timeout), 0 = no deadline. At the deadline they return
 * KOLO_ETIMEDOUT; a connection on which part of the buffer had moved is
 * then marked failed (its byte stream is out of step), one on which
 * nothing moved stays usable. When nothing moves they spin for
 * xport_spin_us() if a connection is a spinning one (shm, or x->spin),
 * then poll(). */
static inline bool xport_spins(const struct xport *x)
{
    return x->ops->spin || x->spin;
}
int xport_send(struct xport *x, const void *buf, size_t len, uint64_t deadline);
int xport_recv(struct xport *x, void *buf, size_t len, uint64_t deadline);
/* xport_sendrecv sends slen bytes on xs while receiving rlen bytes on xr
 * (xs and xr may be the same connection, or NULL with a 0 length). */
int xport_sendrecv(struct xport *xs, const void *sbuf, size_t slen, struct xport *xr, void *rbuf,
                   size_t rlen, uint64_t deadline);
void xport_close(struct xport *x);
/* true when giving up on x now would leave its stream out of step even
 * though no byte was counted (ops->mid_send) */
static inline bool xport_mid_send(const struct xport *x)
{
    return x->ops->mid_send && x->ops->mid_send(x);
}
/* true when x holds received bytes a poll() on its fd cannot see
 * (ops->buffered): whoever waits for "the peer sent something" by polling
 * the fd must ask this first */
static inline bool xport_buffered(const struct xport *x)
{
    return x->ops->buffered && x->ops->buffered(x);
}

/* xport_spin_us: how long a blocked wait spins before it sleeps, in
 * microseconds. Knob KOLO_SPIN_US (default 20, 0 = never spin, at most
 * 10000), read once; keep it short where ranks outnumber cores, since a
 * spinning rank takes the core its peer needs. xport_set_spin_us
 * overrides it (a negative value goes back to the environment). */
int xport_spin_us(void);
void xport_set_spin_us(int us);

/* xport_fail is for transports: it makes the connection's failure sticky
 * (the first code and message win) and returns -code for try_*. */
ssize_t xport_fail(struct xport *x, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- tcp ---- */

/* Who a rank is in its generation, and the generation's key: what every
 * connection's handshake proves (transport_tcp.c). */
struct tcp_ident {
    uint64_t job, generation;
    int rank;
    unsigned char key[32];
    /* seal every byte after the handshake (seal.h): both ends must agree,
     * or the acceptor refuses the connection (KOLO_EINVAL) */
    bool encrypt;
};

/* A listener on addr ("0.0.0.0", "127.0.0.1", ...) port 0; *port is the
 * port the kernel chose. The fd is non-blocking; close() it when done. */
int tcp_listen(const char *addr, int *fd, int *port);

/* Blocking set-up, one connection at a time. tcp_connect dials addr:port
 * and sends the hello naming (me, to_rank); tcp_accept waits for a
 * connection, reads its hello and answers it, refusing other jobs, ranks
 * and generations. Both return a connected xport whose last handshake
 * step (the acceptor's answer checked and the proof sent; the proof
 * checked) runs in its first try_send/try_recv. So
 * tcp_connect does not wait for the acceptor, and ranks may connect and
 * accept in any order.
 *
 * Codes: a refusal fails the connection with the acceptor's code
 * (KOLO_ESTALE for another generation, KOLO_EPROTO for another job,
 * another rank or a malformed hello, KOLO_EVERSION for another protocol
 * version, KOLO_EINVAL for another encryption setting); a peer without
 * the generation's key fails it with KOLO_EAUTH, and so does a sealed
 * record that fails its tag. tcp_accept returns the code of a connection it refused
 * (and closed): the caller decides whether to keep accepting. Both wait
 * until the deadline at most (KOLO_ETIMEDOUT). */
int tcp_connect(const char *addr, int port, const struct tcp_ident *me, int to_rank,
                uint64_t deadline, struct xport **out);
int tcp_accept(int listen_fd, const struct tcp_ident *me, uint64_t deadline, struct xport **out);

/* Non-blocking set-up, for many handshakes in one poll loop (mesh.c):
 * tcp_dial_start starts a connect, tcp_accept_start takes a waiting
 * connection off the listener (0 and *out NULL when none waits;
 * KOLO_EBUSY when out of descriptors). tcp_handshake then moves the
 * handshake as far as it goes without blocking: 0 with *done once it
 * finished, 0 without while it waits (xport arm() gives the fd and the
 * events), or the code it failed with. An accepted connection's peer is
 * -1 until its hello named one. */
int tcp_dial_start(const char *addr, int port, const struct tcp_ident *me, int to_rank,
                   struct xport **out);
int tcp_accept_start(int listen_fd, const struct tcp_ident *me, struct xport **out);
int tcp_handshake(struct xport *x, bool *done);
/* "ADDR:PORT" of the other end, for logs. */
void tcp_peer_addr(const struct xport *x, char *buf, size_t len);

/* ---- shm ---- */

/* A shared segment holds the rings for every ordered pair of local ranks.
 * The leader creates it (name: "/kolo-<job>-<gen>-<random>"), every local
 * rank attaches, and once all attached the name is unlinked so nothing is
 * left behind if processes die. */
struct shm_segment;
/* The ring size used when ring_bytes is 0. Other sizes are rounded up to
 * a power of two (at least 4 KiB). The segment takes about
 * nlocal * nlocal * (ring_bytes + 4 KiB) of address space; tmpfs only
 * backs the pages a ring actually used. Creator and attachers must pass
 * the same nlocal and ring_bytes (checked: KOLO_EPROTO otherwise). */
#define SHM_RING_BYTES_DEFAULT ((size_t)1 << 20)
/* shm_segment_name: a new segment's name (common/shm_names.h). */
int shm_segment_name(uint64_t job, uint64_t generation, char *out, size_t outlen);
/* shm_segment_trusted: 0 when the open segment fd belongs to this user
 * and nobody else may open it (mode 0600), else KOLO_EPERM: a segment
 * whoever else made is never attached. */
int shm_segment_trusted(int fd, const char *name);
/* create fails with KOLO_EEXIST if the name exists; attach with
 * KOLO_ENOTFOUND if it does not. */
int shm_segment_create(const char *name, int nlocal, size_t ring_bytes, struct shm_segment **out);
int shm_segment_attach(const char *name, int nlocal, size_t ring_bytes, struct shm_segment **out);
void shm_segment_unlink(const char *name);
void shm_segment_release(struct shm_segment *seg); /* after every xport on it closed */
/* shm_connect returns the connection from local index me to local index
 * peer (rank numbers are only for messages). peer_pid lets the waiter
 * notice a dead peer (pidfd; 0 = do not watch). It never waits for the
 * peer, so every rank can connect in any order. One connection per
 * ordered pair and segment: closing it tells the peer (KOLO_EPEER once
 * the data sent before the close is read), and the pair cannot be
 * connected again on that segment.
 *
 * Waiting: each local index has a doorbell, an abstract unix datagram
 * socket named from a random id stored in the segment, bound by the first
 * shm_connect for that index. Peers poke it only while we sleep. One
 * thread at a time waits for a given local index (the one that runs its
 * collectives). Ranks must share the pid namespace (for the watch) and
 * the network namespace (for the doorbells). A peer_pid equal to our own
 * (ranks as threads) is not watched. */
int shm_connect(struct shm_segment *seg, int me, int peer, int peer_rank, pid_t peer_pid,
                struct xport **out);

#endif
