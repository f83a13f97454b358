/*
 * stacks.c - `kolo stacks` on an agent: what each worker of a job is doing.
 *
 * DESIGN. Every worker inherits an anonymous file in append mode as fd 3
 * (KOLO_STACKS_FD), and kolo's Python package registers faulthandler on
 * KOLO_STACKS_SIGNAL to write every thread's stack there
 * (python/kolo/_stacks.py). faulthandler writes from the signal handler
 * itself, in C, so it answers while the main thread is blocked inside a
 * collective, spins in a loop or sleeps in a data loader, and nothing
 * runs for it until somebody asks.
 *
 * When a heartbeat reply asks (stacks_job, stacks_seq), the link thread
 * empties the files of that job's workers, signals each command that
 * catches the signal (SigCgt in /proc/PID/status: a process that never
 * registered would be killed by a real-time signal, so it is not sent
 * one), and reads what arrived once a file stopped growing for
 * STACKS_QUIET_MS, or when STACKS_WAIT_MS passed. A process that wrote
 * nothing (stopped, stuck in the kernel, not Python, not registered) is
 * reported with its state and wait channel from /proc. The report goes
 * to the coordinator on the link's own client (AgentService.Stacks).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_int.h"
#include "errors.h"
#include "log.h"
#include "rpc.h"
#include "util.h"

#define STACKS_QUIET_MS  150
#define STACKS_MAX_BYTES (256u << 10)
#define STACKS_POLL_MS   20

int stacks_signal(void)
{
    return SIGRTMIN + 6;
}

int stacks_file(void)
{
    int fd = memfd_create("kolo-stacks", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_APPEND) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One worker being asked. */
struct target {
    Kolo__WorkerStack ws;
    int fd;   /* a dup of its stacks file, -1 none */
    int shim; /* the pid the agent started */
    off_t size;
    uint64_t changed; /* when size last changed (mono ms) */
    bool signalled, done;
    char state[64], wchan[64];
};

/* Whether pid has a handler for sig (SigCgt of /proc/PID/status). */
static bool catches(int pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool yes = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "SigCgt:", 7) == 0) {
            unsigned long long mask = strtoull(line + 7, NULL, 16);
            yes = sig >= 1 && sig <= 64 && (mask >> (sig - 1)) & 1;
            break;
        }
    }
    fclose(f);
    return yes;
}

static const char *state_name(char c)
{
    switch (c) {
    case 'R': return "R (running)";
    case 'S': return "S (sleeping)";
    case 'D': return "D (uninterruptible sleep)";
    case 'T': return "T (stopped by a signal)";
    case 't': return "t (stopped by a debugger)";
    case 'Z': return "Z (exited, not reaped)";
    case 'I': return "I (idle)";
    default: return c ? "?" : "gone";
    }
}

static void read_wchan(int pid, char *out, size_t size)
{
    char path[64];
    out[0] = '\0';
    snprintf(path, sizeof path, "/proc/%d/wchan", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, size - 1);
    close(fd);
    out[n > 0 ? n : 0] = '\0';
    if (strcmp(out, "0") == 0)
        out[0] = '\0';
}

/* The job's workers on this host, their files dup'ed (the loop may close
 * the originals meanwhile). */
static struct target *targets_of(struct agent *a, uint64_t job_id, size_t *n)
{
    *n = 0;
    pthread_mutex_lock(&a->mu);
    struct target *t = calloc(a->n_running ? a->n_running : 1, sizeof *t);
    for (size_t i = 0; t && i < a->n_running; i++) {
        const Kolo__RunningWorker *r = &a->running[i];
        if (r->job_id != job_id)
            continue;
        struct target *x = &t[(*n)++];
        kolo__worker_stack__init(&x->ws);
        x->ws.job_id = r->job_id;
        x->ws.rank = r->rank;
        x->ws.worker_id = r->worker_id;
        x->ws.generation = r->generation;
        x->shim = r->pid;
        x->fd = a->stacks_fd[i] >= 0 ? fcntl(a->stacks_fd[i], F_DUPFD_CLOEXEC, 0) : -1;
    }
    pthread_mutex_unlock(&a->mu);
    return t;
}

