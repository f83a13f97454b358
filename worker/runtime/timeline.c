/*
 * timeline.c - kolo_timeline: start or stop the job's timeline at run time,
 * and rank 0's copy of it at the path the job named.
 *
 * The timeline is written by the coordinator (every rank's negotiation in
 * one file, see coordinator/coord_timeline.c), in a directory of its own
 * under a name it chooses: a caller never picks a path on the
 * coordinator's host (issue 28). The path the job names (kolo_timeline,
 * HOROVOD_TIMELINE) is where rank 0 keeps a copy, as Horovod's rank 0
 * writes the timeline: a thread of this process ("kolo-timeline") reads
 * the coordinator's file with WorkerService.TimelineRead every
 * COPY_PERIOD_MS and appends what is new, so the file is written on rank
 * 0's host, as rank 0's user, and grows while the job runs.
 *
 * - Stopping (kolo_timeline NULL) on rank 0 waits, at most STOP_WAIT_MS,
 *   until the coordinator closed its file and the copy has all of it: the
 *   file is complete (its "]") when stop_timeline returns.
 * - kolo_fini makes the copy current and a valid JSON array (a torn last
 *   event left out, "]" added); a later kolo_init in the same process (an
 *   elastic reset, init after shutdown) goes on from there.
 * - The copy belongs to the process, not to one context: it outlives the
 *   contexts of elastic resets. Contexts of process sets never touch it.
 * - The local file follows the coordinator's rules (trace_file_open):
 *   only an earlier timeline is replaced, links are not followed.
 *
 * Calls to the coordinator use connections of their own (a rare call;
 * the background thread's may be parked in a negotiation).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "report.h"
#include "rpc.h"
#include "settings.h"
#include "util.h"
#include "timeline.h"
#include "fastpath.h"

#define TIMELINE_CALL_MS 10000
/* stop_timeline waits this long for this rank's spans to be sent */
#define TIMELINE_FLUSH_MS 3000
#define COPY_PERIOD_MS   300
#define READ_CALL_MS     5000
#define STOP_WAIT_MS     10000
#define FINI_WAIT_MS     3000
#define FINI_SETTLE_MS   700

/* The process's copy (under copy.mu; the thread does its I/O outside). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the thread's wait; progress for waiters */
    pthread_once_t once;
    pthread_t thread;
    bool thread_on, quit;
    int fd;            /* the local file, -1: none */
    char *path;        /* as named: what TimelineRead is asked for */
    uint64_t offset;   /* the coordinator's bytes the file holds */
    uint64_t file_id;  /* of the coordinator's file they came from */
    bool closed_here;  /* kolo_fini added an end after offset */
    bool ended;        /* the coordinator's file ended, all of it is here */
    bool env_taken;    /* HOROVOD_TIMELINE looked at (once a process) */
    /* the connection, from the context that keeps the copy now (owner;
     * NULL between its kolo_fini and the next kolo_init) */
    const struct kolo_ctx *owner;
    struct rpc_client *cli;
    char url[512], ident[64];
    char *token;
    bool token_job;
    struct tls_files tls;
    uint64_t job, generation;
    int rank;
} copy = {.mu = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT, .fd = -1};

static void copy_once(void)
{
    cond_init_monotonic(&copy.cv);
}

/* copy_bind takes c's connection details for the copy's reads (under
 * copy.mu and c->mu): the old client goes. */
static void copy_bind(const struct kolo_ctx *c)
{
    if (copy.cli)
        rpc_client_close(copy.cli);
    copy.cli = NULL;
    copy.owner = c;
    snprintf(copy.url, sizeof copy.url, "%s", c->coord_url);
    snprintf(copy.ident, sizeof copy.ident, "job%llu-rank%d-timeline",
             (unsigned long long)c->job, c->rank);
    free(copy.token);
    copy.token = c->coord_token ? strdup(c->coord_token) : NULL;
    copy.token_job = c->coord_token_job;
    copy.tls = c->tls;
    copy.job = c->job;
    copy.generation = c->generation;
    copy.rank = c->rank;
}

/* One TimelineRead: the reply, or NULL with *code (by whoever pulls:
 * the thread, or with the thread stopped; without copy.mu). */
