/*
 * shmcoll.c - the collectives of a generation whose ranks all live on one
 * host, over one shared-memory segment that every rank maps.
 *
 * DESIGN
 *
 * Segment. The leader creates it (shm_open + fallocate, so a full /dev/shm
 * fails here and not as a SIGBUS later), the others attach; shmcoll_ready
 * unlinks the name as soon as everyone has it mapped, so nothing is left in
 * /dev/shm whatever happens afterwards. It holds, at offsets (processes map
 * it at different addresses):
 *   - a header: geometry, and an abort record (who failed and why);
 *   - one control block per rank (its own 128 bytes, so two ranks never
 *     share a cache line or a prefetched pair of lines): the rank's event
 *     counter, which is also the futex word others sleep on, a count of
 *     sleepers, a "left" state, and 2 x 24 bytes of inline data so a tiny
 *     allreduce moves one cache line per rank;
 *   - per rank two "small" slots for the flat small-message algorithm;
 *   - per rank SHM_NBUF pipeline buffers of chunk bytes each.
 * Rank regions are skewed by a few cache lines against each other so the
 * same offset in two ranks' buffers never falls in the same cache set or
 * 4 KiB alias, which would slow down a loop reading one and writing the
 * other.
 *
 * Synchronisation: one counter per rank. Every collective makes each rank
 * post a fixed number of events (the same on every rank, computed from the
 * arguments every rank shares), in a fixed order, so "rank j has staged
 * chunk k" is just "j's counter reached base + f(k)". There are no global
 * barriers inside an operation, only waits for the events the next step
 * needs, and those waits come after some other useful work that was done
 * since the matching post. Each buffer this rank writes remembers the
 * event every peer must have posted once it is done reading it; writing
 * the buffer again first waits for that (usually long true, a compare on
 * cached values). That one rule is what makes back-to-back collectives of
 * any kind safe without a barrier between them.
 *
 * Waiting spins for KOLO_SPIN_US (with a cpu pause), then sleeps in
 * FUTEX_WAIT on the peer's counter in slices of SHM_SLICE_MS; a poster
 * issues FUTEX_WAKE only when the sleepers count in its control block says
 * someone sleeps (store counter / load sleepers against increment
 * sleepers / load counter, all sequentially consistent, so a wake-up is
 * never lost). When ranks outnumber the CPUs, a spinning rank would only
 * hold the CPU its peer needs: there is no spin, but up to KOLO_YIELD_US
 * of sched_yield, which hands the CPU straight to a peer queued behind us
 * without a FUTEX_WAKE round trip (on 4 ranks and 2 CPUs: 4 B in ~6 us
 * against ~13 us going straight to futex and ~50 us after a 2 us spin).
 * With a CPU each, a rank also yields for up to 200 us after its spin
 * before it sleeps: two ranks whose sleeps and wakes put them on one CPU
 * (the kernel moves a woken task next to its waker, and two tasks that
 * take turns never look busy enough to be pulled apart) would otherwise
 * stay there, each op paying the spin and two switches (np 2, 4 B: p99
 * 130-180 us in 3 launches of 8 against ~1.3 us); a rank that yields
 * stays runnable, so the idle CPU takes one of them within the period.
 * Yielding stops while it does not pay (SHM_YIELD_TAKEN_NS): a training
 * step computing beside the waiting thread would otherwise take the CPU
 * for a whole time slice at each yield.
 * After each slice a sleeper checks the peers' pidfds (a pidfd polls
 * readable once the process exited, zombie or not), the abort record and
 * its deadline.
 * The deadline is a liveness bound, not a time limit: each wait for a
 * peer gets the operation's whole span, so a long operation whose peers
 * keep posting (a loaded host, a stopping and resuming process) finishes
 * however long it takes, and a frozen peer is given up on one span after
 * its last post.
 *
 * Failure is sticky: the first rank that sees one (a dead pid, a
 * deadline, mismatched alltoall sizes) records it in the header and wakes
 * every counter, so every rank's pending call fails at once with
 * KOLO_EPEER naming the culprit. A rank that destroys its struct coll
 * marks itself "left"; a peer that then waits for it fails (and spreads
 * the failure), while peers that need nothing more from it finish
 * normally.
 *
 * Knobs (environment, read once in create/attach):
 *   KOLO_SPIN_US     spin before sleeping, microseconds (default 30; at
 *                    least SHM_IDLE_SPIN_US on a thread with nothing else
 *                    to do; 0 never, the default when ranks outnumber
 *                    CPUs)
 *   KOLO_YIELD_US    then yield the CPU for up to this long before
 *                    sleeping (default 200; 100 when ranks outnumber CPUs)
 *   KOLO_SHM_CHUNK   pipeline chunk in bytes when slot_bytes is 0
 *                    (default SHM_CHUNK_DEFAULT); decided by the leader
 *   KOLO_SHM_SMALL   largest allreduce that takes the flat algorithm
 *                    (default SHM_SMALL_DEFAULT); decided by the leader
 */
#include "coll.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "reduce.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "transport.h"
#include "round.h"
#include "settings.h"
#include "util.h"

#define SHM_MAGIC   0x314c4f434d48534bULL /* "KSHMCOL1" */
#define SHM_VERSION 3u

/* Pipeline buffers per rank. Three are enough for every algorithm below
 * never to wait for a buffer (see the event orders); a fourth absorbs
 * jitter between ranks. */
#define SHM_NBUF 4
/* 256 KiB chunks: the chunk in flight (staged copies, results, the user's
 * input and output for it) stays in L2 while the next one streams in. */
#define SHM_CHUNK_DEFAULT (256u * 1024u)
#define SHM_CHUNK_MIN     4096u
#define SHM_SMALL_DEFAULT (16u * 1024u)
#define SHM_INLINE        24u
#define SHM_CTRL_BYTES    128u
/* Rank regions start this far apart modulo 4 KiB (17 cache lines). */
#define SHM_SKEW 1088u
/* Reductions over more than two sources run in blocks that fit L1, so
 * the partial result is re-read from L1 by each further source. */
#define SHM_BLOCK                   16384u
#define SHM_SLICE_MS                10u
/* The same when no peer can die apart from this process (ranks as
 * threads of it): nothing to look at but the deadline; an abort or a
 * peer that leaves wakes the sleepers itself. */
#define SHM_SLICE_UNWATCHED_MS      200u
#define SHM_SPIN_US_DEFAULT         30
/* A thread with nothing else to do (coll_thread_idle: a user thread
 * blocked in kolo_wait) on a rank with a CPU of its own spins at least
 * this long, longer than the wake-up of an idle virtual CPU (~75-150 us
 * on the 2-vCPU VMs measured here). With 30 us, one late post put a
 * waiter to sleep, its wake-up made the peer's next wait outlast the
 * spin too, and two ranks could go on waking each other at ~75 us an op
 * (np 2, 4 B: a ~75 us median in about one phase of a launch in three,
 * none in 18 launches spinning 250-1000 us). The background thread,
 * beside the user's compute, keeps the short spin. */
#define SHM_IDLE_SPIN_US            250
#define SHM_SPIN_US_OVERSUBSCRIBED  0
#define SHM_YIELD_US_DEFAULT        200
/* Crowded: long enough for a peer queued behind us to run its part (4 B
 * at np 4 on 2 CPUs: 11.6-12.8 us p50, 68-90 p99, against 9.9-14.3 and
 * 97-103 with 1000 us and 24-52 and ~150 with none), short enough not to
 * burn the CPU a computing peer needs (synthetic CNN, np 4: 370-388 img/s,
 * against 346-349 with 1000 us). */
#define SHM_YIELD_US_OVERSUBSCRIBED 100
/* Yielding pays while the rank we wait for posts within the window (a
 * peer queued behind us on our CPU, or one a few microseconds away). It
 * does not when the wait outlasts the window (a peer still computing: the
 * window only keeps this CPU looking busy, so the scheduler does not move
 * a computing thread onto it) or when a yield kept us off the CPU for
 * SHM_YIELD_TAKEN_NS (it went to a thread with work of its own, such as
 * the training step beside the rank's background thread, for a whole
 * time slice, ~1 ms, while the peer's post waited). After two such waits
 * in a row, waits go straight from their spin to sleep, whose FUTEX_WAKE
 * gets the CPU back at once; one wait in SHM_YIELD_PROBE yields again to
 * see whether that changed. (np 2 synthetic CNN on 2 CPUs, yielding every
 * time: ~500k sched_yield calls a rank in a 10 s launch, nearly all of them
 * with nobody else to run, and ~2 % of its CPU time in the kernel; with
 * this rule system time fell from 1.9 to 1.2-1.6 s a launch. 4 B at np 2
 * still runs at ~1.1 us p50, ~1.3 us p99.) */
#define SHM_YIELD_TAKEN_NS 200000u
#define SHM_YIELD_PROBE   64u

enum { SHM_STATE_FREE = 0, SHM_STATE_ATTACHED = 1, SHM_STATE_LEFT = 2 };

