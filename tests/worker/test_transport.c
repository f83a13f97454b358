/*
 * test_transport.c - the tcp and shm transports and the blocking helpers.
 *
 * Every case runs over both transports, with ranks as threads of this
 * process and as forked processes (the shm rings and doorbells then
 * really cross address spaces, and a rank can be SIGKILLed). Sizes cover
 * the edges on purpose: 0, 1, 7, 4099 (odd, over a page), 1 MiB (the
 * ring's capacity) and 64 MiB (many times any buffer; 32 MiB in the
 * sanitizer builds). The throughput and dead-peer detection figures are
 * printed, for the record.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "test.h"
#include "tcp_ident.h"
#include "transport.h"
#include "util.h"

#define MiB       ((size_t)1 << 20)
#define JOB       42
#define GEN       7
#define MAX_RANKS 8

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif
/* The largest transfer, and the one both ranks send at once (the swap):
 * far more than a socket's buffers or a 1 MiB shm ring hold either way.
 * Half as much in the sanitizer builds, where every copy is checked. */
#define BIG (SANITIZED ? 32 * MiB : 64 * MiB)

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* SEALED is tcp with the encrypted record layer (seal.h). */
enum kind { TCP, SHM, SEALED, NKINDS };
/* How shm connections watch their peer in this process (for messages). */
static const char *watch_mode = "pidfd";
static const char *kind_name[] = {"tcp", "shm", "tcp+seal"};

static bool is_tcp(enum kind k)
{
    return k != SHM;
}

/* Who rank r is on a connection of kind k. */
#define IDENT_K(k, j, g, r)                                                                       \
    (&(struct tcp_ident){                                                                          \
        .job = (j), .generation = (g), .rank = (r), .key = TEST_KEY, .encrypt = (k) == SEALED})
static const size_t sizes[] = {0, 1, 7, 4099, MiB, BIG};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static uint64_t deadline_in(uint64_t ms)
{
    return now_mono_ms() + ms;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- content: a pattern that differs per seed and per position ---- */

/* Filling and checking BIG buffers is test bookkeeping, not code under
 * test; under ThreadSanitizer it would take most of the run. The
 * buffers change hands only through pthread_create/join and the
 * transports, whose own copies stay instrumented. */
#if defined(__SANITIZE_THREAD__)
#define NO_TSAN __attribute__((no_sanitize("thread")))
#else
#define NO_TSAN
#endif

static uint64_t pattern_word(uint64_t seed, size_t i)
{
    uint64_t v = (seed + 1) * 0x9e3779b97f4a7c15ull + (uint64_t)i * 0xbf58476d1ce4e5b9ull;
    return v ^ (v >> 29);
}

NO_TSAN static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = pattern_word(seed, i / 8);
        memcpy(p + i, &w, 8);
    }
    uint64_t w = pattern_word(seed, i / 8);
    for (; i < n; i++)
        p[i] = (unsigned char)(w >> (8 * (i % 8)));
}

NO_TSAN static bool matches(const unsigned char *p, size_t n, uint64_t seed)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = pattern_word(seed, i / 8), got;
        memcpy(&got, p + i, 8);
        if (got != w)
            return false;
    }
    uint64_t w = pattern_word(seed, i / 8);
    for (; i < n; i++)
        if (p[i] != (unsigned char)(w >> (8 * (i % 8))))
            return false;
    return true;
}

