/*
 * coord_timeline.c - Horovod's timeline, written by the coordinator.
 *
 * A job submitted with HOROVOD_TIMELINE=<path> in its environment (kolo
 * run --timeline-filename) gets a Chrome trace file (chrome://tracing,
 * Perfetto) in Horovod's format: one "process" per tensor name, and for
 * each operation a NEGOTIATE_<OP> span from the first rank's request to
 * the moment every rank has submitted it, with one zero-length event per
 * rank, named by the rank, when that rank's request arrives; then an <OP>
 * span (ALLREDUCE, ...) from the moment the response is appended to the
 * log until every rank has fetched it (its cursor passed the response),
 * or a rank asks for the same tensor again, whichever comes first (spans
 * of one process must nest); its end carries the dtype, shape and fused
 * names. Since the
 * coordinator decides the order for every rank, one file shows all of
 * them, as Horovod's rank 0 does.
 *
 * Cost: a job without a timeline pays one pointer test per request. With
 * one, the negotiation handler only formats events into a memory buffer;
 * the tick (coord_jobs_cron, every COORD_CRON_MS) hands the buffer to the
 * timeline's writer thread (struct tl_sink), which writes and closes the
 * file. So neither the handlers nor the tick wait on the disk, and a slow
 * disk cannot stall negotiation. What is buffered or queued is capped
 * (TL_MAX_BUF): past it events are dropped and counted, rather than
 * letting a stuck disk grow the coordinator without bound.
 *
 * The file is "[" and events separated by ",\n"; a clean end writes "]".
 * A coordinator that dies leaves a file without the "]", which Chrome's
 * trace viewer loads all the same (it tolerates a missing end, as
 * Horovod relies on too); json.load needs the "]" appended.
 *
 * Timestamps are microseconds since the timeline was opened (the job's
 * first rendezvous); the header metadata holds that moment since the
 * epoch, as Horovod's start_time_since_epoch_in_micros. *
 * REST (GET /api/v1/jobs/{id}/timeline, coord_timeline_serve) reads the
 * file back on the state thread, after the writer wrote out what was
 * buffered (waiting at most TL_SERVE_WAIT_MS for it), and closes
 * the array itself when the writer has not: events are separated by
 * ",\n" and a string never holds a raw newline (put_str escapes it), so
 * the text after the last newline is the last event, whole or torn.
 */
#include "coord_timeline.h"
#include "coord_jobs.h"
#include "coord_core.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "hmac.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "mismatch.h"
#include "util.h"

#define TL_BUCKETS 1024
#define TL_MAX_BUF (64u << 20)
/* the largest file REST serves */
#define TL_MAX_SERVE (64u << 20)
/* how long REST waits for the writer to catch up before reading */
#define TL_SERVE_WAIT_MS 2000

/* The writer side of a timeline: a thread that writes the chunks the
 * state thread queues, in order, then closes the file and frees all this
 * once told to close (nobody waits for it). */
struct tl_chunk {
    struct buf b;
    struct tl_chunk *next;
};

struct tl_sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* work queued, or a chunk written */
    struct tl_chunk *head, *tail;
    bool closing;          /* no more chunks: close the file and exit */
    uint64_t queued, written; /* chunks */
    atomic_size_t bytes;   /* queued, not yet written */
    FILE *f;
    char *path;
    struct tl_sink *live_next; /* live_head's list */
};

struct tl_name {
    char *name;
    int pid;
    struct tl_name *next;
};

/* An op whose response is in the log and not yet fetched by every rank
 * (under readiness rounds: not yet reported done by every rank). */
struct tl_op {
    uint64_t index;
    int pid;
    char *args; /* a JSON object, for the span's end */
    uint64_t begin_us; /* timeline time of its begin */
};

/* The ranks' spans of one op (coord_timeline_spans), until every rank's
 * came in or TL_GROUP_MS passed: an op the ranks agreed in round `round`
 * (name set), or the log entry `index` (name NULL). Times are the
 * coordinator's CLOCK_MONOTONIC; ready[r] 0: rank r's span is missing. */
struct tl_group {
    char *name;
    uint64_t round, index;
    int got;
    uint64_t born_ms;
    uint64_t agreed_max, done_min;
    uint32_t coll, dtype;
    char shape[160];
    uint64_t *ready; /* [size] */
    struct tl_group *hnext;        /* hash chain */
    struct tl_group *prev, *next;  /* arrival order */
};

struct timeline {
    char *path;  /* the coordinator's own file (tl_file) */
    char *label; /* the path the job named, absolute: what logs and replies say */
    struct tl_sink *sink; /* NULL once closed */
    bool first; /* no event written yet: no separator */
    bool closed;
    uint64_t t0_us; /* monotonic */
    struct buf b;   /* formatted, not yet written */
    uint64_t dropped;
    struct tl_name *names[TL_BUCKETS];
    int npids;
    /* per pid, the latest ts written: a tensor's events never go back in
     * time, whatever the ranks' clocks' error (pid_ts) */
    uint64_t *last_ts;
    size_t last_cap;
    struct tl_op *ops; /* FIFO by index: ops[head..len) */
    size_t ops_head, ops_len, ops_cap;
    /* the ranks' telemetry under readiness rounds */
    uint64_t stop_us; /* monotonic: stopped then (0: running); later ops are not its */
    uint64_t drain_until_ms; /* a stopped one takes spans until then, then closes */
    int size;         /* ranks a group waits for */
    struct tl_group *groups[TL_BUCKETS];
    struct tl_group *g_head, *g_tail;
    size_t ngroups;
    uint64_t spans_dropped;
    uint64_t ranks_dropped; /* the most spans one rank said it dropped */
};

static void put_str(struct buf *b, const char *s)
{
    buf_putc(b, '"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            buf_putc(b, '\\');
            buf_putc(b, (char)ch);
        } else if (ch < 0x20) {
            buf_printf(b, "\\u%04x", ch);
        } else {
            buf_putc(b, (char)ch);
        }
    }
    buf_putc(b, '"');
}

