/*
 * test_coord.c - the coordinator in-process, driven over real TCP RPC by
 * scripted agents and clients, with its state in a real SQLite file:
 * registration, leases, launch orders, the job state machine, output
 * streams, restarts, and bad input.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "errors.h"
#include "kolo.pb-c.h"
#include "creds.h"
#include "rpc.h"
#include "store.h"
#include "test.h"
#include "util.h"

#define LEASE_MS 2000 /* a sanitized test on a loaded machine can miss 1 s of heartbeats */
#define HB_MS    200

static char dbpath[256];

static struct coord *start_with(int rpc_contexts)
{
    struct coord *c = NULL;
    char err[512];
    struct coord_config cfg = {
        .listen = "tcp://127.0.0.1:0",
        .http = "127.0.0.1:0",
        .db_path = dbpath,
        .lease_ms = LEASE_MS,
        .heartbeat_ms = HB_MS,
        .stop_grace_ms = 1000,
        .rpc_contexts = rpc_contexts,
    };
    int rv = coord_start(&c, &cfg, err, sizeof(err));
    if (rv)
        fprintf(stderr, "coord_start: %s\n", err);
    REQUIRE(rv == 0);
    return c;
}

static struct coord *start(void)
{
    return start_with(0);
}

static struct rpc_client *connect_to(struct coord *c, const char *who)
{
    struct rpc_client *cli = NULL;
    struct rpc_client_config cfg = {.url = coord_rpc_url(c), .identity = who};
    REQUIRE(rpc_client_open(&cli, &cfg) == 0);
    return cli;
}

/* call packs req, calls, and unpacks the reply (NULL on error). */
static int call(struct rpc_client *cli, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *desc, void **rep, int timeout, char *err)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(req, buf);
    void *out = NULL;
    size_t olen = 0;
    int rv = rpc_client_call(cli, method, buf, len, &out, &olen, timeout, err, 512);
    free(buf);
    *rep = NULL;
    if (rv == 0 && desc) {
        *rep = protobuf_c_message_unpack(desc, NULL, olen, out);
        REQUIRE(*rep != NULL);
    }
    free(out);
    return rv;
}

struct fake_agent {
    struct rpc_client *cli;
    char id[64];
    char instance[64];
    char session[64];
    char version[64];
    uint64_t batch;
};

static int agent_register(struct fake_agent *a, const char *name, int slots,
                          Kolo__RunningWorker **running, size_t nrunning, char *err)
{
    Kolo__RegisterRequest req = KOLO__REGISTER_REQUEST__INIT;
    Kolo__HostInventory inv = KOLO__HOST_INVENTORY__INIT;
    inv.cpus = 2;
    req.host_id = a->id;
    req.hostname = (char *)name;
    req.name = (char *)name;
    req.addr = "127.0.0.1";
    req.slots = slots;
    req.inventory = &inv;
    req.agent_instance = a->instance;
    req.running = running;
    req.n_running = nrunning;
    void *rep;
    int rv = call(a->cli, "AgentService.RegisterHost", &req.base, &kolo__register_reply__descriptor,
                  &rep, 3000, err);
    if (rv == 0) {
        Kolo__RegisterReply *r = rep;
        str_copy(a->session, r->session, sizeof(a->session));
        CHECK_EQ_INT(r->lease_ms, LEASE_MS);
        CHECK_EQ_INT(r->heartbeat_ms, HB_MS);
        a->version[0] = '\0';
        protobuf_c_message_free_unpacked(rep, NULL);
    }
    return rv;
}

/* heartbeat returns the reply (caller frees) or NULL with *rv set. */
static Kolo__HeartbeatReply *agent_heartbeat(struct fake_agent *a, uint32_t wait, int *rv)
{
    Kolo__HeartbeatRequest req = KOLO__HEARTBEAT_REQUEST__INIT;
    char err[512];
    req.session = a->session;
    req.desired_version = a->version;
    req.wait_ms = wait;
    void *rep;
    *rv = call(a->cli, "AgentService.Heartbeat", &req.base, &kolo__heartbeat_reply__descriptor,
               &rep, (int)wait + 3000, err);
    if (*rv)
        return NULL;
    Kolo__HeartbeatReply *r = rep;
    str_copy(a->version, r->desired_version, sizeof(a->version));
    return r;
}

static int agent_event(struct fake_agent *a, uint64_t job, uint64_t gen, int rank, int kind,
                       int code, int sig, const char *line)
{
    Kolo__ReportRequest req = KOLO__REPORT_REQUEST__INIT;
    Kolo__WorkerEvent ev = KOLO__WORKER_EVENT__INIT;
    Kolo__WorkerEvent *evp = &ev;
    Kolo__OutputLine ol = KOLO__OUTPUT_LINE__INIT;
    Kolo__OutputLine *olp = &ol;
    char err[512];
    ev.job_id = job;
    ev.generation = gen;
    ev.rank = rank;
    ev.kind = kind;
    ev.pid = 1000 + rank;
    ev.exit_code = code;
    ev.term_signal = sig;
    req.session = a->session;
    req.batch_seq = ++a->batch;
    if (kind) {
        req.events = &evp;
        req.n_events = 1;
    }
    if (line) {
        ol.job_id = job;
        ol.rank = rank;
        ol.stream = KOLO__OUTPUT_STREAM__OUTPUT_STDOUT;
        ol.text.data = (uint8_t *)line;
        ol.text.len = strlen(line);
        req.lines = &olp;
        req.n_lines = 1;
    }
    void *rep;
    int rv = call(a->cli, "AgentService.Report", &req.base, &kolo__report_reply__descriptor, &rep,
                  3000, err);
    if (rep)
        protobuf_c_message_free_unpacked(rep, NULL);
    return rv;
}

