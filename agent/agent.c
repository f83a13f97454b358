/*
 * agent.c - the agent's lifecycle: configuration, host id, the loop
 * thread and the mailbox between the threads (see agent_int.h).
 *
 * DESIGN. The libuv loop runs on a thread of its own and owns every
 * worker; other threads talk to it only through the mailbox under
 * agent.mu plus uv_async_send, the one libuv call that is thread-safe.
 * The mailbox holds at most one desired set (a newer one replaces an
 * unread older one: each is the full set, so only the latest matters) and
 * the stop request. A wake is sent only while loop_alive is set; the loop
 * clears it under the lock before closing the async handle, so no thread
 * can touch a closed handle.
 *
 * Shutdown runs on the loop: every worker is stopped (SIGTERM, SIGKILL
 * after the grace); once the last worker's handles are closed the loop
 * closes its own and uv_run returns. A timer bounds the whole thing in
 * case a process survives SIGKILL (a task stuck in a driver). Only then
 * is the link stopped, so the last Report carries the workers' exits.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_int.h"
#include "errors.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "rpc.h"
#include "util.h"

/* How long the shutdown waits, beyond the grace, for processes that were
 * sent SIGKILL before it gives up on them. */
#define AGENT_STOP_SLACK_MS 3000

/* ---------------------------------------------------------------- host id */