/* Starts one event: the separator and the opening brace. Returns false
 * (and counts a drop) when the buffer is full. */
static bool ev_begin(struct timeline *tl)
{
    if (tl->closed)
        return false;
    if (tl->b.len + atomic_load(&tl->sink->bytes) >= TL_MAX_BUF) {
        tl->dropped++;
        return false;
    }
    buf_puts(&tl->b, tl->first ? "\n{" : ",\n{");
    tl->first = false;
    return true;
}

static uint64_t ts_now(const struct timeline *tl)
{
    return now_mono_us() - tl->t0_us;
}

/* pid_ts: ts for the next event of process pid, no earlier than its last
 * one. The coordinator's own events are in time order; the ranks' spans
 * come on their clocks, placed on ours to within half a report's round
 * trip, which could otherwise put a rank's tick before the end of the
 * tensor's previous op (spans of one process must nest). */
static uint64_t pid_ts(struct timeline *tl, int pid, uint64_t ts)
{
    if (pid < 0)
        return ts;
    if ((size_t)pid >= tl->last_cap) {
        size_t cap = tl->last_cap ? tl->last_cap : 64;
        while (cap <= (size_t)pid)
            cap *= 2;
        uint64_t *grown = realloc(tl->last_ts, cap * sizeof(*grown));
        if (!grown)
            return ts;
        memset(grown + tl->last_cap, 0, (cap - tl->last_cap) * sizeof(*grown));
        tl->last_ts = grown;
        tl->last_cap = cap;
    }
    if (ts < tl->last_ts[pid])
        ts = tl->last_ts[pid];
    tl->last_ts[pid] = ts;
    return ts;
}

/* The tensor's process id, announcing the process on first sight. */
static int tl_pid(struct timeline *tl, const char *name)
{
    uint64_t h = str_hash(name) % TL_BUCKETS;
    for (struct tl_name *n = tl->names[h]; n; n = n->next)
        if (strcmp(n->name, name) == 0)
            return n->pid;
    struct tl_name *n = calloc(1, sizeof(*n));
    if (!n || !(n->name = strdup(name))) {
        free(n);
        return 0;
    }
    n->pid = ++tl->npids;
    n->next = tl->names[h];
    tl->names[h] = n;
    if (ev_begin(tl)) {
        buf_printf(&tl->b, "\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":",
                   n->pid);
        put_str(&tl->b, name);
        buf_puts(&tl->b, "}}");
    }
    if (ev_begin(tl))
        buf_printf(&tl->b,
                   "\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
                   "\"args\":{\"sort_index\":%d}}",
                   n->pid, n->pid);
    return n->pid;
}

static const char *tl_env(const struct job *j);

struct timeline *coord_timeline_open(struct coord *c, const struct job *j)
{
    const char *val = tl_env(j);
    return val ? coord_timeline_open_path(c, j, val) : NULL;
}

/* tl_resolve makes a timeline path absolute (relative ones are the
 * job's cwd's); NULL when out of memory. */
static char *tl_resolve(const struct job *j, const char *val)
{
    if (val[0] == '/' || !j->cwd || !j->cwd[0])
        return strdup(val);
    size_t len = strlen(j->cwd) + strlen(val) + 2;
    char *path = malloc(len);
    if (path)
        snprintf(path, len, "%s/%s", j->cwd, val);
    return path;
}

/* tl_dir: the directory of the coordinator's timelines, made on first use
 * (issue 28): "<database>.timelines", or a private temporary directory
 * when the store is in memory. A caller never chooses a path on the
 * coordinator's host: the job's path is a label, and the rank that asked
 * for the file writes it on its own host, as its own user (worker/
 * timeline.c, from TimelineRead). The directory must be the
 * coordinator's, 0700 and not a symbolic link. NULL with errno. */
static const char *tl_dir(struct coord *c)
{
    if (c->timeline_dir)
        return c->timeline_dir;
    const char *db = c->db_path;
    char *dir = NULL;
    if (db && db[0] && strcmp(db, ":memory:") != 0) {
        size_t len = strlen(db) + sizeof ".timelines";
        if ((dir = malloc(len)))
            snprintf(dir, len, "%s.timelines", db);
        if (dir && mkdir(dir, 0700) != 0 && errno != EEXIST) {
            free(dir);
            return NULL;
        }
    } else {
        const char *tmp = getenv("TMPDIR");
        size_t len = strlen(tmp && tmp[0] ? tmp : "/tmp") + sizeof "/kolo-timelines-XXXXXX";
        if ((dir = malloc(len))) {
            snprintf(dir, len, "%s/kolo-timelines-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
            if (!mkdtemp(dir)) {
                free(dir);
                return NULL;
            }
        }
    }
    if (!dir) {
        errno = ENOMEM;
        return NULL;
    }
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077)) {
        LOGW("coord", "timelines: %s is not a directory of this user's with mode 0700; no "
             "timeline is written", dir);
        free(dir);
        errno = EPERM;
        return NULL;
    }
    return c->timeline_dir = dir;
}

/* tl_file: the coordinator's file for the job's timeline at (absolute)
 * label: a name kolo chooses, the same for the same job and label (a
 * restarted coordinator reopens it, TimelineRead finds it). NULL with
 * errno. */
