/*
 * test_stop.c - coord_stop with parked calls of every kind (issue 28).
 *
 * The coordinator runs in-process (so the sanitizer builds see the whole
 * stop) while clients park: an agent's heartbeat long poll, an operator's
 * output stream, an elastic worker's place request waiting for capacity,
 * a rendezvous waiting for a rank that never comes, a negotiation long
 * poll, and HTTP connections that are idle, half a request, a body never
 * sent, or responses nobody reads. coord_stop must return within
 * STOP_BOUND_MS and answer every parked call before it closes the RPC
 * server: the agent's and the operator's with KOLO_ESHUTDOWN, the
 * workers' with KOLO_EIO, which they retry (a restart resumes them, as
 * after a kill -9). The elastic place request used to be answered
 * from coord_free, after the server's contexts were freed (a
 * use-after-free AddressSanitizer reports, exit 139 without it). Several
 * rounds, to catch races.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coord.h"
#include "errors.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "test.h"
#include "util.h"
#include "coord_harness.h"

#define LEASE_MS      3000
#define HB_MS         300
#define PARK_MS       20000 /* every parked call asks to wait this long */
#define STOP_BOUND_MS 5000
#define ROUNDS        4

static char dbpath[256];

struct parked {
    const char *what;
    int want; /* the answer the stop must give */
    atomic_int code; /* -1 until answered */
};

static void parked_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    (void)rep, (void)len, (void)err;
    atomic_store(&((struct parked *)arg)->code, code);
}

static struct rpc_client *client(struct coord *c, uint64_t job, uint64_t gen, int rank)
{
    return harness_client(coord_rpc_url(c), job, gen, rank);
}

/* call packs req and calls; the reply unpacked with desc (NULL: none). */
static int call(struct rpc_client *cli, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *desc, void **rep)
{
    uint8_t buf[4096];
    char err[512];
    REQUIRE(protobuf_c_message_get_packed_size(req) <= sizeof buf);
    size_t len = protobuf_c_message_pack(req, buf);
    void *out = NULL;
    size_t olen = 0;
    int rv = rpc_client_call(cli, method, buf, len, &out, &olen, 3000, err, sizeof err);
    if (rv)
        fprintf(stderr, "%s: %s\n", method, err);
    if (rep)
        *rep = rv == 0 && desc ? protobuf_c_message_unpack(desc, NULL, olen, out) : NULL;
    free(out);
    return rv;
}

/* park sends req without waiting; p->code says when it is answered. */
static void park(struct rpc_client *cli, const char *method, const ProtobufCMessage *req,
                 struct parked *p, const char *what, int want)
{
    uint8_t buf[4096];
    REQUIRE(protobuf_c_message_get_packed_size(req) <= sizeof buf);
    size_t len = protobuf_c_message_pack(req, buf);
    p->what = what;
    p->want = want;
    atomic_store(&p->code, -1);
    REQUIRE(rpc_client_call_async(cli, method, buf, len, PARK_MS + 5000, parked_done, p) == 0);
}

static uint64_t submit(struct rpc_client *admin, int np, bool elastic)
{
    Kolo__SubmitJobRequest req = KOLO__SUBMIT_JOB_REQUEST__INIT;
    char *argv[] = {"true"};
    req.argv = argv;
    req.n_argv = 1;
    req.np = np;
    req.hosts = "";
    req.elastic = elastic;
    req.min_np = np;
    req.max_np = np;
    void *rep;
    REQUIRE(call(admin, "AdminService.SubmitJob", &req.base, &kolo__submit_job_reply__descriptor,
                 &rep) == 0 &&
            rep);
    uint64_t id = ((Kolo__SubmitJobReply *)rep)->job_id;
    protobuf_c_message_free_unpacked(rep, NULL);
    return id;
}

static bool job_in(struct rpc_client *admin, uint64_t id, const char *state, bool waiting)
{
    Kolo__GetJobRequest req = KOLO__GET_JOB_REQUEST__INIT;
    req.job_id = id;
    void *rep;
    if (call(admin, "AdminService.GetJob", &req.base, &kolo__job_info__descriptor, &rep) != 0 ||
        !rep)
        return false;
    Kolo__JobInfo *j = rep;
    bool ok = strcmp(j->state, state) == 0 &&
              (!waiting || strstr(j->reason, "waiting for capacity") != NULL);
    protobuf_c_message_free_unpacked(rep, NULL);
    return ok;
}

static void wait_job(struct rpc_client *admin, uint64_t id, const char *state, bool waiting)
{
    uint64_t t0 = now_mono_ms();
    while (!job_in(admin, id, state, waiting) && now_mono_ms() - t0 < 5000)
        usleep(20 * 1000);
    REQUIRE(job_in(admin, id, state, waiting));
}

