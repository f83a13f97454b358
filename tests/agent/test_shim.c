/*
 * test_shim.c - `kolo __exec`, the process every worker runs under: exit
 * codes and signals passed through, a command that cannot run, a shim
 * whose agent is already gone, and (g) `kill -9` of an agent process
 * taking its workers with it.
 *
 * argv[1] is the kolo binary (its `__exec`). For (g) this binary runs
 * itself as the agent (`agent-child URL KOLO STATE_DIR`), so the agent is
 * a separate process that can be SIGKILLed, and makes itself a child
 * subreaper so the orphaned shim is reparented to it and can be reaped.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "errors.h"
#include "fake_coord.h"
#include "test.h"
#include "util.h"

static const char *exec_path;
static char self[4096];

/* run_shim runs `exec_path __exec -- args...` with extra environment,
 * returns its wait status and, in err, what it wrote to stderr. */
static int run_shim(char *const *args, const char *env, char *err, size_t errlen)
{
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        if (env)
            putenv((char *)env);
        char *argv[16] = {(char *)exec_path, "__exec", "--"};
        int n = 3;
        for (int i = 0; args[i] && n < 15; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        execv(exec_path, argv);
        _exit(99);
    }
    close(p[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < errlen && (r = read(p[0], err + got, errlen - 1 - got)) > 0)
        got += (size_t)r;
    err[got] = '\0';
    close(p[0]);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    return status;
}

static void test_exit_status(void)
{
    char err[512];
    char *exit3[] = {"sh", "-c", "exit 3", NULL};
    int st = run_shim(exit3, NULL, err, sizeof(err));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3);

    char *term[] = {"sh", "-c", "kill -TERM $$", NULL};
    st = run_shim(term, NULL, err, sizeof(err));
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);

    char *segv[] = {"sh", "-c", "kill -SEGV $$", NULL};
    st = run_shim(segv, NULL, err, sizeof(err));
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);

    char *missing[] = {"kolo-no-such-command", "x", NULL};
    st = run_shim(missing, NULL, err, sizeof(err));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 127);
    CHECK_EQ_STR(err, "kolo: cannot run 'kolo-no-such-command': No such file or directory\n");

    /* Spawned for an agent that is not our parent (it died before the
     * shim could ask for the parent-death signal): quit at once. */
    char *sleeper[] = {"sleep", "100", NULL};
    uint64_t t0 = now_mono_ms();
    st = run_shim(sleeper, "KOLO_AGENT_PID=1", err, sizeof(err));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    CHECK(now_mono_ms() - t0 < 2000);

    /* No command. */
    char *none[] = {NULL};
    st = run_shim(none, NULL, err, sizeof(err));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
}

static void reap_all(void)
{
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

static bool gone(pid_t pid)
{
    reap_all();
    return kill(pid, 0) == -1 && errno == ESRCH;
}

/* SIGTERM to the shim alone (not its group) reaches the command; one that
 * ignores it is killed after KOLO_STOP_GRACE_MS. */
static void test_forward(void)
{
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0); /* as the agent starts it: a group of its own */
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        putenv("KOLO_STOP_GRACE_MS=300");
        execl(exec_path, exec_path, "__exec", "--", "sh", "-c",
              "trap '' TERM; echo $$; while :; do sleep 0.05; done", (char *)NULL);
        _exit(99);
    }
    close(p[1]);
    char buf[64] = {0};
    ssize_t n = read(p[0], buf, sizeof(buf) - 1);
    REQUIRE(n > 0);
    pid_t worker = atoi(buf);
    REQUIRE(worker > 0);
    uint64_t t0 = now_mono_ms();
    kill(pid, SIGTERM);
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    uint64_t took = now_mono_ms() - t0;
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    CHECK(took >= 300 && took < 3000);
    CHECK(WAIT_UNTIL(gone(worker), 2000));
    close(p[0]);
}

/* ---------------------------------------------------------------- (g) */

static int agent_child(const char *url, const char *kolo, const char *state_dir)
{
    struct agent_config cfg = {0};
    cfg.coordinator_url = url;
    cfg.name = "doomed";
    cfg.state_dir = state_dir;
    cfg.slots = 1;
    cfg.stop_grace_ms = 1000;
    cfg.exec_path = kolo;
    struct agent *a = NULL;
    char err[256];
    if (agent_start(&a, &cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "agent_start: %s\n", err);
        return 1;
    }
    for (;;)
        pause(); /* until SIGKILL */
}