static int default_state_dir(const char *name, char *out, size_t n)
{
    char safe[256];
    str_copy(safe, name, sizeof(safe));
    for (char *p = safe; *p; p++)
        if (*p == '/')
            *p = '_';
    const char *xdg = getenv("XDG_STATE_HOME");
    if (xdg && xdg[0] == '/') {
        snprintf(out, n, "%s/kolo/agent-%s", xdg, safe);
        return 0;
    }
    const char *home = getenv("HOME");
    if (!home || !*home) {
        struct passwd *pw = getpwuid(getuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home || !*home)
        return KOLO_EINVAL;
    snprintf(out, n, "%s/.local/state/kolo/agent-%s", home, safe);
    return 0;
}

/* The coordinator's rule for host ids: what an operator may also write into
 * the file by hand (a name instead of random hex). */
static bool host_id_valid(const char *s, size_t len)
{
    if (len == 0 || len >= sizeof(((struct agent *)0)->host_id))
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

/* load_host_id reads <state_dir>/host-id, or creates it. The id is what
 * lets a restarted agent (or a restarted coordinator) recognise the host,
 * so an unreadable file is an error rather than a reason to make a new
 * identity; only a missing or mangled one is replaced. */
static int load_host_id(struct agent *a, char *err, size_t errlen)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    int rc = mkdir_p(a->state_dir);
    if (rc)
        return errf(err, errlen, rc, "cannot create state directory %s: %s", a->state_dir,
                       strerror(errno));
    snprintf(path, sizeof(path), "%s/host-id", a->state_dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        char *data = NULL;
        size_t len = 0;
        rc = read_file_all(path, &data, &len, 4096);
        if (rc) {
            free(data);
            return errf(err, errlen, rc, "cannot read host id from %s: %s", path,
                           abi_strerror(rc));
        }
        size_t b = 0, e = len;
        while (b < e && (data[b] == ' ' || data[b] == '\n' || data[b] == '\r' || data[b] == '\t'))
            b++;
        while (e > b && (data[e - 1] == ' ' || data[e - 1] == '\n' || data[e - 1] == '\r' ||
                         data[e - 1] == '\t'))
            e--;
        if (host_id_valid(data + b, e - b)) {
            memcpy(a->host_id, data + b, e - b);
            a->host_id[e - b] = '\0';
            free(data);
            return 0;
        }
        free(data);
        LOGW("agent", "%s does not hold a host id; making a new one", path);
    } else if (errno != ENOENT) {
        return errf(err, errlen, KOLO_ESYS, "cannot read host id from %s: %s", path,
                       strerror(errno));
    }

    if ((rc = random_hex(a->host_id, 16)) != 0)
        return errf(err, errlen, rc, "cannot make a host id: no randomness");
    /* Write and rename, so a crash never leaves a half-written id behind. */
    snprintf(tmp, sizeof(tmp), "%s/host-id.tmp", a->state_dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return errf(err, errlen, KOLO_ESYS, "cannot write %s: %s", tmp, strerror(errno));
    char line[40];
    int n = snprintf(line, sizeof(line), "%s\n", a->host_id);
    bool ok = write(fd, line, (size_t)n) == n && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if (!ok || rename(tmp, path) != 0) {
        e = ok ? errno : e;
        unlink(tmp);
        return errf(err, errlen, KOLO_ESYS, "cannot write %s: %s", path, strerror(e));
    }
    LOGI("agent", "new host id %s (saved in %s)", a->host_id, path);
    return 0;
}

/* ---------------------------------------------------------------- shared state */

bool worker_key_eq(const struct worker_key *a, const struct worker_key *b)
{
    if (a->job_id != b->job_id || a->worker_id != b->worker_id)
        return false;
    return a->worker_id != 0 || (a->generation == b->generation && a->rank == b->rank);
}

void agent_running_add(struct agent *a, const struct worker_key *k, int32_t pid, int stacks_fd)
{
    pthread_mutex_lock(&a->mu);
    if (a->n_running == a->cap_running) {
        size_t cap = a->cap_running ? a->cap_running * 2 : 16;
        Kolo__RunningWorker *r = realloc(a->running, cap * sizeof(*r));
        if (r)
            a->running = r;
        uint64_t *since = r ? realloc(a->stopped_since, cap * sizeof(*since)) : NULL;
        if (since)
            a->stopped_since = since;
        int *fds = since ? realloc(a->stacks_fd, cap * sizeof(*fds)) : NULL;
        if (!fds) {
            pthread_mutex_unlock(&a->mu);
            LOGE("agent", "out of memory tracking a running worker");
            if (stacks_fd >= 0)
                close(stacks_fd);
            return;
        }
        a->stacks_fd = fds;
        a->cap_running = cap;
    }
    a->stopped_since[a->n_running] = 0;
    a->stacks_fd[a->n_running] = stacks_fd;
    Kolo__RunningWorker init = KOLO__RUNNING_WORKER__INIT;
    init.job_id = k->job_id;
    init.generation = k->generation;
    init.rank = k->rank;
    init.worker_id = k->worker_id;
    init.pid = pid;
    a->running[a->n_running++] = init;
    a->stats.workers_alive = (int)a->n_running;
    pthread_mutex_unlock(&a->mu);
}

void agent_running_remove(struct agent *a, const struct worker_key *k)
{
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->n_running; i++) {
        Kolo__RunningWorker *r = &a->running[i];
        struct worker_key rk = {r->job_id, r->generation, r->worker_id, r->rank};
        if (worker_key_eq(&rk, k)) {
            if (a->stacks_fd[i] >= 0)
                close(a->stacks_fd[i]);
            a->running[i] = a->running[--a->n_running];
            a->stopped_since[i] = a->stopped_since[a->n_running];
            a->stacks_fd[i] = a->stacks_fd[a->n_running];
            break;
        }
    }
    a->stats.workers_alive = (int)a->n_running;
    pthread_mutex_unlock(&a->mu);
}

/* The state letter of a worker's process: the command the shim forked
 * (exec_shim.c; the first child in /proc/PID/task/PID/children), else
 * the shim itself; from /proc/PID/stat, after the command's closing
 * parenthesis (which the command's name may hold too). 0: unreadable. */
char agent_proc_state(int shim, int *pid_out)
{
    char path[64], buf[512];
    int pid = shim;
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", shim, shim);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n > 0 ? n : 0] = '\0';
        if (atoi(buf) > 0)
            pid = atoi(buf);
    }
    *pid_out = pid;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *end = strrchr(buf, ')');
    return end && end[1] == ' ' ? end[2] : 0;
}

Kolo__RunningWorker *agent_running_stopped(struct agent *a, size_t *n)
{
    *n = 0;
    pthread_mutex_lock(&a->mu);
    size_t count = a->n_running;
    int *pids = count ? malloc(count * sizeof *pids) : NULL;
    for (size_t i = 0; pids && i < count; i++)
        pids[i] = a->running[i].pid;
    pthread_mutex_unlock(&a->mu);
    if (!pids)
        return NULL;
    /* read outside the lock; a worker that came or went meanwhile waits
     * for the next heartbeat */
    char *state = malloc(count ? count : 1);
    int *real = malloc((count ? count : 1) * sizeof *real); /* the command's pid */
    for (size_t i = 0; state && real && i < count; i++) {
        real[i] = pids[i];
        state[i] = pids[i] > 0 ? agent_proc_state(pids[i], &real[i]) : 0;
    }
    Kolo__RunningWorker *out = state && real ? calloc(count, sizeof *out) : NULL;
    uint64_t now = now_mono_ms();
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; out && i < a->n_running; i++) {
        size_t k = 0;
        while (k < count && pids[k] != a->running[i].pid)
            k++;
        if (k == count)
            continue;
        /* T: stopped by a signal; t (a debugger's stop) is not frozen */
        if (state[k] != 'T') {
            a->stopped_since[i] = 0;
            continue;
        }
        if (!a->stopped_since[i])
            a->stopped_since[i] = now;
        out[*n] = a->running[i];
        out[*n].pid = real[k];
        uint64_t ms = now - a->stopped_since[i];
        out[*n].stopped_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
        (*n)++;
    }
    pthread_mutex_unlock(&a->mu);
    free(pids);
    free(state);
    free(real);
    if (out && *n == 0) {
        free(out);
        out = NULL;
    }
    return out;
}