static uint64_t submit(struct rpc_client *cli, int np, const char *hosts, uint32_t timeout_ms,
                       int *rv_out, char *err)
{
    Kolo__SubmitJobRequest req = KOLO__SUBMIT_JOB_REQUEST__INIT;
    char *argv[] = {"sh", "-c", "echo $KOLO_RANK"};
    char *env[] = {"FOO=bar"};
    req.argv = argv;
    req.n_argv = 3;
    req.env = env;
    req.n_env = 1;
    req.cwd = "/tmp";
    req.np = np;
    req.hosts = (char *)(hosts ? hosts : "");
    req.start_timeout_ms = timeout_ms;
    void *rep;
    int rv = call(cli, "AdminService.SubmitJob", &req.base, &kolo__submit_job_reply__descriptor,
                  &rep, 3000, err);
    if (rv_out)
        *rv_out = rv;
    if (rv)
        return 0;
    uint64_t id = ((Kolo__SubmitJobReply *)rep)->job_id;
    protobuf_c_message_free_unpacked(rep, NULL);
    return id;
}

static Kolo__JobInfo *get_job(struct rpc_client *cli, uint64_t id)
{
    Kolo__GetJobRequest req = KOLO__GET_JOB_REQUEST__INIT;
    char err[512];
    void *rep;
    req.job_id = id;
    REQUIRE(call(cli, "AdminService.GetJob", &req.base, &kolo__job_info__descriptor, &rep, 3000,
                 err) == 0);
    return rep;
}

static void expect_job_state(struct rpc_client *cli, uint64_t id, const char *state, int code)
{
    Kolo__JobInfo *j = get_job(cli, id);
    if (strcmp(j->state, state) != 0)
        fprintf(stderr, "job %llu: state %s (%s), want %s\n", (unsigned long long)id, j->state,
                j->reason, state);
    CHECK_EQ_STR(j->state, state);
    if (code >= 0)
        CHECK_EQ_INT(j->exit_code, code);
    protobuf_c_message_free_unpacked(&j->base, NULL);
}

static struct fake_agent *new_agent(struct coord *c, const char *id, const char *name, int slots)
{
    struct fake_agent *a = calloc(1, sizeof(*a));
    char err[512];
    a->cli = connect_to(c, id);
    str_copy(a->id, id, sizeof(a->id));
    random_hex(a->instance, 8);
    REQUIRE(agent_register(a, name, slots, NULL, 0, err) == 0);
    return a;
}

static void free_agent(struct fake_agent *a)
{
    rpc_client_close(a->cli);
    free(a);
}

