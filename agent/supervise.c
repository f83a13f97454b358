/*
 * supervise.c - the worker processes of this host, on the agent's loop.
 *
 * DESIGN. The coordinator sends the full desired set of workers for this
 * host, keyed (job, generation, rank); supervise_reconcile makes reality
 * follow it: a key not yet seen is spawned, a running worker whose key
 * left the set is stopped. A key runs at most once: after its worker
 * exited it stays known (so it is not restarted) until the coordinator
 * drops it from the set. Restarting is the coordinator's decision, made by
 * issuing a new generation.
 *
 * Every worker is `kolo __exec [--user U] -- argv...` (see exec_shim.c,
 * job_user.c: U is --job-user, the user the worker runs as) started with
 * UV_PROCESS_DETACHED, so it leads a process group of its own: stopping
 * signals the whole group (the worker and whatever it forked), SIGTERM
 * first and SIGKILL after the grace. The group is signalled only while
 * exit_cb has not run, using the pid held in the uv_process_t: until the
 * leader is reaped its pid, and so the group id, cannot name anything
 * else.
 *
 * The shim's parent-death signal is tied to the thread that forked it,
 * which is this loop's thread (libuv forks in uv_spawn's caller); the
 * thread outlives every worker because shutdown waits for their exits.
 *
 * Exit ordering. stdout and stderr are pipes read into line splitters.
 * WORKER_EXITED is queued once both pipes reached EOF, or at the latest
 * AGENT_EXIT_FLUSH_MS after the exit (a grandchild may hold a pipe open),
 * and the pipes are closed then, so no line of a worker is ever queued
 * after its exit event.
 *
 * Lifetime of a struct worker: its handles (process, two pipes, a timer)
 * are closed once the exit is reported; when the last close callback ran
 * and the key is no longer desired, the struct is freed.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "creds.h"
#include "shm_names.h"
#include "errors.h"
#include "log.h"
#include "util.h"

extern char **environ;

enum { OUT = 0, ERR = 1 };

struct worker {
    struct worker *next;
    struct agent *a;
    struct worker_key key;

    uv_process_t proc;
    uv_pipe_t pipes[2];
    uv_timer_t timer; /* kill escalation while running, exit flush after */
    struct line_splitter lines[2];
    int handles_open; /* initialised handles whose close callback has not run */
    bool proc_inited;

    bool spawned;       /* the process was started */
    bool exited;        /* exit_cb ran (or the spawn failed) */
    bool eof[2];        /* a pipe reached EOF or failed, and was closed */
    bool exit_reported; /* WORKER_EXITED is queued; the handles are closing */
    bool stopping;      /* SIGTERM sent */
    bool desired;       /* the key is in the current desired set */
    int64_t exit_status;
    int term_signal;
};

/* ---------------------------------------------------------------- events */

static void queue_event(struct worker *w, Kolo__WorkerEventKind kind, int32_t pid, int exit_code,
                        int term_signal, const char *message)
{
    Kolo__WorkerEvent ev = KOLO__WORKER_EVENT__INIT;
    ev.job_id = w->key.job_id;
    ev.generation = w->key.generation;
    ev.rank = w->key.rank;
    ev.worker_id = w->key.worker_id;
    ev.kind = kind;
    ev.pid = pid;
    ev.exit_code = exit_code;
    ev.term_signal = term_signal;
    ev.message = (char *)(message ? message : "");
    ev.ts_ms = now_wall_ms();
    agent_queue_event(w->a, &ev);
}

static void emit_stdout(void *arg, const char *line, size_t len)
{
    struct worker *w = arg;
    agent_queue_line(w->a, &w->key, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, line, len);
}

static void emit_stderr(void *arg, const char *line, size_t len)
{
    struct worker *w = arg;
    agent_queue_line(w->a, &w->key, KOLO__OUTPUT_STREAM__OUTPUT_STDERR, line, len);
}

/* ---------------------------------------------------------------- lifetime */

static void worker_unlink(struct agent *a, struct worker *w)
{
    for (struct worker **pp = &a->workers; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
    line_splitter_free(&w->lines[OUT]);
    line_splitter_free(&w->lines[ERR]);
    free(w);
}

static void on_closed(uv_handle_t *h)
{
    struct worker *w = h->data;
    struct agent *a = w->a;
    if (--w->handles_open > 0)
        return;
    /* The key stays known while desired, so that it is not restarted; the
     * buffers are not needed any more. */
    line_splitter_free(&w->lines[OUT]);
    line_splitter_free(&w->lines[ERR]);
    if (!w->desired)
        worker_unlink(a, w);
    agent_loop_check_done(a);
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, on_closed);
}