static Kolo__TimelineReadReply *copy_read(const char *path, uint64_t offset, int timeout_ms,
                                          int *code)
{
    if (!copy.cli) {
        struct rpc_client_config rc = {.url = copy.url,
                                       .token = copy.token,
                                       .token_is_job = copy.token_job,
                                       .identity = copy.ident,
                                       .job_id = copy.job,
                                       .generation = copy.generation,
                                       .rank = copy.rank,
                                       .tls = &copy.tls,
                                       .retry_busy = true};
        if ((*code = rpc_client_open(&copy.cli, &rc)) != 0)
            return NULL;
    }
    Kolo__TimelineReadRequest req = KOLO__TIMELINE_READ_REQUEST__INIT;
    req.path = (char *)path;
    req.offset = offset;
    size_t len = kolo__timeline_read_request__get_packed_size(&req);
    uint8_t *buf = malloc(len + 1);
    void *out = NULL;
    size_t olen = 0;
    char err[256] = "";
    if (!buf) {
        *code = KOLO_ENOMEM;
        return NULL;
    }
    kolo__timeline_read_request__pack(&req, buf);
    *code = rpc_client_call(copy.cli, "WorkerService.TimelineRead", buf, len, &out, &olen,
                            timeout_ms, err, sizeof err);
    free(buf);
    Kolo__TimelineReadReply *rep = NULL;
    if (*code == 0 && !(rep = kolo__timeline_read_reply__unpack(NULL, olen, out)))
        *code = KOLO_EPROTO;
    if (*code && *code != KOLO_ENOTFOUND)
        LOGD("kolo", "timeline %s: read: %s", path, err[0] ? err : kolo_strerror(*code));
    free(out);
    return rep;
}

/* copy_pull brings the copy up to date: reads until the coordinator has
 * nothing more (by whoever pulls, without copy.mu). 0, or a kolo error. */
static int copy_pull(int timeout_ms)
{
    for (int rounds = 0; rounds < 64; rounds++) {
        int code;
        Kolo__TimelineReadReply *rep = copy_read(copy.path, copy.offset, timeout_ms, &code);
        if (!rep)
            return code;
        if (rep->file_id != copy.file_id || rep->size < copy.offset) {
            /* written anew (started again, a coordinator that reopened it) */
            bool fresh = copy.offset == 0;
            copy.file_id = rep->file_id;
            copy.offset = 0;
            copy.closed_here = false;
            if (ftruncate(copy.fd, 0) != 0) {
                kolo__timeline_read_reply__free_unpacked(rep, NULL);
                return KOLO_EIO;
            }
            if (!fresh) {
                kolo__timeline_read_reply__free_unpacked(rep, NULL);
                continue;
            }
        }
        if (copy.closed_here && (rep->data.len || rep->ended)) {
            /* kolo_fini ended the file here; the coordinator's bytes go on */
            if (ftruncate(copy.fd, (off_t)copy.offset) != 0) {
                kolo__timeline_read_reply__free_unpacked(rep, NULL);
                return KOLO_EIO;
            }
            copy.closed_here = false;
        }
        if (rep->data.len && pwrite_all(copy.fd, rep->data.data, rep->data.len, copy.offset) != 0) {
            LOGW("kolo", "timeline %s: write failed: %s", copy.path, strerror(errno));
            kolo__timeline_read_reply__free_unpacked(rep, NULL);
            return KOLO_EIO;
        }
        copy.offset += rep->data.len;
        bool ended = rep->ended && copy.offset >= rep->size;
        bool drained = copy.offset >= rep->size;
        kolo__timeline_read_reply__free_unpacked(rep, NULL);
        if (ended) {
            pthread_mutex_lock(&copy.mu);
            copy.ended = true;
            pthread_mutex_unlock(&copy.mu);
            return 0;
        }
        if (drained)
            return 0;
    }
    return 0;
}

/* copy_close_here makes the file a JSON array as it stands: cut after its
 * last whole event (a torn one left out) and closed with "]". The next
 * pull reads on from the cut (without copy.mu, the thread stopped). */