static void event(struct rpc_client *agent, const char *session, uint64_t *seq, uint64_t job,
                  int rank, uint64_t wid, int kind, int code)
{
    Kolo__ReportRequest req = KOLO__REPORT_REQUEST__INIT;
    Kolo__WorkerEvent ev = KOLO__WORKER_EVENT__INIT;
    Kolo__WorkerEvent *evp = &ev;
    ev.job_id = job;
    ev.generation = 1;
    ev.rank = rank;
    ev.worker_id = wid;
    ev.kind = kind;
    ev.pid = 1000 + rank;
    ev.exit_code = code;
    req.session = (char *)session;
    req.batch_seq = ++*seq;
    req.events = &evp;
    req.n_events = 1;
    REQUIRE(call(agent, "AgentService.Report", &req.base, NULL, NULL) == 0);
}

static void rendezvous_req(Kolo__RendezvousRequest *r, int size, uint64_t wid)
{
    kolo__rendezvous_request__init(r);
    r->host_id = "host-a";
    r->pid = 4242;
    r->wait_ms = PARK_MS;
    r->size = size;
    r->worker_id = wid;
}

static int http_connect(const char *http_url)
{
    int port = atoi(strrchr(http_url, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    REQUIRE(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    return fd;
}

static void http_send(int fd, const char *text)
{
    size_t n = strlen(text);
    REQUIRE(write(fd, text, n) == (ssize_t)n);
}

enum { P_HEARTBEAT, P_STREAM, P_ASSIGN, P_RENDEZVOUS, P_NEGOTIATE, P_COUNT };
#define NHTTP 12

static void round_of_parked_calls(int round)
{
    snprintf(strrchr(dbpath, '/') + 1, 32, "stop%d.db", round);
    struct coord_config cfg = {
        .listen = "tcp://127.0.0.1:0",
        .http = "127.0.0.1:0",
        .db_path = dbpath,
        .lease_ms = LEASE_MS,
        .heartbeat_ms = HB_MS,
        .stop_grace_ms = 1000,
    };
    struct coord *c = harness_coord_start(&cfg);
    struct rpc_client *admin = client(c, 0, 0, 0);
    struct rpc_client *agent = client(c, 0, 0, 0);

    /* one host with room for the three jobs */
    Kolo__RegisterRequest reg = KOLO__REGISTER_REQUEST__INIT;
    char inst[32];
    random_hex(inst, 8);
    reg.host_id = reg.name = reg.hostname = "host-a";
    reg.addr = "127.0.0.1";
    reg.slots = 6;
    reg.agent_instance = inst;
    void *rep;
    REQUIRE(call(agent, "AgentService.RegisterHost", &reg.base, &kolo__register_reply__descriptor,
                 &rep) == 0 &&
            rep);
    char session[64];
    str_copy(session, ((Kolo__RegisterReply *)rep)->session, sizeof session);
    protobuf_c_message_free_unpacked(rep, NULL);
    uint64_t seq = 0;

    /* an elastic job (min-np 2) whose rank 1 fails: its host is excluded,
     * so the job waits for capacity it will not get */
    uint64_t ej = submit(admin, 2, true);
    wait_job(admin, ej, "running", false);
    event(agent, session, &seq, ej, 0, 1, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0);
    event(agent, session, &seq, ej, 1, 2, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0);
    event(agent, session, &seq, ej, 1, 2, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 3);
    wait_job(admin, ej, "running", true);
    /* a job whose rank 1 never comes to the rendezvous, and one whose
     * two ranks meet and then long-poll the negotiation */
    uint64_t rj = submit(admin, 2, false), nj = submit(admin, 2, false);
    wait_job(admin, rj, "running", false);
    wait_job(admin, nj, "running", false);
    for (int r = 0; r < 2; r++) {
        event(agent, session, &seq, rj, r, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0);
        event(agent, session, &seq, nj, r, 0, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0);
    }
    struct rpc_client *nrank[2] = {client(c, nj, 1, 0), client(c, nj, 1, 1)};
    struct parked met[2];
    Kolo__RendezvousRequest rdv;
    rendezvous_req(&rdv, 2, 0);
    for (int r = 0; r < 2; r++)
        park(nrank[r], "WorkerService.Rendezvous", &rdv.base, &met[r], "rendezvous (met)", 0);
    uint64_t t0 = now_mono_ms();
    while ((atomic_load(&met[0].code) < 0 || atomic_load(&met[1].code) < 0) &&
           now_mono_ms() - t0 < 5000)
        usleep(10 * 1000);
    CHECK_EQ_INT(atomic_load(&met[0].code), 0);
    CHECK_EQ_INT(atomic_load(&met[1].code), 0);

    /* now every kind parks */
    struct parked p[P_COUNT];
    struct rpc_client *ew = client(c, ej, 1, 0), *rw = client(c, rj, 1, 0);
    Kolo__HeartbeatRequest hb = KOLO__HEARTBEAT_REQUEST__INIT;
    hb.session = session;
    hb.wait_ms = 0;
    hb.desired_version = "";
    REQUIRE(call(agent, "AgentService.Heartbeat", &hb.base, &kolo__heartbeat_reply__descriptor,
                 &rep) == 0 &&
            rep);
    char version[64];
    str_copy(version, ((Kolo__HeartbeatReply *)rep)->desired_version, sizeof version);
    protobuf_c_message_free_unpacked(rep, NULL);
    hb.desired_version = version;
    hb.wait_ms = PARK_MS;
    park(agent, "AgentService.Heartbeat", &hb.base, &p[P_HEARTBEAT], "heartbeat", KOLO_ESHUTDOWN);
    Kolo__StreamOutputRequest so = KOLO__STREAM_OUTPUT_REQUEST__INIT;
    so.job_id = nj;
    so.wait_ms = PARK_MS;
    park(admin, "AdminService.StreamOutput", &so.base, &p[P_STREAM], "output stream", KOLO_ESHUTDOWN);
    Kolo__RendezvousRequest asg;
    rendezvous_req(&asg, 2, 1); /* worker 1, rank 0 of the elastic job */
    park(ew, "WorkerService.Rendezvous", &asg.base, &p[P_ASSIGN], "elastic place request", KOLO_EIO);
    park(rw, "WorkerService.Rendezvous", &rdv.base, &p[P_RENDEZVOUS], "rendezvous (waiting)", KOLO_EIO);
    Kolo__NegotiateRequest ng = KOLO__NEGOTIATE_REQUEST__INIT;
    ng.wait_ms = PARK_MS;
    park(nrank[0], "WorkerService.Negotiate", &ng.base, &p[P_NEGOTIATE], "negotiation long poll",
         KOLO_EIO);

    /* HTTP connections a stop must not wait for */
    int hfd[NHTTP];
    for (int i = 0; i < NHTTP; i++)
        hfd[i] = http_connect(coord_http_url(c));
    http_send(hfd[0], "GET /api/v1/hosts HTTP/1.1\r\nHost: x\r\n\r\n"); /* kept alive, idle */
    http_send(hfd[1], "GET /api/v1/jo");                                 /* half a request line */
    http_send(hfd[2], "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n{");
    /* hfd[3]: connected, nothing sent; the rest: responses nobody reads */
    for (int i = 4; i < NHTTP; i++)
        for (int k = 0; k < 40; k++)
            http_send(hfd[i], "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");

    usleep(300 * 1000);
    for (int i = 0; i < P_COUNT; i++) {
        if (atomic_load(&p[i].code) != -1)
            fprintf(stderr, "round %d: the %s was answered (%d) before the stop\n", round,
                    p[i].what, atomic_load(&p[i].code));
        CHECK_EQ_INT(atomic_load(&p[i].code), -1);
    }

    t0 = now_mono_ms();
    coord_stop(c);
    uint64_t took = now_mono_ms() - t0;
    printf("round %d: coord_stop took %llu ms with %d parked calls and %d HTTP connections\n",
           round, (unsigned long long)took, P_COUNT, NHTTP);
    CHECK(took < STOP_BOUND_MS);
    /* every parked call was answered, as a stop, not dropped */
    t0 = now_mono_ms();
    for (int i = 0; i < P_COUNT; i++) {
        while (atomic_load(&p[i].code) == -1 && now_mono_ms() - t0 < 3000)
            usleep(10 * 1000);
        if (atomic_load(&p[i].code) != p[i].want)
            fprintf(stderr, "round %d: the %s ended with %d\n", round, p[i].what,
                    atomic_load(&p[i].code));
        CHECK_EQ_INT(atomic_load(&p[i].code), p[i].want);
    }
    for (int i = 0; i < NHTTP; i++)
        close(hfd[i]);
    rpc_client_close(ew);
    rpc_client_close(rw);
    rpc_client_close(nrank[0]);
    rpc_client_close(nrank[1]);
    rpc_client_close(agent);
    rpc_client_close(admin);
}

int main(void)
{
    char dir[] = "/tmp/kolo-test-stop-XXXXXX";
    REQUIRE(mkdtemp(dir));
    snprintf(dbpath, sizeof dbpath, "%s/x", dir);
    for (int round = 1; round <= ROUNDS; round++)
        round_of_parked_calls(round);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    TEST_DONE();
}