static char *tl_file(struct coord *c, const struct job *j, const char *label)
{
    const char *dir = tl_dir(c);
    if (!dir)
        return NULL;
    uint8_t h[SHA256_LEN];
    sha256(label, strlen(label), h);
    size_t len = strlen(dir) + 64;
    char *path = malloc(len);
    if (!path) {
        errno = ENOMEM;
        return NULL;
    }
    snprintf(path, len, "%s/job-%llu-%02x%02x%02x%02x%02x%02x%02x%02x.json", dir,
             (unsigned long long)j->id, h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
    return path;
}

/* tl_env returns the file the job's HOROVOD_TIMELINE names, or NULL
 * (none, or DYNAMIC: timeline_env_path). */
static const char *tl_env(const struct job *j)
{
    const char *val = NULL;
    for (int i = 0; i < j->nenv; i++)
        if (strncmp(j->env[i], "HOROVOD_TIMELINE=", 17) == 0)
            val = j->env[i] + 17;
    return timeline_env_path(val);
}

/* The files whose writer has not closed them yet (tl_sink_live): a
 * TimelineRead of a file still being written is not at its end, even once
 * the job has let go of its timeline. Any thread; its own lock. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct tl_sink *live_head;

static bool tl_sink_live(const char *path)
{
    pthread_mutex_lock(&live_mu);
    bool live = false;
    for (struct tl_sink *k = live_head; k && !live; k = k->live_next)
        live = strcmp(k->path, path) == 0;
    pthread_mutex_unlock(&live_mu);
    return live;
}

static void live_remove(struct tl_sink *k)
{
    pthread_mutex_lock(&live_mu);
    for (struct tl_sink **pp = &live_head; *pp; pp = &(*pp)->live_next)
        if (*pp == k) {
            *pp = k->live_next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

static void *sink_main(void *arg)
{
    thread_name("kolo-timeline");
    struct tl_sink *k = arg;
    pthread_mutex_lock(&k->mu);
    for (;;) {
        while (!k->head && !k->closing)
            pthread_cond_wait(&k->cv, &k->mu);
        struct tl_chunk *list = k->head;
        if (!list)
            break; /* closing, and everything is written */
        k->head = k->tail = NULL;
        pthread_mutex_unlock(&k->mu);
        uint64_t n = 0;
        bool ok = true;
        while (list) {
            struct tl_chunk *next = list->next;
            if (fwrite(list->b.data, 1, list->b.len, k->f) != list->b.len)
                ok = false;
            atomic_fetch_sub(&k->bytes, list->b.len);
            buf_free(&list->b);
            free(list);
            list = next;
            n++;
        }
        if (fflush(k->f) != 0)
            ok = false;
        if (!ok)
            LOGW("coord", "timeline %s: write failed: %s", k->path, strerror(errno));
        pthread_mutex_lock(&k->mu);
        k->written += n;
        pthread_cond_broadcast(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    fclose(k->f);
    live_remove(k);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k->path);
    free(k);
    return NULL;
}

/* A writer for the open file f (the sink owns it from here), or NULL. */
static struct tl_sink *sink_start(FILE *f, const char *path)
{
    struct tl_sink *k = calloc(1, sizeof(*k));
    if (!k || !(k->path = strdup(path))) {
        free(k);
        return NULL;
    }
    k->f = f;
    atomic_init(&k->bytes, 0);
    pthread_mutex_init(&k->mu, NULL);
    cond_init_monotonic(&k->cv);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&live_mu);
    k->live_next = live_head;
    live_head = k;
    pthread_mutex_unlock(&live_mu);
    int rc = pthread_create(&t, &a, sink_main, k);
    pthread_attr_destroy(&a);
    if (rc != 0) {
        live_remove(k);
        pthread_cond_destroy(&k->cv);
        pthread_mutex_destroy(&k->mu);
        free(k->path);
        free(k);
        return NULL;
    }
    return k;
}

/* tl_why: what a failed open of a timeline means. */
static const char *tl_why(int err)
{
    return err == EEXIST ? TRACE_FILE_EEXIST : strerror(err);
}

/* tl_create opens the coordinator's own timeline file for writing (see
 * trace_file_open: only an earlier timeline is replaced). NULL with
 * errno. */