static void copy_close_here(void)
{
    uint64_t from = copy.offset > 65536 ? copy.offset - 65536 : 0;
    size_t n = (size_t)(copy.offset - from);
    char *tail = malloc(n + 1);
    uint64_t cut = copy.offset;
    if (tail && n && pread(copy.fd, tail, n, (off_t)from) == (ssize_t)n) {
        size_t line = n; /* the last line: the last event, whole or torn */
        while (line > 0 && tail[line - 1] != '\n')
            line--;
        size_t end = n;
        while (end > line && (tail[end - 1] == ',' || tail[end - 1] == ' '))
            end--;
        struct json *ev = NULL;
        char err[64];
        bool whole = line > 0 && json_parse(tail + line, end - line, &ev, err, sizeof err) == 0 &&
                     ev->type == JSON_OBJECT;
        json_free(ev);
        size_t keep = whole ? end : line;
        if (!whole && line == 0)
            keep = from == 0 && n > 0 && tail[0] == '[' ? 1 : 0; /* no event yet */
        while (keep > 1 && (tail[keep - 1] == '\n' || tail[keep - 1] == ','))
            keep--;
        cut = from + keep;
    } else if (copy.offset == 0 || !tail) {
        cut = 0;
    }
    free(tail);
    const char *end = cut == 0 ? "[\n]\n" : "\n]\n";
    if (pwrite_all(copy.fd, end, strlen(end), cut) != 0 ||
        ftruncate(copy.fd, (off_t)(cut + strlen(end))) != 0)
        LOGW("kolo", "timeline %s: cannot end the file: %s", copy.path, strerror(errno));
    copy.offset = cut;
    copy.closed_here = true;
}

/* copy_drop forgets the copy (under copy.mu, the thread stopped). */
static void copy_drop(void)
{
    if (copy.fd >= 0)
        close(copy.fd);
    copy.fd = -1;
    free(copy.path);
    copy.path = NULL;
    copy.offset = copy.file_id = 0;
    copy.closed_here = copy.ended = false;
}

static void *copy_main(void *arg)
{
    (void)arg;
    thread_name("kolo-timeline");
    pthread_mutex_lock(&copy.mu);
    while (!copy.quit && !copy.ended) {
        pthread_mutex_unlock(&copy.mu);
        copy_pull(READ_CALL_MS);
        pthread_mutex_lock(&copy.mu);
        pthread_cond_broadcast(&copy.cv); /* progress, for a stop that waits */
        if (copy.quit || copy.ended)
            break;
        struct timespec ts;
        mono_deadline(&ts, COPY_PERIOD_MS);
        pthread_cond_timedwait(&copy.cv, &copy.mu, &ts);
    }
    pthread_cond_broadcast(&copy.cv);
    pthread_mutex_unlock(&copy.mu);
    return NULL;
}

/* copy_start starts the thread (under copy.mu). */
static void copy_start(void)
{
    copy.quit = false;
    if (!copy.thread_on && pthread_create(&copy.thread, NULL, copy_main, NULL) == 0)
        copy.thread_on = true;
}

/* copy_join stops the thread (under copy.mu, which it drops meanwhile). */
static void copy_join(void)
{
    copy.quit = true;
    pthread_cond_broadcast(&copy.cv);
    if (!copy.thread_on)
        return;
    pthread_t t = copy.thread;
    copy.thread_on = false;
    pthread_mutex_unlock(&copy.mu);
    pthread_join(t, NULL);
    pthread_mutex_lock(&copy.mu);
}

/* copy_finish waits (at most wait_ms) until the coordinator closed its
 * file and the copy holds all of it, then lets the copy go; a copy that
 * did not end in time is ended here (under copy.mu). */
static void copy_finish(int wait_ms)
{
    if (copy.fd < 0)
        return;
    uint64_t deadline = now_mono_ms() + (uint64_t)wait_ms;
    if (!copy.thread_on)
        copy_start();
    pthread_cond_broadcast(&copy.cv); /* read now, not in a period */
    while (!copy.ended && copy.thread_on && now_mono_ms() < deadline) {
        struct timespec ts;
        mono_deadline(&ts, deadline_left(deadline, 100));
        pthread_cond_timedwait(&copy.cv, &copy.mu, &ts);
    }
    copy_join();
    if (!copy.ended) {
        LOGW("kolo", "timeline %s: the coordinator did not end it within %d ms; the file "
             "ends here", copy.path, wait_ms);
        copy_close_here();
    }
    copy_drop();
}