static void test_launch_and_succeed(void)
{
    struct coord *c = start();
    struct fake_agent *a = new_agent(c, "host-a", "alpha", 2);
    struct fake_agent *b = new_agent(c, "host-b", "beta", 2);
    struct rpc_client *admin = connect_to(c, "admin");
    char err[512];
    int rv;

    /* first heartbeat: empty desired set */
    Kolo__HeartbeatReply *hb = agent_heartbeat(a, 0, &rv);
    REQUIRE(hb);
    CHECK(hb->has_desired);
    CHECK_EQ_INT(hb->n_desired, 0);
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    hb = agent_heartbeat(b, 0, &rv);
    protobuf_c_message_free_unpacked(&hb->base, NULL);

    /* a parked heartbeat is woken by the launch order */
    uint64_t t0 = now_mono_ms();
    uint64_t job = submit(admin, 4, NULL, 0, NULL, err);
    REQUIRE(job > 0);
    hb = agent_heartbeat(a, 150, &rv);
    REQUIRE(hb);
    CHECK(now_mono_ms() - t0 < 1000);
    CHECK(hb->has_desired);
    REQUIRE(hb->n_desired == 2);
    for (size_t i = 0; i < 2; i++) {
        Kolo__WorkerSpec *s = hb->desired[i];
        CHECK_EQ_INT(s->rank, (int)i);
        CHECK_EQ_INT(s->size, 4);
        CHECK_EQ_INT(s->local_rank, (int)i);
        CHECK_EQ_INT(s->local_size, 2);
        CHECK_EQ_INT(s->cross_rank, 0);
        CHECK_EQ_INT(s->cross_size, 2);
        CHECK_EQ_INT(s->n_argv, 3);
        CHECK_EQ_STR(s->argv[2], "echo $KOLO_RANK");
        CHECK_EQ_STR(s->env[0], "FOO=bar");
        CHECK_EQ_STR(s->cwd, "/tmp");
        CHECK_EQ_INT(s->generation, 1);
    }
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    hb = agent_heartbeat(b, 100, &rv);
    REQUIRE(hb && hb->n_desired == 2);
    CHECK_EQ_INT(hb->desired[0]->rank, 2);
    CHECK_EQ_INT(hb->desired[1]->cross_rank, 1);
    protobuf_c_message_free_unpacked(&hb->base, NULL);

    /* an unchanged set parks until the wait runs out and sends no set */
    t0 = now_mono_ms();
    hb = agent_heartbeat(a, 150, &rv);
    REQUIRE(hb);
    CHECK(!hb->has_desired);
    CHECK(now_mono_ms() - t0 >= 100);
    protobuf_c_message_free_unpacked(&hb->base, NULL);

    expect_job_state(admin, job, "running", -1);
    for (int r = 0; r < 4; r++) {
        struct fake_agent *x = r < 2 ? a : b;
        CHECK_EQ_INT(agent_event(x, job, 1, r, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL),
                     0);
    }
    /* a host cannot speak for another host's rank */
    CHECK_EQ_INT(agent_event(a, job, 1, 3, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 9, 0, "forged"),
                 0);
    expect_job_state(admin, job, "running", -1);
    for (int r = 0; r < 4; r++) {
        struct fake_agent *x = r < 2 ? a : b;
        char line[32];
        snprintf(line, sizeof(line), "hello from %d", r);
        CHECK_EQ_INT(agent_event(x, job, 1, r, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0, 0, line),
                     0);
    }
    expect_job_state(admin, job, "succeeded", 0);

    /* the stream has the four lines (not the forged one) and is done */
    Kolo__StreamOutputRequest sreq = KOLO__STREAM_OUTPUT_REQUEST__INIT;
    sreq.job_id = job;
    sreq.wait_ms = 100;
    void *rep;
    REQUIRE(call(admin, "AdminService.StreamOutput", &sreq.base,
                 &kolo__stream_output_reply__descriptor, &rep, 3000, err) == 0);
    Kolo__StreamOutputReply *so = rep;
    CHECK_EQ_INT(so->n_lines, 4);
    CHECK(so->done);
    int seen = 0;
    for (size_t i = 0; i < so->n_lines; i++) {
        char want[32];
        snprintf(want, sizeof(want), "hello from %d", so->lines[i]->rank);
        CHECK(so->lines[i]->text.len == strlen(want) &&
              memcmp(so->lines[i]->text.data, want, strlen(want)) == 0);
        seen |= 1 << so->lines[i]->rank;
    }
    CHECK_EQ_INT(seen, 15);
    protobuf_c_message_free_unpacked(rep, NULL);

    /* the hosts' desired sets are empty again */
    hb = agent_heartbeat(a, 0, &rv);
    REQUIRE(hb);
    CHECK(hb->has_desired && hb->n_desired == 0);
    protobuf_c_message_free_unpacked(&hb->base, NULL);

    free_agent(a);
    free_agent(b);
    rpc_client_close(admin);
    coord_stop(c);
}

static void test_failure_stops_others(void)
{
    struct coord *c = start();
    struct fake_agent *a = new_agent(c, "host-a", "alpha", 2);
    struct fake_agent *b = new_agent(c, "host-b", "beta", 2);
    struct rpc_client *admin = connect_to(c, "admin");
    char err[512];
    int rv;
    uint64_t job = submit(admin, 4, "beta:2,alpha:2", 0, NULL, err);
    REQUIRE(job > 0);
    Kolo__HeartbeatReply *hb = agent_heartbeat(b, 0, &rv);
    REQUIRE(hb && hb->n_desired == 2);
    CHECK_EQ_INT(hb->desired[0]->rank, 0); /* -H order: beta first */
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    hb = agent_heartbeat(a, 0, &rv);
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    for (int r = 0; r < 4; r++)
        agent_event(r < 2 ? b : a, job, 1, r, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL);
    agent_event(a, job, 1, 2, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 3, 0, NULL);
    expect_job_state(admin, job, "failed", 3);
    Kolo__JobInfo *j = get_job(admin, job);
    CHECK(strstr(j->reason, "rank 2") && strstr(j->reason, "code 3"));
    CHECK_EQ_INT(j->ranks_alive, 3);
    protobuf_c_message_free_unpacked(&j->base, NULL);
    /* the failed job leaves both desired sets: agents stop the rest */
    hb = agent_heartbeat(b, 0, &rv);
    REQUIRE(hb && hb->has_desired);
    CHECK_EQ_INT(hb->n_desired, 0);
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    /* stream is not done while workers still run, then done */
    agent_event(b, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0, 15, NULL);
    agent_event(b, job, 1, 1, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0, 15, NULL);
    Kolo__StreamOutputRequest sreq = KOLO__STREAM_OUTPUT_REQUEST__INIT;
    sreq.job_id = job;
    void *rep;
    REQUIRE(call(admin, "AdminService.StreamOutput", &sreq.base,
                 &kolo__stream_output_reply__descriptor, &rep, 3000, err) == 0);
    CHECK(!((Kolo__StreamOutputReply *)rep)->done);
    protobuf_c_message_free_unpacked(rep, NULL);
    agent_event(a, job, 1, 3, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0, 15, NULL);
    REQUIRE(call(admin, "AdminService.StreamOutput", &sreq.base,
                 &kolo__stream_output_reply__descriptor, &rep, 3000, err) == 0);
    CHECK(((Kolo__StreamOutputReply *)rep)->done);
    CHECK_EQ_INT(((Kolo__StreamOutputReply *)rep)->exit_code, 3);
    protobuf_c_message_free_unpacked(rep, NULL);
    /* a signal-killed worker fails a job with 128+signal */
    job = submit(admin, 1, NULL, 0, NULL, err);
    agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL);
    agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0, 9, NULL);
    expect_job_state(admin, job, "failed", 137);
    free_agent(a);
    free_agent(b);
    rpc_client_close(admin);
    coord_stop(c);
}