struct shm_header {
    _Atomic uint64_t magic; /* stored last by the creator */
    uint32_t version;
    uint32_t size;
    uint64_t total_bytes;
    uint64_t chunk_bytes; /* one pipeline buffer */
    uint64_t small_bytes; /* one flat-algorithm slot */
    uint64_t off_ctrl, off_small, off_buf;
    uint64_t small_stride, buf_stride; /* bytes between two ranks' regions */
    /* The abort record: a failing rank claims it, writes code and text,
     * then publishes the culprit (rank + 1). */
    _Atomic uint32_t abort_claim;
    _Atomic uint32_t abort_rank;
    int32_t abort_code;
    char abort_why[256];
};

struct shm_ctrl {
    _Atomic uint32_t events;   /* events posted (low 32 bits); futex word */
    _Atomic uint32_t sleepers; /* ranks in FUTEX_WAIT on events */
    _Atomic uint32_t state;    /* SHM_STATE_* */
    int32_t pid;
    unsigned char inl[2][SHM_INLINE];
    /* The rank's bell (coll.h: idle_wait): peers ring it when they start a
     * readiness round, its own threads when they have news; futex word. */
    _Atomic uint32_t bell;
    _Atomic uint32_t bell_sleepers;
    /* shmcoll_rearm's two steps: the generation this rank re-arms the
     * segment for (low 32 bits), once it is here and once it reset */
    _Atomic uint32_t arm;
    _Atomic uint32_t armed;
    unsigned char pad[SHM_CTRL_BYTES - 32 - 2 * SHM_INLINE];
};

_Static_assert(sizeof(struct shm_ctrl) == SHM_CTRL_BYTES, "control block size");

struct shmcoll {
    struct coll c;
    unsigned char *base;
    size_t map_bytes;
    struct shm_header *hdr;
    int me, n;
    size_t chunk, small;
    uint64_t ev;     /* events this rank posted, 64-bit */
    uint64_t *seen;  /* per rank: events known to be posted */
    uint64_t bufseq; /* pipeline buffers used so far, equal on all ranks */
    uint64_t buf_free_at[SHM_NBUF];
    uint64_t smallseq;
    uint64_t small_free_at[2];
    const unsigned char **srcs; /* n source pointers for a reduction */
    uint64_t *matrix;           /* n x n alltoall sizes, allocated on first use */
    size_t *off_a, *off_b;      /* n offsets each, for the v-collectives */
    /* peer watching */
    int *pidfd;
    pid_t *pid;
    struct pollfd *pfd;
    int *pfd_rank;
    int npfd;
    bool unwatched; /* no peer to watch: every one is a thread of this process */
    uint64_t spin_ns, idle_spin_ns, yield_ns;
    uint32_t want;      /* the event a busy peer wait looks for */
    uint32_t bell_want; /* the bell value a busy idle wait has seen */
    unsigned yield_misses, yield_skipped; /* waits in a row yields did not pay; skips since */
    /* Liveness, not a time limit: the span of the running operation's
     * deadline (shm_enter). Each wait for a peer gets the whole span, so an
     * operation may outlast it as long as the peers keep posting. */
    uint64_t window;
    bool creator, unlinked, claimed;
    char name[NAME_MAX + 2];
};

/* ------------------------------------------------------------------ small helpers */

