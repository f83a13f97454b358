/*
 * transport_shm.c - byte rings in shared memory between ranks of a host.
 *
 * DESIGN. One segment (shm_open + mmap) per generation and host holds a
 * ring for every ordered pair (i, j) of local ranks: i writes, j reads.
 * A ring is single-producer single-consumer, so it needs no lock: the
 * producer owns `head` (bytes ever written), the consumer owns `tail`
 * (bytes ever read), each on its own cache line so that the two cores do
 * not fight over one line. The capacity is a power of two, so a position
 * is a counter masked, and head - tail is the fill level even after the
 * counters pass the capacity. The producer copies its bytes in and then
 * publishes head with a store that releases them; the consumer reads head
 * with a load that acquires them before it copies out (and symmetrically
 * for tail and the space it frees); both are seq-cst for the sake of
 * waiting, below. Copies go in chunks of 64 KiB, each published at
 * once, so the reader starts on the first chunk while the writer copies
 * the next: a 1 MiB ring then behaves as a pipeline, not as a mailbox.
 *
 *   segment:  [header page][ring 0->0][ring 0->1]...[ring n-1->n-1]
 *   ring:     [head | tail | data_waiting | space_waiting | closed flags]
 *             (one 128-byte line each, in a 4 KiB page) [data, capacity]
 *
 * Waiting. A rank that cannot move spins briefly (transport.c), then
 * sleeps in poll() on a doorbell: an abstract-namespace unix datagram
 * socket per local rank, named from a random id kept in the segment
 * header and the local index. Sleeping is two-phase so that no wake-up is
 * lost: the waiter stores the ring's waiting flag and then looks at the
 * other side's counter once more (the caller's retry after arm); the
 * other side stores its counter and then reads the flag. All four are
 * sequentially consistent, so they fall in one total order in which at
 * least one of the two loads comes after the other side's store: either
 * the waiter finds the data, or the publisher finds the flag, takes it
 * (exchange to 0, so one poke per sleep) and sends a byte to the waiter's
 * doorbell. (Seq-cst operations rather than relaxed ones plus fences:
 * the same cost on x86 and ARM, and ThreadSanitizer understands them.)
 * Without a waiter there is no system call at all on the data path.
 *
 * Dead peers. Memory does not tell us that the process at the other end
 * died, so every connection watches its peer's pid with a pidfd (readable
 * once the process exits, zombies included). The doorbell and the pidfd
 * sit in one epoll set per connection and arm() returns that epoll fd:
 * a single pollable fd per connection, as the interface promises, that
 * wakes for data, space and death alike. Where pidfd_open is missing
 * (kernels before 5.3, some seccomp profiles), a 50 ms timerfd in the
 * same set makes the waiter check kill(pid, 0) and /proc instead. Either
 * way the ranks of a host must share a pid namespace (and a network
 * namespace, for the doorbells). Data a dead or closed peer wrote before
 * it went is still delivered; then KOLO_EPEER.
 */
#include "transport.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include "errors.h"
#include "kolo.h"
#include "log.h"
#include "shm_names.h"
#include "util.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every architecture */
#endif

#define SEG_MAGIC      0x314d48534f4c4f4bull /* "KOLOSHM1" */
#define SEG_VERSION    1
#define SEG_PAGE       4096
#define SEG_MAX_LOCAL  256
#define RING_MIN_BYTES ((size_t)SEG_PAGE)
#define RING_MAX_BYTES ((size_t)1 << 28)
/* Two lines, not one: some CPUs prefetch cache lines in pairs. */
#define LINE       128
#define COPY_CHUNK ((size_t)64 << 10)
#define WATCH_MS   50

/* Lock-free atomics are address-free, which is what lets two processes
 * share them through a mapping; anything else would take a lock that
 * lives in one process only. */
static_assert(ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
              "shared-memory rings need lock-free atomics");

struct seg_header {
    _Atomic uint64_t magic; /* stored last, with release: the rest is ready */
    uint32_t version;
    uint32_t nlocal;
    uint64_t ring_bytes;
    uint64_t total_bytes;
    uint64_t nonce; /* names the doorbells */
};

struct ring {
    alignas(LINE) _Atomic uint64_t head;          /* written by the producer */
    alignas(LINE) _Atomic uint64_t tail;          /* written by the consumer */
    alignas(LINE) _Atomic uint32_t data_waiting;  /* consumer asleep, wants data */
    alignas(LINE) _Atomic uint32_t space_waiting; /* producer asleep, wants space */
    alignas(LINE) _Atomic uint32_t writer_closed;
    _Atomic uint32_t reader_closed;
};
static_assert(sizeof(struct ring) <= SEG_PAGE, "a ring header fits its page");
static_assert(sizeof(struct seg_header) <= SEG_PAGE, "the segment header fits its page");

