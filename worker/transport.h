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
     * transport tells its peer to signal the eventfd, then the caller must
     * retry try_* once before sleeping (no lost wake-ups). */
    int (*arm)(struct xport *x, bool want_send, bool want_recv, short *events);
    /* Disarm after waking (optional, may be NULL). */
    void (*disarm)(struct xport *x);
    void (*close)(struct xport *x);
};

struct xport {
    const struct xport_ops *ops;
    int peer;        /* peer rank */
    int failed;      /* sticky KOLO_E* once the connection broke */
    char why[128];   /* what broke it */
};

/* Blocking helpers built on the table; deadline is CLOCK_MONOTONIC ms
 * (now_mono_ms() + timeout), 0 = no deadline. */
int xport_send(struct xport *x, const void *buf, size_t len, uint64_t deadline);
int xport_recv(struct xport *x, void *buf, size_t len, uint64_t deadline);
/* xport_sendrecv sends slen bytes on xs while receiving rlen bytes on xr
 * (xs and xr may be the same connection, or NULL with a 0 length). */
int xport_sendrecv(struct xport *xs, const void *sbuf, size_t slen, struct xport *xr, void *rbuf,
                   size_t rlen, uint64_t deadline);
void xport_close(struct xport *x);

/* ---- tcp ---- */

/* A listener on addr ("0.0.0.0", "127.0.0.1", ...) port 0; *port is the
 * port the kernel chose. */
int tcp_listen(const char *addr, int *fd, int *port);
/* tcp_connect dials addr:port and sends a hello naming (job, generation,
 * from_rank); tcp_accept reads the hello from a new connection, refusing
 * other jobs and generations. Both return a connected xport. */
int tcp_connect(const char *addr, int port, uint64_t job, uint64_t generation, int from_rank,
                int to_rank, uint64_t deadline, struct xport **out);
int tcp_accept(int listen_fd, uint64_t job, uint64_t generation, int my_rank, uint64_t deadline,
               struct xport **out);

/* ---- shm ---- */

/* A shared segment holds the rings for every ordered pair of local ranks.
 * The leader creates it (name: "/kolo-<job>-<gen>-<random>"), every local
 * rank attaches, and once all attached the name is unlinked so nothing is
 * left behind if processes die. */
struct shm_segment;
int shm_segment_create(const char *name, int nlocal, size_t ring_bytes, struct shm_segment **out);
int shm_segment_attach(const char *name, int nlocal, size_t ring_bytes, struct shm_segment **out);
void shm_segment_unlink(const char *name);
void shm_segment_release(struct shm_segment *seg); /* after every xport on it closed */
/* shm_connect returns the connection from local index me to local index
 * peer (rank numbers are only for messages). peer_pid lets the waiter
 * notice a dead peer (pidfd). */
int shm_connect(struct shm_segment *seg, int me, int peer, int peer_rank, pid_t peer_pid,
                struct xport **out);

#endif