static void test_pending_and_bad_submissions(void)
{
    struct coord *c = start();
    /* the coordinator's threads are named (top -H, ps -L, gdb) */
    CHECK_EQ_INT(test_threads_named("kolo-coord"), 1);
    CHECK(test_threads_named("kolo-writer") >= 1);
    struct fake_agent *a = new_agent(c, "host-a", "alpha", 2);
    struct rpc_client *admin = connect_to(c, "admin");
    char err[512];
    int rv;
    /* np over the free slots: pending with a reason, failed at the start timeout */
    uint64_t job = submit(admin, 3, NULL, 400, &rv, err);
    REQUIRE(job > 0);
    Kolo__JobInfo *j = get_job(admin, job);
    CHECK_EQ_STR(j->state, "pending");
    CHECK(strstr(j->reason, "needs 3, 2 free") != NULL);
    protobuf_c_message_free_unpacked(&j->base, NULL);
    usleep(700000);
    expect_job_state(admin, job, "failed", 1);
    /* host-a's lease (LEASE_MS) must outlive what follows on a slow
     * (sanitized, loaded) machine: renew it */
    Kolo__HeartbeatReply *hb = agent_heartbeat(a, 0, &rv);
    REQUIRE(hb);
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    /* a pending job starts when capacity arrives */
    job = submit(admin, 3, NULL, 0, &rv, err);
    expect_job_state(admin, job, "pending", -1);
    struct fake_agent *b = new_agent(c, "host-b", "beta", 1);
    expect_job_state(admin, job, "running", -1);
    /* stopping a running job */
    Kolo__StopJobRequest stop = KOLO__STOP_JOB_REQUEST__INIT;
    stop.job_id = job;
    void *rep;
    REQUIRE(call(admin, "AdminService.StopJob", &stop.base, &kolo__stop_job_reply__descriptor, &rep,
                 3000, err) == 0);
    CHECK_EQ_STR(((Kolo__StopJobReply *)rep)->state, "stopped");
    protobuf_c_message_free_unpacked(rep, NULL);
    /* bad submissions: clear errors */
    submit(admin, 0, NULL, 0, &rv, err);
    CHECK_EQ_INT(rv, KOLO_EINVAL);
    submit(admin, 4, "alpha:2,beta:1", 0, &rv, err);
    CHECK_EQ_INT(rv, KOLO_EINVAL);
    CHECK(strstr(err, "3 slot(s) but np is 4") != NULL);
    submit(admin, 1, "al pha:2", 0, &rv, err);
    CHECK_EQ_INT(rv, KOLO_EINVAL);
    stop.job_id = 999;
    CHECK_EQ_INT(call(admin, "AdminService.StopJob", &stop.base, &kolo__stop_job_reply__descriptor,
                      &rep, 3000, err),
                 KOLO_ENOTFOUND);
    /* unknown method, malformed body */
    void *out;
    size_t olen;
    CHECK_EQ_INT(rpc_client_call(admin, "AdminService.Nope", NULL, 0, &out, &olen, 3000, err, 512),
                 KOLO_ENOMETHOD);
    CHECK(strstr(err, "AdminService.Nope") != NULL);
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0x07, 0x01};
    CHECK_EQ_INT(rpc_client_call(admin, "AdminService.SubmitJob", junk, sizeof(junk), &out, &olen,
                                 3000, err, 512),
                 KOLO_EPROTO);
    CHECK_EQ_INT(rpc_client_call(admin, "AgentService.RegisterHost", junk, sizeof(junk), &out,
                                 &olen, 3000, err, 512),
                 KOLO_EPROTO);
    free_agent(a);
    free_agent(b);
    rpc_client_close(admin);
    coord_stop(c);
}

