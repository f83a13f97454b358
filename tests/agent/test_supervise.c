/*
 * test_supervise.c - the agent running workers against a fake coordinator:
 * events and output lines and their order, exit codes and signals, the
 * worker environment, spawn failures, stopping (SIGTERM, then SIGKILL
 * after the grace), no restarts, and agent_stop leaving nothing behind.
 *
 * argv[1] is the kolo binary the workers run under (`kolo __exec`); when
 * it is missing this test binary serves as its own shim.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "errors.h"
#include "fake_coord.h"
#include "log.h"
#include "test.h"
#include "util.h"

#define STARTED      KOLO__WORKER_EVENT_KIND__WORKER_STARTED
#define EXITED       KOLO__WORKER_EVENT_KIND__WORKER_EXITED
#define SPAWN_FAILED KOLO__WORKER_EVENT_KIND__WORKER_SPAWN_FAILED

static const char *exec_path;

/* agent_stop logs "event loop not empty" when uv_loop_close fails; every
 * test here must end with a clean loop. */
static atomic_int loop_not_empty;

static void log_sink(int level, const char *module, const char *msg, void *arg)
{
    (void)arg;
    fprintf(stderr, "%s %s: %s\n", log_level_name(level), module, msg);
    if (strstr(msg, "event loop not empty"))
        atomic_fetch_add(&loop_not_empty, 1);
}
static char state_dir[64];

static struct agent *start_agent(struct fake_coord *fc, int64_t grace_ms)
{
    struct agent_config cfg = {0};
    cfg.coordinator_url = fake_url(fc);
    cfg.name = "testhost";
    cfg.state_dir = state_dir;
    cfg.slots = 4;
    cfg.stop_grace_ms = grace_ms;
    cfg.exec_path = exec_path;
    struct agent *a = NULL;
    char err[256];
    int rc = agent_start(&a, &cfg, err, sizeof(err));
    if (rc)
        fprintf(stderr, "agent_start: %s\n", err);
    REQUIRE(rc == 0);
    return a;
}

static struct fake_coord *start_fake(void)
{
    struct fake_coord *fc = NULL;
    REQUIRE(fake_open(&fc, "tcp://127.0.0.1:0", 200) == 0);
    return fc;
}

/* Under the fake's lock: the order numbers of the first and last line of
 * (job, rank) on stream (0 = any), and how many there are. */
static int lines_of(struct fake_coord *fc, uint64_t job, int rank, int stream, uint64_t *first,
                    uint64_t *last)
{
    int n = 0;
    *first = UINT64_MAX;
    *last = 0;
    for (size_t i = 0; i < fc->n_lines; i++) {
        struct fake_line *l = &fc->lines[i];
        if (l->job_id != job || l->rank != rank || (stream && l->stream != stream))
            continue;
        n++;
        if (l->order < *first)
            *first = l->order;
        if (l->order > *last)
            *last = l->order;
    }
    return n;
}

/* The text of the n-th line of (job, rank) on stream, copied; "" if none. */
static void line_text(struct fake_coord *fc, uint64_t job, int rank, int stream, int nth, char *out,
                      size_t n)
{
    out[0] = '\0';
    fake_lock(fc);
    for (size_t i = 0; i < fc->n_lines; i++) {
        struct fake_line *l = &fc->lines[i];
        if (l->job_id == job && l->rank == rank && l->stream == stream && nth-- == 0) {
            str_copy(out, l->text, n);
            break;
        }
    }
    fake_unlock(fc);
}

static bool have_line(struct fake_coord *fc, uint64_t job, int rank)
{
    uint64_t f, l;
    fake_lock(fc);
    int n = lines_of(fc, job, rank, 0, &f, &l);
    fake_unlock(fc);
    return n > 0;
}

/* gone: no such process, or only a zombie left for init to reap (a worker
 * SIGKILLed together with its shim is reparented to init, which reaps it
 * when it gets to it). */
static bool gone(pid_t pid)
{
    if (kill(pid, 0) == -1 && errno == ESRCH)
        return true;
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'Z';
}