static bool has_lines(struct fake_coord *fc)
{
    fake_lock(fc);
    bool yes = fc->n_lines > 0;
    fake_unlock(fc);
    return yes;
}

static void test_agent_killed(void)
{
    struct fake_coord *fc = NULL;
    REQUIRE(fake_open(&fc, "tcp://127.0.0.1:0", 200) == 0);
    char dir[] = "/tmp/kolo-agent-kill-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);

    pid_t agent = fork();
    REQUIRE(agent >= 0);
    if (agent == 0) {
        execl(self, self, "agent-child", fake_url(fc), exec_path, dir, (char *)NULL);
        _exit(99);
    }
    Kolo__WorkerSpec *s = spec_sh(11, 1, 0, 1, "echo $$; exec sleep 1000");
    fake_set_desired(fc, &s, 1);
    CHECK(WAIT_UNTIL(has_lines(fc), 10000));
    struct fake_event e;
    REQUIRE(fake_get_event(fc, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 11, 0, &e));
    fake_lock(fc);
    REQUIRE(fc->n_lines > 0);
    pid_t worker = atoi(fc->lines[0].text);
    fake_unlock(fc);
    pid_t shim = e.pid;
    REQUIRE(worker > 0 && shim > 0);
    CHECK(kill(worker, 0) == 0);

    kill(agent, SIGKILL);
    int st;
    REQUIRE(waitpid(agent, &st, 0) == agent);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    CHECK(WAIT_UNTIL(gone(worker) && gone(shim), 5000));

    fake_close(fc);
    spec_free(s);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* `kolo agent` itself: flags, a worker run through /proc/self/exe, and a
 * clean exit on SIGTERM. Needs the real kolo binary. */
static void test_cmd_agent(void)
{
    struct fake_coord *fc = NULL;
    REQUIRE(fake_open(&fc, "tcp://127.0.0.1:0", 200) == 0);
    char dir[] = "/tmp/kolo-agent-cmd-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    int devnull = open("/dev/null", O_WRONLY);

    /* --help and a missing --coordinator. */
    pid_t pid = fork();
    if (pid == 0) {
        dup2(devnull, 1);
        execl(exec_path, exec_path, "agent", "--help", (char *)NULL);
        _exit(99);
    }
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pid = fork();
    if (pid == 0) {
        dup2(devnull, 2);
        unsetenv("KOLO_COORDINATOR");
        execl(exec_path, exec_path, "agent", "--slots", "2", (char *)NULL);
        _exit(99);
    }
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);

    pid = fork();
    if (pid == 0) {
        dup2(devnull, 2);
        execl(exec_path, exec_path, "agent", "--coordinator", fake_url(fc), "--slots", "3",
              "--name", "cmdhost", "--state-dir", dir, "--stop-grace", "1s", (char *)NULL);
        _exit(99);
    }
    Kolo__WorkerSpec *s = spec_sh(13, 1, 0, 1, "echo $HOROVOD_HOSTNAME; exec sleep 100");
    fake_set_desired(fc, &s, 1);
    CHECK(WAIT_UNTIL(has_lines(fc), 10000));
    fake_lock(fc);
    CHECK_EQ_INT(fc->slots, 3);
    CHECK(fc->n_lines > 0 && strcmp(fc->lines[0].text, "cmdhost") == 0);
    fake_unlock(fc);
    kill(pid, SIGTERM);
    uint64_t t0 = now_mono_ms();
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(now_mono_ms() - t0 < 5000);
    struct fake_event e;
    CHECK(fake_get_event(fc, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 13, 0, &e) &&
          e.term_signal == SIGTERM);
    close(devnull);
    fake_close(fc);
    spec_free(s);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "__exec") == 0)
        return cmd_exec_shim(argc - 1, argv + 1);
    if (argc == 5 && strcmp(argv[1], "agent-child") == 0)
        return agent_child(argv[2], argv[3], argv[4]);
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    REQUIRE(n > 0);
    self[n] = '\0';
    exec_path = argc > 1 ? argv[1] : self;
    /* Orphans (a shim whose agent died, a worker whose shim died) come to
     * us, so gone() can reap them instead of leaving zombies to an init
     * that may not. */
    REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);

    test_exit_status();
    test_forward();
    test_agent_killed();
    if (strcmp(exec_path, self) != 0)
        test_cmd_agent();
    TEST_DONE();
}