static void test_leases_and_sessions(void)
{
    struct coord *c = start();
    struct fake_agent *a = new_agent(c, "host-a", "alpha", 1);
    struct fake_agent *b = new_agent(c, "host-b", "beta", 1);
    struct rpc_client *admin = connect_to(c, "admin");
    char err[512];
    int rv;
    uint64_t job = submit(admin, 2, NULL, 0, NULL, err);
    agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL);
    agent_event(b, job, 1, 1, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL);
    /* a keeps heart-beating, b goes silent: lost within lease + 1 s */
    uint64_t t0 = now_mono_ms();
    bool lost = false;
    while (now_mono_ms() - t0 < LEASE_MS + 1000 && !lost) {
        Kolo__HeartbeatReply *hb = agent_heartbeat(a, 100, &rv);
        if (hb)
            protobuf_c_message_free_unpacked(&hb->base, NULL);
        Kolo__JobInfo *j = get_job(admin, job);
        lost = strcmp(j->state, "failed") == 0;
        protobuf_c_message_free_unpacked(&j->base, NULL);
    }
    CHECK(lost);
    CHECK(now_mono_ms() - t0 >= LEASE_MS - 300);
    Kolo__JobInfo *j = get_job(admin, job);
    CHECK(strstr(j->reason, "beta") && strstr(j->reason, "lost"));
    CHECK_EQ_STR(j->ranks[1]->state, "lost");
    protobuf_c_message_free_unpacked(&j->base, NULL);
    /* the expired session is refused; re-registration brings the host back */
    Kolo__HeartbeatReply *hb = agent_heartbeat(b, 0, &rv);
    CHECK(hb == NULL && rv == KOLO_ESTALE);
    CHECK_EQ_INT(agent_register(b, "beta", 1, NULL, 0, err), 0);
    /* a heartbeat with a made-up session */
    struct fake_agent ghost = *a;
    strcpy(ghost.session, "not-a-session");
    hb = agent_heartbeat(&ghost, 0, &rv);
    CHECK(hb == NULL && rv == KOLO_ESTALE);

    /* a's agent restarts (new instance): its running rank is lost */
    job = submit(admin, 1, "alpha:1", 0, NULL, err);
    agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL);
    char old_instance[64];
    str_copy(old_instance, a->instance, sizeof(old_instance));
    random_hex(a->instance, 8);
    CHECK_EQ_INT(agent_register(a, "alpha", 1, NULL, 0, err), 0);
    expect_job_state(admin, job, "failed", 1);
    /* the old instance coming back inside a lease is a duplicate: refused */
    struct fake_agent dup = *a;
    str_copy(dup.instance, old_instance, sizeof(dup.instance));
    CHECK_EQ_INT(agent_register(&dup, "alpha", 1, NULL, 0, err), KOLO_EEXIST);
    CHECK(strstr(err, "state-dir") != NULL);
    /* the same instance registering again is fine (a reconnect) */
    CHECK_EQ_INT(agent_register(a, "alpha", 1, NULL, 0, err), 0);
    /* invalid registrations */
    struct fake_agent bad = *a;
    strcpy(bad.id, "bad id!");
    CHECK_EQ_INT(agent_register(&bad, "x", 1, NULL, 0, err), KOLO_EINVAL);
    free_agent(a);
    free_agent(b);
    rpc_client_close(admin);
    coord_stop(c);
}

static void test_restart_keeps_state(void)
{
    struct coord *c = start();
    struct fake_agent *a = new_agent(c, "host-a", "alpha", 2);
    struct rpc_client *admin = connect_to(c, "admin");
    char err[512];
    int rv;
    uint64_t job = submit(admin, 2, NULL, 0, NULL, err);
    agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, "before");
    agent_event(a, job, 1, 1, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL);
    rpc_client_close(admin);
    rpc_client_close(a->cli);
    coord_stop(c);

    c = start();
    a->cli = connect_to(c, "host-a");
    admin = connect_to(c, "admin");
    Kolo__JobInfo *j = get_job(admin, job);
    CHECK_EQ_STR(j->state, "running");
    REQUIRE(j->n_ranks == 2);
    CHECK_EQ_STR(j->ranks[0]->state, "running");
    CHECK_EQ_STR(j->ranks[0]->host_id, "host-a");
    protobuf_c_message_free_unpacked(&j->base, NULL);
    /* the old session is unknown to the new coordinator */
    Kolo__HeartbeatReply *hb = agent_heartbeat(a, 0, &rv);
    CHECK(hb == NULL && rv == KOLO_ESTALE);
    /* re-attach with the running workers: the job goes on */
    Kolo__RunningWorker w0 = KOLO__RUNNING_WORKER__INIT, w1 = KOLO__RUNNING_WORKER__INIT;
    w0.job_id = w1.job_id = job;
    w0.generation = w1.generation = 1;
    w0.rank = 0;
    w1.rank = 1;
    Kolo__RunningWorker *running[] = {&w0, &w1};
    CHECK_EQ_INT(agent_register(a, "alpha", 2, running, 2, err), 0);
    hb = agent_heartbeat(a, 0, &rv);
    REQUIRE(hb);
    CHECK_EQ_INT(hb->n_desired, 2);
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    /* output numbering continues after the restart */
    agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0, 0, "after");
    agent_event(a, job, 1, 1, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0, 0, NULL);
    expect_job_state(admin, job, "succeeded", 0);
    Kolo__StreamOutputRequest sreq = KOLO__STREAM_OUTPUT_REQUEST__INIT;
    sreq.job_id = job;
    void *rep;
    REQUIRE(call(admin, "AdminService.StreamOutput", &sreq.base,
                 &kolo__stream_output_reply__descriptor, &rep, 3000, err) == 0);
    Kolo__StreamOutputReply *so = rep;
    REQUIRE(so->n_lines == 2);
    CHECK_EQ_INT(so->lines[0]->seq, 1);
    CHECK_EQ_INT(so->lines[1]->seq, 2);
    CHECK(so->lines[1]->text.len == 5 && memcmp(so->lines[1]->text.data, "after", 5) == 0);
    protobuf_c_message_free_unpacked(rep, NULL);
    /* a duplicated report batch (a resend after a lost reply) is ignored */
    a->batch--;
    agent_event(a, job, 1, 1, 0, 0, 0, "dup");
    REQUIRE(call(admin, "AdminService.StreamOutput", &sreq.base,
                 &kolo__stream_output_reply__descriptor, &rep, 3000, err) == 0);
    CHECK_EQ_INT(((Kolo__StreamOutputReply *)rep)->n_lines, 2);
    protobuf_c_message_free_unpacked(rep, NULL);

    /* a job whose host never comes back fails once the fresh lease runs out */
    job = submit(admin, 1, NULL, 0, NULL, err);
    agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL);
    rpc_client_close(admin);
    rpc_client_close(a->cli);
    coord_stop(c);
    c = start();
    admin = connect_to(c, "admin");
    expect_job_state(admin, job, "running", -1);
    usleep((LEASE_MS + 600) * 1000);
    expect_job_state(admin, job, "failed", 1);
    rpc_client_close(admin);
    free(a);
    coord_stop(c);
}

