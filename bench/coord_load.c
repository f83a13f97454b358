/*
 * coord_load.c - coordinator capacity: how many negotiated training steps
 * per second one `kolo coordinator` sustains for a job of N ranks.
 *
 * A client of a running coordinator (over its RPC listener), it plays:
 *   - one fake agent: AgentService.RegisterHost with N slots, then a
 *     heartbeat every second so the host keeps its lease;
 *   - one submitter: AdminService.SubmitJob of N ranks on that host (the
 *     job is placed and running at once; no process is ever started);
 *   - N workers, one RPC client (one connection) each, with the job /
 *     generation / rank identity in every frame, as libkolo sends it:
 *     WorkerService.Rendezvous, then steps. In each step every rank submits
 *     the named allreduces of a model (default: the 161 ResNet-50 gradients
 *     of bench/resnet50_sizes.txt) in one WorkerService.Negotiate call and
 *     reads the response log until every name came back. Step 0 sends full
 *     TensorRequests; later steps send only the cache ids the responses
 *     carried (NegotiateRequest.cached), as libkolo does.
 *
 * Step 0 is timed on its own. Then, after all ranks finished it, the timed
 * phase runs --steps steps with every rank going on as soon as its own
 * step completed (no barrier between steps, like a training loop).
 * Reported: steps/s, the coordinator's CPU per step (utime+stime of
 * /proc/PID/stat, given --coord-pid), this generator's own CPU per step,
 * and Negotiate RPCs per step. One JSON line on stdout.
 *
 *   coord_load --coordinator tcp://127.0.0.1:PORT [--token-file F]
 *              [--ranks N] [--steps S] [--tensors FILE] [--coord-pid PID]
 *
 * The coordinator needs --rpc-contexts above N (every rank's call parks
 * there while it waits for the others), e.g. 4 * N.
 *
 * Build (bench/run.sh does this):
 *   gcc -O2 -Icommon -Iinclude -Ibuild/proto bench/coord_load.c \
 *       build/common/libkolo_common.a build/libkolo_proto.a \
 *       -lnng -lprotobuf-c -lpthread -o coord_load
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "util.h"

#define MAX_TENSORS   1024
#define CALL_WAIT_MS  30000
#define CALL_TIMEOUT  (CALL_WAIT_MS + 15000)
#define NAME_BUCKETS  4096

struct tensor {
    char name[96];
    int64_t count;
    int next; /* hash chain */
};

static struct tensor tensors[MAX_TENSORS];
static int ntensors;
static int name_hash[NAME_BUCKETS];

struct rank {
    int rank;
    struct rpc_client *cli;
    uint64_t cursor;
    int step;          /* the step in progress */
    int seen;          /* names of this step already in the log */
    uint32_t *cache;   /* [ntensors] cache id per tensor, 0: unknown */
    uint8_t *got;      /* [ntensors] seen in this step */
    int calls;         /* Negotiate calls made */
};

static struct {
    const char *url;
    char *token;
    int nranks;
    int steps;
    uint64_t job_id, generation;
    char host_id[64], host_name[64], session[64], desired_version[128];
    struct rank *ranks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int step_target;   /* ranks run steps up to this one (inclusive) */
    int done_count;    /* ranks that reached step_target */
    int rdv_done;
    int failed;
    char fail_msg[512];
    atomic_int stop_hb;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&g.mu);
    if (!g.failed) {
        g.failed = 1;
        va_start(ap, fmt);
        vsnprintf(g.fail_msg, sizeof(g.fail_msg), fmt, ap);
        va_end(ap);
    }
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

static uint32_t hash_str(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h % NAME_BUCKETS;
}

static int tensor_index(const char *name)
{
    for (int i = name_hash[hash_str(name)]; i >= 0; i = tensors[i].next)
        if (strcmp(tensors[i].name, name) == 0)
            return i;
    return -1;
}