static unsigned char *xmalloc(size_t n)
{
    unsigned char *p = malloc(n ? n : 1);
    REQUIRE(p);
    return p;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    REQUIRE(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static bool shm_name_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

static void new_segment_name(char *name, size_t len)
{
    REQUIRE(shm_segment_name(JOB, GEN, name, len) == 0);
}

/* ---- two ranks in one process ---- */

struct pair {
    struct xport *x[2]; /* x[r] is rank r's end */
    struct shm_segment *seg[2];
};

static void pair_open(enum kind k, struct pair *p)
{
    memset(p, 0, sizeof *p);
    if (is_tcp(k)) {
        int lfd, port;
        REQUIRE(tcp_listen("127.0.0.1", &lfd, &port) == 0);
        /* connect first, accept second: the connector does not wait. */
        REQUIRE(tcp_connect("127.0.0.1", port, IDENT_K(k, JOB, GEN, 0), 1, deadline_in(5000), &p->x[0]) == 0);
        REQUIRE(tcp_accept(lfd, IDENT_K(k, JOB, GEN, 1), deadline_in(5000), &p->x[1]) == 0);
        CHECK_EQ_INT(p->x[0]->peer, 1);
        CHECK_EQ_INT(p->x[1]->peer, 0);
        close(lfd);
        return;
    }
    char name[64];
    new_segment_name(name, sizeof name);
    REQUIRE(shm_segment_create(name, 2, 0, &p->seg[0]) == 0);
    REQUIRE(shm_segment_attach(name, 2, 0, &p->seg[1]) == 0);
    /* Once every rank is attached the name goes; the mappings stay. */
    shm_segment_unlink(name);
    CHECK(!shm_name_exists(name));
    REQUIRE(shm_connect(p->seg[0], 0, 1, 1, getpid(), &p->x[0]) == 0);
    REQUIRE(shm_connect(p->seg[1], 1, 0, 0, getpid(), &p->x[1]) == 0);
}

static void pair_close(struct pair *p)
{
    for (int r = 0; r < 2; r++) {
        xport_close(p->x[r]);
        shm_segment_release(p->seg[r]);
    }
}

struct echo_arg {
    struct xport *x;
    size_t len;
    int rc_recv, rc_send;
    bool content_ok;
};

/* Rank 1 of the size test: receive, check, send its own pattern back. */
static void *echo_rank(void *p)
{
    struct echo_arg *a = p;
    unsigned char *buf = xmalloc(a->len);
    a->rc_recv = xport_recv(a->x, buf, a->len, deadline_in(30000));
    a->content_ok = matches(buf, a->len, 100 + a->len);
    fill(buf, a->len, 200 + a->len);
    a->rc_send = xport_send(a->x, buf, a->len, deadline_in(30000));
    free(buf);
    return NULL;
}

static void test_sizes_threads(enum kind k)
{
    struct pair p;
    pair_open(k, &p);
    for (size_t i = 0; i < NSIZES; i++) {
        size_t len = sizes[i];
        unsigned char *buf = xmalloc(len);
        fill(buf, len, 100 + len);
        struct echo_arg a = {.x = p.x[1], .len = len};
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, echo_rank, &a) == 0);
        CHECK_EQ_INT(xport_send(p.x[0], buf, len, deadline_in(30000)), 0);
        memset(buf, 0, len);
        CHECK_EQ_INT(xport_recv(p.x[0], buf, len, deadline_in(30000)), 0);
        pthread_join(t, NULL);
        CHECK_EQ_INT(a.rc_recv, 0);
        CHECK_EQ_INT(a.rc_send, 0);
        CHECK(a.content_ok);
        CHECK(matches(buf, len, 200 + len));
        free(buf);
    }
    pair_close(&p);
}

/* Both ranks send BIG bytes to each other at once: with blocking sends
 * this is the classic ring-step deadlock. */
struct swap_arg {
    struct xport *x;
    int rank;
    size_t len;
    int rc;
    bool content_ok;
};

static void *swap_rank(void *p)
{
    struct swap_arg *a = p;
    unsigned char *out = xmalloc(a->len), *in = xmalloc(a->len);
    fill(out, a->len, 300 + (uint64_t)a->rank);
    a->rc = xport_sendrecv(a->x, out, a->len, a->x, in, a->len, deadline_in(30000));
    a->content_ok = matches(in, a->len, 300 + (uint64_t)(1 - a->rank));
    free(out);
    free(in);
    return NULL;
}

static void test_swap_threads(enum kind k)
{
    struct pair p;
    pair_open(k, &p);
    struct swap_arg a[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        a[r] = (struct swap_arg){.x = p.x[r], .rank = r, .len = BIG};
        REQUIRE(pthread_create(&t[r], NULL, swap_rank, &a[r]) == 0);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(t[r], NULL);
        CHECK_EQ_INT(a[r].rc, 0);
        CHECK(a[r].content_ok);
    }
    pair_close(&p);
}

/* ---- two ranks as processes: this process is rank 0, a child rank 1 ---- */

struct proc_pair {
    enum kind kind;
    int lfd, port;
    char name[64];
    struct shm_segment *seg;
    pid_t child;
};

typedef void (*rank_body)(struct xport *x, void *arg);

/* Forks rank 1, which connects and runs body, exiting 0 if every check
 * in it passed. Returns rank 0's end of the connection. */
static struct xport *proc_pair_open(enum kind k, struct proc_pair *pp, rank_body body, void *arg)
{
    memset(pp, 0, sizeof *pp);
    pp->kind = k;
    pp->lfd = -1;
    if (is_tcp(k)) {
        REQUIRE(tcp_listen("127.0.0.1", &pp->lfd, &pp->port) == 0);
    } else {
        new_segment_name(pp->name, sizeof pp->name);
        REQUIRE(shm_segment_create(pp->name, 2, 0, &pp->seg) == 0);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        test_failures = 0; /* the child reports its own checks only */
        struct xport *x = NULL;
        struct shm_segment *seg = NULL;
        if (is_tcp(k)) {
            close(pp->lfd);
            REQUIRE(tcp_connect("127.0.0.1", pp->port, IDENT_K(k, JOB, GEN, 1), 0, deadline_in(5000), &x) == 0);
        } else {
            /* The inherited handle is the parent's; a rank attaches its
             * own, as a separate process would. */
            shm_segment_release(pp->seg);
            REQUIRE(shm_segment_attach(pp->name, 2, 0, &seg) == 0);
            REQUIRE(shm_connect(seg, 1, 0, 0, getppid(), &x) == 0);
        }
        /* "attached": lets rank 0 unlink the segment name. */
        unsigned char one = 1;
        REQUIRE(xport_send(x, &one, 1, deadline_in(5000)) == 0);
        body(x, arg);
        xport_close(x);
        shm_segment_release(seg);
        _exit(test_failures ? 1 : 0);
    }
    pp->child = pid;
    struct xport *x = NULL;
    if (is_tcp(k)) {
        REQUIRE(tcp_accept(pp->lfd, IDENT_K(k, JOB, GEN, 0), deadline_in(5000), &x) == 0);
        close(pp->lfd);
        pp->lfd = -1;
    } else {
        REQUIRE(shm_connect(pp->seg, 0, 1, 1, pid, &x) == 0);
    }
    unsigned char one = 0;
    REQUIRE(xport_recv(x, &one, 1, deadline_in(5000)) == 0);
    CHECK_EQ_INT(one, 1);
    if (k == SHM) {
        shm_segment_unlink(pp->name);
        CHECK(!shm_name_exists(pp->name));
    }
    return x;
}