static void test_refuses_open_listener_without_token(void)
{
    struct coord *c = NULL;
    char err[512];
    struct coord_config cfg = {.listen = "tcp://0.0.0.0:0", .db_path = dbpath};
    CHECK_EQ_INT(coord_start(&c, &cfg, err, sizeof(err)), KOLO_EPERM);
    CHECK(strstr(err, "token") != NULL);
    struct coord_config cfg2 = {
        .listen = "tcp://127.0.0.1:0", .http = "0.0.0.0:0", .db_path = dbpath};
    CHECK_EQ_INT(coord_start(&c, &cfg2, err, sizeof(err)), KOLO_EPERM);
}

/* A worker's credential (the job's, creds.h) opens that job's worker
 * calls and nothing an agent or an operator does (issue 15, F6). */
static void test_job_credential_scope(void)
{
    static const char token[] = "scope-test-token-0123456789abcdef";
    struct coord *c = NULL;
    char err[512];
    struct coord_config cfg = {.listen = "tcp://127.0.0.1:0", .db_path = dbpath, .token = token};
    REQUIRE(coord_start(&c, &cfg, err, sizeof(err)) == 0);
    char cred[CREDS_JOB_HEX];
    creds_job(token, 3, cred);
    struct rpc_client *cli = NULL;
    struct rpc_client_config cc = {.url = coord_rpc_url(c), .token = cred, .token_is_job = true,
                                   .identity = "job3-rank0", .job_id = 3};
    REQUIRE(rpc_client_open(&cli, &cc) == 0);
    void *rep;
    Kolo__ListHostsRequest lh = KOLO__LIST_HOSTS_REQUEST__INIT;
    CHECK_EQ_INT(call(cli, "AdminService.ListHosts", &lh.base, NULL, &rep, 3000, err), KOLO_EPERM);
    CHECK(strstr(err, "needs the cluster token") != NULL);
    Kolo__SubmitJobRequest sub = KOLO__SUBMIT_JOB_REQUEST__INIT;
    char *argv[] = {"id"};
    sub.argv = argv;
    sub.n_argv = 1;
    sub.np = 1;
    CHECK_EQ_INT(call(cli, "AdminService.SubmitJob", &sub.base, NULL, &rep, 3000, err),
                 KOLO_EPERM);
    Kolo__RegisterRequest reg = KOLO__REGISTER_REQUEST__INIT;
    reg.host_id = "h";
    reg.slots = 1;
    CHECK_EQ_INT(call(cli, "AgentService.RegisterHost", &reg.base, NULL, &rep, 3000, err),
                 KOLO_EPERM);
    /* a worker call gets past the credential (the job itself is unknown) */
    Kolo__WorkerReportRequest wr = KOLO__WORKER_REPORT_REQUEST__INIT;
    int rv = call(cli, "WorkerService.Report", &wr.base, NULL, &rep, 3000, err);
    CHECK(rv != KOLO_EPERM && rv != KOLO_EAUTH);
    rpc_client_close(cli);
    coord_stop(c);
}

static void stream_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    (void)rep, (void)len, (void)err;
    if (code == KOLO_EBUSY)
        atomic_fetch_add((atomic_int *)arg, 1);
}

/* F10 as it was reproduced: output streams parked until they hold every
 * receive context starved the heartbeats and the host was lost. Now a
 * sixteenth of the contexts (a quarter below 64) stays for the agents:
 * the streams beyond the rest get KOLO_EBUSY, heartbeats keep the lease
 * and the job runs on. */