/* (a) three workers: STARTED, their lines, EXITED 0 after the lines. */
static void test_run_three(void)
{
    struct fake_coord *fc = start_fake();
    struct agent *a = start_agent(fc, 2000);
    Kolo__WorkerSpec *specs[3];
    for (int r = 0; r < 3; r++)
        specs[r] = spec_sh(1, 1, r, 3, "echo $KOLO_RANK $HOROVOD_SIZE; echo err >&2");
    fake_set_desired(fc, specs, 3);

    CHECK(WAIT_UNTIL(fake_count_events(fc, EXITED) == 3, 10000));
    fake_lock(fc);
    CHECK_EQ_INT(fc->registrations, 1);
    CHECK_EQ_INT(fc->slots, 4);
    char id[64];
    agent_host_id(a, id, sizeof(id));
    CHECK_EQ_STR(fc->host_id, id);
    for (int r = 0; r < 3; r++) {
        const struct fake_event *s = fake_find_event(fc, STARTED, 1, r);
        const struct fake_event *e = fake_find_event(fc, EXITED, 1, r);
        REQUIRE(s && e);
        CHECK(s->pid > 0);
        CHECK_EQ_INT(e->pid, s->pid);
        CHECK_EQ_INT(e->exit_code, 0);
        CHECK_EQ_INT(e->term_signal, 0);
        uint64_t first, last;
        CHECK_EQ_INT(lines_of(fc, 1, r, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, &first, &last), 1);
        CHECK_EQ_INT(lines_of(fc, 1, r, KOLO__OUTPUT_STREAM__OUTPUT_STDERR, &first, &last), 1);
        CHECK_EQ_INT(lines_of(fc, 1, r, 0, &first, &last), 2);
        CHECK(s->order < first);
        CHECK(e->order > last);
    }
    fake_unlock(fc);
    for (int r = 0; r < 3; r++) {
        char text[64], want[16];
        snprintf(want, sizeof(want), "%d 3", r);
        line_text(fc, 1, r, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, 0, text, sizeof(text));
        CHECK_EQ_STR(text, want);
        line_text(fc, 1, r, KOLO__OUTPUT_STREAM__OUTPUT_STDERR, 0, text, sizeof(text));
        CHECK_EQ_STR(text, "err");
    }

    /* The keys stay desired: they must not run again. */
    usleep(600000);
    CHECK_EQ_INT(fake_count_events(fc, STARTED), 3);

    /* Dropping them and adding them back is a new run (the keys were
     * forgotten once they left the set). */
    fake_set_desired(fc, NULL, 0);
    usleep(400000);
    fake_set_desired(fc, specs, 1);
    CHECK(WAIT_UNTIL(fake_count_events(fc, EXITED) == 4, 10000));
    CHECK_EQ_INT(fake_count_events(fc, STARTED), 4);

    agent_stop(a);
    fake_close(fc);
    for (int r = 0; r < 3; r++)
        spec_free(specs[r]);
}

/* The worker environment: spec entries over the agent's, rank variables
 * over both; cwd; PYTHONUNBUFFERED; a spec with an empty command. */
static void test_environment(void)
{
    struct fake_coord *fc = start_fake();
    struct agent *a = start_agent(fc, 2000);
    setenv("KOLO_TEST_INHERITED", "yes", 1);
    Kolo__WorkerSpec *s = spec_sh(2, 7, 1, 2,
                                  "echo $KOLO_TEST_INHERITED $FOO $KOLO_RANK $KOLO_SIZE $KOLO_JOB "
                                  "$KOLO_GENERATION $HOROVOD_HOSTNAME $PYTHONUNBUFFERED; pwd; "
                                  "echo $KOLO_HOST_ID $KOLO_COORDINATOR; "
                                  "echo $HOROVOD_RANK $HOROVOD_LOCAL_RANK $HOROVOD_LOCAL_SIZE "
                                  "$HOROVOD_CROSS_RANK $HOROVOD_CROSS_SIZE $KOLO_TOKEN.");
    s->n_env = 2;
    s->env = calloc(2, sizeof(char *));
    s->env[0] = strdup("FOO=bar baz");
    s->env[1] = strdup("KOLO_RANK=99");
    s->cwd = strdup("/tmp");
    Kolo__WorkerSpec *empty = spec_sh(2, 7, 0, 2, "");
    for (size_t i = 0; i < empty->n_argv; i++)
        free(empty->argv[i]);
    empty->n_argv = 0;
    Kolo__WorkerSpec *specs[2] = {s, empty};
    fake_set_desired(fc, specs, 2);

    CHECK(WAIT_UNTIL(fake_count_events(fc, EXITED) == 2, 10000));
    char text[512], want[512];
    line_text(fc, 2, 1, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, 0, text, sizeof(text));
    CHECK_EQ_STR(text, "yes bar baz 1 2 2 7 testhost 1");
    line_text(fc, 2, 1, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, 1, text, sizeof(text));
    CHECK_EQ_STR(text, "/tmp");
    char id[64];
    agent_host_id(a, id, sizeof(id));
    snprintf(want, sizeof(want), "%s %s", id, fake_url(fc));
    line_text(fc, 2, 1, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, 2, text, sizeof(text));
    CHECK_EQ_STR(text, want);
    line_text(fc, 2, 1, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, 3, text, sizeof(text));
    CHECK_EQ_STR(text, "1 1 2 0 1 ."); /* no token configured: no KOLO_TOKEN */

    struct fake_event e;
    CHECK(fake_get_event(fc, SPAWN_FAILED, 2, 0, &e));
    CHECK(fake_get_event(fc, EXITED, 2, 0, &e) && e.exit_code == 127);

    agent_stop(a);
    fake_close(fc);
    spec_free(s);
    empty->argv[0] = empty->argv[1] = empty->argv[2] = NULL;
    empty->n_argv = 3;
    spec_free(empty);
    unsetenv("KOLO_TEST_INHERITED");
}