/* Waits for rank 1 and returns its exit status (-signal if killed). */
static int proc_pair_close(struct proc_pair *pp, struct xport *x)
{
    xport_close(x);
    int status = 0;
    REQUIRE(waitpid(pp->child, &status, 0) == pp->child);
    shm_segment_release(pp->seg);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

static void sizes_child(struct xport *x, void *arg)
{
    for (size_t i = 0; i < NSIZES; i++) {
        struct echo_arg a = {.x = x, .len = sizes[i]};
        echo_rank(&a);
        CHECK_EQ_INT(a.rc_recv, 0);
        CHECK_EQ_INT(a.rc_send, 0);
        CHECK(a.content_ok);
    }
}

static void test_sizes_procs(enum kind k)
{
    struct proc_pair pp;
    struct xport *x = proc_pair_open(k, &pp, sizes_child, NULL);
    for (size_t i = 0; i < NSIZES; i++) {
        size_t len = sizes[i];
        unsigned char *buf = xmalloc(len);
        fill(buf, len, 100 + len);
        CHECK_EQ_INT(xport_send(x, buf, len, deadline_in(30000)), 0);
        memset(buf, 0, len);
        CHECK_EQ_INT(xport_recv(x, buf, len, deadline_in(30000)), 0);
        CHECK(matches(buf, len, 200 + len));
        free(buf);
    }
    CHECK_EQ_INT(proc_pair_close(&pp, x), 0);
}

static void swap_child(struct xport *x, void *arg)
{
    struct swap_arg a = {.x = x, .rank = 1, .len = BIG};
    swap_rank(&a);
    CHECK_EQ_INT(a.rc, 0);
    CHECK(a.content_ok);
}

static void test_swap_procs(enum kind k)
{
    struct proc_pair pp;
    struct xport *x = proc_pair_open(k, &pp, swap_child, NULL);
    struct swap_arg a = {.x = x, .rank = 0, .len = BIG};
    swap_rank(&a);
    CHECK_EQ_INT(a.rc, 0);
    CHECK(a.content_ok);
    CHECK_EQ_INT(proc_pair_close(&pp, x), 0);
}

/* ---- throughput, 2 processes ---- */

struct bench_arg {
    int reps;
    bool both;
};

static void bench_child(struct xport *x, void *arg)
{
    const struct bench_arg *b = arg;
    unsigned char *out = xmalloc(BIG), *in = xmalloc(BIG);
    fill(out, BIG, 1);
    memset(in, 0, BIG);
    for (int i = 0; i < b->reps + 1; i++) {
        if (b->both)
            CHECK_EQ_INT(xport_sendrecv(x, out, BIG, x, in, BIG, deadline_in(30000)), 0);
        else
            CHECK_EQ_INT(xport_recv(x, in, BIG, deadline_in(30000)), 0);
    }
    CHECK(matches(in, BIG, 0));
    unsigned char done = 1;
    CHECK_EQ_INT(xport_send(x, &done, 1, deadline_in(30000)), 0);
    free(out);
    free(in);
}

/* Rank 0's side: one untimed round (first touch of every page), then
 * reps timed rounds, ended by rank 1's "done". Returns GB/s (1e9 bytes)
 * in each direction. */
static double bench(enum kind k, bool both, int reps)
{
    struct bench_arg b = {.reps = reps, .both = both};
    struct proc_pair pp;
    struct xport *x = proc_pair_open(k, &pp, bench_child, &b);
    unsigned char *out = xmalloc(BIG), *in = xmalloc(BIG);
    fill(out, BIG, 0);
    memset(in, 0, BIG);
    uint64_t t0 = 0;
    for (int i = 0; i < reps + 1; i++) {
        if (i == 1)
            t0 = now_us();
        if (both)
            CHECK_EQ_INT(xport_sendrecv(x, out, BIG, x, in, BIG, deadline_in(30000)), 0);
        else
            CHECK_EQ_INT(xport_send(x, out, BIG, deadline_in(30000)), 0);
    }
    unsigned char done = 0;
    CHECK_EQ_INT(xport_recv(x, &done, 1, deadline_in(30000)), 0);
    uint64_t t1 = now_us();
    if (both)
        CHECK(matches(in, BIG, 1));
    free(out);
    free(in);
    CHECK_EQ_INT(proc_pair_close(&pp, x), 0);
    return (double)reps * (double)BIG / (double)(t1 - t0) / 1e3;
}

static void test_throughput(void)
{
    if (SANITIZED) {
        printf("throughput: not measured in a sanitizer build\n");
        return;
    }
    int reps = 8;
    for (int k = 0; k < NKINDS; k++) {
        double one = bench(k, false, reps);
        double both = bench(k, true, reps);
        printf("throughput %s, 2 processes, 64 MiB x %d: one-way %.2f GB/s; sendrecv both ways "
               "%.2f GB/s each direction (%.2f GB/s total)\n",
               kind_name[k], reps, one, both, 2 * both);
    }
}

/* ---- rings of n ranks: links[i] is the connection from i to i+1 ---- */

struct ring_setup {
    int n;
    enum kind kinds[MAX_RANKS]; /* of link i -> i+1 */
    size_t block;
    /* tcp: the listener of rank i+1 that link i goes to */
    int lfd[MAX_RANKS], port[MAX_RANKS];
    char name[64];
    bool any_shm;
};

struct ring_rank {
    const struct ring_setup *s;
    int rank;
    struct xport *next, *prev;
    struct shm_segment *seg;
    int rc;
    bool content_ok;
};

/* An allgather around the ring: in step s, rank r forwards block r - s
 * to r + 1 and receives block r - s - 1 from r - 1; after n - 1 steps
 * every rank holds every block. Each step sends and receives at once,
 * which is what xport_sendrecv exists for. */
static void ring_run(struct ring_rank *rr)
{
    int n = rr->s->n, r = rr->rank;
    size_t block = rr->s->block;
    unsigned char *all = xmalloc(block * (size_t)n);
    memset(all, 0, block * (size_t)n);
    fill(all + (size_t)r * block, block, 500 + (uint64_t)r);
    rr->rc = 0;
    for (int s = 0; s < n - 1 && rr->rc == 0; s++) {
        int send_idx = ((r - s) % n + n) % n, recv_idx = ((r - s - 1) % n + n) % n;
        rr->rc = xport_sendrecv(rr->next, all + (size_t)send_idx * block, block, rr->prev,
                                all + (size_t)recv_idx * block, block, deadline_in(30000));
    }
    rr->content_ok = true;
    for (int i = 0; i < n; i++)
        rr->content_ok =
            rr->content_ok && matches(all + (size_t)i * block, block, 500 + (uint64_t)i);
    free(all);
}

static void *ring_thread(void *p)
{
    ring_run(p);
    return NULL;
}

static void ring_prepare(struct ring_setup *s)
{
    s->any_shm = false;
    for (int i = 0; i < s->n; i++) {
        s->lfd[i] = -1;
        if (is_tcp(s->kinds[i]))
            REQUIRE(tcp_listen("127.0.0.1", &s->lfd[i], &s->port[i]) == 0);
        else
            s->any_shm = true;
    }
    if (s->any_shm)
        new_segment_name(s->name, sizeof s->name);
}

/* Connects rank r's two links; pids[i] is rank i's pid. The dialling
 * half and the accepting half are separate so that ranks run in one
 * thread can all dial before anyone accepts. */
static void ring_dial(const struct ring_setup *s, struct ring_rank *rr, const pid_t *pids)
{
    int n = s->n, r = rr->rank, nx = (r + 1) % n;
    if (s->any_shm && !rr->seg)
        REQUIRE(shm_segment_attach(s->name, n, 0, &rr->seg) == 0);
    if (is_tcp(s->kinds[r]))
        REQUIRE(tcp_connect("127.0.0.1", s->port[r], IDENT_K(s->kinds[r], JOB, GEN, r), nx, deadline_in(5000),
                            &rr->next) == 0);
    else
        REQUIRE(shm_connect(rr->seg, r, nx, nx, pids[nx], &rr->next) == 0);
    CHECK_EQ_INT(rr->next->peer, nx);
}

static void ring_accept(const struct ring_setup *s, struct ring_rank *rr, const pid_t *pids)
{
    int n = s->n, r = rr->rank, pv = (r + n - 1) % n;
    if (is_tcp(s->kinds[pv]))
        REQUIRE(tcp_accept(s->lfd[pv], IDENT_K(s->kinds[pv], JOB, GEN, r), deadline_in(5000), &rr->prev) == 0);
    else
        REQUIRE(shm_connect(rr->seg, r, pv, pv, pids[pv], &rr->prev) == 0);
    CHECK_EQ_INT(rr->prev->peer, pv);
}

static void ring_rank_close(struct ring_rank *rr)
{
    xport_close(rr->next);
    xport_close(rr->prev);
    shm_segment_release(rr->seg);
    rr->next = rr->prev = NULL;
    rr->seg = NULL;
}

static void ring_listeners_close(struct ring_setup *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->lfd[i] >= 0)
            close(s->lfd[i]);
}