static void load_tensors(const char *path)
{
    for (int i = 0; i < NAME_BUCKETS; i++)
        name_hash[i] = -1;
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        exit(1);
    }
    while (ntensors < MAX_TENSORS &&
           fscanf(f, "%95s %lld", tensors[ntensors].name, (long long *)&tensors[ntensors].count) ==
               2) {
        uint32_t h = hash_str(tensors[ntensors].name);
        tensors[ntensors].next = name_hash[h];
        name_hash[h] = ntensors;
        ntensors++;
    }
    fclose(f);
    if (ntensors == 0) {
        fprintf(stderr, "%s: no tensors\n", path);
        exit(1);
    }
}

/* A synchronous call with protobuf in and out; exits on failure. */
static ProtobufCMessage *call_pb(struct rpc_client *cli, const char *method,
                                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(req, buf);
    void *out = NULL;
    size_t olen = 0;
    char err[512];
    int rv = rpc_client_call(cli, method, buf, len, &out, &olen, 10000, err, sizeof(err));
    free(buf);
    if (rv) {
        fprintf(stderr, "coord_load: %s: %s: %s\n", method, kolo_errname(rv), err);
        exit(1);
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(rd, NULL, olen, out);
    free(out);
    if (!m) {
        fprintf(stderr, "coord_load: malformed %s reply\n", method);
        exit(1);
    }
    return m;
}

/* ---------------------------------------------------------------- fake agent */

static void *heartbeat_main(void *arg)
{
    struct rpc_client *cli = arg;
    while (!atomic_load(&g.stop_hb)) {
        for (int i = 0; i < 10 && !atomic_load(&g.stop_hb); i++)
            usleep(100000);
        if (atomic_load(&g.stop_hb))
            break;
        Kolo__HeartbeatRequest req = KOLO__HEARTBEAT_REQUEST__INIT;
        req.session = g.session;
        req.desired_version = g.desired_version;
        req.wait_ms = 0;
        size_t len = kolo__heartbeat_request__get_packed_size(&req);
        uint8_t *buf = malloc(len + 1);
        kolo__heartbeat_request__pack(&req, buf);
        void *out = NULL;
        size_t olen = 0;
        char err[256];
        int rv = rpc_client_call(cli, "AgentService.Heartbeat", buf, len, &out, &olen, 5000, err,
                                 sizeof(err));
        free(buf);
        if (rv) {
            fprintf(stderr, "coord_load: heartbeat: %s: %s\n", kolo_errname(rv), err);
            continue;
        }
        Kolo__HeartbeatReply *rep = kolo__heartbeat_reply__unpack(NULL, olen, out);
        if (rep) {
            str_copy(g.desired_version, rep->desired_version, sizeof(g.desired_version));
            kolo__heartbeat_reply__free_unpacked(rep, NULL);
        }
        free(out);
    }
    return NULL;
}

/* ---------------------------------------------------------------- workers */

static void rendezvous_send(struct rank *r);
static void negotiate_send(struct rank *r, bool submit);

static void rendezvous_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    struct rank *r = arg;
    if (code == KOLO_ETIMEDOUT) {
        rendezvous_send(r);
        return;
    }
    if (code) {
        fail("rank %d: Rendezvous: %s: %s", r->rank, kolo_errname(code), err);
        return;
    }
    Kolo__RendezvousReply *m = kolo__rendezvous_reply__unpack(NULL, len, rep);
    if (!m) {
        fail("rank %d: malformed RendezvousReply", r->rank);
        return;
    }
    bool complete = m->complete;
    kolo__rendezvous_reply__free_unpacked(m, NULL);
    if (!complete) {
        rendezvous_send(r);
        return;
    }
    pthread_mutex_lock(&g.mu);
    g.rdv_done++;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

static void rendezvous_send(struct rank *r)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "tcp:127.0.0.1:%d", 20000 + r->rank);
    char *addrs[1] = {addr};
    Kolo__RendezvousRequest req = KOLO__RENDEZVOUS_REQUEST__INIT;
    req.host_id = g.host_id;
    req.data_addrs = addrs;
    req.n_data_addrs = 1;
    req.pid = 100000 + r->rank;
    req.shm_name = (char *)(r->rank == 0 ? "/kolo-bench-load" : "");
    req.wait_ms = CALL_WAIT_MS;
    req.size = g.nranks;
    size_t len = kolo__rendezvous_request__get_packed_size(&req);
    uint8_t *buf = malloc(len + 1);
    kolo__rendezvous_request__pack(&req, buf);
    int rv = rpc_client_call_async(r->cli, "WorkerService.Rendezvous", buf, len, CALL_TIMEOUT,
                                   rendezvous_done, r);
    free(buf);
    if (rv)
        fail("rank %d: cannot send Rendezvous (%s)", r->rank, kolo_errname(rv));
}

