/*
 * test_link.c - the agent's coordinator link against a fake coordinator:
 * a host id that survives restarts, re-registration with the running
 * workers when the session is forgotten or the coordinator restarts,
 * reports retried until accepted, and a prompt stop when the coordinator
 * is unreachable.
 *
 * argv[1] is the kolo binary the workers run under (`kolo __exec`); when
 * it is missing this test binary serves as its own shim.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "creds.h"
#include "errors.h"
#include "fake_coord.h"
#include "log.h"
#include "test.h"
#include "util.h"

#define STARTED KOLO__WORKER_EVENT_KIND__WORKER_STARTED
#define EXITED  KOLO__WORKER_EVENT_KIND__WORKER_EXITED

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
static char base_dir[64];

static struct agent *start_agent_tok(const char *url, const char *state_dir, const char *token)
{
    struct agent_config cfg = {0};
    cfg.coordinator_url = url;
    cfg.name = "linkhost";
    cfg.state_dir = state_dir;
    cfg.slots = 2;
    cfg.stop_grace_ms = 1000;
    cfg.exec_path = exec_path;
    cfg.token = token;
    struct agent *a = NULL;
    char err[256];
    int rc = agent_start(&a, &cfg, err, sizeof(err));
    if (rc)
        fprintf(stderr, "agent_start: %s\n", err);
    REQUIRE(rc == 0);
    return a;
}

static struct agent *start_agent_at(const char *url, const char *state_dir)
{
    return start_agent_tok(url, state_dir, NULL);
}

static void state_path(char *out, size_t n, const char *sub)
{
    snprintf(out, n, "%s/%s", base_dir, sub);
}

/* (d) the host id is stable across agent_stop / agent_start. */
static void test_host_id(void)
{
    struct fake_coord *fc = NULL;
    REQUIRE(fake_open(&fc, "inproc://agent-hostid", 200) == 0);
    char dir1[128], dir2[128], id1[64], id2[64], id3[64], inst1[64];
    state_path(dir1, sizeof(dir1), "one/nested");
    state_path(dir2, sizeof(dir2), "two");

    struct agent *a = start_agent_at(fake_url(fc), dir1);
    REQUIRE(agent_host_id(a, id1, sizeof(id1)) == 0);
    CHECK_EQ_INT(strlen(id1), 32);
    CHECK(agent_host_id(a, id2, 8) == KOLO_EINVAL);
    CHECK(WAIT_UNTIL(fake_registrations(fc) == 1, 5000));
    fake_lock(fc);
    CHECK_EQ_STR(fc->host_id, id1);
    str_copy(inst1, fc->agent_instance, sizeof(inst1));
    fake_unlock(fc);
    agent_stop(a);

    char file[160];
    snprintf(file, sizeof(file), "%s/host-id", dir1);
    struct stat st;
    REQUIRE(stat(file, &st) == 0);
    CHECK_EQ_INT(st.st_mode & 0777, 0600);

    a = start_agent_at(fake_url(fc), dir1);
    agent_host_id(a, id2, sizeof(id2));
    CHECK_EQ_STR(id2, id1);
    CHECK(WAIT_UNTIL(fake_registrations(fc) == 2, 5000));
    fake_lock(fc);
    CHECK_EQ_STR(fc->host_id, id1);
    CHECK(strcmp(fc->agent_instance, inst1) != 0); /* a new agent process */
    fake_unlock(fc);
    agent_stop(a);

    a = start_agent_at(fake_url(fc), dir2);
    agent_host_id(a, id3, sizeof(id3));
    CHECK(strcmp(id3, id1) != 0);
    agent_stop(a);

    /* A mangled file is replaced; an unreadable one is an error. */
    FILE *f = fopen(file, "w");
    fputs("not a host id!\n", f);
    fclose(f);
    a = start_agent_at(fake_url(fc), dir1);
    agent_host_id(a, id2, sizeof(id2));
    CHECK(strcmp(id2, id1) != 0 && strlen(id2) == 32);
    agent_stop(a);
    /* An id written by hand is kept. */
    f = fopen(file, "w");
    fputs("gpu-node-07.example\n", f);
    fclose(f);
    a = start_agent_at(fake_url(fc), dir1);
    agent_host_id(a, id2, sizeof(id2));
    CHECK_EQ_STR(id2, "gpu-node-07.example");
    agent_stop(a);
    if (geteuid() != 0) {
        chmod(file, 0);
        struct agent_config cfg = {
            .coordinator_url = fake_url(fc), .state_dir = dir1, .exec_path = exec_path};
        char err[256];
        CHECK(agent_start(&a, &cfg, err, sizeof(err)) != 0);
        chmod(file, 0600);
    }
    fake_close(fc);
}