/* (b) exit codes and signals; a command that does not exist; a cwd that
 * does not exist (the spawn itself fails). */
static void test_exit_codes(void)
{
    struct fake_coord *fc = start_fake();
    struct agent *a = start_agent(fc, 2000);
    Kolo__WorkerSpec *specs[4];
    specs[0] = spec_sh(3, 1, 0, 4, "exit 3");
    specs[1] = spec_sh(3, 1, 1, 4, "kill -KILL $$");
    specs[2] = spec_sh(3, 1, 2, 4, "");
    free(specs[2]->argv[0]);
    free(specs[2]->argv[1]);
    free(specs[2]->argv[2]);
    specs[2]->n_argv = 1;
    specs[2]->argv[0] = strdup("/nonexistent/kolo-test-command");
    specs[3] = spec_sh(3, 1, 3, 4, "echo never");
    specs[3]->cwd = strdup("/nonexistent-kolo-dir");
    fake_set_desired(fc, specs, 4);

    CHECK(WAIT_UNTIL(fake_count_events(fc, EXITED) == 4, 10000));
    struct fake_event e;
    CHECK(fake_get_event(fc, EXITED, 3, 0, &e) && e.exit_code == 3 && e.term_signal == 0);
    CHECK(fake_get_event(fc, EXITED, 3, 1, &e) && e.term_signal == SIGKILL);
    CHECK(fake_get_event(fc, EXITED, 3, 2, &e) && e.exit_code == 127 && e.term_signal == 0);
    char text[256];
    line_text(fc, 3, 2, KOLO__OUTPUT_STREAM__OUTPUT_STDERR, 0, text, sizeof(text));
    CHECK_EQ_STR(text, "kolo: cannot run '/nonexistent/kolo-test-command': "
                       "No such file or directory");
    CHECK(fake_get_event(fc, SPAWN_FAILED, 3, 3, &e) && strstr(e.message, "nonexistent-kolo-dir"));
    CHECK(fake_get_event(fc, EXITED, 3, 3, &e) && e.exit_code == 127);
    CHECK(!fake_get_event(fc, STARTED, 3, 3, NULL));

    agent_stop(a);
    fake_close(fc);
    for (int i = 0; i < 4; i++)
        spec_free(specs[i]);
}

/* (c) a worker removed from the desired set is stopped: SIGTERM, and
 * SIGKILL after the grace for one that ignores SIGTERM. */
static void test_stop(void)
{
    struct fake_coord *fc = start_fake();
    struct agent *a = start_agent(fc, 700);
    Kolo__WorkerSpec *specs[3];
    specs[0] = spec_sh(4, 1, 0, 2, "echo $$; exec sleep 100");
    specs[1] = spec_sh(4, 1, 1, 2, "trap '' TERM; echo $$; while :; do sleep 0.05; done");
    specs[2] = spec_sh(5, 1, 0, 1, "echo $$; exec sleep 100"); /* stays */
    fake_set_desired(fc, specs, 3);
    CHECK(WAIT_UNTIL(have_line(fc, 4, 0) && have_line(fc, 4, 1) && have_line(fc, 5, 0), 10000));
    char text[64];
    line_text(fc, 4, 0, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, 0, text, sizeof(text));
    pid_t w0 = atoi(text);
    line_text(fc, 4, 1, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, 0, text, sizeof(text));
    pid_t w1 = atoi(text);
    CHECK(w0 > 0 && w1 > 0);

    uint64_t t0 = now_mono_ms();
    fake_set_desired(fc, &specs[2], 1);
    CHECK(WAIT_UNTIL(fake_get_event(fc, EXITED, 4, 0, NULL), 5000));
    uint64_t t_term = now_mono_ms() - t0;
    CHECK(WAIT_UNTIL(fake_get_event(fc, EXITED, 4, 1, NULL), 5000));
    uint64_t t_kill = now_mono_ms() - t0;
    struct fake_event e;
    CHECK(fake_get_event(fc, EXITED, 4, 0, &e) && e.term_signal == SIGTERM);
    CHECK(fake_get_event(fc, EXITED, 4, 1, &e) && e.term_signal == SIGKILL);
    CHECK(t_term < 700);
    CHECK(t_kill >= 700);
    CHECK(WAIT_UNTIL(gone(w0) && gone(w1), 2000));
    /* The worker still desired was left alone. */
    CHECK(!fake_get_event(fc, EXITED, 5, 0, NULL));

    agent_stop(a);
    fake_close(fc);
    for (int i = 0; i < 3; i++)
        spec_free(specs[i]);
}