void agent_post_desired(struct agent *a, Kolo__HeartbeatReply *rep)
{
    Kolo__HeartbeatReply *old = NULL;
    pthread_mutex_lock(&a->mu);
    if (a->loop_alive) {
        old = a->mail_desired;
        a->mail_desired = rep;
        uv_async_send(&a->wake);
    } else {
        old = rep;
    }
    pthread_mutex_unlock(&a->mu);
    if (old)
        kolo__heartbeat_reply__free_unpacked(old, NULL);
}

void agent_queue_event(struct agent *a, const Kolo__WorkerEvent *ev)
{
    pthread_mutex_lock(&a->mu);
    if (outbox_push_event(&a->outbox, ev))
        pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
}

void agent_queue_line(struct agent *a, const struct worker_key *k, int stream, const char *text,
                      size_t len)
{
    uint64_t ts = now_wall_ms();
    pthread_mutex_lock(&a->mu);
    if (outbox_push_line(&a->outbox, k->job_id, k->rank, k->worker_id, stream, text, len, ts))
        pthread_cond_broadcast(&a->cond);
    a->stats.dropped_lines = a->outbox.dropped;
    pthread_mutex_unlock(&a->mu);
}

/* ---------------------------------------------------------------- loop */

static void on_stop_deadline(uv_timer_t *t)
{
    struct agent *a = t->data;
    LOGE("agent", "workers still running %d ms after SIGKILL; giving up on them",
         AGENT_STOP_SLACK_MS);
    supervise_force_close(a);
}

void agent_loop_check_done(struct agent *a)
{
    if (!a->shutting_down || !supervise_idle(a) || uv_is_closing((uv_handle_t *)&a->wake))
        return;
    pthread_mutex_lock(&a->mu);
    a->loop_alive = false;
    pthread_mutex_unlock(&a->mu);
    uv_close((uv_handle_t *)&a->wake, NULL);
    uv_close((uv_handle_t *)&a->stop_timer, NULL);
}

static void on_wake(uv_async_t *h)
{
    struct agent *a = h->data;
    pthread_mutex_lock(&a->mu);
    Kolo__HeartbeatReply *rep = a->mail_desired;
    a->mail_desired = NULL;
    bool stop = a->mail_stop;
    pthread_mutex_unlock(&a->mu);

    if (rep) {
        if (!a->shutting_down)
            supervise_reconcile(a, rep);
        kolo__heartbeat_reply__free_unpacked(rep, NULL);
    }
    if (stop && !a->shutting_down) {
        a->shutting_down = true;
        supervise_stop_all(a);
        uv_timer_start(&a->stop_timer, on_stop_deadline,
                       (uint64_t)(a->grace_ms + AGENT_STOP_SLACK_MS), 0);
        agent_loop_check_done(a);
    }
}