/* worker_finish queues the exit and closes every handle: the end of the
 * worker's life on this host. */
static void worker_finish(struct worker *w)
{
    if (w->exit_reported)
        return;
    w->exit_reported = true;
    for (int i = 0; i < 2; i++) {
        if (!w->eof[i]) {
            /* Something still holds the pipe (see DESIGN): keep what was
             * read, drop what was not. */
            line_splitter_finish(&w->lines[i]);
            w->eof[i] = true;
        }
        close_handle((uv_handle_t *)&w->pipes[i]);
    }
    if (w->spawned) {
        int32_t pid = (int32_t)uv_process_get_pid(&w->proc);
        queue_event(w, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, pid, (int)w->exit_status,
                    w->term_signal, NULL);
        if (w->term_signal)
            LOGI("agent", "job %" PRIu64 " rank %d: pid %d killed by signal %d", w->key.job_id, w->key.rank,
                 pid, w->term_signal);
        else
            LOGI("agent", "job %" PRIu64 " rank %d: pid %d exited with code %d", w->key.job_id, w->key.rank,
                 pid, (int)w->exit_status);
    }
    close_handle((uv_handle_t *)&w->timer);
    if (w->proc_inited)
        close_handle((uv_handle_t *)&w->proc);
    /* Shared segments are unlinked once every local rank attached; ranks
     * that died before that leave theirs in /dev/shm. */
    int swept = shm_names_sweep(w->key.job_id);
    if (swept)
        LOGI("agent", "job %" PRIu64 ": removed %d shared-memory segment(s) its dead ranks left",
             w->key.job_id, swept);
}

/* ---------------------------------------------------------------- output */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct worker *w = h->data;
    int i = h == (uv_handle_t *)&w->pipes[OUT] ? OUT : ERR;
    char *p;
    size_t n;
    (void)suggested;
    line_splitter_space(&w->lines[i], &p, &n);
    *buf = uv_buf_init(p, (unsigned int)n);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct worker *w = s->data;
    int i = s == (uv_stream_t *)&w->pipes[OUT] ? OUT : ERR;
    (void)buf;
    if (nread > 0) {
        line_splitter_commit(&w->lines[i], (size_t)nread);
        return;
    }
    if (nread == 0)
        return; /* EAGAIN: nothing read this time */
    if (nread != UV_EOF)
        LOGD("agent", "job %" PRIu64 " rank %d: reading %s: %s", w->key.job_id, w->key.rank,
             i == OUT ? "stdout" : "stderr", uv_strerror((int)nread));
    line_splitter_finish(&w->lines[i]);
    w->eof[i] = true;
    close_handle((uv_handle_t *)s);
    if (w->exited && w->eof[OUT] && w->eof[ERR])
        worker_finish(w);
}

/* ---------------------------------------------------------------- exit, stop */

static void on_flush_timeout(uv_timer_t *t)
{
    worker_finish(t->data);
}

static void on_worker_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct worker *w = p->data;
    w->exited = true;
    w->exit_status = exit_status;
    w->term_signal = term_signal;
    agent_running_remove(w->a, &w->key);
    uv_timer_stop(&w->timer);
    if (w->eof[OUT] && w->eof[ERR])
        worker_finish(w);
    else
        uv_timer_start(&w->timer, on_flush_timeout, AGENT_EXIT_FLUSH_MS, 0);
}

static void signal_group(struct worker *w, int sig)
{
    /* Only called before exit_cb: the pid is the live group leader's. */
    int pid = uv_process_get_pid(&w->proc);
    if (pid <= 0)
        return;
    if (uv_kill(-pid, sig) != 0) {
        /* The group is gone but the leader is not reaped yet, or it never
         * got its own group; the process itself is what is left. */
        uv_process_kill(&w->proc, sig);
    }
}

static void on_kill_timeout(uv_timer_t *t)
{
    struct worker *w = t->data;
    if (w->exited)
        return;
    LOGW("agent", "job %" PRIu64 " rank %d: still running %lld ms after SIGTERM, sending SIGKILL",
         w->key.job_id, w->key.rank, (long long)w->a->grace_ms);
    signal_group(w, SIGKILL);
}

/* why ends the log line: what an operator reads to tell a fenced
 * generation from an agent going down. */
static void worker_stop(struct worker *w, const char *why)
{
    if (!w->spawned || w->exited || w->stopping)
        return;
    w->stopping = true;
    LOGI("agent", "job %" PRIu64 " gen %" PRIu64 " rank %d: stopping (SIGTERM, SIGKILL after %lld ms): %s",
         w->key.job_id, w->key.generation, w->key.rank, (long long)w->a->grace_ms, why);
    signal_group(w, SIGTERM);
    uv_timer_start(&w->timer, on_kill_timeout, (uint64_t)(w->a->grace_ms > 0 ? w->a->grace_ms : 0),
                   0);
}