/* (e) a coordinator that forgets the session gets a new registration that
 * lists the running workers, and they are not restarted. */
static void test_stale_session(void)
{
    struct fake_coord *fc = NULL;
    REQUIRE(fake_open(&fc, "inproc://agent-stale", 200) == 0);
    char dir[128];
    state_path(dir, sizeof(dir), "stale");
    struct agent *a = start_agent_at(fake_url(fc), dir);
    Kolo__WorkerSpec *specs[2] = {spec_sh(7, 2, 0, 2, "exec sleep 100"),
                                  spec_sh(7, 2, 1, 2, "exec sleep 100")};
    fake_set_desired(fc, specs, 2);
    CHECK(WAIT_UNTIL(fake_count_events(fc, STARTED) == 2, 5000));
    fake_lock(fc);
    CHECK_EQ_INT(fc->registrations, 1);
    CHECK_EQ_INT(fc->n_last_running, 0);
    fc->stale_heartbeats = 1;
    fake_unlock(fc);

    CHECK(WAIT_UNTIL(fake_registrations(fc) == 2, 5000));
    fake_lock(fc);
    CHECK_EQ_INT(fc->n_last_running, 2);
    for (size_t i = 0; i < fc->n_last_running && i < 2; i++) {
        Kolo__RunningWorker *rw = &fc->last_running[i];
        const struct fake_event *s = fake_find_event(fc, STARTED, 7, rw->rank);
        CHECK(rw->job_id == 7 && rw->generation == 2);
        CHECK(s && s->pid == rw->pid);
    }
    fake_unlock(fc);
    /* The desired set comes again (versions restart with a session); the
     * workers keep running. */
    usleep(800000);
    CHECK_EQ_INT(fake_count_events(fc, STARTED), 2);
    CHECK_EQ_INT(fake_count_events(fc, EXITED), 0);

    /* Reports refused for a while are retried until accepted, in order
     * and exactly once. */
    fake_lock(fc);
    fc->fail_reports = 3;
    fake_unlock(fc);
    Kolo__WorkerSpec *talk =
        spec_sh(9, 1, 0, 1, "i=0; while [ $i -lt 200 ]; do echo n$i; i=$((i+1)); done");
    Kolo__WorkerSpec *all[3] = {specs[0], specs[1], talk};
    fake_set_desired(fc, all, 3);
    CHECK(WAIT_UNTIL(fake_get_event(fc, EXITED, 9, 0, NULL), 10000));
    fake_lock(fc);
    int n = 0;
    for (size_t i = 0; i < fc->n_lines; i++) {
        if (fc->lines[i].job_id != 9)
            continue;
        char want[16];
        snprintf(want, sizeof(want), "n%d", n++);
        CHECK_EQ_STR(fc->lines[i].text, want);
    }
    CHECK_EQ_INT(n, 200);
    CHECK_EQ_INT(fc->fail_reports, 0);
    fake_unlock(fc);
    struct agent_stats st;
    agent_get_stats(a, &st);
    CHECK_EQ_INT(st.registrations, 2);
    CHECK_EQ_INT(st.dropped_lines, 0);
    CHECK_EQ_INT(st.workers_alive, 2);

    agent_stop(a);
    CHECK_EQ_INT(fake_count_events(fc, EXITED), 3);
    fake_close(fc);
    spec_free(specs[0]);
    spec_free(specs[1]);
    spec_free(talk);
}

/* The coordinator goes away and comes back empty (a restart): the agent
 * retries, registers again with its worker, and the events it could not
 * deliver meanwhile arrive. */