static void *loop_main(void *arg)
{
    thread_name("kolo-agent");
    struct agent *a = arg;
    uv_run(&a->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void walk_cb(uv_handle_t *h, void *arg)
{
    (void)arg;
    LOGE("agent", "  handle left open: %s%s", uv_handle_type_name(h->type),
         uv_is_closing(h) ? " (closing)" : "");
}

/* ---------------------------------------------------------------- start, stop */

static void agent_free(struct agent *a)
{
    if (a->rpc)
        rpc_client_close(a->rpc);
    if (a->hb_rpc)
        rpc_client_close(a->hb_rpc);
    if (a->mail_desired)
        kolo__heartbeat_reply__free_unpacked(a->mail_desired, NULL);
    outbox_free(&a->outbox);
    inventory_free(&a->inv);
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->mu);
    for (size_t i = 0; i < a->n_running; i++)
        if (a->stacks_fd[i] >= 0)
            close(a->stacks_fd[i]);
    free(a->running);
    free(a->stopped_since);
    free(a->stacks_fd);
    free(a->url);
    free(a->token);
    free(a->name);
    free(a->addr);
    free(a->state_dir);
    free(a->exec_path);
    free(a->job_user);
    free(a);
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

int agent_start(struct agent **out, const struct agent_config *cfg, char *err, size_t errlen)
{
    char buf[PATH_MAX];
    bool oom = false;
    int rc;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (!cfg || !cfg->coordinator_url || !*cfg->coordinator_url)
        return errf(err, errlen, KOLO_EINVAL, "no coordinator address given");
    if (cfg->slots < 0 || cfg->stop_grace_ms < 0)
        return errf(err, errlen, KOLO_EINVAL, "slots and stop grace must not be negative");

    struct agent *a = calloc(1, sizeof(*a));
    if (!a)
        return errf(err, errlen, KOLO_ENOMEM, "out of memory");
    pthread_mutex_init(&a->mu, NULL);
    /* Timed waits on the cond are deadlines: measure them on the
     * monotonic clock so a wall-clock step cannot stretch them. */
    cond_init_monotonic(&a->cond);
    outbox_init(&a->outbox, AGENT_OUTBOX_CAP);
    a->pid = (int)getpid();

    if (gethostname(a->hostname, sizeof(a->hostname) - 1) != 0 || !a->hostname[0])
        str_copy(a->hostname, "localhost", sizeof(a->hostname));
    a->url = dup_or_null(cfg->coordinator_url, &oom);
    a->token = cfg->token && *cfg->token ? dup_or_null(cfg->token, &oom) : NULL;
    if (cfg->tls)
        a->tls = *cfg->tls;
    a->name = dup_or_null(cfg->name && *cfg->name ? cfg->name : a->hostname, &oom);
    if (cfg->addr && *cfg->addr) {
        a->addr = dup_or_null(cfg->addr, &oom);
    } else {
        host_default_addr(a->hostname, buf, sizeof(buf));
        a->addr = dup_or_null(buf, &oom);
    }
    if (cfg->exec_path && *cfg->exec_path) {
        /* Absolute: workers are spawned after a chdir to their cwd. */
        if (!realpath(cfg->exec_path, buf)) {
            rc = errf(err, errlen, KOLO_EINVAL, "cannot find %s: %s", cfg->exec_path,
                         strerror(errno));
            agent_free(a);
            return rc;
        }
        a->exec_path = dup_or_null(buf, &oom);
    } else {
        ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
        if (n <= 0) {
            agent_free(a);
            return errf(err, errlen, KOLO_ESYS, "cannot find the kolo binary: %s",
                           strerror(errno));
        }
        buf[n] = '\0';
        a->exec_path = dup_or_null(buf, &oom);
    }
    if (cfg->state_dir && *cfg->state_dir) {
        a->state_dir = dup_or_null(cfg->state_dir, &oom);
    } else if (default_state_dir(a->name, buf, sizeof(buf)) == 0) {
        a->state_dir = dup_or_null(buf, &oom);
    } else {
        agent_free(a);
        return errf(err, errlen, KOLO_EINVAL,
                       "no state directory: set --state-dir, XDG_STATE_HOME or HOME");
    }
    if (oom) {
        agent_free(a);
        return errf(err, errlen, KOLO_ENOMEM, "out of memory");
    }
    if (access(a->exec_path, X_OK) != 0) {
        rc = errf(err, errlen, KOLO_EINVAL, "cannot run %s: %s", a->exec_path, strerror(errno));
        agent_free(a);
        return rc;
    }
    if (cfg->job_user && *cfg->job_user) {
        uid_t uid;
        gid_t gid;
        if (job_user_resolve(cfg->job_user, &uid, &gid, err, errlen) != 0) {
            agent_free(a);
            return KOLO_EINVAL;
        }
        if (uid != geteuid() && !(a->job_user = dup_or_null(cfg->job_user, &oom))) {
            agent_free(a);
            return errf(err, errlen, KOLO_ENOMEM, "out of memory");
        }
        LOGI("agent", "workers run as %s (uid %d, gid %d)", cfg->job_user, (int)uid, (int)gid);
    } else if (geteuid() == 0) {
        LOGW("agent", "running as root without --job-user: jobs run as root and can read this "
                      "agent's files and token");
    }
    if ((rc = load_host_id(a, err, errlen)) != 0) {
        agent_free(a);
        return rc;
    }
    if ((rc = random_hex(a->instance, 8)) != 0) {
        agent_free(a);
        return errf(err, errlen, rc, "no randomness");
    }

    inventory_probe(&a->inv);
    a->slots = cfg->slots > 0 ? cfg->slots : a->inv.gpus > 0 ? a->inv.gpus : a->inv.cpus;
    a->stop_grace_ms = cfg->stop_grace_ms > 0 ? cfg->stop_grace_ms : AGENT_DEFAULT_GRACE_MS;
    a->grace_ms = a->stop_grace_ms;

    if ((rc = uv_loop_init(&a->loop)) != 0) {
        rc = errf(err, errlen, KOLO_ESYS, "cannot create the event loop: %s", uv_strerror(rc));
        agent_free(a);
        return rc;
    }
    if ((rc = uv_async_init(&a->loop, &a->wake, on_wake)) != 0) {
        uv_loop_close(&a->loop);
        rc = errf(err, errlen, KOLO_ESYS, "cannot create the event loop: %s", uv_strerror(rc));
        agent_free(a);
        return rc;
    }
    a->wake.data = a;
    uv_timer_init(&a->loop, &a->stop_timer);
    a->stop_timer.data = a;
    a->loop_alive = true;

    /* The link opens the RPC client; then the loop thread starts, and the
     * link's threads last, so nothing is posted to a loop not running. */
    rc = link_start(a, err, errlen);
    if (rc == 0 && (rc = pthread_create(&a->loop_thread, NULL, loop_main, a)) != 0) {
        errf(err, errlen, KOLO_ESYS, "cannot start the loop thread: %s", strerror(rc));
        rc = KOLO_ESYS;
        link_stop(a);
    }
    if (rc != 0) {
        uv_close((uv_handle_t *)&a->wake, NULL);
        uv_close((uv_handle_t *)&a->stop_timer, NULL);
        uv_run(&a->loop, UV_RUN_DEFAULT);
        uv_loop_close(&a->loop);
        agent_free(a);
        return rc;
    }
    LOGI("agent", "agent %s (host id %s, %s, %d slots, %d cpus, %d gpus) -> %s", a->name,
         a->host_id, a->addr, a->slots, a->inv.cpus, a->inv.gpus, a->url);
    *out = a;
    return 0;
}

void agent_stop(struct agent *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->mail_stop = true;
    if (a->loop_alive)
        uv_async_send(&a->wake);
    pthread_mutex_unlock(&a->mu);
    /* Bounded: the loop gives up on workers AGENT_STOP_SLACK_MS after the
     * SIGKILL (on_stop_deadline). */
    pthread_join(a->loop_thread, NULL);

    int rc = uv_loop_close(&a->loop);
    if (rc != 0) {
        LOGE("agent", "event loop not empty at shutdown (%s)", uv_strerror(rc));
        uv_walk(&a->loop, walk_cb, NULL);
    }
    /* Last: the reporter still flushes the workers' exits (bounded 2 s). */
    link_stop(a);
    LOGI("agent", "agent %s stopped", a->name);
    agent_free(a);
}

int agent_host_id(const struct agent *a, char *out, size_t n)
{
    if (!a || !out || n <= strlen(a->host_id))
        return KOLO_EINVAL;
    memcpy(out, a->host_id, strlen(a->host_id) + 1);
    return 0;
}

int agent_drain_self(struct agent *a, int timeout_ms, char *err, size_t errlen)
{
    Kolo__DrainHostRequest req = KOLO__DRAIN_HOST_REQUEST__INIT;
    req.host = a->host_id;
    req.leaving = true;
    size_t len = kolo__drain_host_request__get_packed_size(&req);
    uint8_t *body = malloc(len ? len : 1);
    if (!body)
        return KOLO_ENOMEM;
    kolo__drain_host_request__pack(&req, body);
    void *rep = NULL;
    size_t rep_len = 0;
    int rc = rpc_client_call(a->rpc, "AdminService.DrainHost", body, len, &rep, &rep_len,
                             timeout_ms, err, errlen);
    free(body);
    free(rep);
    return rc;
}

void agent_get_stats(struct agent *a, struct agent_stats *st)
{
    pthread_mutex_lock(&a->mu);
    *st = a->stats;
    pthread_mutex_unlock(&a->mu);
}