static void test_parked_streams_leave_heartbeats_room(void)
{
    struct coord *c = start_with(64); /* 4 kept for the agent, 60 for the rest */
    struct fake_agent *a = new_agent(c, "host-a", "alpha", 1);
    struct rpc_client *admin = connect_to(c, "admin");
    char err[512];
    int rv;
    uint64_t job = submit(admin, 1, NULL, 0, NULL, err);
    agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL);
    /* 64 streams on each of two connections: 128 asked, 60 kept */
    struct rpc_client *streams[2] = {connect_to(c, "s1"), connect_to(c, "s2")};
    static atomic_int busy;
    Kolo__StreamOutputRequest sreq = KOLO__STREAM_OUTPUT_REQUEST__INIT;
    sreq.job_id = job;
    sreq.wait_ms = 5 * LEASE_MS / 2;
    uint8_t body[64];
    size_t blen = protobuf_c_message_pack(&sreq.base, body);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 64; i++)
            REQUIRE(rpc_client_call_async(streams[s], "AdminService.StreamOutput", body, blen,
                                          8 * LEASE_MS, stream_done, &busy) == 0);
    /* the agent heart-beats through two leases */
    uint64_t t0 = now_mono_ms();
    int beats = 0;
    while (now_mono_ms() - t0 < 2 * LEASE_MS) {
        Kolo__HeartbeatReply *hb = agent_heartbeat(a, 100, &rv);
        CHECK_EQ_INT(rv, 0);
        if (!hb)
            break;
        beats++;
        protobuf_c_message_free_unpacked(&hb->base, NULL);
    }
    CHECK(beats >= 4);
    CHECK_EQ_INT(atomic_load(&busy), 128 - 60);
    /* an operator's call waits its turn (KOLO_EBUSY until the streams
     * time out), then finds the job running on its live host */
    Kolo__GetJobRequest greq = KOLO__GET_JOB_REQUEST__INIT;
    greq.job_id = job;
    void *rep = NULL;
    t0 = now_mono_ms();
    while ((rv = call(admin, "AdminService.GetJob", &greq.base, &kolo__job_info__descriptor, &rep,
                      3000, err)) == KOLO_EBUSY &&
           now_mono_ms() - t0 < 4 * LEASE_MS)
        usleep(100 * 1000);
    CHECK_EQ_INT(rv, 0);
    if (rep) {
        CHECK_EQ_STR(((Kolo__JobInfo *)rep)->state, "running");
        protobuf_c_message_free_unpacked(rep, NULL);
    }
    for (int s = 0; s < 2; s++)
        rpc_client_close(streams[s]);
    free_agent(a);
    rpc_client_close(admin);
    coord_stop(c);
}

/* ------------------------------------------------ output off the state lock */

struct async_result {
    atomic_int code; /* -1 until done */
};

static void async_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    (void)rep, (void)len, (void)err;
    atomic_store(&((struct async_result *)arg)->code, code);
}

/* report_async sends one batch of rank 0's lines "line 0".."line n-1"
 * and, if kind, an event after them. */
static void report_async(struct fake_agent *a, uint64_t seq, uint64_t job, int nlines, int kind,
                         struct async_result *res)
{
    Kolo__ReportRequest req = KOLO__REPORT_REQUEST__INIT;
    Kolo__WorkerEvent ev = KOLO__WORKER_EVENT__INIT;
    Kolo__WorkerEvent *evp = &ev;
    Kolo__OutputLine ol[8], *olp[8];
    char text[8][16];
    REQUIRE(nlines <= 8);
    for (int i = 0; i < nlines; i++) {
        kolo__output_line__init(&ol[i]);
        snprintf(text[i], sizeof(text[i]), "line %d", i);
        ol[i].job_id = job;
        ol[i].rank = 0;
        ol[i].text.data = (uint8_t *)text[i];
        ol[i].text.len = strlen(text[i]);
        olp[i] = &ol[i];
    }
    ev.job_id = job;
    ev.generation = 1;
    ev.kind = kind;
    ev.pid = 1000;
    req.session = a->session;
    req.batch_seq = seq;
    req.lines = olp;
    req.n_lines = (size_t)nlines;
    if (kind) {
        req.events = &evp;
        req.n_events = 1;
    }
    uint8_t body[1024];
    size_t len = protobuf_c_message_pack(&req.base, body);
    atomic_store(&res->code, -1);
    REQUIRE(rpc_client_call_async(a->cli, "AgentService.Report", body, len, 8000, async_done,
                                  res) == 0);
}

static Kolo__StreamOutputReply *stream_now(struct rpc_client *cli, uint64_t job)
{
    Kolo__StreamOutputRequest sreq = KOLO__STREAM_OUTPUT_REQUEST__INIT;
    char err[512];
    void *rep = NULL;
    sreq.job_id = job;
    sreq.wait_ms = 0;
    sreq.max_lines = 100;
    REQUIRE(call(cli, "AdminService.StreamOutput", &sreq.base,
                 &kolo__stream_output_reply__descriptor, &rep, 3000, err) == 0);
    return rep;
}

static int wait_code(struct async_result *r, int ms)
{
    uint64_t t0 = now_mono_ms();
    while (atomic_load(&r->code) == -1 && now_mono_ms() - t0 < (uint64_t)ms)
        usleep(5000);
    return atomic_load(&r->code);
}

/* release_later lets go of a store's write lock 300 ms from now. */
static void *release_later(void *arg)
{
    usleep(300 * 1000);
    store_rollback(arg);
    store_close(arg);
    return NULL;
}

/* Issue 17, item 2: output lines are stored by the output writer, off the
 * state lock. While the writer is stuck (another connection holds the
 * database's write lock), the coordinator still answers at once; the
 * batch's exit event waits for its lines; a batch the agent sends again
 * meanwhile takes over the call; and every line is stored once. */