/* ---------------------------------------------------------------- spawn */

struct envv {
    char **v;
    size_t n, cap;
    bool oom;
};

/* envv_set adds "NAME=value" (copied), replacing an entry of the same name. */
static void envv_set(struct envv *e, const char *entry)
{
    const char *eq = strchr(entry, '=');
    if (!eq || eq == entry)
        return;
    size_t nlen = (size_t)(eq - entry) + 1; /* name and '=' */
    char *copy = strdup(entry);
    if (!copy) {
        e->oom = true;
        return;
    }
    for (size_t i = 0; i < e->n; i++) {
        if (strncmp(e->v[i], entry, nlen) == 0) {
            free(e->v[i]);
            e->v[i] = copy;
            return;
        }
    }
    if (e->n + 2 > e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 64;
        char **v = realloc(e->v, cap * sizeof(*v));
        if (!v) {
            free(copy);
            e->oom = true;
            return;
        }
        e->v = v;
        e->cap = cap;
    }
    e->v[e->n++] = copy;
    e->v[e->n] = NULL;
}

/* envv_unset removes NAME's entry, if any. */
static void envv_unset(struct envv *e, const char *name)
{
    size_t nlen = strlen(name);
    for (size_t i = 0; i < e->n; i++) {
        if (strncmp(e->v[i], name, nlen) == 0 && e->v[i][nlen] == '=') {
            free(e->v[i]);
            e->v[i] = e->v[--e->n];
            e->v[e->n] = NULL;
            return;
        }
    }
}