/* The rank finished its step: go on, or stop at the target. */
static void step_finished(struct rank *r)
{
    r->step++;
    r->seen = 0;
    memset(r->got, 0, (size_t)ntensors);
    pthread_mutex_lock(&g.mu);
    bool go = r->step <= g.step_target && !g.failed;
    if (!go) {
        g.done_count++;
        pthread_cond_broadcast(&g.cv);
    }
    pthread_mutex_unlock(&g.mu);
    if (go)
        negotiate_send(r, true);
}

static void negotiate_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    struct rank *r = arg;
    if (code == KOLO_ETIMEDOUT) {
        negotiate_send(r, false);
        return;
    }
    if (code) {
        fail("rank %d: Negotiate: %s: %s", r->rank, kolo_errname(code), err);
        return;
    }
    Kolo__NegotiateReply *m = kolo__negotiate_reply__unpack(NULL, len, rep);
    if (!m) {
        fail("rank %d: malformed NegotiateReply", r->rank);
        return;
    }
    for (size_t i = 0; i < m->n_responses; i++) {
        Kolo__Response *x = m->responses[i];
        if (x->index < r->cursor)
            continue;
        if (x->error_code || x->shutdown) {
            fail("rank %d: response %llu: error %d: %s", r->rank, (unsigned long long)x->index,
                 x->error_code, x->error);
            kolo__negotiate_reply__free_unpacked(m, NULL);
            return;
        }
        for (size_t k = 0; k < x->n_names; k++) {
            int t = tensor_index(x->names[k]);
            if (t < 0 || r->got[t])
                continue;
            r->got[t] = 1;
            r->seen++;
            if (k < x->n_cache_ids && x->cache_ids[k])
                r->cache[t] = x->cache_ids[k];
        }
    }
    if (m->next_cursor > r->cursor)
        r->cursor = m->next_cursor;
    kolo__negotiate_reply__free_unpacked(m, NULL);
    if (r->seen == ntensors)
        step_finished(r);
    else
        negotiate_send(r, false);
}