struct shm_segment {
    unsigned char *base;
    size_t size;
    int nlocal;
    size_t ring_bytes;
    uint64_t nonce;
    /* Doorbells by local index, bound by the first shm_connect from that
     * index; threads-as-ranks may share one handle. */
    pthread_mutex_t lock;
    int *bells;
};

/* What an epoll event of a connection is about. */
enum { EV_BELL = 1, EV_PIDFD, EV_TIMER };

struct shm_conn {
    struct xport base;
    struct shm_segment *seg;
    struct ring *tx, *rx;
    unsigned char *tx_data, *rx_data;
    uint64_t cap;
    int bell;    /* our doorbell (owned by the segment) */
    int epfd;    /* bell + pidfd or timer: what arm() returns */
    int pidfd;   /* -1 if not watched this way */
    int timerfd; /* -1 unless pidfd_open is unavailable */
    pid_t peer_pid;
    bool peer_dead;
    bool armed_send, armed_recv;
    struct sockaddr_un peer_bell;
    socklen_t peer_bell_len;
};

static size_t ring_stride(size_t ring_bytes)
{
    return SEG_PAGE + ring_bytes;
}

static struct ring *ring_at(const struct shm_segment *seg, int from, int to)
{
    size_t idx = (size_t)from * (size_t)seg->nlocal + (size_t)to;
    return (struct ring *)(seg->base + SEG_PAGE + idx * ring_stride(seg->ring_bytes));
}

static unsigned char *ring_data(struct ring *r)
{
    return (unsigned char *)r + SEG_PAGE;
}

static socklen_t bell_address(uint64_t nonce, int index, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    /* Abstract namespace (leading NUL): nothing in the file system to
     * clean up when a rank dies. */
    int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "kolo-bell-%016llx-%d",
                     (unsigned long long)nonce, index);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* ---- segments ---- */

static int normalise_ring_bytes(size_t ring_bytes, size_t *out)
{
    if (ring_bytes == 0)
        ring_bytes = SHM_RING_BYTES_DEFAULT;
    if (ring_bytes > RING_MAX_BYTES)
        return KOLO_EINVAL;
    size_t cap = RING_MIN_BYTES;
    while (cap < ring_bytes)
        cap <<= 1;
    *out = cap;
    return 0;
}

static bool name_ok(const char *name)
{
    size_t len = name ? strlen(name) : 0;
    return len >= 2 && len < NAME_MAX && name[0] == '/' && !strchr(name + 1, '/');
}

int shm_segment_name(uint64_t job, uint64_t generation, char *out, size_t outlen)
{
    return shm_names_make(job, generation, out, outlen);
}

int shm_segment_trusted(int fd, const char *name)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return KOLO_ESYS;
    if (st.st_uid == geteuid() && (st.st_mode & 077) == 0)
        return 0;
    LOGW("xport", "not attaching shared segment %s: owned by uid %d with mode %04o (want uid %d, "
         "0600)", name, (int)st.st_uid, (unsigned)(st.st_mode & 07777), (int)geteuid());
    return KOLO_EPERM;
}


static int segment_open(const char *name, int nlocal, size_t ring_bytes, bool create,
                        struct shm_segment **out)
{
    *out = NULL;
    size_t cap;
    if (!name_ok(name) || nlocal < 1 || nlocal > SEG_MAX_LOCAL ||
        normalise_ring_bytes(ring_bytes, &cap))
        return KOLO_EINVAL;
    size_t size = SEG_PAGE + (size_t)nlocal * (size_t)nlocal * ring_stride(cap);