/* (f) agent_stop stops every worker and leaves no process behind; the
 * exits still reach the coordinator. */
static void test_stop_agent(void)
{
    struct fake_coord *fc = start_fake();
    struct agent *a = start_agent(fc, 500);
    Kolo__WorkerSpec *specs[3];
    specs[0] = spec_sh(6, 1, 0, 3, "echo $$; exec sleep 100");
    specs[1] = spec_sh(6, 1, 1, 3, "echo $$; sleep 100 & wait");
    specs[2] = spec_sh(6, 1, 2, 3, "trap '' TERM; echo $$; while :; do sleep 0.05; done");
    fake_set_desired(fc, specs, 3);
    CHECK(WAIT_UNTIL(have_line(fc, 6, 0) && have_line(fc, 6, 1) && have_line(fc, 6, 2), 10000));
    pid_t pids[6];
    int n = 0;
    for (int r = 0; r < 3; r++) {
        struct fake_event e;
        char text[64];
        CHECK(fake_get_event(fc, STARTED, 6, r, &e));
        pids[n++] = e.pid;
        line_text(fc, 6, r, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, 0, text, sizeof(text));
        pids[n++] = atoi(text);
    }
    struct agent_stats st;
    agent_get_stats(a, &st);
    CHECK_EQ_INT(st.workers_alive, 3);

    uint64_t t0 = now_mono_ms();
    agent_stop(a);
    uint64_t took = now_mono_ms() - t0;
    CHECK(took < 500 + 4000);
    for (int i = 0; i < n; i++) {
        CHECK(pids[i] > 0);
        if (!WAIT_UNTIL(gone(pids[i]), 2000))
            fprintf(stderr, "pid %d survived agent_stop\n", (int)pids[i]);
        CHECK(gone(pids[i]));
    }
    CHECK_EQ_INT(fake_count_events(fc, EXITED), 3);
    fake_close(fc);
    for (int i = 0; i < 3; i++)
        spec_free(specs[i]);
}

/* A worker printing a lot, with a long line and a last line without a
 * newline: everything arrives, in order, before the exit. */
static void test_output_volume(void)
{
    struct fake_coord *fc = start_fake();
    struct agent *a = start_agent(fc, 2000);
    Kolo__WorkerSpec *s = spec_sh(8, 1, 0, 1,
                                  "i=0; while [ $i -lt 3000 ]; do echo line$i; i=$((i+1)); done; "
                                  "head -c 70000 /dev/zero | tr '\\0' x; echo; printf tail");
    fake_set_desired(fc, &s, 1);
    CHECK(WAIT_UNTIL(fake_get_event(fc, EXITED, 8, 0, NULL), 20000));
    fake_lock(fc);
    int n = 0;
    bool in_order = true;
    uint64_t prev = 0;
    for (size_t i = 0; i < fc->n_lines; i++) {
        struct fake_line *l = &fc->lines[i];
        if (l->job_id != 8)
            continue;
        char want[32];
        if (n < 3000) {
            snprintf(want, sizeof(want), "line%d", n);
            if (strcmp(l->text, want) != 0)
                in_order = false;
        } else if (n == 3000) {
            CHECK_EQ_INT(strlen(l->text), 65536);
        } else if (n == 3001) {
            CHECK_EQ_INT(strlen(l->text), 70000 - 65536);
        } else if (n == 3002) {
            CHECK_EQ_STR(l->text, "tail");
        }
        CHECK(l->order > prev);
        prev = l->order;
        n++;
    }
    CHECK(in_order);
    CHECK_EQ_INT(n, 3003);
    const struct fake_event *e = fake_find_event(fc, EXITED, 8, 0);
    CHECK(e && e->order > prev);
    fake_unlock(fc);
    agent_stop(a);
    fake_close(fc);
    spec_free(s);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "__exec") == 0)
        return cmd_exec_shim(argc - 1, argv + 1);
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    REQUIRE(n > 0);
    self[n] = '\0';
    exec_path = argc > 1 ? argv[1] : self;
    log_set_default(LOG_ERROR);
    log_set_sink(log_sink, NULL);
    snprintf(state_dir, sizeof(state_dir), "/tmp/kolo-agent-test-XXXXXX");
    REQUIRE(mkdtemp(state_dir) != NULL);

    test_run_three();
    test_environment();
    test_exit_codes();
    test_stop();
    test_stop_agent();
    test_output_volume();

    char path[128];
    snprintf(path, sizeof(path), "%s/host-id", state_dir);
    unlink(path);
    rmdir(state_dir);
    CHECK_EQ_INT(atomic_load(&loop_not_empty), 0);
    log_set_sink(NULL, NULL);
    TEST_DONE();
}