static void test_ring_threads(struct ring_setup *s)
{
    ring_prepare(s);
    struct shm_segment *creator = NULL;
    if (s->any_shm)
        REQUIRE(shm_segment_create(s->name, s->n, 0, &creator) == 0);
    pid_t pids[MAX_RANKS];
    struct ring_rank rr[MAX_RANKS];
    for (int r = 0; r < s->n; r++)
        pids[r] = getpid();
    /* Connections are made in one thread: tcp_connect does not wait for
     * the acceptor, and shm_connect waits for nobody. */
    for (int r = 0; r < s->n; r++) {
        rr[r] = (struct ring_rank){.s = s, .rank = r};
        ring_dial(s, &rr[r], pids);
    }
    for (int r = 0; r < s->n; r++)
        ring_accept(s, &rr[r], pids);
    if (s->any_shm) {
        shm_segment_unlink(s->name);
        shm_segment_release(creator);
    }
    ring_listeners_close(s);
    pthread_t t[MAX_RANKS];
    for (int r = 0; r < s->n; r++)
        REQUIRE(pthread_create(&t[r], NULL, ring_thread, &rr[r]) == 0);
    for (int r = 0; r < s->n; r++) {
        pthread_join(t[r], NULL);
        CHECK_EQ_INT(rr[r].rc, 0);
        CHECK(rr[r].content_ok);
        ring_rank_close(&rr[r]);
    }
}