    int fd = shm_open(name, O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return KOLO_EEXIST;
        if (errno == ENOENT)
            return KOLO_ENOTFOUND;
        return errno == EACCES ? KOLO_EPERM : KOLO_ESYS;
    }
    int rc = 0;
    struct stat st = {0};
    if (create && ftruncate(fd, (off_t)size) < 0) {
        rc = KOLO_ESYS;
    } else if (!create && (rc = shm_segment_trusted(fd, name)) != 0) {
        /* someone else's segment */
    } else if (!create && (fstat(fd, &st) < 0 || (size_t)st.st_size != size)) {
        LOGD("xport", "segment %s has %lld bytes, expected %zu", name, (long long)st.st_size, size);
        rc = KOLO_EPROTO;
    }
    void *base = MAP_FAILED;
    if (rc == 0) {
        base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED)
            rc = KOLO_ESYS;
    }
    close(fd); /* the mapping keeps the memory */

    struct shm_segment *seg = NULL;
    if (rc == 0) {
        seg = calloc(1, sizeof *seg);
        int *bells = seg ? malloc((size_t)nlocal * sizeof *bells) : NULL;
        if (!bells) {
            free(seg);
            seg = NULL;
            rc = KOLO_ENOMEM;
        } else {
            for (int i = 0; i < nlocal; i++)
                bells[i] = -1;
            seg->bells = bells;
            seg->base = base;
            seg->size = size;
            seg->nlocal = nlocal;
            seg->ring_bytes = cap;
            pthread_mutex_init(&seg->lock, NULL);
        }
    }

    struct seg_header *h = base;
    if (rc == 0 && create) {
        rc = random_bytes(&seg->nonce, sizeof seg->nonce);
        h->version = SEG_VERSION;
        h->nlocal = (uint32_t)nlocal;
        h->ring_bytes = cap;
        h->total_bytes = size;
        h->nonce = seg->nonce;
        atomic_store_explicit(&h->magic, SEG_MAGIC, memory_order_release);
    } else if (rc == 0) {
        if (atomic_load_explicit(&h->magic, memory_order_acquire) != SEG_MAGIC ||
            h->version != SEG_VERSION || h->nlocal != (uint32_t)nlocal || h->ring_bytes != cap ||
            h->total_bytes != size) {
            LOGD("xport", "segment %s does not match (nlocal %d, ring %zu)", name, nlocal, cap);
            rc = KOLO_EPROTO;
        }
        seg->nonce = h->nonce;
    }

    if (rc) {
        if (seg)
            shm_segment_release(seg);
        else if (base != MAP_FAILED)
            munmap(base, size);
        if (create)
            shm_unlink(name);
        return rc;
    }
    *out = seg;
    return 0;
}

int shm_segment_create(const char *name, int nlocal, size_t ring_bytes, struct shm_segment **out)
{
    return segment_open(name, nlocal, ring_bytes, true, out);
}

int shm_segment_attach(const char *name, int nlocal, size_t ring_bytes, struct shm_segment **out)
{
    return segment_open(name, nlocal, ring_bytes, false, out);
}

void shm_segment_unlink(const char *name)
{
    if (name_ok(name))
        shm_unlink(name);
}

void shm_segment_release(struct shm_segment *seg)
{
    if (!seg)
        return;
    for (int i = 0; i < seg->nlocal; i++)
        if (seg->bells[i] >= 0)
            close(seg->bells[i]);
    free(seg->bells);
    pthread_mutex_destroy(&seg->lock);
    munmap(seg->base, seg->size);
    free(seg);
}

/* The doorbell of local index me, bound on first use: the fd or
 * -KOLO_E*. */
static int segment_bell(struct shm_segment *seg, int me)
{
    pthread_mutex_lock(&seg->lock);
    int fd = seg->bells[me];
    if (fd < 0) {
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa;
        socklen_t len = bell_address(seg->nonce, me, &sa);
        if (fd < 0) {
            fd = -KOLO_ESYS;
        } else if (bind(fd, (struct sockaddr *)&sa, len) < 0) {
            /* Taken: another handle (or process) already is local rank
             * me of this segment. */
            int code = errno == EADDRINUSE ? KOLO_EEXIST : KOLO_ESYS;
            close(fd);
            fd = -code;
        } else {
            seg->bells[me] = fd;
        }
    }
    pthread_mutex_unlock(&seg->lock);
    return fd;
}

/* ---- connections ---- */

static void poke(struct shm_conn *c)
{
    /* Errors do not matter: a full queue already holds a wake-up, and a
     * peer whose doorbell is gone is dead, which its pidfd reports. */
    char byte = 0;
    (void)sendto(c->bell, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                 (const struct sockaddr *)&c->peer_bell, c->peer_bell_len);
}

/* The publishing half of the two-phase sleep (see the top of the file). */
static void wake_if_waiting(struct shm_conn *c, _Atomic uint32_t *flag)
{
    if (atomic_load_explicit(flag, memory_order_seq_cst) &&
        atomic_exchange_explicit(flag, 0, memory_order_relaxed))
        poke(c);
}