static void test_coordinator_restart(void)
{
    const char *url = "inproc://agent-restart";
    struct fake_coord *fc = NULL;
    REQUIRE(fake_open(&fc, url, 200) == 0);
    char dir[128];
    state_path(dir, sizeof(dir), "restart");
    struct agent *a = start_agent_at(url, dir);
    Kolo__WorkerSpec *specs[2] = {spec_sh(10, 1, 0, 2, "exec sleep 100"),
                                  spec_sh(10, 1, 1, 2, "sleep 1; echo done")};
    fake_set_desired(fc, specs, 2);
    CHECK(WAIT_UNTIL(fake_count_events(fc, STARTED) == 2, 5000));
    struct fake_event started;
    CHECK(fake_get_event(fc, STARTED, 10, 0, &started));
    fake_close(fc);

    /* Rank 1 exits while nobody listens. */
    usleep(1500000);
    REQUIRE(fake_open(&fc, url, 200) == 0);
    CHECK(WAIT_UNTIL(fake_registrations(fc) == 1, 10000));
    fake_lock(fc);
    CHECK_EQ_INT(fc->n_last_running, 1);
    CHECK(fc->n_last_running == 1 && fc->last_running[0].rank == 0 &&
          fc->last_running[0].pid == started.pid);
    fake_unlock(fc);
    /* The exit of rank 1, and its line, from before the restart. */
    CHECK(WAIT_UNTIL(fake_get_event(fc, EXITED, 10, 1, NULL), 5000));
    fake_lock(fc);
    CHECK(fc->n_lines == 1 && strcmp(fc->lines[0].text, "done") == 0);
    fake_unlock(fc);

    agent_stop(a);
    fake_close(fc);
    spec_free(specs[0]);
    spec_free(specs[1]);
}

/* With a cluster token: the agent authenticates and hands its workers
 * their job's credential, never the token itself (not even one in the
 * agent's environment); with a wrong token it is refused and keeps
 * trying. */
static void test_token(void)
{
    const char *token = "kolo-test-token-0123456789";
    struct fake_coord *fc = NULL;
    REQUIRE(fake_open_token(&fc, "inproc://agent-token", 200, token) == 0);
    char dir[128];
    state_path(dir, sizeof(dir), "token");
    struct agent *a = start_agent_tok(fake_url(fc), dir, token);
    setenv("KOLO_TOKEN", token, 1);
    Kolo__WorkerSpec *s = spec_sh(12, 1, 0, 1, "echo \"[$KOLO_TOKEN]$KOLO_JOB_TOKEN\"");
    fake_set_desired(fc, &s, 1);
    CHECK(WAIT_UNTIL(fake_get_event(fc, EXITED, 12, 0, NULL), 5000));
    unsetenv("KOLO_TOKEN");
    char want[CREDS_JOB_HEX + 2] = "[]";
    creds_job(token, 12, want + 2);
    fake_lock(fc);
    CHECK(fc->n_lines == 1 && strcmp(fc->lines[0].text, want) == 0);
    fake_unlock(fc);
    agent_stop(a);

    a = start_agent_tok(fake_url(fc), dir, "the-wrong-token-0123456789");
    usleep(700000);
    struct agent_stats st;
    agent_get_stats(a, &st);
    CHECK_EQ_INT(st.registrations, 0);
    uint64_t t0 = now_mono_ms();
    agent_stop(a); /* wakes from the 10 s retry sleep */
    CHECK(now_mono_ms() - t0 < 1000);
    CHECK_EQ_INT(fake_registrations(fc), 1);
    fake_close(fc);
    spec_free(s);
}

/* Nobody listens: agent_start still succeeds, and agent_stop is prompt. */
static void test_unreachable(void)
{
    char dir[128];
    state_path(dir, sizeof(dir), "unreachable");
    struct agent *a = start_agent_at("tcp://127.0.0.1:1", dir);
    usleep(1500000);
    struct agent_stats st;
    agent_get_stats(a, &st);
    CHECK_EQ_INT(st.registrations, 0);
    uint64_t t0 = now_mono_ms();
    agent_stop(a);
    uint64_t took = now_mono_ms() - t0;
    CHECK(took < 7000);

    /* A bad address is refused at once. */
    struct agent_config cfg = {
        .coordinator_url = "nonsense://x", .state_dir = dir, .exec_path = exec_path};
    char err[256];
    CHECK(agent_start(&a, &cfg, err, sizeof(err)) != 0);
    cfg.coordinator_url = NULL;
    CHECK(agent_start(&a, &cfg, err, sizeof(err)) == KOLO_EINVAL);
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
    snprintf(base_dir, sizeof(base_dir), "/tmp/kolo-agent-link-XXXXXX");
    REQUIRE(mkdtemp(base_dir) != NULL);

    test_host_id();
    test_stale_session();
    test_coordinator_restart();
    test_token();
    test_unreachable();

    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base_dir);
    CHECK(system(cmd) == 0);
    CHECK_EQ_INT(atomic_load(&loop_not_empty), 0);
    log_set_sink(NULL, NULL);
    TEST_DONE();
}