static void test_ring_procs(struct ring_setup *s)
{
    ring_prepare(s);
    struct shm_segment *creator = NULL;
    if (s->any_shm)
        REQUIRE(shm_segment_create(s->name, s->n, 0, &creator) == 0);
    pid_t pids[MAX_RANKS];
    int pipes[MAX_RANKS][2];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < s->n; r++) {
        REQUIRE(pipe(pipes[r]) == 0);
        pids[r] = fork();
        REQUIRE(pids[r] >= 0);
        if (pids[r] == 0) {
            test_failures = 0;
            /* Every rank's pid is known only once all are forked. */
            close(pipes[r][1]);
            REQUIRE(read(pipes[r][0], pids, sizeof pids) == (ssize_t)sizeof pids);
            close(pipes[r][0]);
            shm_segment_release(creator);
            struct ring_rank rr = {.s = s, .rank = r};
            ring_dial(s, &rr, pids);
            ring_accept(s, &rr, pids);
            ring_listeners_close(s);
            ring_run(&rr);
            CHECK_EQ_INT(rr.rc, 0);
            CHECK(rr.content_ok);
            ring_rank_close(&rr);
            _exit(test_failures ? 1 : 0);
        }
        close(pipes[r][0]);
    }
    for (int r = 0; r < s->n; r++) {
        REQUIRE(write(pipes[r][1], pids, sizeof pids) == (ssize_t)sizeof pids);
        close(pipes[r][1]);
    }
    ring_listeners_close(s);
    for (int r = 0; r < s->n; r++) {
        int status = 0;
        REQUIRE(waitpid(pids[r], &status, 0) == pids[r]);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    if (s->any_shm) {
        shm_segment_unlink(s->name);
        shm_segment_release(creator);
    }
}

static void test_rings(void)
{
    static const struct {
        int n;
        enum kind kinds[MAX_RANKS];
        const char *what;
    } cases[] = {
        {3, {TCP, TCP, TCP}, "tcp"},
        {3, {SHM, SHM, SHM}, "shm"},
        {5, {TCP, TCP, TCP, TCP, TCP}, "tcp"},
        {5, {SHM, SHM, SHM, SHM, SHM}, "shm"},
        /* Mixed: ranks 0 and 1 send on one transport and receive on the
         * other within the same xport_sendrecv. */
        {3, {TCP, SHM, SHM}, "mixed"},
        {5, {SHM, TCP, SHM, TCP, SHM}, "mixed"},
        {3, {SEALED, SEALED, SEALED}, "sealed"},
        {4, {SEALED, SHM, TCP, SHM}, "sealed, mixed"},
    };
    /* The big block is over the ring's capacity either way; sanitizer
     * builds copy ten times slower, so theirs is smaller. */
    static const size_t blocks[] = {1, 4099, SANITIZED ? MiB + 4099 : 3 * MiB + 5};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
            struct ring_setup s = {.n = cases[c].n, .block = blocks[b]};
            memcpy(s.kinds, cases[c].kinds, sizeof s.kinds);
            int before = test_failures;
            test_ring_threads(&s);
            test_ring_procs(&s);
            if (test_failures != before)
                fprintf(stderr, "ring of %d (%s), block %zu failed\n", s.n, cases[c].what, s.block);
        }
    }
}

/* ---- hello, refusals, deadlines ---- */

static void expect_refused(uint64_t cjob, uint64_t cgen, int to, int want)
{
    int lfd, port;
    REQUIRE(tcp_listen("127.0.0.1", &lfd, &port) == 0);
    struct xport *c = NULL, *a = (struct xport *)1;
    REQUIRE(tcp_connect("127.0.0.1", port, IDENT(cjob, cgen, 0), to, deadline_in(5000), &c) == 0);
    CHECK_EQ_INT(tcp_accept(lfd, IDENT(JOB, GEN, 1), deadline_in(5000), &a), want);
    CHECK(a == NULL);
    /* The connector learns why on its first use, and it sticks. */
    unsigned char byte;
    CHECK_EQ_INT(xport_recv(c, &byte, 1, deadline_in(5000)), want);
    CHECK(strstr(c->why, "refused the connection") != NULL);
    CHECK_EQ_INT(xport_send(c, &byte, 1, deadline_in(5000)), want);
    CHECK_EQ_INT(c->failed, want);
    xport_close(c);
    close(lfd);
}