/* One Negotiate call: with this step's requests (submit) or a poll. */
static void negotiate_send(struct rank *r, bool submit)
{
    Kolo__TensorRequest *reqs = NULL, **ptrs = NULL;
    uint32_t *cached = NULL;
    size_t nr = 0, nc = 0;
    int64_t *shapes = NULL;
    Kolo__NegotiateRequest req = KOLO__NEGOTIATE_REQUEST__INIT;
    if (submit) {
        reqs = calloc((size_t)ntensors, sizeof(*reqs));
        ptrs = calloc((size_t)ntensors, sizeof(*ptrs));
        cached = calloc((size_t)ntensors, sizeof(*cached));
        shapes = calloc((size_t)ntensors, sizeof(*shapes));
        for (int t = 0; t < ntensors; t++) {
            if (r->cache[t]) {
                cached[nc++] = r->cache[t];
                continue;
            }
            Kolo__TensorRequest *q = &reqs[nr];
            kolo__tensor_request__init(q);
            q->name = tensors[t].name;
            q->coll = KOLO_COLL_ALLREDUCE;
            q->dtype = KOLO_FLOAT32;
            q->op = KOLO_SUM;
            shapes[t] = tensors[t].count;
            q->shape = &shapes[t];
            q->n_shape = 1;
            q->prescale = 1.0;
            q->postscale = 1.0;
            q->device = -1;
            ptrs[nr++] = q;
        }
        req.requests = ptrs;
        req.n_requests = nr;
        req.cached = cached;
        req.n_cached = nc;
    }
    req.cursor = r->cursor;
    req.wait_ms = CALL_WAIT_MS;
    req.reason = "";
    size_t len = kolo__negotiate_request__get_packed_size(&req);
    uint8_t *buf = malloc(len + 1);
    kolo__negotiate_request__pack(&req, buf);
    free(reqs);
    free(ptrs);
    free(cached);
    free(shapes);
    r->calls++;
    int rv = rpc_client_call_async(r->cli, "WorkerService.Negotiate", buf, len, CALL_TIMEOUT,
                                   negotiate_done, r);
    free(buf);
    if (rv)
        fail("rank %d: cannot send Negotiate (%s)", r->rank, kolo_errname(rv));
}

/* ---------------------------------------------------------------- main */

static double proc_cpu_s(int pid)
{
    if (pid <= 0)
        return 0;
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the name may hold spaces */
    if (!p)
        return 0;
    unsigned long long ut = 0, st = 0;
    /* after ") ": state(3) ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* Waits until every rank reached the current target (or a failure). */
static int wait_ranks(double timeout_s)
{
    double deadline = now_s() + timeout_s;
    pthread_mutex_lock(&g.mu);
    while (g.done_count < g.nranks && !g.failed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&g.cv, &g.mu, &ts);
        if (now_s() > deadline) {
            pthread_mutex_unlock(&g.mu);
            fail("timed out: %d of %d ranks finished", g.done_count, g.nranks);
            return -1;
        }
    }
    int rv = g.failed ? -1 : 0;
    pthread_mutex_unlock(&g.mu);
    return rv;
}