static void envv_setf(struct envv *e, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void envv_setf(struct envv *e, const char *name, const char *fmt, ...)
{
    char entry[1024];
    int off = snprintf(entry, sizeof(entry), "%s=", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(entry + off, sizeof(entry) - (size_t)off, fmt, ap);
    va_end(ap);
    envv_set(e, entry);
}

static void envv_free(struct envv *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->v[i]);
    free(e->v);
}

/* build_env: the agent's environment, then the spec's entries over it,
 * then the rank variables over both (a job cannot lie about its rank). */
static void build_env(struct agent *a, const Kolo__WorkerSpec *s, struct envv *e)
{
    for (char **p = environ; p && *p; p++)
        envv_set(e, *p);
    for (size_t i = 0; i < s->n_env; i++) {
        if (!strchr(s->env[i], '=') || s->env[i][0] == '=')
            LOGW("agent",
                 "job %" PRIu64 " rank %d: ignoring environment entry '%s' "
                 "(want NAME=value)",
                 s->job_id, s->rank, s->env[i]);
        else
            envv_set(e, s->env[i]);
    }
    static const char *const pre[] = {"KOLO", "HOROVOD"};
    for (int k = 0; k < 2; k++) {
        char name[64];
#define SETV(suffix, val)                                                                          \
    do {                                                                                           \
        snprintf(name, sizeof(name), "%s_%s", pre[k], suffix);                                     \
        envv_setf(e, name, "%d", (int)(val));                                                      \
    } while (0)
        SETV("RANK", s->rank);
        SETV("SIZE", s->size);
        SETV("LOCAL_RANK", s->local_rank);
        SETV("LOCAL_SIZE", s->local_size);
        SETV("CROSS_RANK", s->cross_rank);
        SETV("CROSS_SIZE", s->cross_size);
#undef SETV
    }
    envv_setf(e, "HOROVOD_HOSTNAME", "%s", a->name);
    envv_setf(e, "KOLO_JOB", "%" PRIu64, s->job_id);
    envv_setf(e, "KOLO_GENERATION", "%" PRIu64, s->generation);
    envv_setf(e, "KOLO_WORKER_ID", "%" PRIu64, s->worker_id);
    envv_setf(e, "KOLO_COORDINATOR", "%s", a->url);
    envv_setf(e, "KOLO_HOST_ID", "%s", a->host_id);
    envv_setf(e, "KOLO_AGENT_PID", "%d", a->pid);
    envv_setf(e, "KOLO_STOP_GRACE_MS", "%lld", (long long)a->grace_ms);
    envv_set(e, "PYTHONUNBUFFERED=1");
    /* Workers get their job's credential, never the cluster token (not
     * from the agent's environment either, nor from the job's own
     * entries): a job that prints its environment gives away nothing
     * beyond itself (common/creds.h). */
    envv_unset(e, "KOLO_TOKEN");
    envv_unset(e, "KOLO_JOB_TOKEN");
    /* The agent's TLS files reach the coordinator, so they are the
     * workers' too; without them the job's own KOLO_TLS_* would only turn
     * its tcp:// coordinator address into a TLS one it cannot reach. */
    envv_unset(e, "KOLO_TLS_DIR");
    envv_unset(e, "KOLO_TLS_CERT");
    envv_unset(e, "KOLO_TLS_KEY");
    envv_unset(e, "KOLO_TLS_CA");
    if (tls_files_on(&a->tls)) {
        envv_setf(e, "KOLO_TLS_CA", "%s", a->tls.ca);
        if (a->tls.cert[0]) {
            envv_setf(e, "KOLO_TLS_CERT", "%s", a->tls.cert);
            envv_setf(e, "KOLO_TLS_KEY", "%s", a->tls.key);
        }
    }
    if (a->token) {
        char cred[CREDS_JOB_HEX];
        creds_job(a->token, s->job_id, cred);
        envv_setf(e, "KOLO_JOB_TOKEN", "%s", cred);
        memset(cred, 0, sizeof cred);
    }
}

static struct worker *worker_new(struct agent *a, const Kolo__WorkerSpec *s)
{
    struct worker *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->a = a;
    w->key = (struct worker_key){s->job_id, s->generation, s->worker_id, s->rank};
    w->desired = true;
    if (line_splitter_init(&w->lines[OUT], AGENT_LINE_MAX, emit_stdout, w) != 0 ||
        line_splitter_init(&w->lines[ERR], AGENT_LINE_MAX, emit_stderr, w) != 0) {
        line_splitter_free(&w->lines[OUT]);
        free(w);
        return NULL;
    }
    /* Neither init can fail on Unix; they only record the loop. */
    uv_pipe_init(&a->loop, &w->pipes[OUT], 0);
    uv_pipe_init(&a->loop, &w->pipes[ERR], 0);
    uv_timer_init(&a->loop, &w->timer);
    w->pipes[OUT].data = w->pipes[ERR].data = w->timer.data = w->proc.data = w;
    w->handles_open = 3;
    w->next = a->workers;
    a->workers = w;
    return w;
}

/* spawn_failed reports a worker that never ran; the coordinator sees a
 * failed spawn and an exit with code 127, like a shell's "not found". */
static void spawn_failed(struct worker *w, const char *msg)
{
    LOGE("agent", "job %" PRIu64 " rank %d: cannot start worker: %s", w->key.job_id, w->key.rank, msg);
    queue_event(w, KOLO__WORKER_EVENT_KIND__WORKER_SPAWN_FAILED, 0, 0, 0, msg);
    queue_event(w, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0, 127, 0, msg);
    w->exited = true;
    w->eof[OUT] = w->eof[ERR] = true;
    worker_finish(w);
}

static void worker_spawn(struct agent *a, const Kolo__WorkerSpec *s)
{
    struct worker *w = worker_new(a, s);
    if (!w) {
        LOGE("agent", "job %" PRIu64 " rank %d: out of memory starting a worker", s->job_id,
             s->rank);
        return;
    }
    if (s->n_argv == 0 || !s->argv[0][0]) {
        spawn_failed(w, "empty command");
        return;
    }

    struct envv env = {0};
    build_env(a, s, &env);
    char **args = calloc(s->n_argv + 6, sizeof(char *));
    if (env.oom || !env.v || !args) {
        envv_free(&env);
        free(args);
        spawn_failed(w, "out of memory");
        return;
    }
    size_t k = 0;
    args[k++] = a->exec_path;
    args[k++] = "__exec";
    if (a->job_user) { /* the shim switches to it first (job_user.c) */
        args[k++] = "--user";
        args[k++] = a->job_user;
    }
    args[k++] = "--";
    for (size_t i = 0; i < s->n_argv; i++)
        args[k + i] = s->argv[i];

    /* fd 3: where its Python writes its stacks for kolo stacks (stacks.c) */
    int stacks_fd = stacks_file();
    uv_stdio_container_t stdio[STACKS_CHILD_FD + 1];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&w->pipes[OUT];
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&w->pipes[ERR];
    stdio[STACKS_CHILD_FD].flags = stacks_fd >= 0 ? UV_INHERIT_FD : UV_IGNORE;
    stdio[STACKS_CHILD_FD].data.fd = stacks_fd;
    if (stacks_fd >= 0)
        envv_setf(&env, "KOLO_STACKS_FD", "%d", STACKS_CHILD_FD);
    if (stacks_fd >= 0)
        envv_setf(&env, "KOLO_STACKS_SIGNAL", "%d", stacks_signal());

    uv_process_options_t opt = {0};
    opt.file = a->exec_path;
    opt.args = args;
    opt.env = env.v;
    opt.cwd = s->cwd && s->cwd[0] ? s->cwd : NULL;
    opt.flags = UV_PROCESS_DETACHED;
    opt.exit_cb = on_worker_exit;
    opt.stdio = stdio;
    opt.stdio_count = stacks_fd >= 0 ? STACKS_CHILD_FD + 1 : 3;

    int rc = uv_spawn(&a->loop, &w->proc, &opt);
    /* uv_spawn initialises the handle even when it fails; it must be
     * closed either way. */
    w->proc_inited = true;
    w->handles_open++;
    envv_free(&env);
    free(args);
    if (rc != 0) {
        if (stacks_fd >= 0)
            close(stacks_fd);
        char msg[512];
        if (opt.cwd)
            snprintf(msg, sizeof(msg), "cannot start '%s' in '%s': %s", s->argv[0], opt.cwd,
                     uv_strerror(rc));
        else
            snprintf(msg, sizeof(msg), "cannot start '%s': %s", s->argv[0], uv_strerror(rc));
        spawn_failed(w, msg);
        return;
    }
    w->spawned = true;
    int32_t pid = (int32_t)uv_process_get_pid(&w->proc);
    agent_running_add(a, &w->key, pid, stacks_fd); /* which closes it */
    queue_event(w, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, pid, 0, 0, NULL);
    LOGI("agent", "job %" PRIu64 " gen %" PRIu64 " rank %d: started pid %d: %s", w->key.job_id,
         w->key.generation, w->key.rank, pid, s->argv[0]);
    for (int i = 0; i < 2; i++) {
        int r = uv_read_start((uv_stream_t *)&w->pipes[i], on_alloc, on_read);
        if (r != 0) {
            LOGW("agent", "job %" PRIu64 " rank %d: cannot read %s: %s", w->key.job_id, w->key.rank,
                 i == OUT ? "stdout" : "stderr", uv_strerror(r));
            w->eof[i] = true;
            close_handle((uv_handle_t *)&w->pipes[i]);
        }
    }
}

/* ---------------------------------------------------------------- reconcile */

static struct worker *find(struct agent *a, const struct worker_key *k)
{
    for (struct worker *w = a->workers; w; w = w->next)
        if (worker_key_eq(&w->key, k))
            return w;
    return NULL;
}

void supervise_reconcile(struct agent *a, const Kolo__HeartbeatReply *rep)
{
    if (rep->stop_grace_ms > 0)
        a->grace_ms = rep->stop_grace_ms;
    for (struct worker *w = a->workers; w; w = w->next)
        w->desired = false;
    for (size_t i = 0; i < rep->n_desired; i++) {
        const Kolo__WorkerSpec *s = rep->desired[i];
        struct worker_key k = {s->job_id, s->generation, s->worker_id, s->rank};
        struct worker *w = find(a, &k);
        if (w)
            w->desired = true;
        else
            worker_spawn(a, s);
    }
    struct worker *next;
    for (struct worker *w = a->workers; w; w = next) {
        next = w->next;
        if (w->desired)
            continue;
        if (w->handles_open == 0)
            worker_unlink(a, w); /* finished earlier; forget the key */
        else
            /* frees itself once its handles are closed */
            worker_stop(w, "not in the coordinator's plan any more (its generation is over, "
                           "or the job ended)");
    }
}

void supervise_stop_all(struct agent *a)
{
    struct worker *next;
    for (struct worker *w = a->workers; w; w = next) {
        next = w->next;
        w->desired = false;
        if (w->handles_open == 0)
            worker_unlink(a, w);
        else
            worker_stop(w, "the agent is stopping");
    }
}

void supervise_force_close(struct agent *a)
{
    for (struct worker *w = a->workers; w; w = w->next) {
        w->desired = false;
        if (w->exit_reported)
            continue;
        if (!w->exited) {
            /* Not even SIGKILL ended it (uninterruptible sleep in a
             * driver, typically). Give up the handle; the process is left
             * to init. */
            LOGE("agent",
                 "job %" PRIu64 " rank %d: pid %d did not exit after SIGKILL; "
                 "abandoning it",
                 w->key.job_id, w->key.rank, uv_process_get_pid(&w->proc));
            w->exited = true;
            w->term_signal = SIGKILL;
            agent_running_remove(a, &w->key);
        }
        worker_finish(w);
    }
}

bool supervise_idle(const struct agent *a)
{
    return a->workers == NULL;
}