/* copy_open opens the local file for rank 0's copy: the descriptor, or
 * -1 with the reason in c's last error. */
static int copy_open(struct kolo_ctx *c, const char *path)
{
    int fd = trace_file_open(path);
    if (fd < 0) {
        int e = errno;
        ctx_set_error(c, "cannot write the timeline %s: %s", path,
                      e == EEXIST ? TRACE_FILE_EEXIST : strerror(e));
    }
    return fd;
}

/* copy_adopt makes fd at path the copy and starts its thread (under c->mu
 * and copy.mu). */
static void copy_adopt(struct kolo_ctx *c, int fd, const char *path)
{
    copy.path = strdup(path);
    if (!copy.path) {
        close(fd);
        return;
    }
    copy.fd = fd;
    copy_bind(c);
    copy_start();
}

int kolo_timeline(kolo_ctx *c, const char *path)
{
    if (!c || (path && strlen(path) >= 4096))
        return KOLO_EINVAL;
    pthread_once(&copy.once, copy_once);
    char ident[64], url[512], err[512] = "";
    char *token = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->solo) {
        pthread_mutex_unlock(&c->mu);
        return ctx_error(c, KOLO_ENOTSUP,
                         "the timeline is written by the coordinator; start the program with "
                         "`kolo run`");
    }
    if (c->stopping || !c->coord_url) {
        pthread_mutex_unlock(&c->mu);
        return KOLO_ESHUTDOWN;
    }
    /* rank 0 of the job keeps the copy, as Horovod's rank 0 writes it */
    bool keeper = c->rank == 0 && c->process_set == 0;
    int rank = c->rank;
    bool starting = path && path[0];
    pthread_mutex_lock(&copy.mu);
    bool same = keeper && starting && copy.fd >= 0 && copy.path && strcmp(copy.path, path) == 0;
    pthread_mutex_unlock(&copy.mu);
    int fd = keeper && starting && !same ? copy_open(c, path) : -1;
    if (keeper && starting && !same && fd < 0) {
        pthread_mutex_unlock(&c->mu);
        return KOLO_EIO;
    }
    struct rpc_client_config rc;
    ctx_rpc_config(c, ident, sizeof ident, &rc);
    /* copies: c's may go once mu is released */
    snprintf(url, sizeof(url), "%s", c->coord_url);
    token = c->coord_token ? strdup(c->coord_token) : NULL;
    struct tls_files tls = c->tls;
    rc.url = url;
    rc.token = token;
    rc.tls = &tls;
    pthread_mutex_unlock(&c->mu);
    /* the ops this rank traced go before the stop: the coordinator takes
     * spans for a moment after it (TL_DRAIN_MS), not a report period or
     * two, and on a loaded host they came too late */
    if (!starting && !report_flush_spans(c, TIMELINE_FLUSH_MS))
        LOGW("kolo", "rank %d: stop_timeline: this rank's last spans were not sent in %d ms; "
             "the timeline may miss its last ops", rank, TIMELINE_FLUSH_MS);
    struct rpc_client *cli = NULL;
    int code = rpc_client_open(&cli, &rc);
    if (code) {
        free(token);
        if (fd >= 0)
            close(fd);
        return code;
    }
    Kolo__TimelineRequest req = KOLO__TIMELINE_REQUEST__INIT;
    req.path = (char *)(path ? path : "");
    size_t len = kolo__timeline_request__get_packed_size(&req);
    uint8_t *buf = malloc(len + 1);
    void *out = NULL;
    size_t olen = 0;
    if (!buf)
        code = KOLO_ENOMEM;
    else {
        kolo__timeline_request__pack(&req, buf);
        code = rpc_client_call(cli, "WorkerService.Timeline", buf, len, &out, &olen,
                               TIMELINE_CALL_MS, err, sizeof(err));
    }
    free(buf);
    free(out);
    rpc_client_close(cli);
    free(token);
    if (code == 0 && keeper && !same) {
        /* the coordinator ended the old file (if any): the copy takes all
         * of it before it goes, then the new one starts */
        pthread_mutex_lock(&copy.mu);
        copy_finish(STOP_WAIT_MS);
        copy.env_taken = true;
        pthread_mutex_unlock(&copy.mu);
    }
    pthread_mutex_lock(&c->mu);
    if (code) {
        ctx_set_error(c, "kolo_timeline: %s", err[0] ? err : kolo_strerror(code));
        if (fd >= 0)
            close(fd);
    } else {
        if (fd >= 0) {
            pthread_mutex_lock(&copy.mu);
            copy_adopt(c, fd, path);
            pthread_mutex_unlock(&copy.mu);
        }
        /* The coordinator writes it now: this rank's next round carries
         * TRACE, so every rank reports the ops it agrees from then on
         * without waiting for the long-poll to tell. Stopped, the
         * long-poll's word ends TRACE. */
        c->timeline_asked = starting;
        fast_news(c);
    }
    pthread_mutex_unlock(&c->mu);
    return code;
}