static FILE *tl_create(const char *path)
{
    int fd = trace_file_open(path);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

struct timeline *coord_timeline_open_path(struct coord *c, const struct job *j, const char *val)
{
    struct timeline *tl = calloc(1, sizeof(*tl));
    if (!tl)
        return NULL;
    buf_init(&tl->b);
    tl->label = tl_resolve(j, val);
    tl->path = tl->label ? tl_file(c, j, tl->label) : NULL;
    FILE *f = tl->path ? tl_create(tl->path) : NULL;
    if (f && !(tl->sink = sink_start(f, tl->path))) {
        fclose(f);
        f = NULL;
        errno = ENOMEM;
    }
    if (!f) {
        int e = errno;
        LOGW("coord", "job %llu: cannot write the timeline %s (in %s): %s",
             (unsigned long long)j->id, tl->label ? tl->label : val,
             tl->path ? tl->path : "no file", tl_why(e));
        errno = e;
        free(tl->path);
        free(tl->label);
        free(tl);
        return NULL;
    }
    LOGI("coord", "job %llu: writing the timeline %s to %s", (unsigned long long)j->id,
         tl->label, tl->path);
    tl->first = true;
    tl->t0_us = now_mono_us();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    uint64_t epoch_us = (uint64_t)wall.tv_sec * 1000000u + (uint64_t)wall.tv_nsec / 1000u;
    buf_puts(&tl->b, "[");
    ev_begin(tl);
    buf_printf(&tl->b,
               "\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"job %llu\","
               "\"start_time_since_epoch_in_micros\":%llu}}",
               (unsigned long long)j->id, (unsigned long long)epoch_us);
    ev_begin(tl);
    buf_puts(&tl->b,
             "\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":0,\"args\":{\"sort_index\":0}}");
    return tl;
}

static void op_end(struct timeline *tl, struct tl_op *o, uint64_t ts)
{
    ts = pid_ts(tl, o->pid, ts);
    if (ev_begin(tl))
        buf_printf(&tl->b, "\"ph\":\"E\",\"ts\":%llu,\"pid\":%d,\"args\":%s}",
                   (unsigned long long)ts, o->pid, o->args ? o->args : "{}");
    free(o->args);
    o->args = NULL;
    o->pid = -1;
}

void coord_timeline_request(struct timeline *tl, const char *name, const char *op, int rank,
                            bool first)
{
    int pid = tl_pid(tl, name);
    uint64_t ts = pid_ts(tl, pid, ts_now(tl));
    /* A rank that fetched the response may ask for the tensor again before
     * the others fetched it: the op's span ends there, since spans of one
     * process must nest. */
    for (size_t i = tl->ops_head; first && i < tl->ops_len; i++)
        if (tl->ops[i].pid == pid)
            op_end(tl, &tl->ops[i], ts);
    if (first && ev_begin(tl))
        buf_printf(&tl->b, "\"name\":\"NEGOTIATE_%s\",\"ph\":\"B\",\"ts\":%llu,\"pid\":%d}", op,
                   (unsigned long long)ts, pid);
    if (ev_begin(tl))
        buf_printf(&tl->b, "\"name\":\"%d\",\"ph\":\"X\",\"ts\":%llu,\"dur\":0,\"pid\":%d}", rank,
                   (unsigned long long)ts, pid);
}

void coord_timeline_ready(struct timeline *tl, const char *name, const char *op, uint64_t index,
                          const char *args, const char *error)
{
    int pid = tl_pid(tl, name);
    uint64_t ts = pid_ts(tl, pid, ts_now(tl));
    if (ev_begin(tl)) {
        buf_printf(&tl->b, "\"ph\":\"E\",\"ts\":%llu,\"pid\":%d", (unsigned long long)ts, pid);
        if (error) {
            buf_puts(&tl->b, ",\"args\":{\"error\":");
            put_str(&tl->b, error);
            buf_putc(&tl->b, '}');
        }
        buf_putc(&tl->b, '}');
    }
    if (error)
        return;
    if (ev_begin(tl))
        buf_printf(&tl->b, "\"name\":\"%s\",\"ph\":\"B\",\"ts\":%llu,\"pid\":%d}", op,
                   (unsigned long long)ts, pid);
    if (tl->ops_len == tl->ops_cap) {
        if (tl->ops_head > 0) {
            memmove(tl->ops, tl->ops + tl->ops_head,
                    (tl->ops_len - tl->ops_head) * sizeof(*tl->ops));
            tl->ops_len -= tl->ops_head;
            tl->ops_head = 0;
        }
        if (array_room(&tl->ops, tl->ops_len, &tl->ops_cap, sizeof(*tl->ops), 64) != 0)
            return;
    }
    tl->ops[tl->ops_len++] = (struct tl_op){index, pid, args ? strdup(args) : NULL, ts};
}

bool coord_timeline_waiting(const struct timeline *tl)
{
    return tl->ops_head < tl->ops_len;
}

void coord_timeline_fetched(struct timeline *tl, uint64_t min_cursor)
{
    uint64_t ts = 0;
    while (tl->ops_head < tl->ops_len && tl->ops[tl->ops_head].index < min_cursor) {
        struct tl_op *o = &tl->ops[tl->ops_head++];
        if (o->pid < 0)
            continue; /* ended early */
        if (!ts)
            ts = ts_now(tl);
        op_end(tl, o, ts);
    }
    if (tl->ops_head == tl->ops_len)
        tl->ops_head = tl->ops_len = 0;
}

/* ---------------------------------------------------------------- the ranks' spans
 *
 * Under readiness rounds the coordinator sees neither the cached ops'
 * requests nor when the ranks ran anything, so the timeline is written from
 * the ranks' telemetry instead (worker/runtime/fastpath.c, trace_begin): for each
 * op a traced round agreed, every rank reports when it submitted it, when
 * the round agreed it and when its data-plane op ended; for each log entry
 * it ran, when that ended. Each rank's times come on its own clock and are
 * placed on the coordinator's with the rank's offset (common/clock_offset.h),
 * so ranks on hosts whose clocks differ still line up to within half a
 * report's round trip. One op's spans form a group; once every rank's is
 * in (or TL_GROUP_MS passed: a rank that died, or that heard of the
 * timeline late), the group is written as the coordinator's own events
 * would be: NEGOTIATE_<OP> from the first rank's submission to the
 * agreement with one tick per rank, then <OP> until the first rank's op
 * ended (the latest end would let it overlap the tensor's next
 * negotiation, and spans of one process must nest). A log entry's group
 * ends its op span the same way. Groups arrive up to a report period late,
 * so in the file they are not in time order; trace viewers order by ts.
 */

/* a group waits for the slowest rank's report: ranks of large jobs report
 * every 4 s at most (worker/runtime/report_rate.h) */
#define TL_GROUP_MS 6000
/* pending groups take at most this many bytes of per-rank ticks */
#define TL_MAX_GROUP_BYTES (64u << 20)
/* an op of the log whose end no rank reported ends this long after it began */
#define TL_OP_WAIT_MS 10000
/* a rank's span placed further than this ahead of now is garbage */
#define TL_FUTURE_SLACK_US 5000000
#define TL_DRAIN_MS 1500
#define TL_START_SLACK_US 1000000

static uint64_t group_hash(const char *name, uint64_t round, uint64_t index)
{
    return (name ? str_hash(name) ^ (round * 0x9e3779b97f4a7c15ull) : index * 0x9e3779b97f4a7c15ull) %
           TL_BUCKETS;
}

static void group_free(struct tl_group *g)
{
    free(g->name);
    free(g->ready);
    free(g);
}

static void group_unlink(struct timeline *tl, struct tl_group *g)
{
    struct tl_group **pp = &tl->groups[group_hash(g->name, g->round, g->index)];
    while (*pp && *pp != g)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = g->hnext;
    if (g->prev)
        g->prev->next = g->next;
    else
        tl->g_head = g->next;
    if (g->next)
        g->next->prev = g->prev;
    else
        tl->g_tail = g->prev;
    tl->ngroups--;
}

static struct tl_group *group_get(struct timeline *tl, const char *name, uint64_t round,
                                  uint64_t index)
{
    uint64_t h = group_hash(name, round, index);
    for (struct tl_group *g = tl->groups[h]; g; g = g->hnext)
        if (name ? g->name && g->round == round && strcmp(g->name, name) == 0
                 : !g->name && g->index == index)
            return g;
    if ((tl->ngroups + 1) * (size_t)tl->size * sizeof(uint64_t) > TL_MAX_GROUP_BYTES)
        return NULL;
    struct tl_group *g = calloc(1, sizeof(*g));
    if (!g || !(g->ready = calloc((size_t)tl->size, sizeof(*g->ready))) ||
        (name && !(g->name = strdup(name)))) {
        if (g)
            free(g->ready);
        free(g);
        return NULL;
    }
    g->round = round;
    g->index = index;
    g->born_ms = now_mono_ms();
    g->done_min = UINT64_MAX;
    g->hnext = tl->groups[h];
    tl->groups[h] = g;
    g->prev = tl->g_tail;
    if (tl->g_tail)
        tl->g_tail->next = g;
    else
        tl->g_head = g;
    tl->g_tail = g;
    tl->ngroups++;
    return g;
}

/* timeline time of a coordinator-clock instant, clamped to its start */
static uint64_t tl_ts(const struct timeline *tl, uint64_t mono_us)
{
    return mono_us > tl->t0_us ? mono_us - tl->t0_us : 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Drops the ended ops at the front of the FIFO (under readiness rounds
 * their spans end out of order, so coord_timeline_fetched does not). */
static void ops_trim(struct timeline *tl)
{
    while (tl->ops_head < tl->ops_len && tl->ops[tl->ops_head].pid < 0)
        tl->ops_head++;
    if (tl->ops_head == tl->ops_len)
        tl->ops_head = tl->ops_len = 0;
}

/* Writes a complete (or given up) group's events, then frees it. */
static void group_write(struct timeline *tl, struct tl_group *g)
{
    group_unlink(tl, g);
    if (!g->name) { /* a log entry: its op spans end when the first rank's did */
        for (size_t i = tl->ops_head; g->done_min != UINT64_MAX && i < tl->ops_len; i++) {
            struct tl_op *o = &tl->ops[i];
            if (o->index == g->index && o->pid >= 0) {
                uint64_t ts = tl_ts(tl, g->done_min);
                op_end(tl, o, ts > o->begin_us ? ts : o->begin_us);
            }
        }
        group_free(g);
        ops_trim(tl);
        return;
    }
    /* the ticks, in time order (with their ranks) */
    uint64_t *order = calloc((size_t)g->got + 1, 2 * sizeof(uint64_t));
    int n = 0;
    for (int r = 0; order && r < tl->size; r++) {
        if (g->ready[r]) {
            order[2 * n] = g->ready[r];
            order[2 * n + 1] = (uint64_t)r;
            n++;
        }
    }
    if (order)
        qsort(order, (size_t)n, 2 * sizeof(uint64_t), cmp_u64);
    uint64_t first = n ? order[0] : 0, last = n ? order[2 * (n - 1)] : 0;
    /* not its ops: agreed before it started, or submitted after it
     * stopped. The ranks trace only while some rank has the timeline on,
     * so the start is given the clocks' error (an op submitted right after
     * start_timeline may be placed a little before it); a stop is not: the
     * ranks hear of it late and trace on for a moment. */
    bool mine = n && last + TL_START_SLACK_US >= tl->t0_us &&
                (!tl->stop_us || first <= tl->stop_us);
    if (mine) {
        int pid = tl_pid(tl, g->name);
        uint64_t b = tl_ts(tl, first);
        /* an op span of this tensor still open (the log's) ends first */
        for (size_t i = tl->ops_head; i < tl->ops_len; i++)
            if (tl->ops[i].pid == pid)
                op_end(tl, &tl->ops[i], b > tl->ops[i].begin_us ? b : tl->ops[i].begin_us);
        const char *op = mismatch_coll_name(g->coll);
        b = pid_ts(tl, pid, b);
        uint64_t agreed = tl_ts(tl, g->agreed_max > last ? g->agreed_max : last);
        uint64_t done = g->done_min != UINT64_MAX ? tl_ts(tl, g->done_min) : agreed;
        if (ev_begin(tl))
            buf_printf(&tl->b, "\"name\":\"NEGOTIATE_%s\",\"ph\":\"B\",\"ts\":%llu,\"pid\":%d}", op,
                       (unsigned long long)b, pid);
        for (int i = 0; i < n; i++)
            if (ev_begin(tl))
                buf_printf(&tl->b, "\"name\":\"%d\",\"ph\":\"X\",\"ts\":%llu,\"dur\":0,\"pid\":%d}",
                           (int)order[2 * i + 1],
                           (unsigned long long)pid_ts(tl, pid, tl_ts(tl, order[2 * i])), pid);
        agreed = pid_ts(tl, pid, agreed);
        done = pid_ts(tl, pid, done);
        if (ev_begin(tl))
            buf_printf(&tl->b, "\"ph\":\"E\",\"ts\":%llu,\"pid\":%d}", (unsigned long long)agreed, pid);
        if (ev_begin(tl))
            buf_printf(&tl->b, "\"name\":\"%s\",\"ph\":\"B\",\"ts\":%llu,\"pid\":%d}", op,
                       (unsigned long long)agreed, pid);
        if (ev_begin(tl)) {
            buf_printf(&tl->b, "\"ph\":\"E\",\"ts\":%llu,\"pid\":%d,\"args\":{\"dtype\":",
                       (unsigned long long)done, pid);
            put_str(&tl->b, mismatch_dtype_name(g->dtype));
            buf_puts(&tl->b, ",\"shape\":");
            put_str(&tl->b, g->shape);
            buf_printf(&tl->b, ",\"round\":%llu", (unsigned long long)g->round);
            if (n < tl->size)
                buf_printf(&tl->b, ",\"ranks_reported\":%d", n);
            buf_puts(&tl->b, "}}");
        }
    }
    free(order);
    group_free(g);
    ops_trim(tl);
}

void coord_timeline_spans(struct timeline *tl, int rank, int size,
                          Kolo__TraceSpan *const *spans, size_t n, int64_t offset_us)
{
    if (!tl || tl->closed || rank < 0 || rank >= size)
        return;
    if (tl->size != size) {
        /* a new generation's size: what is pending belongs to the old one */
        while (tl->g_head)
            group_write(tl, tl->g_head);
        tl->size = size;
    }
    for (size_t i = 0; i < n; i++) {
        const Kolo__TraceSpan *s = spans[i];
        bool agreed = s->round != 0;
        if (agreed && !s->name[0])
            continue;
        struct tl_group *g = group_get(tl, agreed ? s->name : NULL, s->round, s->log_index);
        if (!g) {
            tl->spans_dropped++;
            continue;
        }
        /* on the coordinator's clock (unsigned: wraps, never overflows);
         * a time from the future is garbage and goes */
        uint64_t ready = s->ready_us + (uint64_t)offset_us;
        uint64_t done = s->done_us + (uint64_t)offset_us;
        uint64_t at = s->agreed_us + (uint64_t)offset_us, limit = now_mono_us() + TL_FUTURE_SLACK_US;
        if ((agreed && (ready > limit || at > limit)) || (s->done_us && done > limit)) {
            tl->spans_dropped++;
            continue;
        }
        if (g->ready[rank] == 0)
            g->got++;
        g->ready[rank] = agreed ? (ready ? ready : 1) : 1;
        if (agreed) {
            g->agreed_max = at > g->agreed_max ? at : g->agreed_max;
            g->coll = s->coll;
            g->dtype = s->dtype;
            if (!g->shape[0]) {
                struct tensor_req t = {.ndim = (int)s->n_shape, .shape = s->shape};
                tensor_shape_text(g->shape, sizeof g->shape, &t);
            }
        }
        if (s->done_us && done < g->done_min)
            g->done_min = done;
        if (g->got >= tl->size)
            group_write(tl, g);
    }
}

/* Writes the groups older than TL_GROUP_MS (all of them with `all`), and
 * ends the log's ops no rank reported the end of within TL_OP_WAIT_MS (a
 * rank's report lost, or its spans dropped). */
static void groups_flush(struct timeline *tl, bool all)
{
    uint64_t now = now_mono_ms();
    while (tl->g_head && (all || now - tl->g_head->born_ms >= TL_GROUP_MS))
        group_write(tl, tl->g_head);
    uint64_t ts = ts_now(tl);
    for (size_t i = tl->ops_head; i < tl->ops_len; i++) {
        struct tl_op *o = &tl->ops[i];
        if (o->pid >= 0 && ts >= o->begin_us && ts - o->begin_us >= (uint64_t)TL_OP_WAIT_MS * 1000u)
            op_end(tl, o, ts);
    }
    ops_trim(tl);
}

void coord_timeline_rank_dropped(struct timeline *tl, uint64_t dropped)
{
    if (tl && dropped > tl->ranks_dropped)
        tl->ranks_dropped = dropped;
}

void coord_timeline_stop(struct timeline *tl)
{
    tl->stop_us = now_mono_us();
    tl->drain_until_ms = now_mono_ms() + TL_DRAIN_MS;
}

bool coord_timeline_drained(const struct timeline *tl)
{
    return tl->stop_us && now_mono_ms() >= tl->drain_until_ms;
}

/* Hands what the handlers buffered to the writer thread; returns the
 * number of chunks queued so far (what tl_wait_written waits for). Never
 * waits on the disk. */
static uint64_t tl_write(struct timeline *tl)
{
    struct tl_sink *k = tl->sink;
    if (!k)
        return 0;
    struct tl_chunk *c = tl->b.len ? calloc(1, sizeof(*c)) : NULL;
    pthread_mutex_lock(&k->mu);
    if (c) {
        c->b = tl->b; /* the chunk takes the buffer; the handlers start a new one */
        buf_init(&tl->b);
        atomic_fetch_add(&k->bytes, c->b.len);
        if (k->tail)
            k->tail->next = c;
        else
            k->head = c;
        k->tail = c;
        k->queued++;
        pthread_cond_broadcast(&k->cv);
    } else if (tl->b.len) {
        tl->dropped++; /* out of memory: the events are lost, the file stays valid */
        buf_reset(&tl->b);
    }
    uint64_t queued = k->queued;
    pthread_mutex_unlock(&k->mu);
    return queued;
}

/* Waits (at most TL_SERVE_WAIT_MS) until the writer wrote the first
 * `upto` chunks; false on timeout. */
static bool tl_wait_written(struct timeline *tl, uint64_t upto)
{
    struct tl_sink *k = tl->sink;
    if (!k)
        return true;
    struct timespec dl;
    mono_deadline(&dl, TL_SERVE_WAIT_MS);
    pthread_mutex_lock(&k->mu);
    int rc = 0;
    while (k->written < upto && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&k->cv, &k->mu, &dl);
    bool done = k->written >= upto;
    pthread_mutex_unlock(&k->mu);
    return done;
}

static void tl_close(struct timeline *tl)
{
    if (tl->closed)
        return;
    groups_flush(tl, true);
    /* ops whose end no rank reported end here (spans of a dead rank's
     * entries, or a timeline stopped under them) */
    uint64_t now = ts_now(tl);
    for (size_t i = tl->ops_head; i < tl->ops_len; i++)
        if (tl->ops[i].pid >= 0)
            op_end(tl, &tl->ops[i], now);
    if (tl->spans_dropped || tl->ranks_dropped)
        LOGW("coord", "timeline %s: %llu span(s) of the ranks dropped here (too many pending, or "
             "garbage), up to %llu by a rank (its queue was full)", tl->path,
             (unsigned long long)tl->spans_dropped, (unsigned long long)tl->ranks_dropped);
    if (tl->dropped)
        LOGW("coord", "timeline %s: %llu event(s) dropped (the writer fell behind)", tl->path,
             (unsigned long long)tl->dropped);
    tl->closed = true;
    buf_puts(&tl->b, "\n]\n");
    /* the close returns with the file complete (as far as the disk takes
     * it in TL_SERVE_WAIT_MS): stop_timeline without readiness rounds, the
     * end of the drain with them */
    if (!tl_wait_written(tl, tl_write(tl)))
        LOGW("coord", "timeline %s: the disk is slow; the file is completed in the background",
             tl->path);
    struct tl_sink *k = tl->sink;
    tl->sink = NULL;
    if (k) {
        /* the writer closes the file and frees itself */
        pthread_mutex_lock(&k->mu);
        k->closing = true;
        pthread_cond_broadcast(&k->cv);
        pthread_mutex_unlock(&k->mu);
    }
}

void coord_timeline_cron(struct timeline *tl, bool job_ended)
{
    if (tl->closed)
        return;
    groups_flush(tl, false);
    if (job_ended)
        tl_close(tl);
    else
        tl_write(tl);
}

void coord_timeline_free(struct timeline *tl)
{
    if (!tl)
        return;
    tl_close(tl);
    for (int b = 0; b < TL_BUCKETS; b++) {
        struct tl_name *n = tl->names[b];
        while (n) {
            struct tl_name *next = n->next;
            free(n->name);
            free(n);
            n = next;
        }
    }
    for (size_t i = tl->ops_head; i < tl->ops_len; i++)
        free(tl->ops[i].args);
    free(tl->ops);
    free(tl->last_ts);
    while (tl->g_head) {
        struct tl_group *g = tl->g_head;
        group_unlink(tl, g);
        group_free(g);
    }
    buf_free(&tl->b);
    free(tl->path);
    free(tl->label);
    free(tl);
}

/* ---------------------------------------------------------------- run time */

/* WorkerService.Timeline (hvd.start_timeline / stop_timeline): any rank
 * of the current generation may start or stop the job's timeline. Every
 * rank calling start with the same file (as Horovod scripts do) opens it
 * once; a start with another file closes the first; stop closes it. From
 * the first call on, the job's HOROVOD_TIMELINE is no longer looked at. */
const char *coord_timeline_path(const struct timeline *tl)
{
    return tl->path ? tl->path : "";
}

const char *coord_timeline_label(const struct timeline *tl)
{
    return tl->label ? tl->label : "";
}

const char *coord_timeline_why(int err)
{
    return tl_why(err);
}

/* ---------------------------------------------------------------- REST */

/* tl_read appends the file at path to out, at most max bytes: 0, or an
 * HTTP status with why set. */
static int tl_read(const char *path, struct buf *out, size_t max, char *why, size_t whylen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(why, whylen, "cannot read the timeline %s: %s", path, strerror(e));
        return e == ENOENT ? 404 : 500;
    }
    struct stat sb;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size > max) {
        snprintf(why, whylen,
                 "the timeline %s is %lld bytes, more than the %zu this route serves; read the "
                 "file on the coordinator's host",
                 path, (long long)sb.st_size, max);
        close(fd);
        return 413;
    }
    char chunk[65536];
    size_t total = 0;
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(why, whylen, "cannot read the timeline %s: %s", path, strerror(errno));
            close(fd);
            return 500;
        }
        if (n == 0)
            break;
        total += (size_t)n;
        if (total > max) { /* it grew after the fstat */
            snprintf(why, whylen,
                     "the timeline %s is more than the %zu bytes this route serves; read the "
                     "file on the coordinator's host",
                     path, max);
            close(fd);
            return 413;
        }
        buf_append(out, chunk, (size_t)n);
    }
    close(fd);
    if (out->oom) {
        snprintf(why, whylen, "out of memory reading the timeline %s", path);
        return 500;
    }
    return 0;
}