static ssize_t fail_gone(struct shm_conn *c, bool closed)
{
    if (closed)
        return xport_fail(&c->base, KOLO_EPEER, "rank %d closed the connection", c->base.peer);
    return xport_fail(&c->base, KOLO_EPEER, "rank %d (pid %d) exited", c->base.peer,
                      (int)c->peer_pid);
}

static ssize_t shm_try_send(struct xport *x, const void *buf, size_t len)
{
    struct shm_conn *c = (struct shm_conn *)x;
    if (x->failed)
        return -x->failed;
    struct ring *r = c->tx;
    if (atomic_load_explicit(&r->reader_closed, memory_order_acquire))
        return fail_gone(c, true);
    if (c->peer_dead)
        return fail_gone(c, false);
    if (len == 0)
        return 0;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    /* At least acquire: the consumer's copies out of the space it freed
     * are done before we overwrite it. Seq-cst for the two-phase sleep. */
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_seq_cst);
    uint64_t space = c->cap - (head - tail);
    size_t n = len < space ? len : (size_t)space;
    const unsigned char *src = buf;
    size_t done = 0;
    while (done < n) {
        size_t off = (size_t)((head + done) & (c->cap - 1));
        size_t step = n - done;
        if (step > COPY_CHUNK)
            step = COPY_CHUNK;
        if (step > c->cap - off)
            step = c->cap - off;
        memcpy(c->tx_data + off, src + done, step);
        done += step;
        atomic_store_explicit(&r->head, head + done, memory_order_seq_cst);
        wake_if_waiting(c, &r->data_waiting);
    }
    return (ssize_t)n;
}

static ssize_t shm_try_recv(struct xport *x, void *buf, size_t len)
{
    struct shm_conn *c = (struct shm_conn *)x;
    if (x->failed)
        return -x->failed;
    if (len == 0)
        return 0;
    struct ring *r = c->rx;
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_seq_cst);
    if (head == tail) {
        bool closed = atomic_load_explicit(&r->writer_closed, memory_order_acquire);
        if (!closed && !c->peer_dead)
            return 0;
        /* The writer's last bytes were published before it closed or
         * died; look again before calling it gone. */
        head = atomic_load_explicit(&r->head, memory_order_acquire);
        if (head == tail)
            return fail_gone(c, closed);
    }
    uint64_t avail = head - tail;
    size_t n = len < avail ? len : (size_t)avail;
    unsigned char *dst = buf;
    size_t done = 0;
    while (done < n) {
        size_t off = (size_t)((tail + done) & (c->cap - 1));
        size_t step = n - done;
        if (step > COPY_CHUNK)
            step = COPY_CHUNK;
        if (step > c->cap - off)
            step = c->cap - off;
        memcpy(dst + done, c->rx_data + off, step);
        done += step;
        /* At least release: our copy out is complete before the producer
         * may reuse the space. */
        atomic_store_explicit(&r->tail, tail + done, memory_order_seq_cst);
        wake_if_waiting(c, &r->space_waiting);
    }
    return (ssize_t)n;
}

static int shm_arm(struct xport *x, bool want_send, bool want_recv, short *events)
{
    struct shm_conn *c = (struct shm_conn *)x;
    if (want_recv) {
        atomic_store_explicit(&c->rx->data_waiting, 1, memory_order_seq_cst);
        c->armed_recv = true;
    }
    if (want_send) {
        atomic_store_explicit(&c->tx->space_waiting, 1, memory_order_seq_cst);
        c->armed_send = true;
    }
    /* The caller's retry is the second half of the two-phase sleep. */
    *events = POLLIN;
    return c->epfd;
}

/* The fallback's liveness test. kill(pid, 0) still succeeds on a zombie,
 * so the state in /proc counts too: a rank that exited is dead to us
 * whether or not its parent has reaped it yet. */