/* Signals every target that can answer, then waits until each file
 * stopped growing or the time is up. */
static void ask_and_wait(struct target *t, size_t n, uint32_t wait_ms)
{
    int sig = stacks_signal();
    uint64_t start = now_mono_ms();
    for (size_t i = 0; i < n; i++) {
        struct target *x = &t[i];
        int pid = x->shim;
        char c = agent_proc_state(x->shim, &pid);
        x->ws.pid = pid;
        /* a stopped process cannot answer until continued: not waited for */
        if (x->fd >= 0 && ftruncate(x->fd, 0) == 0 && c && c != 'Z' && c != 'T' && c != 't' &&
            catches(pid, sig))
            x->signalled = kill(pid, sig) == 0;
        x->done = !x->signalled;
        x->changed = start;
    }
    for (;;) {
        bool all = true;
        uint64_t now = now_mono_ms();
        for (size_t i = 0; i < n; i++) {
            struct target *x = &t[i];
            if (x->done)
                continue;
            struct stat st;
            if (fstat(x->fd, &st) == 0 && st.st_size != x->size) {
                x->size = st.st_size;
                x->changed = now;
            }
            x->done = x->size > 0 && now - x->changed >= STACKS_QUIET_MS;
            all = all && x->done;
        }
        if (all || now - start >= wait_ms)
            break;
        usleep(STACKS_POLL_MS * 1000);
    }
}

/* Fills each target's text and state. */
static void read_answers(struct target *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct target *x = &t[i];
        int pid = x->ws.pid;
        char c = pid > 0 ? agent_proc_state(x->shim, &pid) : 0;
        str_copy(x->state, state_name(c), sizeof x->state);
        read_wchan(pid, x->wchan, sizeof x->wchan);
        x->ws.proc_state = x->state;
        x->ws.wchan = x->wchan;
        x->ws.text = "";
        struct stat st;
        if (x->fd < 0 || fstat(x->fd, &st) != 0 || st.st_size <= 0)
            continue;
        size_t len = (size_t)st.st_size < STACKS_MAX_BYTES ? (size_t)st.st_size : STACKS_MAX_BYTES;
        char *buf = malloc(len + 1);
        ssize_t got = buf ? pread(x->fd, buf, len, 0) : -1;
        if (got <= 0) {
            free(buf);
            continue;
        }
        buf[got] = '\0';
        x->ws.text = buf;
        x->ws.answered = true;
    }
}

void stacks_collect(struct agent *a, const char *session, uint64_t job_id, uint64_t seq,
                    uint32_t wait_ms)
{
    size_t n = 0;
    struct target *t = targets_of(a, job_id, &n);
    if (!t) {
        LOGW("agent", "kolo stacks for job %" PRIu64 ": out of memory", job_id);
        return;
    }
    ask_and_wait(t, n, wait_ms);
    read_answers(t, n);
    Kolo__WorkerStack **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    Kolo__StacksReport rep = KOLO__STACKS_REPORT__INIT;
    rep.session = (char *)session;
    rep.job_id = job_id;
    rep.seq = seq;
    for (size_t i = 0; ptrs && i < n; i++)
        ptrs[i] = &t[i].ws;
    rep.workers = ptrs;
    rep.n_workers = ptrs ? n : 0;
    size_t len = kolo__stacks_report__get_packed_size(&rep);
    uint8_t *data = malloc(len ? len : 1);
    if (data) {
        kolo__stacks_report__pack(&rep, data);
        char err[512];
        void *out = NULL;
        size_t olen = 0;
        if (rpc_client_call(a->hb_rpc, "AgentService.Stacks", data, len, &out, &olen, 5000, err,
                            sizeof err) != 0)
            LOGW("agent", "kolo stacks for job %" PRIu64 ": cannot send them: %s", job_id, err);
        free(out);
    }
    free(data);
    free(ptrs);
    for (size_t i = 0; i < n; i++) {
        if (t[i].fd >= 0)
            close(t[i].fd);
        if (t[i].ws.answered)
            free(t[i].ws.text);
    }
    free(t);
}