void timeline_ctx_init(struct kolo_ctx *c)
{
    if (c->solo || c->process_set != 0)
        return;
    pthread_once(&copy.once, copy_once);
    pthread_mutex_lock(&c->mu);
    pthread_mutex_lock(&copy.mu);
    if (copy.fd >= 0 && !copy.ended) {
        /* an elastic reset, or init after shutdown: go on; a second
         * context beside the keeping one (ranks as threads) leaves it */
        if (!copy.owner) {
            copy_bind(c);
            copy_start();
        }
    } else if (!copy.env_taken) {
        copy.env_taken = true;
        /* the rank 0 of the job's first generation: a worker that joins
         * an elastic job later as rank 0 must not start the file again
         * beside the process that keeps it (it may be on this host) */
        const char *env = timeline_env_path(settings_str(SET_TIMELINE));
        bool keeper = env && c->rank == 0 && c->generation <= 1;
        int fd = keeper ? copy_open(c, env) : -1;
        if (fd >= 0)
            copy_adopt(c, fd, env);
        else if (keeper)
            LOGW("kolo", "rank 0: %s; the coordinator keeps the job's timeline (REST "
                 "/api/v1/jobs/%llu/timeline)", c->last_error, (unsigned long long)c->job);
    }
    pthread_mutex_unlock(&copy.mu);
    pthread_mutex_unlock(&c->mu);
}

void timeline_ctx_fini(struct kolo_ctx *c)
{
    if (c->solo || c->process_set != 0)
        return;
    pthread_once(&copy.once, copy_once);
    pthread_mutex_lock(&copy.mu);
    if (copy.owner != c) { /* not the context that keeps the copy */
        pthread_mutex_unlock(&copy.mu);
        return;
    }
    copy.owner = NULL;
    if (copy.fd >= 0) {
        copy_join();
        /* what the coordinator has: the spans of the last ops reach it with
         * the ranks' last reports, so read until nothing new came for
         * FINI_SETTLE_MS (at most FINI_WAIT_MS); then a valid end until
         * more comes */
        uint64_t t0 = now_mono_ms(), moved = t0;
        pthread_mutex_unlock(&copy.mu);
        while (!copy.ended && now_mono_ms() - t0 < FINI_WAIT_MS &&
               now_mono_ms() - moved < FINI_SETTLE_MS) {
            uint64_t before = copy.offset;
            if (copy_pull(FINI_WAIT_MS) != 0)
                break;
            if (copy.offset != before)
                moved = now_mono_ms();
            else if (!copy.ended)
                usleep(COPY_PERIOD_MS * 1000 / 2);
        }
        pthread_mutex_lock(&copy.mu);
        if (copy.ended)
            copy_drop();
        else
            copy_close_here();
    }
    if (copy.cli)
        rpc_client_close(copy.cli);
    copy.cli = NULL;
    pthread_mutex_unlock(&copy.mu);
}
