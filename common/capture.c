/*
 * capture.c - see capture.h.
 */
#include "capture.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buf.h"
#include "errors.h"
#include "util.h"

extern char **environ;

static pid_t spawn_piped(char *const argv[], int out_fd, int *rc)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&at, 0);
    pid_t pid = -1;
    *rc = posix_spawnp(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    return *rc ? -1 : pid;
}

enum read_end { READ_EOF, READ_TIMEOUT, READ_TOO_BIG, READ_ERROR };

/* Reads fd into b until EOF, the deadline, max_out bytes or an error. */
static enum read_end read_until(int fd, struct buf *b, uint64_t deadline, size_t max_out)
{
    for (;;) {
        uint64_t now = now_mono_ms();
        if (now >= deadline)
            return READ_TIMEOUT;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, (int)(deadline - now));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return READ_ERROR;
        if (n == 0)
            return READ_TIMEOUT;
        char chunk[4096];
        ssize_t got = read(fd, chunk, sizeof(chunk));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return READ_ERROR;
        if (got == 0)
            return READ_EOF;
        if (b->len + (size_t)got > max_out)
            return READ_TOO_BIG;
        buf_append(b, chunk, (size_t)got);
    }
}

/* Reaps pid by the deadline (a program may close its output and still
 * run); past it, kills its group and reaps it. True when it ran over. */
static bool reap(pid_t pid, uint64_t deadline, int *status)
{
    for (;;) {
        pid_t got = waitpid(pid, status, WNOHANG);
        if (got == pid || (got < 0 && errno != EINTR))
            return false;
        if (now_mono_ms() >= deadline)
            break;
        usleep(1000);
    }
    kill(-pid, SIGKILL);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return true;
}

int capture_run(char *const argv[], const char *what, uint64_t timeout_ms, size_t max_out,
                char **out, char *err, size_t errlen)
{
    *out = NULL;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "cannot run %s: pipe: %s", what, strerror(errno));
        return KOLO_ESYS;
    }
    int rc;
    pid_t pid = spawn_piped(argv, fds[1], &rc);
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        snprintf(err, errlen, "cannot run %s: %s", what, strerror(rc));
        return KOLO_ESYS;
    }
    struct buf b;
    buf_init(&b);
    uint64_t deadline = now_mono_ms() + timeout_ms;
    enum read_end end = read_until(fds[0], &b, deadline, max_out);
    int read_errno = errno;
    close(fds[0]);
    if (end != READ_EOF)
        kill(-pid, SIGKILL);
    int status = 0;
    if (reap(pid, deadline, &status) && end == READ_EOF)
        end = READ_TIMEOUT;
    rc = KOLO_EIO;
    if (end == READ_TIMEOUT)
        snprintf(err, errlen, "%s ran over %.3g s", what, (double)timeout_ms / 1000.0);
    else if (end == READ_TOO_BIG)
        snprintf(err, errlen, "%s printed over %zu bytes", what, max_out);
    else if (end == READ_ERROR)
        snprintf(err, errlen, "%s: reading its output failed: %s", what, strerror(read_errno));
    else if (WIFSIGNALED(status))
        snprintf(err, errlen, "%s was killed by signal %d", what, WTERMSIG(status));
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        snprintf(err, errlen, "%s exited with code %d", what,
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    else if ((*out = buf_steal(&b, NULL)) != NULL)
        rc = 0;
    else {
        snprintf(err, errlen, "%s: out of memory", what);
        rc = KOLO_ENOMEM;
    }
    buf_free(&b);
    return rc;
}