static bool is_space(char ch)
{
    return ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t';
}

/* tl_close_array makes the trace text in b[from..] a JSON array: as it is
 * when the writer closed it (its last line is "]"), else cut after its
 * last whole event and closed. Returns false when the text is not a trace
 * array at all. */
static bool tl_close_array(struct buf *b, size_t from)
{
    const char *d = b->data ? b->data + from : "";
    size_t n = b->len - from, start = 0;
    while (start < n && is_space(d[start]))
        start++;
    if (start == n || d[start] != '[')
        return false;
    while (n > start && is_space(d[n - 1]))
        n--;
    size_t line = n; /* the start of the last line */
    while (line > start && d[line - 1] != '\n')
        line--;
    if (line == start) {
        n = start + 1; /* no event yet: keep the "[" */
    } else if (n - line == 1 && d[line] == ']') {
        return true; /* closed by the writer */
    } else {
        size_t end = n;
        if (d[end - 1] == ',')
            end--;
        struct json *ev = NULL;
        char err[64];
        bool whole =
            json_parse(d + line, end - line, &ev, err, sizeof err) == 0 && ev->type == JSON_OBJECT;
        json_free(ev);
        n = whole ? end : line;
        while (n > start && (is_space(d[n - 1]) || d[n - 1] == ','))
            n--;
    }
    b->len = from + n;
    buf_puts(b, "\n]\n");
    return !b->oom;
}

