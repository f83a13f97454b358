/*
 * exec_shim.c - `kolo __exec [--user USER] -- argv...`: the process every
 * worker runs under, so that workers never outlive their agent; with
 * --user it becomes USER before anything else (job_user.c).
 *
 * DESIGN. The agent spawns the shim as the leader of a new process group
 * (UV_PROCESS_DETACHED). The shim asks the kernel for SIGTERM when its
 * parent dies (PR_SET_PDEATHSIG), which covers even `kill -9` of the
 * agent, then forks the real command into the same group and waits for
 * it. If the agent died before the request took effect, getppid() no
 * longer names the agent (KOLO_AGENT_PID) and the shim quits at once.
 *
 * Signals. SIGTERM, SIGINT and SIGHUP are forwarded to the group, and
 * SIGTERM (from the agent or from the parent-death request) also arms a
 * SIGKILL of the whole group after KOLO_STOP_GRACE_MS. A signal the agent
 * itself sent while it is still our parent was sent to the whole group
 * already (that is how the agent stops workers), so it is not forwarded
 * again: a worker that handles SIGTERM sees it once. The forwarded copy
 * comes back to the shim, which is in the group too; it is recognised by
 * its sender (ourselves) and ignored.
 *
 * Exit. When the command exits, whatever it left behind in the group gets
 * SIGTERM (so nothing holds the output pipes open), and the shim exits the
 * same way the command did: with its exit code, or by the same signal, so
 * the agent's exit_cb sees the true signal and a shell sees 128+signal.
 * Should re-raising fail, the shim exits with 128+signal.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "agent_int.h"

#define SHIM_DEFAULT_GRACE_MS 5000

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long env_long(const char *name, long def)
{
    const char *s = getenv(name);
    char *end;
    if (!s || !*s)
        return def;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || *end || v < 0 ? def : v;
}

static int exit_like(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (!WIFSIGNALED(status))
        return 127;
    int sig = WTERMSIG(status);
    /* Die by the same signal, without a core file of our own: the command
     * dumped one already if the system wanted it. */
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    return 128 + sig;
}

int cmd_exec_shim(int argc, char **argv)
{
    int i = 1;
    const char *user = NULL;
    if (i + 1 < argc && strcmp(argv[i], "--user") == 0) {
        user = argv[i + 1];
        i += 2;
    }
    if (i < argc && strcmp(argv[i], "--") == 0)
        i++;
    if (i >= argc) {
        fprintf(stderr, "usage: kolo __exec [--user USER] -- COMMAND [ARGS...] (internal, used "
                        "by the agent)\n");
        return 2;
    }
    char **cmd = argv + i;
    if (user) {
        /* First: the parent-death request below would not survive the
         * change of credentials (job_user.c). */
        char err[512];
        if (job_user_become(user, err, sizeof err) != 0) {
            fprintf(stderr, "kolo: cannot run '%s': %s\n", cmd[0], err);
            return 127;
        }
    }

    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, &old);

    prctl(PR_SET_PDEATHSIG, SIGTERM);
    long agent_pid = env_long("KOLO_AGENT_PID", 0);
    if (agent_pid > 0 && getppid() != (pid_t)agent_pid)
        return 1; /* the agent died before PR_SET_PDEATHSIG took effect */
    int64_t grace = env_long("KOLO_STOP_GRACE_MS", SHIM_DEFAULT_GRACE_MS);
    pid_t self = getpid();
    /* Run by hand from a shell, the shim may share its group with the
     * shell; then it signals the command alone, never the group. */
    bool own_group = getpgrp() == self;

    pid_t child = fork();
    if (child < 0) {
        fprintf(stderr, "kolo: cannot fork to run '%s': %s\n", cmd[0], strerror(errno));
        return 127;
    }
    if (child == 0) {
        /* If the shim is killed alone (SIGKILL), the command must not be
         * left running unsupervised. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != self)
            _exit(127);
        sigprocmask(SIG_SETMASK, &old, NULL);
        execvp(cmd[0], cmd);
        int e = errno;
        fprintf(stderr, "kolo: cannot run '%s': %s\n", cmd[0], strerror(e));
        _exit(127);
    }

    int64_t kill_at = 0;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(child, &status, WNOHANG);
        if (r == child)
            break;
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "kolo: lost track of '%s': %s\n", cmd[0], strerror(errno));
            return 127;
        }
        int64_t now = mono_ms();
        if (kill_at && now >= kill_at) {
            if (own_group)
                kill(0, SIGKILL); /* the shim goes too; the agent sees SIGKILL */
            else
                kill(child, SIGKILL);
            kill_at = 0;
            continue;
        }
        int64_t wait = kill_at ? kill_at - now : 1000;
        if (wait > 1000)
            wait = 1000;
        struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
        siginfo_t si;
        int sig = sigtimedwait(&set, &si, &ts);
        if (sig <= 0 || sig == SIGCHLD)
            continue;
        if (sig == SIGTERM && !kill_at)
            kill_at = mono_ms() + grace;
        bool from_self = si.si_code == SI_USER && si.si_pid == self;
        bool from_agent_to_group = agent_pid > 0 && si.si_code == SI_USER &&
                                   si.si_pid == (pid_t)agent_pid && getppid() == (pid_t)agent_pid;
        if (from_self)
            continue;
        if (from_agent_to_group) {
            /* Unless the command moved itself out of our group. */
            if (getpgid(child) != self)
                kill(child, sig);
            continue;
        }
        if (own_group)
            kill(0, sig);
        else
            kill(child, sig);
    }
    if (own_group)
        kill(0, SIGTERM); /* stragglers; ours stays blocked and pending */
    return exit_like(status);
}