static void test_hello(void)
{
    expect_refused(JOB, GEN + 1, 1, KOLO_ESTALE);
    expect_refused(JOB, GEN - 1, 1, KOLO_ESTALE);
    expect_refused(JOB + 1, GEN, 1, KOLO_EPROTO);
    expect_refused(JOB, GEN, 2, KOLO_EPROTO);

    int lfd, port;
    REQUIRE(tcp_listen("127.0.0.1", &lfd, &port) == 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct xport *a = NULL;

    /* Not a kolo rank at all. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\nand some more bytes";
    REQUIRE(write(s, junk, sizeof junk) == (ssize_t)sizeof junk);
    CHECK_EQ_INT(tcp_accept(lfd, IDENT(JOB, GEN, 1), deadline_in(5000), &a), KOLO_EPROTO);
    close(s);

    /* Half a hello, then gone. */
    s = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    REQUIRE(write(s, "KOLX", 4) == 4);
    close(s);
    CHECK_EQ_INT(tcp_accept(lfd, IDENT(JOB, GEN, 1), deadline_in(5000), &a), KOLO_EPROTO);

    /* A connection that never says hello cannot hold accept past its
     * deadline; nor can the absence of any connection. */
    s = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    uint64_t t0 = now_mono_ms();
    CHECK_EQ_INT(tcp_accept(lfd, IDENT(JOB, GEN, 1), deadline_in(200), &a), KOLO_ETIMEDOUT);
    uint64_t dt = now_mono_ms() - t0;
    CHECK(dt >= 190 && dt < 1000);
    close(s);
    t0 = now_mono_ms();
    CHECK_EQ_INT(tcp_accept(lfd, IDENT(JOB, GEN, 1), deadline_in(200), &a), KOLO_ETIMEDOUT);
    dt = now_mono_ms() - t0;
    CHECK(dt >= 190 && dt < 1000);
    close(lfd);

    /* Nobody listens there any more. */
    struct xport *c = NULL;
    CHECK_EQ_INT(tcp_connect("127.0.0.1", port, IDENT(JOB, GEN, 0), 1, deadline_in(2000), &c),
                 KOLO_ECONNREFUSED);
    CHECK(c == NULL);
}

static void test_deadlines(enum kind k)
{
    struct pair p;
    pair_open(k, &p);
    unsigned char byte = 0;

    /* Nothing arrives: ETIMEDOUT on time, and the connection, on which
     * nothing moved, stays usable. */
    uint64_t t0 = now_mono_ms();
    CHECK_EQ_INT(xport_recv(p.x[1], &byte, 1, deadline_in(200)), KOLO_ETIMEDOUT);
    uint64_t dt = now_mono_ms() - t0;
    CHECK(dt >= 195 && dt < 700);
    CHECK_EQ_INT(p.x[1]->failed, 0);
    byte = 9;
    CHECK_EQ_INT(xport_send(p.x[0], &byte, 1, deadline_in(1000)), 0);
    byte = 0;
    CHECK_EQ_INT(xport_recv(p.x[1], &byte, 1, deadline_in(1000)), 0);
    CHECK_EQ_INT(byte, 9);

    /* A deadline already past: no wait at all. */
    t0 = now_mono_ms();
    CHECK_EQ_INT(xport_recv(p.x[1], &byte, 1, now_mono_ms() - 1), KOLO_ETIMEDOUT);
    CHECK(now_mono_ms() - t0 < 100);

    /* Nobody reads: the send stops at the deadline with part of the
     * buffer gone, which breaks the connection for good. */
    unsigned char *big = xmalloc(BIG);
    memset(big, 1, BIG);
    t0 = now_mono_ms();
    CHECK_EQ_INT(xport_sendrecv(p.x[0], big, BIG, p.x[0], &byte, 1, deadline_in(200)),
                 KOLO_ETIMEDOUT);
    dt = now_mono_ms() - t0;
    CHECK(dt >= 195 && dt < 700);
    CHECK_EQ_INT(p.x[0]->failed, KOLO_ETIMEDOUT);
    CHECK(strstr(p.x[0]->why, "rank 1") != NULL);
    CHECK_EQ_INT(xport_send(p.x[0], &byte, 1, deadline_in(200)), KOLO_ETIMEDOUT);
    free(big);
    pair_close(&p);
}

/* A rank that closes: the peer still reads what was sent, then EPEER. */
static void test_close(enum kind k)
{
    struct pair p;
    pair_open(k, &p);
    unsigned char out[4099], in[4099];
    fill(out, sizeof out, 77);
    CHECK_EQ_INT(xport_send(p.x[0], out, sizeof out, deadline_in(5000)), 0);
    xport_close(p.x[0]);
    p.x[0] = NULL;
    CHECK_EQ_INT(xport_recv(p.x[1], in, sizeof in, deadline_in(5000)), 0);
    CHECK(matches(in, sizeof in, 77));
    uint64_t t0 = now_mono_ms();
    CHECK_EQ_INT(xport_recv(p.x[1], in, 1, deadline_in(5000)), KOLO_EPEER);
    CHECK(now_mono_ms() - t0 < 1000);
    CHECK(strstr(p.x[1]->why, "rank 0") != NULL);
    /* Sending to it fails too (tcp may take a round trip to learn). */
    int rc = 0;
    for (int i = 0; i < 100 && rc == 0; i++)
        rc = xport_send(p.x[1], out, sizeof out, deadline_in(5000));
    CHECK_EQ_INT(rc, KOLO_EPEER);
    pair_close(&p);
}

/* ---- a peer process SIGKILLed mid-transfer ---- */

static void endless_child(struct xport *x, void *arg)
{
    bool send = *(const bool *)arg;
    unsigned char *buf = xmalloc(BIG);
    memset(buf, 3, BIG);
    /* Until killed; the deadline only bounds a broken test. */
    for (;;) {
        int rc = send ? xport_send(x, buf, BIG, deadline_in(20000))
                      : xport_recv(x, buf, BIG, deadline_in(20000));
        if (rc)
            break;
    }
    free(buf);
}

struct killer {
    pid_t pid;
    _Atomic uint64_t killed_at_us, exited_at_us;
};

static void *killer_thread(void *p)
{
    struct killer *k = p;
    usleep(150 * 1000);
    k->killed_at_us = now_us();
    kill(k->pid, SIGKILL);
    /* When the kernel finished the victim's exit (WNOWAIT: seen, not
     * reaped; it stays a zombie until proc_pair_close). */
    siginfo_t si;
    if (waitid(P_PID, (id_t)k->pid, &si, WEXITED | WNOWAIT) == 0)
        k->exited_at_us = now_us();
    return NULL;
}

static void test_peer_killed(enum kind k, bool survivor_sends)
{
    bool child_sends = !survivor_sends;
    struct proc_pair pp;
    struct xport *x = proc_pair_open(k, &pp, endless_child, &child_sends);
    unsigned char *buf = xmalloc(BIG);
    memset(buf, 4, BIG);
    struct killer kl = {.pid = pp.child};
    pthread_t t;
    int rc = 0;
    uint64_t transfers = 0;
    while (rc == 0) {
        /* Started after one whole transfer, so the kill lands in the
         * middle of the stream, not during the setup. */
        if (transfers == 1)
            REQUIRE(pthread_create(&t, NULL, killer_thread, &kl) == 0);
        rc = survivor_sends ? xport_send(x, buf, BIG, deadline_in(10000))
                            : xport_recv(x, buf, BIG, deadline_in(10000));
        transfers++;
    }
    REQUIRE(transfers > 1);
    uint64_t failed_at = now_us();
    pthread_join(t, NULL);
    CHECK_EQ_INT(rc, KOLO_EPEER);
    CHECK(strstr(x->why, "rank 1") != NULL);
    CHECK(kl.killed_at_us != 0 && kl.exited_at_us != 0);
    double ms = ((double)failed_at - (double)kl.killed_at_us) / 1e3;
    double exit_ms = ((double)kl.exited_at_us - (double)kl.killed_at_us) / 1e3;
    /* The kernel tears a sanitizer process down slowly (terabytes of
     * shadow mappings), on a busy machine for up to seconds; the
     * detection itself must still follow the exit closely. */
    if (SANITIZED)
        CHECK(ms - exit_ms < 1000 && ms < 10000);
    else
        CHECK(ms < 1000);
    printf("dead peer %s%s%s (survivor %s, %llu transfers of %zu MiB): KOLO_EPEER %.2f "
           "ms after SIGKILL (the victim's exit completed after %.2f ms): %s\n",
           kind_name[k], k == SHM ? ", watched by " : "", k == SHM ? watch_mode : "",
           survivor_sends ? "sending" : "receiving", (unsigned long long)transfers - 1, BIG / MiB,
           ms, exit_ms, x->why);
    free(buf);
    CHECK_EQ_INT(proc_pair_close(&pp, x), -SIGKILL);
}

/* Makes pidfd_open fail with ENOSYS in this process and its children,
 * as on a kernel before 5.3. */
static bool block_pidfd_open(void)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_open, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
           prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

/* The same SIGKILL cases with the timer and kill(pid, 0) fallback, in a
 * child process that has no pidfd_open. The victim stays an unreaped
 * zombie until the survivor notices, which is the case kill() alone
 * would miss. */
static void test_peer_killed_fallback(void)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        test_failures = 0;
        if (!block_pidfd_open()) {
            printf("dead peer shm, kill(pid, 0) fallback: skipped (no seccomp)\n");
            _exit(0);
        }
        errno = 0;
        CHECK(syscall(SYS_pidfd_open, getpid(), 0) < 0 && errno == ENOSYS);
        watch_mode = "kill(pid, 0) fallback";
        test_peer_killed(SHM, false);
        test_peer_killed(SHM, true);
        fflush(stdout);
        _exit(test_failures ? 1 : 0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- segments ---- */

static void test_segments(void)
{
    char name[64];
    new_segment_name(name, sizeof name);
    CHECK(strncmp(name, "/kolo-42-7-", 11) == 0);
    struct shm_segment *a = NULL, *b = NULL, *c = NULL;
    CHECK_EQ_INT(shm_segment_attach(name, 3, 0, &a), KOLO_ENOTFOUND);
    REQUIRE(shm_segment_create(name, 3, 5000, &a) == 0);
    CHECK_EQ_INT(shm_segment_create(name, 3, 5000, &b), KOLO_EEXIST);
    /* Attachers must agree on the geometry (5000 rounds up to 8 KiB). */
    CHECK_EQ_INT(shm_segment_attach(name, 4, 5000, &b), KOLO_EPROTO);
    CHECK_EQ_INT(shm_segment_attach(name, 3, 0, &b), KOLO_EPROTO);
    REQUIRE(shm_segment_attach(name, 3, 8192, &b) == 0);
    REQUIRE(shm_segment_attach(name, 3, 5000, &c) == 0);
    shm_segment_unlink(name);
    CHECK(!shm_name_exists(name));
    struct shm_segment *bad = NULL;
    CHECK_EQ_INT(shm_segment_create("no-slash", 2, 0, &bad), KOLO_EINVAL);
    CHECK_EQ_INT(shm_segment_create("/a/b", 2, 0, &bad), KOLO_EINVAL);
    CHECK_EQ_INT(shm_segment_create(name, 0, 0, &bad), KOLO_EINVAL);
    CHECK(bad == NULL);

    struct xport *x01 = NULL, *x10 = NULL, *x20 = NULL, *dup = NULL;
    CHECK_EQ_INT(shm_connect(a, 0, 0, 0, 0, &dup), KOLO_EINVAL);
    CHECK_EQ_INT(shm_connect(a, 0, 3, 3, 0, &dup), KOLO_EINVAL);
    REQUIRE(shm_connect(a, 0, 1, 1, getpid(), &x01) == 0);
    REQUIRE(shm_connect(b, 1, 0, 0, getpid(), &x10) == 0);
    /* Local index 1 already has its doorbell in handle b. */
    CHECK_EQ_INT(shm_connect(c, 1, 2, 2, getpid(), &dup), KOLO_EEXIST);
    REQUIRE(shm_connect(c, 2, 0, 0, getpid(), &x20) == 0);

    /* A ring smaller than the message: flow control wraps many times. */
    size_t len = 100000;
    unsigned char *out = xmalloc(len), *in = xmalloc(len);
    struct echo_arg e = {.x = x10, .len = len};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, echo_rank, &e) == 0);
    fill(out, len, 100 + len);
    CHECK_EQ_INT(xport_send(x01, out, len, deadline_in(5000)), 0);
    CHECK_EQ_INT(xport_recv(x01, in, len, deadline_in(5000)), 0);
    pthread_join(t, NULL);
    CHECK(e.content_ok);
    CHECK(matches(in, len, 200 + len));
    free(out);
    free(in);

    /* A pid that is not running cannot be a peer. */
    pid_t gone = fork();
    REQUIRE(gone >= 0);
    if (gone == 0)
        _exit(0);
    REQUIRE(waitpid(gone, NULL, 0) == gone);
    CHECK_EQ_INT(shm_connect(c, 2, 1, 1, gone, &dup), KOLO_EPEER);

    xport_close(x01);
    xport_close(x10);
    xport_close(x20);
    shm_segment_release(a);
    shm_segment_release(b);
    shm_segment_release(c);
}