/* The file GET /timeline serves: the timeline being written, else the
 * last one stopped, else (*env_path, to free) the one HOROVOD_TIMELINE
 * names if the job started under an earlier coordinator and this one has
 * not reopened the file (yet): what that one wrote. A job started here
 * gets nothing before its rendezvous opens the file, not what an older
 * job left at the same path. NULL: none. */
static const char *tl_serve_path(struct coord *c, const struct job *j, char **env_path)
{
    *env_path = NULL;
    if (j->tl)
        return j->tl->path;
    if (j->tl_last)
        return j->tl_last;
    if (!j->tl_checked && j->started_ms && j->started_ms < c->started_ms && tl_env(j)) {
        char *label = tl_resolve(j, tl_env(j));
        *env_path = label ? tl_file(c, j, label) : NULL;
        free(label);
        return *env_path;
    }
    return NULL;
}

bool coord_timeline_available(struct coord *c, const struct job *j)
{
    char *env_path;
    bool yes = tl_serve_path(c, j, &env_path) != NULL;
    free(env_path);
    return yes;
}

int coord_timeline_serve(struct coord *c, struct job *j, struct buf *out, char *why, size_t whylen)
{
    char *env_path;
    const char *path = tl_serve_path(c, j, &env_path);
    if (j->tl && !tl_wait_written(j->tl, tl_write(j->tl))) {
        /* what the tick has not written yet, written: else say so */
        snprintf(why, whylen, "the timeline %s: the disk did not take the events in %d ms",
                 path, TL_SERVE_WAIT_MS);
        return 503;
    }
    if (!path) {
        snprintf(why, whylen,
                 "job %llu has no timeline (submit it with HOROVOD_TIMELINE in its environment, "
                 "kolo run --timeline-filename, or call hvd.start_timeline)",
                 (unsigned long long)j->id);
        free(env_path);
        return 404;
    }
    size_t from = out->len;
    int status = tl_read(path, out, TL_MAX_SERVE, why, whylen);
    if (status == 0 && !tl_close_array(out, from)) {
        snprintf(why, whylen, "the timeline %s is not a JSON array of trace events", path);
        status = 500;
    }
    if (status != 0)
        out->len = from;
    free(env_path);
    return status ? status : 200;
}