static void usage(void)
{
    fprintf(stderr, "usage: coord_load --coordinator URL [--token-file F] [--ranks N] "
                    "[--steps S] [--tensors FILE] [--coord-pid PID]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *token_file = NULL, *tensor_file = "bench/resnet50_sizes.txt";
    int coord_pid = 0;
    g.nranks = 64;
    g.steps = 50;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        if (strcmp(argv[i], "--coordinator") == 0)
            g.url = argv[++i];
        else if (strcmp(argv[i], "--token-file") == 0)
            token_file = argv[++i];
        else if (strcmp(argv[i], "--ranks") == 0)
            g.nranks = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0)
            g.steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--tensors") == 0)
            tensor_file = argv[++i];
        else if (strcmp(argv[i], "--coord-pid") == 0)
            coord_pid = atoi(argv[++i]);
        else
            usage();
    }
    if (!g.url || g.nranks < 1 || g.steps < 1)
        usage();
    if (token_file) {
        char err[256];
        if (read_token_file(token_file, &g.token, err, sizeof(err)) != 0) {
            fprintf(stderr, "coord_load: %s\n", err);
            return 1;
        }
    }
    load_tensors(tensor_file);

    /* The fake host. */
    char inst[40];
    random_hex(inst, 8);
    snprintf(g.host_id, sizeof(g.host_id), "benchload-%s", inst);
    snprintf(g.host_name, sizeof(g.host_name), "benchload-%s", inst);
    struct rpc_client *agent, *hb, *admin;
    struct rpc_client_config cc = {.url = g.url, .token = g.token, .identity = g.host_id};
    if (rpc_client_open(&agent, &cc) || rpc_client_open(&hb, &cc)) {
        fprintf(stderr, "coord_load: cannot open a client for %s\n", g.url);
        return 1;
    }
    Kolo__HostInventory inv = KOLO__HOST_INVENTORY__INIT;
    inv.cpus = g.nranks;
    Kolo__RegisterRequest rr = KOLO__REGISTER_REQUEST__INIT;
    rr.host_id = g.host_id;
    rr.hostname = g.host_name;
    rr.name = g.host_name;
    rr.addr = "127.0.0.1";
    rr.slots = g.nranks;
    rr.inventory = &inv;
    rr.agent_version = "coord_load";
    rr.agent_instance = inst;
    Kolo__RegisterReply *reg = (Kolo__RegisterReply *)call_pb(
        agent, "AgentService.RegisterHost", &rr.base, &kolo__register_reply__descriptor);
    str_copy(g.session, reg->session, sizeof(g.session));
    kolo__register_reply__free_unpacked(reg, NULL);
    pthread_t hb_thread;
    pthread_create(&hb_thread, NULL, heartbeat_main, hb);

    /* The job. */
    struct rpc_client_config ac = {.url = g.url, .token = g.token, .identity = "kolo-bench-load"};
    if (rpc_client_open(&admin, &ac)) {
        fprintf(stderr, "coord_load: cannot open a client for %s\n", g.url);
        return 1;
    }
    char hosts[128];
    snprintf(hosts, sizeof(hosts), "%s:%d", g.host_name, g.nranks);
    char *job_argv[1] = {"/bin/true"};
    Kolo__SubmitJobRequest sj = KOLO__SUBMIT_JOB_REQUEST__INIT;
    sj.argv = job_argv;
    sj.n_argv = 1;
    sj.cwd = "/";
    sj.np = g.nranks;
    sj.hosts = hosts;
    sj.name = "coord-load";
    sj.start_timeout_ms = 10000;
    Kolo__SubmitJobReply *sr = (Kolo__SubmitJobReply *)call_pb(
        admin, "AdminService.SubmitJob", &sj.base, &kolo__submit_job_reply__descriptor);
    g.job_id = sr->job_id;
    kolo__submit_job_reply__free_unpacked(sr, NULL);
    for (int tries = 0;; tries++) {
        Kolo__GetJobRequest gj = KOLO__GET_JOB_REQUEST__INIT;
        gj.job_id = g.job_id;
        Kolo__JobInfo *ji = (Kolo__JobInfo *)call_pb(admin, "AdminService.GetJob", &gj.base,
                                                     &kolo__job_info__descriptor);
        bool running = strcmp(ji->state, "running") == 0;
        g.generation = ji->generation;
        if (!running && (strcmp(ji->state, "pending") != 0 || tries > 100)) {
            fprintf(stderr, "coord_load: job %llu is %s: %s\n", (unsigned long long)g.job_id,
                    ji->state, ji->reason);
            return 1;
        }
        kolo__job_info__free_unpacked(ji, NULL);
        if (running)
            break;
        usleep(100000);
    }

    /* The workers. */
    g.ranks = calloc((size_t)g.nranks, sizeof(*g.ranks));
    double t_open = now_s();
    for (int i = 0; i < g.nranks; i++) {
        struct rank *r = &g.ranks[i];
        r->rank = i;
        r->cache = calloc((size_t)ntensors, sizeof(uint32_t));
        r->got = calloc((size_t)ntensors, 1);
        struct rpc_client_config wc = {.url = g.url,
                                       .token = g.token,
                                       .identity = g.host_id,
                                       .job_id = g.job_id,
                                       .generation = g.generation,
                                       .rank = i};
        if (rpc_client_open(&r->cli, &wc)) {
            fprintf(stderr, "coord_load: cannot open client %d\n", i);
            return 1;
        }
    }
    for (int i = 0; i < g.nranks; i++)
        rendezvous_send(&g.ranks[i]);
    pthread_mutex_lock(&g.mu);
    while (g.rdv_done < g.nranks && !g.failed)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    double t_rdv = now_s();
    int rc = 0;
    double t0 = 0, t1 = 0, t2 = 0, c0 = 0, c1 = 0, c2 = 0, s1 = 0, s2 = 0;
    int calls1 = 0, calls2 = 0;
    if (!g.failed) {
        /* Step 0: full requests. */
        g.step_target = 0;
        g.done_count = 0;
        c0 = proc_cpu_s(coord_pid);
        t0 = now_s();
        for (int i = 0; i < g.nranks; i++)
            negotiate_send(&g.ranks[i], true);
        rc = wait_ranks(120);
        t1 = now_s();
        c1 = proc_cpu_s(coord_pid);
        s1 = self_cpu_s();
        for (int i = 0; i < g.nranks; i++)
            calls1 += g.ranks[i].calls;
    }
    if (!rc && !g.failed) {
        /* Steps 1..S: by cache id, no barrier between steps. */
        pthread_mutex_lock(&g.mu);
        g.step_target = g.steps;
        g.done_count = 0;
        pthread_mutex_unlock(&g.mu);
        for (int i = 0; i < g.nranks; i++)
            negotiate_send(&g.ranks[i], true);
        rc = wait_ranks(600);
        t2 = now_s();
        c2 = proc_cpu_s(coord_pid);
        s2 = self_cpu_s();
        for (int i = 0; i < g.nranks; i++)
            calls2 += g.ranks[i].calls;
        calls2 -= calls1;
    }
    int cached_ok = 1;
    for (int i = 0; i < g.nranks && cached_ok; i++)
        for (int t = 0; t < ntensors; t++)
            if (!g.ranks[i].cache[t])
                cached_ok = 0;

    if (g.failed || rc) {
        fprintf(stderr, "coord_load: %s\n", g.fail_msg);
        rc = 1;
    } else {
        double dt = t2 - t1;
        printf("{\"impl\":\"kolo\",\"kind\":\"coord_load\",\"ranks\":%d,\"tensors\":%d,"
               "\"steps\":%d,\"rendezvous_ms\":%.1f,\"first_step_ms\":%.2f,"
               "\"step_ms\":%.3f,\"steps_per_s\":%.1f,\"coord_cpu_ms_per_step\":%.3f,"
               "\"client_cpu_ms_per_step\":%.3f,\"negotiate_calls_per_step\":%.1f,"
               "\"first_step_coord_cpu_ms\":%.2f,\"all_cached\":%s}\n",
               g.nranks, ntensors, g.steps, (t_rdv - t_open) * 1e3, (t1 - t0) * 1e3,
               dt * 1e3 / g.steps, g.steps / dt,
               coord_pid > 0 ? (c2 - c1) * 1e3 / g.steps : -1.0, (s2 - s1) * 1e3 / g.steps,
               (double)calls2 / g.steps, (c1 - c0) * 1e3, cached_ok ? "true" : "false");
        fflush(stdout);
    }

    /* Leave: every rank says shutdown (so the job ends cleanly), then stop it. */
    Kolo__StopJobRequest st = KOLO__STOP_JOB_REQUEST__INIT;
    st.job_id = g.job_id;
    st.reason = "coord_load finished";
    size_t len = kolo__stop_job_request__get_packed_size(&st);
    uint8_t *buf = malloc(len + 1);
    kolo__stop_job_request__pack(&st, buf);
    void *out = NULL;
    size_t olen = 0;
    char err[256];
    rpc_client_call(admin, "AdminService.StopJob", buf, len, &out, &olen, 5000, err, sizeof(err));
    free(buf);
    free(out);
    for (int i = 0; i < g.nranks; i++) {
        rpc_client_close(g.ranks[i].cli);
        free(g.ranks[i].cache);
        free(g.ranks[i].got);
    }
    free(g.ranks);
    atomic_store(&g.stop_hb, 1);
    pthread_join(hb_thread, NULL);
    rpc_client_close(admin);
    rpc_client_close(hb);
    rpc_client_close(agent);
    free(g.token);
    return rc;
}