static void test_output_off_the_lock(void)
{
    struct coord *c = start();
    struct fake_agent *a = new_agent(c, "host-a", "alpha", 1);
    struct rpc_client *admin = connect_to(c, "admin");
    char err[512];
    uint64_t job = submit(admin, 1, NULL, 0, NULL, err);
    REQUIRE(job);
    CHECK_EQ_INT(agent_event(a, job, 1, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0, 0, NULL),
                 0);
    uint64_t seq = ++a->batch;

    struct store *blocker = NULL;
    REQUIRE(store_open(&blocker, dbpath, err, sizeof(err)) == 0);
    REQUIRE(store_begin(blocker) == 0); /* BEGIN IMMEDIATE: the write lock */

    struct async_result first, again;
    report_async(a, seq, job, 5, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, &first);
    usleep(100 * 1000);
    CHECK_EQ_INT(atomic_load(&first.code), -1); /* the writer waits for the lock */
    /* the coordinator answers meanwhile; the exit is not applied yet and
     * no line is visible */
    uint64_t t0 = now_mono_ms();
    expect_job_state(admin, job, "running", -1);
    Kolo__StreamOutputReply *so = stream_now(admin, job);
    CHECK(now_mono_ms() - t0 < 1000);
    CHECK_EQ_INT(so->n_lines, 0);
    CHECK(!so->done);
    protobuf_c_message_free_unpacked(&so->base, NULL);

    /* the agent gives up on the call and sends the batch again */
    report_async(a, seq, job, 5, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, &again);
    CHECK_EQ_INT(wait_code(&first, 3000), KOLO_EBUSY);
    CHECK_EQ_INT(atomic_load(&again.code), -1);

    store_rollback(blocker);
    store_close(blocker);
    CHECK_EQ_INT(wait_code(&again, 6000), 0);
    expect_job_state(admin, job, "succeeded", 0);
    so = stream_now(admin, job);
    CHECK_EQ_INT(so->n_lines, 5);
    CHECK(so->done);
    for (size_t i = 0; i < so->n_lines; i++) {
        char want[32];
        snprintf(want, sizeof(want), "line %zu", i);
        CHECK(so->lines[i]->text.len == strlen(want) &&
              memcmp(so->lines[i]->text.data, want, strlen(want)) == 0);
    }
    protobuf_c_message_free_unpacked(&so->base, NULL);

    /* its reply lost, the batch comes a third time: acknowledged, not
     * stored again */
    struct async_result third;
    report_async(a, seq, job, 5, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, &third);
    CHECK_EQ_INT(wait_code(&third, 3000), 0);
    so = stream_now(admin, job);
    CHECK_EQ_INT(so->n_lines, 5);
    protobuf_c_message_free_unpacked(&so->base, NULL);

    /* A new agent process for the host registers while the old one's
     * batch is being stored: the new one counts its batches from 1 again,
     * and its first is not taken for the old one's. (The registration
     * waits in the store, holding the state lock, until the blocker lets
     * go; the batch's completion needs that lock, so it comes after.) */
    REQUIRE(store_open(&blocker, dbpath, err, sizeof(err)) == 0);
    REQUIRE(store_begin(blocker) == 0);
    struct async_result old_batch, new_batch;
    report_async(a, ++a->batch, job, 1, 0, &old_batch);
    usleep(100 * 1000);
    pthread_t releaser;
    REQUIRE(pthread_create(&releaser, NULL, release_later, blocker) == 0);
    random_hex(a->instance, 8);
    CHECK_EQ_INT(agent_register(a, "alpha", 1, NULL, 0, err), 0);
    pthread_join(releaser, NULL);
    CHECK_EQ_INT(wait_code(&old_batch, 6000), 0);
    a->batch = 0;
    report_async(a, ++a->batch, job, 1, 0, &new_batch);
    CHECK_EQ_INT(wait_code(&new_batch, 3000), 0);
    so = stream_now(admin, job);
    CHECK_EQ_INT(so->n_lines, 7); /* both batches' lines */
    protobuf_c_message_free_unpacked(&so->base, NULL);

    free_agent(a);
    rpc_client_close(admin);
    coord_stop(c);
}

int main(void)
{
    char dir[] = "/tmp/kolo-test-coord-XXXXXX";
    REQUIRE(mkdtemp(dir));
    const char *tests[] = {"launch", "failure", "pending", "leases",
                           "restart", "open", "scope", "parked", "output"};
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        snprintf(dbpath, sizeof(dbpath), "%s/%s.db", dir, tests[i]);
        switch (i) {
        case 0:
            test_launch_and_succeed();
            break;
        case 1:
            test_failure_stops_others();
            break;
        case 2:
            test_pending_and_bad_submissions();
            break;
        case 3:
            test_leases_and_sessions();
            break;
        case 4:
            test_restart_keeps_state();
            break;
        case 5:
            test_refuses_open_listener_without_token();
            break;
        case 6:
            test_job_credential_scope();
            break;
        case 7:
            test_parked_streams_leave_heartbeats_room();
            break;
        case 8:
            test_output_off_the_lock();
            break;
        }
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    TEST_DONE();
}