/* ---------------------------------------------------------------- TimelineRead */

#define TL_READ_MAX (512u << 10)

/* Whether the job still writes the timeline at label (its current one or
 * the one draining), or its writer has not closed the file yet. */
static bool tl_writing(const struct job *j, const char *label, const char *file)
{
    const struct timeline *t[2] = {j->tl, j->tl_draining};
    for (int i = 0; i < 2; i++)
        if (t[i] && !t[i]->closed && strcmp(coord_timeline_label(t[i]), label) == 0)
            return true; /* an ended job's stays until the job is freed, closed */
    return tl_sink_live(file);
}

/* WorkerService.TimelineRead (issue 28): the rank that asked for a
 * timeline (rank 0, as Horovod's rank 0 writes it) reads the
 * coordinator's file from an offset and writes the bytes at its path, on
 * its own host and as its own user (worker/runtime/timeline.c). Any rank of the
 * job may read, in any generation: a rank keeps its file across elastic
 * resets. The file is the job's own (its credential scopes the call). */
void coord_rpc_timeline_read(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__TimelineReadRequest *req = kolo__timeline_read_request__unpack(NULL, f->body_len, f->body);
    if (!req || !req->path[0] || strlen(req->path) >= 4096) {
        c->m.rpc_errors[m]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed TimelineReadRequest");
        if (req)
            kolo__timeline_read_request__free_unpacked(req, NULL);
        return;
    }
    /* a worker's frame names its job (its credential is that job's); a
     * launcher's names none and asks for its job in the request */
    uint64_t id = f->job_id ? f->job_id : req->job;
    struct job *j = rpc_call_job_scoped(call) && req->job && req->job != f->job_id
                        ? NULL
                        : coord_job_find(c, id);
    if (!j) {
        c->m.rpc_errors[m]++;
        rpc_call_error(call, KOLO_ENOTFOUND, "no such job %llu", (unsigned long long)id);
        kolo__timeline_read_request__free_unpacked(req, NULL);
        return;
    }
    char *label = tl_resolve(j, req->path);
    char *file = label ? tl_file(c, j, label) : NULL;
    /* asked before the file's size is: once nobody writes it, the size
     * read after is its end; what is formatted is written out first */
    bool writing = file && tl_writing(j, label, file);
    if (j->tl && label && strcmp(coord_timeline_label(j->tl), label) == 0)
        tl_wait_written(j->tl, tl_write(j->tl));
    int fd = file ? open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
    int e = errno;
    struct stat st;
    uint8_t *data = NULL;
    ssize_t n = 0;
    Kolo__TimelineReadReply rep = KOLO__TIMELINE_READ_REPLY__INIT;
    if (fd >= 0 && fstat(fd, &st) == 0) {
        /* the file's identity: "[" and its header event (its start time,
         * written with the next event at the opening), unique to each
         * opening and the same however much follows */
        char head[512];
        ssize_t h = pread(fd, head, sizeof head, 0);
        size_t idlen = h > 0 ? (size_t)h : 0;
        const char *nl = idlen ? memchr(head, '\n', idlen) : NULL;
        if (nl && (nl = memchr(nl + 1, '\n', idlen - (size_t)(nl + 1 - head))) != NULL)
            idlen = (size_t)(nl - head);
        uint8_t id[SHA256_LEN];
        sha256(head, idlen, id);
        memcpy(&rep.file_id, id, sizeof rep.file_id);
        rep.size = (uint64_t)st.st_size;
        rep.ended = !writing;
        if (req->offset < rep.size) {
            size_t want = rep.size - req->offset;
            want = want > TL_READ_MAX ? TL_READ_MAX : want;
            data = malloc(want);
            n = data ? pread(fd, data, want, (off_t)req->offset) : -1;
            if (n < 0) {
                e = data ? errno : ENOMEM;
                rep.ended = false;
            }
        }
    }
    if (fd >= 0)
        close(fd);
    if (fd < 0 || n < 0) {
        c->m.rpc_errors[m]++;
        rpc_call_error(call, e == ENOENT ? KOLO_ENOTFOUND : KOLO_EIO,
                       "job %llu has no timeline for %s%s%s", (unsigned long long)j->id,
                       label ? label : req->path, e == ENOENT ? "" : ": ",
                       e == ENOENT ? "" : strerror(e));
    } else {
        rep.data.data = data;
        rep.data.len = (size_t)n;
        rep.ended = rep.ended && req->offset + (uint64_t)n >= rep.size;
        coord_send_pb(call, &rep.base);
    }
    free(data);
    free(file);
    free(label);
    kolo__timeline_read_request__free_unpacked(req, NULL);
}