static size_t round_up(size_t v, size_t to)
{
    return (v + to - 1) / to * to;
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

static void futex_wait(_Atomic uint32_t *word, uint32_t val, uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    /* Not FUTEX_PRIVATE: the word lives in a mapping shared between
     * processes, so the kernel must key it by the page, not the mm. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int pidfd_open_compat(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    return (int)syscall(434, pid, 0);
#endif
}

static inline struct shm_ctrl *ctrl_of(const struct shmcoll *s, int r)
{
    return (struct shm_ctrl *)(s->base + s->hdr->off_ctrl + (size_t)r * SHM_CTRL_BYTES);
}

static inline unsigned char *small_of(const struct shmcoll *s, int r, int parity)
{
    return s->base + s->hdr->off_small + (size_t)r * s->hdr->small_stride +
           (size_t)parity * s->small;
}

static inline unsigned char *buf_of(const struct shmcoll *s, int r, size_t i)
{
    return s->base + s->hdr->off_buf + (size_t)r * s->hdr->buf_stride + i * s->chunk;
}

/* Pipeline buffer that chunk k of the current operation uses: buffers
 * rotate across operations, so an operation starts on the one used
 * longest ago. bufseq advances identically on every rank. */
static inline size_t buf_index(const struct shmcoll *s, size_t k)
{
    return (size_t)((s->bufseq + k) % SHM_NBUF);
}

/* ------------------------------------------------------------------ failure */

static void wake_everyone(struct shmcoll *s)
{
    for (int r = 0; r < s->n; r++)
        futex_wake_all(&ctrl_of(s, r)->events);
}

/* shm_fail makes the failure sticky on this rank and, when publish is set,
 * records it in the segment (first failure wins) and wakes every sleeper
 * so the other ranks fail now rather than at their deadlines. culprit is
 * the rank the failure is blamed on. */
static int shm_fail(struct shmcoll *s, int code, int culprit, bool publish, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int shm_fail(struct shmcoll *s, int code, int culprit, bool publish, const char *fmt, ...)
{
    if (!s->c.failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->c.why, sizeof s->c.why, fmt, ap);
        va_end(ap);
        s->c.failed = code;
    }
    if (publish) {
        uint32_t zero = 0;
        if (atomic_compare_exchange_strong(&s->hdr->abort_claim, &zero, 1u)) {
            s->hdr->abort_code = code;
            str_copy(s->hdr->abort_why, s->c.why, sizeof s->hdr->abort_why);
            atomic_store_explicit(&s->hdr->abort_rank, (uint32_t)culprit + 1u,
                                  memory_order_release);
        }
        wake_everyone(s);
    }
    return s->c.failed;
}

/* shm_check_peers: 0 if every watched peer process is alive, else the
 * sticky KOLO_EPEER naming the first dead one. */
static int shm_check_peers(struct shmcoll *s)
{
    int dead = -1;
    if (s->npfd > 0 && poll(s->pfd, (nfds_t)s->npfd, 0) > 0) {
        for (int i = 0; i < s->npfd && dead < 0; i++)
            if (s->pfd[i].revents)
                dead = s->pfd_rank[i];
    }
    for (int r = 0; r < s->n && dead < 0; r++) {
        /* Peers without a pidfd (old kernels): kill(pid, 0) fails with
         * ESRCH only once the process is reaped, which the agent does
         * promptly. */
        if (r != s->me && s->pidfd && s->pidfd[r] < 0 && s->pid[r] > 0 && kill(s->pid[r], 0) < 0 &&
            errno == ESRCH)
            dead = r;
    }
    if (dead < 0)
        return 0;
    return shm_fail(s, KOLO_EPEER, dead, true, "rank %d (pid %d) exited", coll_name(&s->c, dead),
                    (int)s->pid[dead]);
}

/* shm_check_abort: the reason this rank may not wait for rank j any more
 * (an abort record, or j left), as a sticky error; 0 if none. */
static int shm_check_abort(struct shmcoll *s, int j)
{
    uint32_t culprit = atomic_load_explicit(&s->hdr->abort_rank, memory_order_acquire);
    if (culprit)
        return shm_fail(s, KOLO_EPEER, (int)culprit - 1, false, "%s", s->hdr->abort_why);
    if (atomic_load_explicit(&ctrl_of(s, j)->state, memory_order_acquire) == SHM_STATE_LEFT)
        return shm_fail(s, KOLO_EPEER, j, true, "rank %d left the collective group",
                        coll_name(&s->c, j));
    return 0;
}

/* shm_enter: whether a collective may start. A group where some rank
 * already failed starts nothing more, so that a late rank does not
 * finish an operation its peers gave up on. It also starts the
 * operation's liveness span (s->window) from its deadline (0: none). */
static inline int shm_enter(struct shmcoll *s, uint64_t deadline)
{
    uint64_t now = now_mono_ms_coarse(); /* the span is seconds long */
    s->window = !deadline ? 0 : deadline > now ? deadline - now : 1;
    if (s->c.failed)
        return s->c.failed;
    if (atomic_load_explicit(&s->hdr->abort_rank, memory_order_acquire))
        return shm_check_abort(s, s->me);
    return 0;
}

/* ------------------------------------------------------------------ events */

static inline bool reached(uint32_t have, uint32_t want)
{
    return (int32_t)(have - want) >= 0;
}

/* shm_post publishes one more event of this rank: everything it wrote
 * before is visible to whoever sees the new count. */
static inline void shm_post(struct shmcoll *s)
{
    struct shm_ctrl *me = ctrl_of(s, s->me);
    s->ev++;
    atomic_store_explicit(&me->events, (uint32_t)s->ev, memory_order_seq_cst);
    if (atomic_load_explicit(&me->sleepers, memory_order_seq_cst) != 0)
        futex_wake_all(&me->events);
}

static inline void note_seen(struct shmcoll *s, int j, uint32_t v)
{
    /* The segment keeps 32 bits; peers are never 2^31 events apart, so the
     * forward distance from what we knew extends it to 64 bits. */
    s->seen[j] += (uint32_t)(v - (uint32_t)s->seen[j]);
}

/*
 * shm_wait_slow sleeps until rank j posted event target. Each turn of the
 * loop re-reads the counter first, so a condition that became true is
 * never reported as a failure, then looks for reasons to stop (abort
 * record, j left, a dead peer process, the deadline), then sleeps on the
 * counter until a post wakes it or the slice ends.
 */
static int shm_wait_slow(struct shmcoll *s, int j, uint64_t target, uint64_t deadline)
{
    struct shm_ctrl *cj = ctrl_of(s, j);
    uint32_t want = (uint32_t)target;
    int rc = 0;
    s->c.waited = true;
    uint64_t start = now_mono_ms();
    uint64_t period = s->unwatched ? SHM_SLICE_UNWATCHED_MS : SHM_SLICE_MS;
    uint64_t next_check = start + period;
    /* the peers moved up to now: this wait gets the operation's whole span */
    if (deadline && s->window)
        deadline = start + s->window;

    coll_waiting(&s->c, j);
    atomic_fetch_add_explicit(&cj->sleepers, 1, memory_order_seq_cst);
    for (;;) {
        uint32_t v = atomic_load_explicit(&cj->events, memory_order_seq_cst);
        if (reached(v, want)) {
            note_seen(s, j, v);
            break;
        }
        if ((rc = shm_check_abort(s, j)) != 0)
            break;
        uint64_t now = now_mono_ms();
        if (now >= next_check) {
            if ((rc = shm_check_peers(s)) != 0)
                break;
            next_check = now + period;
        }
        if (deadline && now >= deadline) {
            rc = shm_fail(s, KOLO_ETIMEDOUT, s->me, true,
                          "rank %d timed out waiting for rank %d (no progress for %llu ms)",
                          coll_name(&s->c, s->me), coll_name(&s->c, j),
                          (unsigned long long)(deadline - start));
            break;
        }
        uint64_t slice = next_check - now;
        if (deadline && deadline - now < slice)
            slice = deadline - now;
        futex_wait(&cj->events, v, slice ? slice : 1);
    }
    atomic_fetch_sub_explicit(&cj->sleepers, 1, memory_order_seq_cst);
    coll_moved(&s->c);
    return rc;
}

/* Whether this wait yields before it sleeps: not while yields do not pay
 * (SHM_YIELD_TAKEN_NS), but now and then to look again. */
static inline bool yield_worth_trying(struct shmcoll *s)
{
    return s->yield_misses < 2 || ++s->yield_skipped % SHM_YIELD_PROBE == 0;
}

/* A failure recorded in the header, or rank j (-1: none) left: a busy
 * wait stops and its caller's slow path says why. */
static inline bool busy_wait_over(struct shmcoll *s, int j)
{
    return atomic_load_explicit(&s->hdr->abort_rank, memory_order_relaxed) ||
           (j >= 0 && atomic_load_explicit(&ctrl_of(s, j)->state, memory_order_relaxed) ==
                          SHM_STATE_LEFT);
}

/*
 * shm_busy_wait: true once done(s, arg) holds, within spin_ns and then
 * (if yield) this rank's yield window; false when they ran out (or
 * busy_wait_over), and the caller sleeps. Spinning: on dedicated cores
 * the awaited rank is usually a few hundred nanoseconds away, far cheaper
 * than a sleep and a wake; the clock and the header are looked at every
 * 64 pauses only.
 * Yielding: with more ranks than CPUs, the awaited rank is often queued
 * behind us on our own CPU, and a yield hands it the CPU at once without
 * a FUTEX_WAKE; with a CPU each, a yielding rank stays runnable, so a
 * post a little later than the spin (a timer tick, a thread waking on the
 * peer's CPU) is seen at once instead of after the wake-up of an idle
 * virtual CPU (~50-150 us on this kind of VM).
 */
static inline bool shm_busy_wait(struct shmcoll *s, int j, uint64_t spin_ns, bool yield,
                                 bool (*done)(struct shmcoll *, uintptr_t), uintptr_t arg)
{
    if (spin_ns) {
        uint64_t t0 = 0;
        for (unsigned i = 1;; i++) {
            cpu_relax();
            if (done(s, arg))
                return true;
            if ((i & 63) == 0) {
                s->c.waited = true;
                uint64_t t = now_mono_ns();
                if (!t0)
                    t0 = t;
                else if (t - t0 >= spin_ns)
                    break;
                if (busy_wait_over(s, j))
                    return false;
            }
        }
    }
    if (!yield || !s->yield_ns || !yield_worth_trying(s))
        return false;
    s->c.waited = true;
    uint64_t t0 = now_mono_ns(), t = t0;
    do {
        sched_yield();
        uint64_t t1 = now_mono_ns();
        bool taken = t1 - t >= SHM_YIELD_TAKEN_NS;
        t = t1;
        if (done(s, arg)) {
            s->yield_misses = taken ? s->yield_misses + 1 : 0;
            return true;
        }
        if (taken || busy_wait_over(s, j))
            break;
    } while (t - t0 < s->yield_ns);
    s->yield_misses++;
    return false;
}

/* The peer wait's condition: rank arg posted the event in s->want. */
static inline bool peer_posted(struct shmcoll *s, uintptr_t j)
{
    uint32_t v = atomic_load_explicit(&ctrl_of(s, (int)j)->events, memory_order_acquire);
    if (!reached(v, s->want))
        return false;
    note_seen(s, (int)j, v);
    return true;
}

/* shm_wait_peer: rank j posted event target. The common cases return
 * without touching j's cache line (already known) or after one load. */
static inline int shm_wait_peer(struct shmcoll *s, int j, uint64_t target, uint64_t deadline)
{
    if (s->seen[j] >= target)
        return 0;
    s->want = (uint32_t)target;
    uint64_t spin_ns = coll_thread_idle ? s->idle_spin_ns : s->spin_ns;
    if (peer_posted(s, (uintptr_t)j) || shm_busy_wait(s, j, spin_ns, true, peer_posted, (uintptr_t)j))
        return 0;
    return shm_wait_slow(s, j, target, deadline);
}

/* shm_wait_all: every other rank posted event target. */
static int shm_wait_all(struct shmcoll *s, uint64_t target, uint64_t deadline)
{
    for (int j = 0; j < s->n; j++) {
        if (j == s->me)
            continue;
        int rc = shm_wait_peer(s, j, target, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------ reductions */

/* reduce_sources: dst = srcs[0] OP srcs[1] OP ... OP srcs[n-1], always in
 * rank order so an element's result never depends on which rank computed
 * it. Blocks keep the partial result in L1 between sources. When copy_to
 * is set, each finished block is also copied there while still hot. */
static void reduce_sources(kolo_dtype dtype, kolo_op op, size_t es, unsigned char *dst,
                           const unsigned char *const *srcs, int n, size_t count,
                           unsigned char *copy_to)
{
    size_t step = n > 2 || copy_to ? SHM_BLOCK / es : count;
    for (size_t i = 0; i < count; i += step) {
        size_t m = min_size(step, count - i);
        size_t o = i * es;
        reduce_two(dtype, op, dst + o, srcs[0] + o, srcs[1] + o, m);
        for (int j = 2; j < n; j++)
            reduce_into(dtype, op, dst + o, srcs[j] + o, m);
        if (copy_to)
            memcpy(copy_to + o, dst + o, m * es);
    }
}

/* part_of: rank j's share of a chunk of len elements: consecutive, whole
 * cache lines (align elements) except at the end, possibly empty. */
static inline void part_of(size_t len, int n, int j, size_t align, size_t *off, size_t *cnt)
{
    size_t per = round_up((len + (size_t)n - 1) / (size_t)n, align);
    size_t o = min_size(per * (size_t)j, len);
    *off = o;
    *cnt = min_size(o + per, len) - o;
}

/* ------------------------------------------------------------------ allreduce */

/*
 * Flat allreduce for small buffers: each rank copies its input into its
 * small slot (inline in its control block for up to SHM_INLINE bytes, so
 * data and counter share one cache line), posts one event, waits for every
 * other rank's event, and reduces all slots itself in rank order. Every
 * rank computes the same bits from the same inputs in the same order, and
 * there is only one synchronisation. Slots alternate by parity: by the
 * time a rank reuses one, the small operation in between made it wait for
 * every peer's next event, which they post only after reading.
 */
static int allreduce_flat(struct shmcoll *s, kolo_dtype dtype, kolo_op op, size_t es,
                          const void *in, void *out, size_t count, uint64_t deadline)
{
    size_t bytes = count * es;
    int p = (int)(s->smallseq++ & 1);
    bool inl = bytes <= SHM_INLINE;
    int rc = shm_wait_all(s, s->small_free_at[p], deadline);
    if (rc)
        return rc;
    unsigned char *mine = inl ? ctrl_of(s, s->me)->inl[p] : small_of(s, s->me, p);
    memcpy(mine, in, bytes);
    shm_post(s);
    uint64_t e = s->ev;
    s->small_free_at[p] = e + 1;
    if ((rc = shm_wait_all(s, e, deadline)) != 0)
        return rc;
    for (int j = 0; j < s->n; j++)
        s->srcs[j] = inl ? ctrl_of(s, j)->inl[p] : small_of(s, j, p);
    reduce_sources(dtype, op, es, out, s->srcs, s->n, count, NULL);
    return 0;
}

/* Stage chunk k: copy the parts other ranks own into this rank's buffer. */
static int allreduce_stage(struct shmcoll *s, size_t es, const unsigned char *in, size_t count,
                           size_t k, uint64_t free_at, uint64_t deadline)
{
    const size_t per_chunk = s->chunk / es, c0 = k * per_chunk;
    const size_t len = min_size(per_chunk, count - c0), bi = buf_index(s, k);
    int rc = shm_wait_all(s, s->buf_free_at[bi], deadline);
    if (rc)
        return rc;
    unsigned char *mine = buf_of(s, s->me, bi);
    for (int j = 0; j < s->n; j++) {
        size_t off, cnt;
        part_of(len, s->n, j, 64 / es, &off, &cnt);
        if (j != s->me && cnt)
            memcpy(mine + off * es, in + (c0 + off) * es, cnt * es);
    }
    s->buf_free_at[bi] = free_at;
    return 0;
}

/* Out of place, results at least this large go out by streaming stores:
 * at 64 MiB np 2 (Xeon VM) 15.2 -> 11.6 ms; at 16 MiB, where the output
 * still fits in the cache, plain stores were 5 % faster. (The L3 size a
 * VM reports says little: 480 MiB here, shared with other guests.) */
#ifndef SHM_STREAM_MIN
#define SHM_STREAM_MIN (32u << 20)
#endif

/*
 * copy_out writes part of an allreduce's result into an output buffer that
 * is not its input. With plain stores the CPU first reads every line it
 * writes into (a line is filled before it is modified): for an output
 * nobody read, a third pass over memory on top of reading the input and
 * writing the output, which made a large allreduce out of place ~1.5x as
 * slow as in place. Streaming stores skip that read (and leave the lines
 * out of the cache, where a large result does not fit anyway); the caller
 * fences once after the last one (copy_out_fence). Without `stream`, a
 * plain memcpy.
 */
static void copy_out(void *dst, const void *src, size_t n, bool stream)
{
    if (!stream) {
        memcpy(dst, src, n);
        return;
    }
#if defined(__SSE2__)
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (n < 256 + head) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
#else
    memcpy(dst, src, n);
#endif
}

/* Orders the streaming stores before what follows (the op's completion). */
static void copy_out_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/*
 * Pipelined allreduce. The buffer is cut into chunks of one pipeline
 * buffer; each chunk into n cache-line-aligned parts, part j owned by
 * rank j. For chunk k every rank
 *   stage:  copies the parts it does not own into its buffer for k;
 *   reduce: reduces its own part from every rank's staged copy (its own
 *           input directly), in rank order, into its own part of its
 *           buffer, and copies the result to its output;
 *   copy:   copies every other rank's reduced part to its output.
 * Each step is followed by a post; the three waits (all staged k, all
 * reduced k) sit after other work: a rank stages k+1 while the others
 * finish reducing k, and copies k out while they stage k+1. Everything
 * but the input and output touches a few chunks of the segment, so it
 * stays in cache, and each rank reads and writes its own buffers from
 * memory exactly once.
 *
 * Event order per rank, relative to base: S0=1; then for each k:
 * R(k)=3k+2, S(k+1)=3k+3 (posted even past the last chunk, for a regular
 * count), C(k)=3k+4. Buffer B(k) is free again once every rank posted
 * C(k). It is next written for chunk k+SHM_NBUF, after this rank saw
 * S(k+3) from everyone, which each posts after its C(k): so with three
 * buffers or more the pipeline never waits for a buffer.
 */
static int allreduce_chunked(struct shmcoll *s, kolo_dtype dtype, kolo_op op, size_t es,
                             const unsigned char *in, unsigned char *out, size_t count,
                             uint64_t deadline)
{
    const int n = s->n, me = s->me;
    const size_t per_chunk = s->chunk / es, align = 64 / es;
    const size_t nchunks = (count + per_chunk - 1) / per_chunk;
    const uint64_t base = s->ev;
    /* out of place and large: the result goes out by streaming stores */
    const bool stream = in != out && count * es >= SHM_STREAM_MIN;
    int rc;

    if ((rc = allreduce_stage(s, es, in, count, 0, base + 4, deadline)) != 0)
        return rc;
    shm_post(s); /* S(0) */
    for (size_t k = 0; k < nchunks; k++) {
        size_t c0 = k * per_chunk, len = min_size(per_chunk, count - c0);
        size_t bi = buf_index(s, k), off, cnt;

        /* Reduce this rank's part of chunk k. */
        if ((rc = shm_wait_all(s, base + (k == 0 ? 1 : 3 * k), deadline)) != 0)
            return rc;
        part_of(len, n, me, align, &off, &cnt);
        if (cnt) {
            for (int j = 0; j < n; j++)
                s->srcs[j] = j == me ? in + (c0 + off) * es : buf_of(s, j, bi) + off * es;
            unsigned char *mine = buf_of(s, me, bi) + off * es;
            reduce_sources(dtype, op, es, mine, s->srcs, n, cnt,
                           stream ? NULL : out + (c0 + off) * es);
            if (stream) /* from the cache, where the reduction just left it */
                copy_out(out + (c0 + off) * es, mine, cnt * es, true);
        }
        shm_post(s); /* R(k) */

        /* Stage chunk k+1 while the others finish reducing k. */
        if (k + 1 < nchunks &&
            (rc = allreduce_stage(s, es, in, count, k + 1, base + 3 * (k + 1) + 4, deadline)))
            return rc;
        shm_post(s); /* S(k+1) */

        /* Copy the other ranks' reduced parts of chunk k out. */
        if ((rc = shm_wait_all(s, base + 3 * k + 2, deadline)) != 0)
            return rc;
        for (int j = 0; j < n; j++) {
            part_of(len, n, j, align, &off, &cnt);
            if (j != me && cnt)
                copy_out(out + (c0 + off) * es, buf_of(s, j, bi) + off * es, cnt * es, stream);
        }
        shm_post(s); /* C(k) */
    }
    if (stream)
        copy_out_fence();
    s->bufseq += nchunks;
    return 0;
}

static int shm_allreduce(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in, void *out,
                         size_t count, uint64_t deadline)
{
    struct shmcoll *s = (struct shmcoll *)c;
    int erc = shm_enter(s, deadline);
    if (erc)
        return erc;
    size_t es = kolo_dtype_size(dtype);
    if (!es || (unsigned)op >= KOLO_OP_COUNT || count > SIZE_MAX / es)
        return KOLO_EINVAL;
    if (count == 0)
        return 0;
    if (s->n == 1) {
        if (in != out)
            memmove(out, in, count * es);
        return 0;
    }
    if (count * es <= s->small)
        return allreduce_flat(s, dtype, op, es, in, out, count, deadline);
    return allreduce_chunked(s, dtype, op, es, in, out, count, deadline);
}

/* ------------------------------------------------------------------ allgatherv */

/*
 * Each rank streams its contribution through its own pipeline buffers,
 * one chunk-sized piece at a time, and every rank copies every other
 * rank's piece k to its place in the output. A rank writes piece k+1
 * before it waits for the others' piece k, so writing overlaps their
 * progress. Contributions may differ in size: the number of pieces is set
 * by the largest, and a rank with nothing left still posts its events.
 *
 * Event order, relative to base: W0=1; then for each k: W(k+1)=2k+2,
 * C(k)=2k+3. Buffer B(k) is free once every rank posted C(k).
 */
static int allgather_write(struct shmcoll *s, const unsigned char *in, size_t bytes, size_t k,
                           uint64_t free_at, uint64_t deadline)
{
    size_t lo = k * s->chunk;
    size_t bi = buf_index(s, k);
    if (lo < bytes) {
        int rc = shm_wait_all(s, s->buf_free_at[bi], deadline);
        if (rc)
            return rc;
        memcpy(buf_of(s, s->me, bi), in + lo, min_size(s->chunk, bytes - lo));
        s->buf_free_at[bi] = free_at;
    }
    return 0;
}

static int shm_allgatherv(struct coll *c, const void *in_, void *out_, const size_t *bytes,
                          uint64_t deadline)
{
    struct shmcoll *s = (struct shmcoll *)c;
    const unsigned char *in = in_;
    unsigned char *out = out_;
    int erc = shm_enter(s, deadline);
    if (erc)
        return erc;
    if (!bytes)
        return KOLO_EINVAL;
    size_t my_off = 0, most = 0;
    for (int j = 0; j < s->n; j++) {
        if (j < s->me)
            my_off += bytes[j];
        if (bytes[j] > most)
            most = bytes[j];
    }
    if (bytes[s->me] && in != out + my_off)
        memmove(out + my_off, in, bytes[s->me]);
    size_t npieces = (most + s->chunk - 1) / s->chunk;
    if (s->n == 1 || npieces == 0)
        return 0;

    const uint64_t base = s->ev;
    int rc = allgather_write(s, in, bytes[s->me], 0, base + 3, deadline);
    if (rc)
        return rc;
    shm_post(s); /* W(0) */
    for (size_t k = 0; k < npieces; k++) {
        if (k + 1 < npieces &&
            (rc = allgather_write(s, in, bytes[s->me], k + 1, base + 2 * (k + 1) + 3, deadline)))
            return rc;
        shm_post(s); /* W(k+1) */
        if ((rc = shm_wait_all(s, base + (k == 0 ? 1 : 2 * k), deadline)) != 0)
            return rc;
        size_t off = 0, lo = k * s->chunk, bi = buf_index(s, k);
        for (int j = 0; j < s->n; j++) {
            if (j != s->me && lo < bytes[j])
                memcpy(out + off + lo, buf_of(s, j, bi), min_size(s->chunk, bytes[j] - lo));
            off += bytes[j];
        }
        shm_post(s); /* C(k) */
    }
    s->bufseq += npieces;
    return 0;
}

/* ------------------------------------------------------------------ broadcast */

/*
 * The root streams the buffer through its pipeline buffers; the others
 * copy each chunk out as soon as the root posted it. Every rank posts one
 * event per chunk (the root: written; the others: copied), so buffer B(k)
 * is free once everyone posted event k+1, and the root runs up to
 * SHM_NBUF chunks ahead of the slowest reader.
 */
static int shm_broadcast(struct coll *c, void *buf_, size_t bytes, int root, uint64_t deadline)
{
    struct shmcoll *s = (struct shmcoll *)c;
    unsigned char *buf = buf_;
    int erc = shm_enter(s, deadline);
    if (erc)
        return erc;
    if (root < 0 || root >= s->n)
        return KOLO_EINVAL;
    size_t nchunks = (bytes + s->chunk - 1) / s->chunk;
    if (s->n == 1 || nchunks == 0)
        return 0;
    const uint64_t base = s->ev;
    int rc;
    for (size_t k = 0; k < nchunks; k++) {
        size_t lo = k * s->chunk, len = min_size(s->chunk, bytes - lo), bi = buf_index(s, k);
        if (s->me == root) {
            if ((rc = shm_wait_all(s, s->buf_free_at[bi], deadline)) != 0)
                return rc;
            memcpy(buf_of(s, root, bi), buf + lo, len);
            s->buf_free_at[bi] = base + k + 1;
        } else {
            if ((rc = shm_wait_peer(s, root, base + k + 1, deadline)) != 0)
                return rc;
            memcpy(buf + lo, buf_of(s, root, bi), len);
        }
        shm_post(s);
    }
    s->bufseq += nchunks;
    return 0;
}

/* ------------------------------------------------------------------ alltoallv */

/*
 * A rank knows only its own row and column of the size matrix, but every
 * rank must agree on the number of pipeline steps. So first every rank
 * publishes its send sizes in a small slot (one event, one wait), which
 * also lets each rank check that what the others send it matches what it
 * expects. Then, as allgatherv, but each pipeline buffer is cut into n
 * sub-areas of q bytes, sub-area j carrying the next piece for rank j.
 *
 * Event order, relative to base (after the size exchange): W0=1; then for
 * each k: W(k+1)=2k+2, C(k)=2k+3.
 */
static int alltoall_write(struct shmcoll *s, const unsigned char *in, const size_t *send,
                          const size_t *soff, size_t q, size_t k, uint64_t free_at,
                          uint64_t deadline)
{
    size_t lo = k * q, bi = buf_index(s, k);
    bool any = false;
    for (int j = 0; j < s->n; j++)
        any |= j != s->me && lo < send[j];
    if (!any)
        return 0;
    int rc = shm_wait_all(s, s->buf_free_at[bi], deadline);
    if (rc)
        return rc;
    unsigned char *mine = buf_of(s, s->me, bi);
    for (int j = 0; j < s->n; j++)
        if (j != s->me && lo < send[j])
            memcpy(mine + (size_t)j * q, in + soff[j] + lo, min_size(q, send[j] - lo));
    s->buf_free_at[bi] = free_at;
    return 0;
}

static int shm_alltoallv(struct coll *c, const void *in_, const size_t *send, void *out_,
                         const size_t *recv, uint64_t deadline)
{
    struct shmcoll *s = (struct shmcoll *)c;
    const unsigned char *in = in_;
    unsigned char *out = out_;
    const int n = s->n, me = s->me;
    int erc = shm_enter(s, deadline);
    if (erc)
        return erc;
    if (!send || !recv)
        return KOLO_EINVAL;
    if (n == 1) {
        if (send[0] != recv[0])
            return KOLO_EMISMATCH;
        if (send[0] && in != out)
            memmove(out, in, send[0]);
        return 0;
    }

    if (!s->matrix && !(s->matrix = calloc((size_t)n * (size_t)n, sizeof *s->matrix)))
        return KOLO_ENOMEM;
    /* Size exchange through the small slots (parity as in allreduce). */
    int p = (int)(s->smallseq++ & 1), rc;
    if ((rc = shm_wait_all(s, s->small_free_at[p], deadline)) != 0)
        return rc;
    uint64_t *row = (uint64_t *)small_of(s, me, p);
    for (int j = 0; j < n; j++)
        row[j] = send[j];
    shm_post(s);
    uint64_t e = s->ev;
    s->small_free_at[p] = e + 1;
    if ((rc = shm_wait_all(s, e, deadline)) != 0)
        return rc;
    uint64_t most = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t *r = (const uint64_t *)small_of(s, i, p);
        for (int j = 0; j < n; j++) {
            s->matrix[(size_t)i * n + j] = r[j];
            if (i != j && r[j] > most)
                most = r[j];
        }
    }
    for (int j = 0; j < n; j++) {
        if (s->matrix[(size_t)j * n + me] != recv[j])
            return shm_fail(s, KOLO_EMISMATCH, me, true,
                            "alltoall: rank %d sends %llu bytes to rank %d, which expects %zu",
                            coll_name(&s->c, j), (unsigned long long)s->matrix[(size_t)j * n + me],
                            coll_name(&s->c, me), recv[j]);
    }

    size_t *soff = s->off_a, *roff = s->off_b;
    soff[0] = roff[0] = 0;
    for (int j = 1; j < n; j++) {
        soff[j] = soff[j - 1] + send[j - 1];
        roff[j] = roff[j - 1] + recv[j - 1];
    }
    if (send[me] && in + soff[me] != out + roff[me])
        memmove(out + roff[me], in + soff[me], send[me]);

    size_t q = s->chunk / (size_t)n / 64 * 64;
    size_t npieces = (size_t)((most + q - 1) / q);
    if (npieces == 0)
        return 0;
    const uint64_t base = s->ev;
    if ((rc = alltoall_write(s, in, send, soff, q, 0, base + 3, deadline)) != 0)
        return rc;
    shm_post(s); /* W(0) */
    for (size_t k = 0; k < npieces; k++) {
        if (k + 1 < npieces &&
            (rc = alltoall_write(s, in, send, soff, q, k + 1, base + 2 * (k + 1) + 3, deadline)))
            return rc;
        shm_post(s); /* W(k+1) */
        if ((rc = shm_wait_all(s, base + (k == 0 ? 1 : 2 * k), deadline)) != 0)
            return rc;
        size_t lo = k * q, bi = buf_index(s, k);
        for (int j = 0; j < n; j++)
            if (j != me && lo < recv[j])
                memcpy(out + roff[j] + lo, buf_of(s, j, bi) + (size_t)me * q,
                       min_size(q, recv[j] - lo));
        shm_post(s); /* C(k) */
    }
    s->bufseq += npieces;
    return 0;
}

/* ------------------------------------------------------------------ reducescatter */

/*
 * Like the pipelined allreduce without its last step: rank j's segment is
 * cut into pieces of q elements; in step k every rank stages piece k of
 * every segment it does not own into sub-area j of its buffer, and the
 * owner reduces piece k of its segment, in rank order, straight into its
 * output. A rank stages k+1 before waiting for everyone's k.
 *
 * Event order, relative to base: S0=1; then for each k: S(k+1)=2k+2,
 * R(k)=2k+3. Buffer B(k) is free once every rank posted R(k).
 */
static int rs_stage(struct shmcoll *s, size_t es, const unsigned char *in, const size_t *counts,
                    const size_t *seg, size_t q, size_t k, uint64_t free_at, uint64_t deadline)
{
    size_t lo = k * q, bi = buf_index(s, k);
    bool any = false;
    for (int j = 0; j < s->n; j++)
        any |= j != s->me && lo < counts[j];
    if (!any)
        return 0;
    int rc = shm_wait_all(s, s->buf_free_at[bi], deadline);
    if (rc)
        return rc;
    unsigned char *mine = buf_of(s, s->me, bi);
    for (int j = 0; j < s->n; j++)
        if (j != s->me && lo < counts[j])
            memcpy(mine + (size_t)j * q * es, in + (seg[j] + lo) * es,
                   min_size(q, counts[j] - lo) * es);
    s->buf_free_at[bi] = free_at;
    return 0;
}

static int shm_reducescatter(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in_,
                             void *out_, const size_t *counts, uint64_t deadline)
{
    struct shmcoll *s = (struct shmcoll *)c;
    const unsigned char *in = in_;
    unsigned char *out = out_;
    const int n = s->n, me = s->me;
    int erc = shm_enter(s, deadline);
    if (erc)
        return erc;
    size_t es = kolo_dtype_size(dtype);
    if (!es || (unsigned)op >= KOLO_OP_COUNT || !counts)
        return KOLO_EINVAL;
    size_t *seg = s->off_a, most = 0;
    seg[0] = 0;
    for (int j = 0; j < n; j++) {
        if (j > 0)
            seg[j] = seg[j - 1] + counts[j - 1];
        if (counts[j] > most)
            most = counts[j];
    }
    if (n == 1) {
        if (counts[0] && in != out)
            memmove(out, in, counts[0] * es);
        return 0;
    }
    size_t q = s->chunk / (size_t)n / 64 * 64 / es;
    size_t npieces = (most + q - 1) / q;
    if (npieces == 0)
        return 0;

    const uint64_t base = s->ev;
    int rc = rs_stage(s, es, in, counts, seg, q, 0, base + 3, deadline);
    if (rc)
        return rc;
    shm_post(s); /* S(0) */
    for (size_t k = 0; k < npieces; k++) {
        if (k + 1 < npieces &&
            (rc = rs_stage(s, es, in, counts, seg, q, k + 1, base + 2 * (k + 1) + 3, deadline)))
            return rc;
        shm_post(s); /* S(k+1) */
        if ((rc = shm_wait_all(s, base + (k == 0 ? 1 : 2 * k), deadline)) != 0)
            return rc;
        size_t lo = k * q, bi = buf_index(s, k);
        if (lo < counts[me]) {
            for (int j = 0; j < n; j++)
                s->srcs[j] =
                    j == me ? in + (seg[me] + lo) * es : buf_of(s, j, bi) + (size_t)me * q * es;
            /* Output over this rank's own input (hier.c reduces in place):
             * past the first two sources, rank order would read it after
             * the first write. The piece's slot in this rank's own buffer
             * (never staged: rs_stage skips j == me) takes the blocks,
             * each copied out while hot, after its source was read. */
            unsigned char *dst = out + lo * es;
            bool alias = me >= 2 && dst == s->srcs[me];
            reduce_sources(dtype, op, es, alias ? buf_of(s, me, bi) + (size_t)me * q * es : dst,
                           s->srcs, n, min_size(q, counts[me] - lo), alias ? dst : NULL);
        }
        shm_post(s); /* R(k) */
    }
    s->bufseq += npieces;
    return 0;
}

/* ------------------------------------------------------------------ readiness rounds */

static void bell_ring_rank(struct shmcoll *s, int r)
{
    struct shm_ctrl *cr = ctrl_of(s, r);
    atomic_fetch_add_explicit(&cr->bell, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&cr->bell_sleepers, memory_order_seq_cst) != 0)
        futex_wake_all(&cr->bell);
}

/* Rings peer r's bell after this rank posted a round's event (its
 * seq_cst store): only when r sleeps on it. An idle wait that is not
 * asleep yet sees the event itself (idle_news: a peer started), and one
 * that registers as a sleeper after this load does so after the store,
 * so its last look before FUTEX_WAIT sees the event (shm_idle_wait); a
 * sleeper seen here gets the bell. Not writing the peer's line keeps
 * it there: ringing always cost an ownership transfer on the path of
 * every round (~12% of the exchange's time at np 2, 4 B). */
static void bell_ring_peer(struct shmcoll *s, int r)
{
    struct shm_ctrl *cr = ctrl_of(s, r);
    if (atomic_load_explicit(&cr->bell_sleepers, memory_order_seq_cst) != 0) {
        atomic_fetch_add_explicit(&cr->bell, 1, memory_order_seq_cst);
        futex_wake_all(&cr->bell);
    }
}

/*
 * A readiness round is the flat allreduce of a vector of 64-bit words,
 * with round_reduce (negotiation/round.h) for the reduction: one post,
 * one wait for every peer, every rank reducing all slots itself. After
 * its post a rank rings the bell of every peer that sleeps on it, so a
 * peer that sits idle (no collective of its own to run) wakes up and
 * takes part at once (bell_ring_peer).
 */
static int shm_round(struct coll *c, uint64_t *vec, size_t nwords, uint64_t deadline)
{
    struct shmcoll *s = (struct shmcoll *)c;
    int erc = shm_enter(s, deadline);
    if (erc)
        return erc;
    size_t bytes = nwords * sizeof(uint64_t);
    if (!vec || nwords < ROUND_HDR || bytes > s->small)
        return KOLO_EINVAL;
    if (s->n == 1)
        return 0;
    int p = (int)(s->smallseq++ & 1);
    bool inl = bytes <= SHM_INLINE;
    int rc = shm_wait_all(s, s->small_free_at[p], deadline);
    if (rc)
        return rc;
    memcpy(inl ? ctrl_of(s, s->me)->inl[p] : small_of(s, s->me, p), vec, bytes);
    shm_post(s);
    uint64_t e = s->ev;
    s->small_free_at[p] = e + 1;
    for (int j = 0; j < s->n; j++)
        if (j != s->me)
            bell_ring_peer(s, j);
    if ((rc = shm_wait_all(s, e, deadline)) != 0)
        return rc;
    /* in rank order on every rank (our own slot still holds our vector),
     * so a floating-point payload sums to the same bits everywhere */
    for (int j = 0; j < s->n; j++) {
        const void *slot = inl ? (const void *)ctrl_of(s, j)->inl[p] : small_of(s, j, p);
        if (j == 0)
            memcpy(vec, slot, bytes);
        else
            round_reduce(vec, slot, nwords, coll_round_pay);
    }
    return 0;
}

/* Between collectives every rank has posted the same number of events, so
 * a peer that posted more has started the next one. */
static bool shm_peer_started(struct coll *c)
{
    struct shmcoll *s = (struct shmcoll *)c;
    uint32_t next = (uint32_t)(s->ev + 1);
    for (int j = 0; j < s->n; j++)
        if (j != s->me &&
            reached(atomic_load_explicit(&ctrl_of(s, j)->events, memory_order_acquire), next))
            return true;
    return false;
}

static uint64_t shm_bell_seen(struct coll *c)
{
    struct shmcoll *s = (struct shmcoll *)c;
    return atomic_load_explicit(&ctrl_of(s, s->me)->bell, memory_order_seq_cst);
}

static void shm_bell_ring(struct coll *c)
{
    struct shmcoll *s = (struct shmcoll *)c;
    bell_ring_rank(s, s->me);
}

static bool idle_news(struct shmcoll *s, uint32_t seen)
{
    return atomic_load_explicit(&ctrl_of(s, s->me)->bell, memory_order_acquire) != seen ||
           shm_peer_started(&s->c);
}

/* The idle wait's condition: the bell rang past s->bell_want, or a peer
 * started a collective. */
static inline bool idle_news_hot(struct shmcoll *s, uintptr_t unused)
{
    (void)unused;
    return idle_news(s, s->bell_want);
}

/* Spins when asked to (a user thread blocked in kolo_wait, with nothing
 * else to do; not at all when ranks outnumber CPUs), then sleeps on this
 * rank's bell. Without spin (the background thread, beside the user's
 * compute) it sleeps at once. It does not yield: an idle wait is often
 * long (the peers compute), and yields that do not pay would turn off the
 * peer waits' yields (yield_worth_trying). A failure of the group shows
 * at the next collective, as without rounds. */
static int shm_idle_wait(struct coll *c, uint64_t seen64, int timeout_ms, bool spin)
{
    struct shmcoll *s = (struct shmcoll *)c;
    struct shm_ctrl *me = ctrl_of(s, s->me);
    uint32_t seen = (uint32_t)seen64;
    if (s->c.failed)
        return -s->c.failed;
    if (idle_news(s, seen))
        return 1;
    s->bell_want = seen;
    if (spin && shm_busy_wait(s, -1, s->idle_spin_ns, false, idle_news_hot, 0))
        return 1;
    if (timeout_ms <= 0)
        return 0;
    atomic_fetch_add_explicit(&me->bell_sleepers, 1, memory_order_seq_cst);
    /* The last look (acquire loads) after the registration, in every
     * memory model: a peer that posted before it saw no sleeper and rang
     * no bell (bell_ring_peer), so this look must see its post. */
    atomic_thread_fence(memory_order_seq_cst);
    int news = idle_news(s, seen);
    if (!news) {
        futex_wait(&me->bell, seen, (uint64_t)timeout_ms);
        news = idle_news(s, seen);
    }
    atomic_fetch_sub_explicit(&me->bell_sleepers, 1, memory_order_seq_cst);
    return news;
}

/* ------------------------------------------------------------------ barrier */

static int shm_barrier(struct coll *c, uint64_t deadline)
{
    struct shmcoll *s = (struct shmcoll *)c;
    int erc = shm_enter(s, deadline);
    if (erc)
        return erc;
    if (s->n == 1)
        return 0;
    shm_post(s);
    return shm_wait_all(s, s->ev, deadline);
}

/* ------------------------------------------------------------------ lifetime */

static void shm_unlink_name(struct shmcoll *s)
{
    if (!s->unlinked) {
        shm_unlink(s->name); /* ENOENT: another rank was first */
        s->unlinked = true;
    }
}

static void shm_destroy(struct coll *c)
{
    struct shmcoll *s = (struct shmcoll *)c;
    if (!s)
        return;
    if (s->claimed) {
        /* Peers still waiting for this rank must not wait in vain. */
        struct shm_ctrl *me = ctrl_of(s, s->me);
        atomic_store_explicit(&me->state, SHM_STATE_LEFT, memory_order_release);
        futex_wake_all(&me->events);
    }
    if (s->creator)
        shm_unlink_name(s);
    if (s->base)
        munmap(s->base, s->map_bytes);
    if (s->pidfd)
        for (int r = 0; r < s->n; r++)
            if (s->pidfd[r] >= 0)
                close(s->pidfd[r]);
    free(s->pidfd);
    free(s->pid);
    free(s->pfd);
    free(s->pfd_rank);
    free(s->seen);
    free(s->srcs);
    free(s->matrix);
    free(s->off_a);
    free(s->off_b);
    free(s);
}

static struct coll *shm_keep_segment(struct coll *c);

static const struct coll_ops shm_ops = {
    .name = "shm",
    .allreduce = shm_allreduce,
    .allgatherv = shm_allgatherv,
    .broadcast = shm_broadcast,
    .alltoallv = shm_alltoallv,
    .reducescatter = shm_reducescatter,
    .barrier = shm_barrier,
    .destroy = shm_destroy,
    .keep_segment = shm_keep_segment,
    .round = shm_round,
    .peer_started = shm_peer_started,
    .bell_seen = shm_bell_seen,
    .bell_ring = shm_bell_ring,
    .idle_wait = shm_idle_wait,
};

/* The segment's layout for n ranks, computed by the creator and stored in
 * the header; attachers only read it. */
static void shm_layout(struct shm_header *h, int n, size_t chunk, size_t small)
{
    h->size = (uint32_t)n;
    h->chunk_bytes = chunk;
    h->small_bytes = small;
    h->off_ctrl = round_up(sizeof *h, SHM_CTRL_BYTES);
    h->off_small = round_up(h->off_ctrl + (size_t)n * SHM_CTRL_BYTES, 4096);
    h->small_stride = 2 * small + SHM_SKEW;
    h->off_buf = round_up(h->off_small + (size_t)n * h->small_stride, 4096);
    h->buf_stride = SHM_NBUF * chunk + SHM_SKEW;
    h->total_bytes = round_up(h->off_buf + (size_t)n * h->buf_stride, 4096);
}

/* How a wait spins and yields, for ranks sharing this machine's CPUs
 * (KOLO_SPIN_US, KOLO_YIELD_US): with more ranks than CPUs, no spin. */
static void wait_knobs(struct shmcoll *s, int ranks)
{
    bool crowded = ranks > usable_cpus();
    int64_t spin = settings_int(SET_SPIN_US, crowded ? SHM_SPIN_US_OVERSUBSCRIBED : SHM_SPIN_US_DEFAULT);
    int64_t yield = settings_int(SET_YIELD_US, crowded ? SHM_YIELD_US_OVERSUBSCRIBED : SHM_YIELD_US_DEFAULT);
    s->spin_ns = (uint64_t)spin * 1000u;
    /* KOLO_SPIN_US=0 (or crowded) spins on no thread */
    s->idle_spin_ns = crowded || spin == 0
                          ? s->spin_ns
                          : (uint64_t)(spin > SHM_IDLE_SPIN_US ? spin : SHM_IDLE_SPIN_US) * 1000u;
    s->yield_ns = (uint64_t)yield * 1000u;
}

/* shm_new allocates this rank's private state; the segment comes later. */
static int shm_new(const char *name, int rank, int size, struct shmcoll **out)
{
    *out = NULL;
    if (!name || !*name || rank < 0 || size < 1 || rank >= size || size > 4096)
        return KOLO_EINVAL;
    struct shmcoll *s = calloc(1, sizeof *s);
    if (!s)
        return KOLO_ENOMEM;
    s->c.ops = &shm_ops;
    s->c.can_round = true;
    s->c.tracks_waits = true;
    s->c.rank = s->me = rank;
    s->c.size = s->n = size;
    if (name[0] == '/')
        str_copy(s->name, name, sizeof s->name);
    else
        snprintf(s->name, sizeof s->name, "/%s", name);
    s->seen = calloc((size_t)size, sizeof *s->seen);
    s->srcs = calloc((size_t)size, sizeof *s->srcs);
    s->off_a = calloc((size_t)size, sizeof *s->off_a);
    s->off_b = calloc((size_t)size, sizeof *s->off_b);
    s->pidfd = malloc((size_t)size * sizeof *s->pidfd);
    s->pid = calloc((size_t)size, sizeof *s->pid);
    s->pfd = calloc((size_t)size, sizeof *s->pfd);
    s->pfd_rank = calloc((size_t)size, sizeof *s->pfd_rank);
    if (!s->seen || !s->srcs || !s->off_a || !s->off_b || !s->pidfd || !s->pid || !s->pfd ||
        !s->pfd_rank) {
        shm_destroy(&s->c);
        return KOLO_ENOMEM;
    }
    for (int r = 0; r < size; r++)
        s->pidfd[r] = -1;
    wait_knobs(s, size);
    *out = s;
    return 0;
}

/* shm_map maps the segment behind fd. */
static int shm_map(struct shmcoll *s, int fd, size_t bytes)
{
    /* Not MAP_POPULATE: the staging buffers are mapped as the first large
     * collective reaches them (shm_claim maps the rest now). Every rank of
     * a host maps the whole segment, and 1,024 ranks on 128 hosts in one
     * process spent seconds of kolo_init filling page tables for buffers
     * most jobs' small collectives never touch. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(s->c.why, sizeof s->c.why, "mmap %.100s: %s", s->name, strerror(errno));
        return KOLO_ESYS;
    }
    s->base = p;
    s->map_bytes = bytes;
    s->hdr = p;
    return 0;
}

static int shm_claim(struct shmcoll *s)
{
    s->chunk = (size_t)s->hdr->chunk_bytes;
    s->small = (size_t)s->hdr->small_bytes;
    /* The header, the control blocks and the small slots, which every
     * collective and readiness round touches: their page faults now, not
     * in the first ones (best effort: Linux 5.14 and later). */
    size_t hot = (size_t)s->hdr->off_buf;
    if (hot > s->map_bytes)
        hot = s->map_bytes;
    (void)madvise(s->base, hot, MADV_POPULATE_WRITE);
    struct shm_ctrl *me = ctrl_of(s, s->me);
    uint32_t free_state = SHM_STATE_FREE;
    if (!atomic_compare_exchange_strong(&me->state, &free_state, SHM_STATE_ATTACHED))
        return KOLO_EEXIST;
    me->pid = (int32_t)getpid();
    s->claimed = true;
    return 0;
}

int shmcoll_create(const char *name, int rank, int size, size_t slot_bytes, struct coll **out)
{
    struct shmcoll *s;
    int rc = shm_new(name, rank, size, &s);
    if (rc)
        return rc;
    *out = NULL;

    size_t chunk = slot_bytes ? slot_bytes / SHM_NBUF
                              : (size_t)settings_int(SET_SHM_CHUNK, SHM_CHUNK_DEFAULT);
    size_t small = (size_t)settings_int(SET_SHM_SMALL, SHM_SMALL_DEFAULT);
    /* A chunk holds a cache line per rank at least (alltoall sub-areas),
     * a small slot an alltoall size row. */
    chunk = round_up(chunk > SHM_CHUNK_MIN ? chunk : SHM_CHUNK_MIN, 4096);
    if (chunk < (size_t)size * 64)
        chunk = round_up((size_t)size * 64, 4096);
    small = round_up(small > (size_t)size * 8 ? small : (size_t)size * 8, 64);

    struct shm_header layout = {0};
    shm_layout(&layout, size, chunk, small);

    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        rc = errno == EEXIST ? KOLO_EEXIST : KOLO_ESYS;
        shm_destroy(&s->c);
        return rc;
    }
    s->creator = true;
    /* fallocate, not ftruncate: a full /dev/shm fails here, not as SIGBUS
     * in the middle of a collective. */
    if ((errno = posix_fallocate(fd, 0, (off_t)layout.total_bytes)) != 0 ||
        (rc = shm_map(s, fd, (size_t)layout.total_bytes)) != 0) {
        rc = errno == ENOSPC ? KOLO_ENOMEM : KOLO_ESYS;
        close(fd);
        shm_destroy(&s->c);
        return rc;
    }
    close(fd);

    struct shm_header *h = s->hdr;
    shm_layout(h, size, chunk, small);
    h->version = SHM_VERSION;
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    if ((rc = shm_claim(s)) != 0) {
        shm_destroy(&s->c);
        return rc;
    }
    *out = &s->c;
    return 0;
}

int shmcoll_attach(const char *name, int rank, int size, size_t slot_bytes, struct coll **out)
{
    (void)slot_bytes; /* the creator's geometry wins */
    struct shmcoll *s;
    int rc = shm_new(name, rank, size, &s);
    if (rc)
        return rc;
    *out = NULL;
    int fd = shm_open(s->name, O_RDWR, 0);
    if (fd < 0) {
        rc = errno == ENOENT ? KOLO_ENOTFOUND : KOLO_ESYS;
        shm_destroy(&s->c);
        return rc;
    }
    if ((rc = shm_segment_trusted(fd, s->name)) != 0) {
        close(fd);
        shm_destroy(&s->c);
        return rc;
    }
    /* The leader creates before the rendezvous and others attach after
     * it, but allow a moment for a leader still filling the header. */
    struct stat st;
    struct shm_header *h = NULL;
    for (int tries = 0; tries < 1000; tries++) {
        if (fstat(fd, &st) != 0) {
            rc = KOLO_ESYS;
            break;
        }
        if ((size_t)st.st_size >= sizeof *h) {
            if (!s->base && (rc = shm_map(s, fd, (size_t)st.st_size)) != 0)
                break;
            h = s->hdr;
            if (atomic_load_explicit(&h->magic, memory_order_acquire) == SHM_MAGIC)
                break;
        }
        h = NULL;
        usleep(1000);
    }
    close(fd);
    if (!rc && !h)
        rc = KOLO_ESTATE;
    if (!rc && (h->version != SHM_VERSION || h->total_bytes > s->map_bytes))
        rc = KOLO_EVERSION;
    if (!rc && h->size != (uint32_t)size)
        rc = KOLO_EMISMATCH;
    if (!rc)
        rc = shm_claim(s);
    if (rc) {
        shm_destroy(&s->c);
        return rc;
    }
    *out = &s->c;
    return 0;
}

/* ------------------------------------------------------------------ kept across generations */

static bool shm_is(const struct coll *c)
{
    return c && c->ops == &shm_ops;
}

/* Parks this rank's membership: like destroy for the peers (this rank
 * left, a wait for it fails), but the mapping and the peers' pidfds stay
 * for shmcoll_rearm. */
static struct coll *shm_keep_segment(struct coll *c)
{
    struct shmcoll *s = (struct shmcoll *)c;
    if (!s->claimed || !s->unlinked) {
        shm_destroy(c); /* never made ready: nothing worth keeping */
        return NULL;
    }
    struct shm_ctrl *me = ctrl_of(s, s->me);
    atomic_store_explicit(&me->state, SHM_STATE_LEFT, memory_order_release);
    futex_wake_all(&me->events);
    s->c.names = NULL; /* the owner's table, gone with it */
    return c;
}

uint64_t shmcoll_id(const struct coll *c)
{
    if (!shm_is(c))
        return 0;
    const struct shmcoll *s = (const struct shmcoll *)c;
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a of the name, random part included */
    for (const char *p = s->name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    return h ? h : 1;
}

/* Waits until every member's word (arm or armed) holds token: a poll
 * with short sleeps, since this runs once a generation; a dead member
 * (its pidfd) or the deadline ends it. */
static int rearm_wait(struct shmcoll *s, size_t word, uint32_t token, uint64_t deadline)
{
    uint64_t next_check = now_mono_ms() + SHM_SLICE_MS;
    for (int j = 0; j < s->n; j++) {
        _Atomic uint32_t *w = (_Atomic uint32_t *)((unsigned char *)ctrl_of(s, j) + word);
        while (atomic_load_explicit(w, memory_order_acquire) != token) {
            uint64_t now = now_mono_ms();
            if (now >= next_check) {
                int rc = shm_check_peers(s);
                if (rc)
                    return rc;
                next_check = now + SHM_SLICE_MS;
            }
            if (deadline && now >= deadline)
                return shm_fail(s, KOLO_ETIMEDOUT, s->me, false,
                                "member %d of the host's kept segment did not come back to it", j);
            usleep(50);
        }
    }
    return 0;
}

int shmcoll_rearm(struct coll *c, uint32_t token, uint64_t deadline)
{
    if (!shm_is(c) || token == 0)
        return KOLO_EINVAL;
    struct shmcoll *s = (struct shmcoll *)c;
    struct shm_ctrl *me = ctrl_of(s, s->me);
    /* 1: every member is here, so none runs a collective of the last
     * generation on the segment any more */
    atomic_store_explicit(&me->arm, token, memory_order_release);
    int rc = rearm_wait(s, offsetof(struct shm_ctrl, arm), token, deadline);
    if (rc)
        return rc;
    /* 2: each member resets what it owns: its counters, its state and,
     * for the first member, the abort record */
    atomic_store_explicit(&me->events, 0, memory_order_relaxed);
    atomic_store_explicit(&me->state, SHM_STATE_ATTACHED, memory_order_relaxed);
    if (s->me == 0) {
        atomic_store_explicit(&s->hdr->abort_rank, 0, memory_order_relaxed);
        s->hdr->abort_code = 0;
        s->hdr->abort_why[0] = '\0';
        atomic_store_explicit(&s->hdr->abort_claim, 0, memory_order_relaxed);
    }
    s->ev = 0;
    memset(s->seen, 0, (size_t)s->n * sizeof *s->seen);
    s->bufseq = s->smallseq = 0;
    memset(s->buf_free_at, 0, sizeof s->buf_free_at);
    memset(s->small_free_at, 0, sizeof s->small_free_at);
    s->want = 0;
    s->yield_misses = s->yield_skipped = 0;
    wait_knobs(s, s->n); /* the caller tells how crowded the machine is now */
    s->c.failed = 0;
    s->c.why[0] = '\0';
    atomic_store_explicit(&s->c.waiting_on, 0, memory_order_relaxed);
    /* 3: every member reset before anyone posts again (release: the
     * resets above are seen by whoever sees this) */
    atomic_store_explicit(&me->armed, token, memory_order_release);
    return rearm_wait(s, offsetof(struct shm_ctrl, armed), token, deadline);
}

int shmcoll_abort(struct coll *c, int code, const char *why)
{
    struct shmcoll *s = (struct shmcoll *)c;
    if (!s || !code)
        return KOLO_EINVAL;
    return shm_fail(s, code, s->me, true, "%s", why ? why : kolo_strerror(code));
}

void shmcoll_share_cpus(struct coll *c, int ranks)
{
    struct shmcoll *s = (struct shmcoll *)c;
    if (s && ranks > s->n)
        wait_knobs(s, ranks);
}

int shmcoll_ready(struct coll *c, const int *pids, uint64_t deadline)
{
    struct shmcoll *s = (struct shmcoll *)c;
    if (!s || !pids)
        return KOLO_EINVAL;
    int erc = shm_enter(s, deadline);
    if (erc)
        return erc;
    pid_t self = getpid();
    s->npfd = 0;
    for (int r = 0; r < s->n; r++) {
        /* Threads as ranks share our pid: nothing to watch (0: not even
         * with kill(pid, 0), which at 1,024 ranks in one process was most
         * of the CPU their waits took) */
        s->pid[r] = pids[r] == self ? 0 : pids[r];
        if (r == s->me || s->pid[r] <= 0 || s->pidfd[r] >= 0)
            continue;
        s->pidfd[r] = pidfd_open_compat(pids[r]);
        if (s->pidfd[r] >= 0) {
            s->pfd[s->npfd].fd = s->pidfd[r];
            s->pfd[s->npfd].events = POLLIN;
            s->pfd_rank[s->npfd++] = r;
        }
    }
    bool watched = s->npfd > 0;
    for (int r = 0; r < s->n; r++)
        watched |= r != s->me && s->pid[r] > 0 && s->pidfd[r] < 0; /* kill(pid, 0) */
    s->unwatched = !watched;
    /* A first barrier: once it passes, every rank has the segment mapped
     * and the name can go. */
    int rc = shm_check_peers(s);
    if (!rc && s->n > 1) {
        shm_post(s);
        rc = shm_wait_all(s, s->ev, deadline);
    }
    shm_unlink_name(s);
    return rc;
}