static bool pid_gone(pid_t pid)
{
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return true;
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false; /* no /proc to ask: kill() said alive */
    ssize_t n = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (n <= 0)
        return false;
    stat[n] = '\0';
    /* "pid (comm) S ...": the command may hold spaces and parentheses,
     * the state follows the last ')'. */
    const char *p = strrchr(stat, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static void check_peer_alive(struct shm_conn *c)
{
    uint64_t expirations;
    while (read(c->timerfd, &expirations, sizeof expirations) > 0)
        ;
    if (pid_gone(c->peer_pid))
        c->peer_dead = true;
}

static void shm_disarm(struct xport *x)
{
    struct shm_conn *c = (struct shm_conn *)x;
    if (c->armed_recv)
        atomic_store_explicit(&c->rx->data_waiting, 0, memory_order_relaxed);
    if (c->armed_send)
        atomic_store_explicit(&c->tx->space_waiting, 0, memory_order_relaxed);
    c->armed_recv = c->armed_send = false;

    /* One system call says which of bell, pidfd and timer fired. */
    struct epoll_event ev[3];
    int n = epoll_wait(c->epfd, ev, 3, 0);
    for (int i = 0; i < n; i++) {
        switch (ev[i].data.u32) {
        case EV_BELL: {
            char drain[64];
            while (recv(c->bell, drain, sizeof drain, MSG_DONTWAIT) > 0)
                ;
            break;
        }
        case EV_PIDFD:
            c->peer_dead = true;
            break;
        case EV_TIMER:
            check_peer_alive(c);
            break;
        }
    }
}

static void shm_close(struct xport *x)
{
    struct shm_conn *c = (struct shm_conn *)x;
    atomic_store_explicit(&c->tx->writer_closed, 1, memory_order_release);
    atomic_store_explicit(&c->rx->reader_closed, 1, memory_order_release);
    /* Unconditionally: the peer may be asleep in either direction. */
    poke(c);
    close(c->epfd);
    if (c->pidfd >= 0)
        close(c->pidfd);
    if (c->timerfd >= 0)
        close(c->timerfd);
    free(c);
}

static const struct xport_ops shm_ops = {
    .name = "shm",
    .try_send = shm_try_send,
    .try_recv = shm_try_recv,
    .arm = shm_arm,
    .disarm = shm_disarm,
    .close = shm_close,
    .spin = true,
};

static int epoll_add(int epfd, int fd, uint32_t tag)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = tag};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? KOLO_ESYS : 0;
}

/* Sets up the watch on the peer's pid: 0, or KOLO_EPEER if it is gone. */
static int watch_peer(struct shm_conn *c)
{
    if (c->peer_pid <= 0 || c->peer_pid == getpid())
        return 0; /* nobody to watch, or ranks as threads of one process */
    c->pidfd = (int)syscall(SYS_pidfd_open, c->peer_pid, 0);
    if (c->pidfd >= 0)
        return epoll_add(c->epfd, c->pidfd, EV_PIDFD);
    if (errno == ESRCH)
        return KOLO_EPEER;
    c->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (c->timerfd < 0)
        return KOLO_ESYS;
    struct itimerspec every = {
        .it_interval = {.tv_nsec = WATCH_MS * 1000000L},
        .it_value = {.tv_nsec = WATCH_MS * 1000000L},
    };
    if (timerfd_settime(c->timerfd, 0, &every, NULL) < 0)
        return KOLO_ESYS;
    return epoll_add(c->epfd, c->timerfd, EV_TIMER);
}

int shm_connect(struct shm_segment *seg, int me, int peer, int peer_rank, pid_t peer_pid,
                struct xport **out)
{
    *out = NULL;
    if (!seg || me < 0 || peer < 0 || me >= seg->nlocal || peer >= seg->nlocal || me == peer)
        return KOLO_EINVAL;
    int bell = segment_bell(seg, me);
    if (bell < 0)
        return -bell;
    struct shm_conn *c = calloc(1, sizeof *c);
    if (!c)
        return KOLO_ENOMEM;
    c->base.ops = &shm_ops;
    c->base.peer = peer_rank;
    c->seg = seg;
    c->tx = ring_at(seg, me, peer);
    c->rx = ring_at(seg, peer, me);
    c->tx_data = ring_data(c->tx);
    c->rx_data = ring_data(c->rx);
    c->cap = seg->ring_bytes;
    c->bell = bell;
    c->pidfd = c->timerfd = -1;
    c->peer_pid = peer_pid;
    c->peer_bell_len = bell_address(seg->nonce, peer, &c->peer_bell);

    int rc = 0;
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (c->epfd < 0)
        rc = KOLO_ESYS;
    if (rc == 0)
        rc = epoll_add(c->epfd, bell, EV_BELL);
    if (rc == 0)
        rc = watch_peer(c);
    if (rc) {
        LOGD("xport", "shm connection to rank %d (pid %d): %s", peer_rank, (int)peer_pid,
             kolo_errname(rc));
        if (c->epfd >= 0)
            close(c->epfd);
        if (c->pidfd >= 0)
            close(c->pidfd);
        if (c->timerfd >= 0)
            close(c->timerfd);
        free(c);
        return rc;
    }
    *out = &c->base;
    return 0;
}