static void test_spin_knob(void)
{
    xport_set_spin_us(5);
    CHECK_EQ_INT(xport_spin_us(), 5);
    xport_set_spin_us(1000000);
    CHECK_EQ_INT(xport_spin_us(), 10000);
    setenv("KOLO_SPIN_US", "33", 1);
    xport_set_spin_us(-1);
    CHECK_EQ_INT(xport_spin_us(), 33);
    setenv("KOLO_SPIN_US", "junk", 1);
    xport_set_spin_us(-1);
    CHECK_EQ_INT(xport_spin_us(), 20);
    unsetenv("KOLO_SPIN_US");
    xport_set_spin_us(-1);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_DFL); /* a stray SIGPIPE must kill the test */
    int fds_before = count_fds();
    uint64_t t0 = now_mono_ms();

    test_spin_knob();
    test_segments();
    test_hello();
    for (int k = 0; k < NKINDS; k++) {
        uint64_t t = now_mono_ms();
        test_sizes_threads(k);
        test_sizes_procs(k);
        test_swap_threads(k);
        test_swap_procs(k);
        printf("%s transfers: %.1f s\n", kind_name[k], (double)(now_mono_ms() - t) / 1e3);
        t = now_mono_ms();
        test_deadlines(k);
        test_close(k);
        test_peer_killed(k, false);
        test_peer_killed(k, true);
        printf("%s failures: %.1f s\n", kind_name[k], (double)(now_mono_ms() - t) / 1e3);
    }
    test_peer_killed_fallback();
    uint64_t t = now_mono_ms();
    test_rings();
    printf("rings: %.1f s\n", (double)(now_mono_ms() - t) / 1e3);
    t = now_mono_ms();
    test_throughput();
    printf("throughput: %.1f s\n", (double)(now_mono_ms() - t) / 1e3);

    CHECK_EQ_INT(count_fds(), fds_before);
    printf("transport tests took %.1f s\n", (double)(now_mono_ms() - t0) / 1e3);
    TEST_DONE();
}
