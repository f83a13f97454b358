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
 *     WorkerService.Rendezvous, then steps of the named allreduces of a
 *     model (default: the 161 ResNet-50 gradients of
 *     bench/resnet50_sizes.txt). Step 0 sends full TensorRequests; later
 *     steps what libkolo sends, by --mode:
 *
 *   per-tensor  libkolo with KOLO_FAST_PATH=0: one WorkerService.Negotiate
 *               call per tensor (the cache id after step 0), each sent once
 *               the previous tensor came back in the log, as the backward
 *               pass hands them over one by one (~161 calls per rank per
 *               step, what /metrics showed for a real ResNet-50 job);
 *   batched     every tensor of a step in one call (the bound the
 *               coordinator path could reach with perfect coalescing);
 *   rounds      libkolo's default: after step 0 the ranks agree among
 *               themselves (readiness rounds over the data plane) and the
 *               coordinator sees only what a real rank sends it: one
 *               long-poll Negotiate parked per rank, and periodically one
 *               WorkerService.Report per rank on a second connection with
 *               the rounds' telemetry (rank 0: one wait sample per round,
 *               --rounds-per-step rounds a step) and that second's step
 *               times, at libkolo's period (worker/runtime/report_rate.h: 500 ms,
 *               longer for ranks > 0 of jobs over 256 ranks). The steps
 *               are paced at --rate steps/s.
 *
 * Step 0 is timed on its own. Then, after all ranks finished it, the timed
 * phase runs --steps steps with every rank going on as soon as its own
 * step completed (no barrier between steps, like a training loop; rounds:
 * --steps / --rate seconds). Reported: steps/s, the coordinator's CPU per
 * step (utime+stime of /proc/PID/stat, given --coord-pid), this
 * generator's own CPU per step, Negotiate and Report RPCs per step. One
 * JSON line on stdout.
 *
 *   coord_load --coordinator tcp://127.0.0.1:PORT [--token-file F]
 *              [--ranks N] [--steps S] [--tensors FILE] [--coord-pid PID]
 *              [--mode per-tensor|batched|rounds] [--rate R]
 *              [--rounds-per-step K] [--no-step-times]
 *
 * The coordinator needs --rpc-contexts above N (every rank's call parks
 * there while it waits for the others), e.g. 4 * N.
 *
 * Build (bench/run.sh does this):
 *   gcc -O2 -Icommon -Iinclude -Iworker/runtime -Ibuild/proto bench/coord_load.c \
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
#include "report_rate.h"
#include "rpc.h"
#include "util.h"

#define MAX_TENSORS   1024
#define CALL_WAIT_MS  30000
#define CALL_TIMEOUT  (CALL_WAIT_MS + 15000)
#define NAME_BUCKETS  4096

enum mode { MODE_PER_TENSOR, MODE_BATCHED, MODE_ROUNDS };

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
    int next;          /* per-tensor: the tensor submitted last */
    int calls;         /* Negotiate calls made */
    struct rpc_client *rep; /* rounds: the report connection */
};

static struct {
    const char *url;
    char *token;
    int nranks;
    int steps;
    enum mode mode;
    double rate;         /* rounds: steps/s */
    int rounds_per_step; /* rounds: readiness rounds a step takes */
    int no_step_times;   /* rounds: reports carry telemetry only */
    atomic_int parked;   /* rounds: the long-polls stop once this is 0 */
    atomic_int reports, report_errors, reports_out;
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
        fprintf(stderr, "coord_load: %s: %s: %s\n", method, abi_errname(rv), err);
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
            fprintf(stderr, "coord_load: heartbeat: %s: %s\n", abi_errname(rv), err);
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

/* Sends req (its requests, if any, filled in) as rank r's next Negotiate,
 * from r's cursor, parked up to CALL_WAIT_MS; done gets the answer. */
static int negotiate_call(struct rank *r, Kolo__NegotiateRequest *req, rpc_done_fn done)
{
    req->cursor = r->cursor;
    req->wait_ms = CALL_WAIT_MS;
    req->reason = "";
    size_t len = kolo__negotiate_request__get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    kolo__negotiate_request__pack(req, buf);
    r->calls++;
    int rv = rpc_client_call_async(r->cli, "WorkerService.Negotiate", buf, len, CALL_TIMEOUT,
                                   done, r);
    free(buf);
    return rv;
}

static void rendezvous_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    struct rank *r = arg;
    if (code == KOLO_ETIMEDOUT || code == KOLO_ECONNREFUSED) { /* late, or never sent */
        rendezvous_send(r);
        return;
    }
    if (code) {
        fail("rank %d: Rendezvous: %s: %s", r->rank, abi_errname(code), err);
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
        fail("rank %d: cannot send Rendezvous (%s)", r->rank, abi_errname(rv));
}

/* The rank finished its step: go on, or stop at the target. */
static void step_finished(struct rank *r)
{
    r->step++;
    r->seen = 0;
    r->next = 0;
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
    if (code == KOLO_ETIMEDOUT || code == KOLO_ECONNREFUSED) { /* late, or never sent */
        negotiate_send(r, false);
        return;
    }
    if (code) {
        fail("rank %d: Negotiate: %s: %s", r->rank, abi_errname(code), err);
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
    if (r->seen == ntensors) {
        step_finished(r);
    } else if (g.mode == MODE_PER_TENSOR && r->got[r->next] && r->step > 0) {
        r->next++; /* the next gradient is handed over */
        negotiate_send(r, true);
    } else {
        negotiate_send(r, false);
    }
}

/* rounds: the one long-poll a rank keeps parked while its cached tensors
 * are agreed by the ranks; it comes back when the log grows or the wait
 * ends, and goes out again until the phase ends. */
static void park_send(struct rank *r);

static void park_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    struct rank *r = arg;
    if (code && code != KOLO_ETIMEDOUT && code != KOLO_ECONNREFUSED) {
        fail("rank %d: long-poll: %s: %s", r->rank, abi_errname(code), err);
        atomic_fetch_sub(&g.parked, 1);
        return;
    }
    Kolo__NegotiateReply *m = code ? NULL : kolo__negotiate_reply__unpack(NULL, len, rep);
    if (m) {
        if (m->next_cursor > r->cursor)
            r->cursor = m->next_cursor;
        kolo__negotiate_reply__free_unpacked(m, NULL);
    }
    pthread_mutex_lock(&g.mu);
    bool again = g.step_target > 0 && !g.failed && r->step <= g.step_target;
    pthread_mutex_unlock(&g.mu);
    if (again)
        park_send(r);
    else
        atomic_fetch_sub(&g.parked, 1);
}

static void park_send(struct rank *r)
{
    Kolo__NegotiateRequest req = KOLO__NEGOTIATE_REQUEST__INIT;
    int rv = negotiate_call(r, &req, park_done);
    if (rv) {
        fail("rank %d: cannot send the long-poll (%s)", r->rank, abi_errname(rv));
        atomic_fetch_sub(&g.parked, 1);
    }
}

static void report_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    (void)rep;
    (void)len;
    struct rank *r = arg;
    if (code) {
        if (atomic_fetch_add(&g.report_errors, 1) == 0)
            fprintf(stderr, "coord_load: rank %d: Report: %s: %s\n", r->rank,
                    abi_errname(code), err);
    }
    atomic_fetch_sub(&g.reports_out, 1);
}

/* rounds: what rank r's report sender sends for one period: the rounds'
 * telemetry (rank 0 carries a wait sample per round) and the step times of
 * the current second, as worker/runtime/report.c does. */
static void report_send(struct rank *r, double period_s, uint32_t *wait_us, uint32_t *wait_ops,
                        size_t nwaits)
{
    double steps = g.rate * period_s;
    Kolo__RoundTelemetry tel = KOLO__ROUND_TELEMETRY__INIT;
    tel.rounds = (uint64_t)(steps * g.rounds_per_step + 0.5);
    tel.agreed = (uint64_t)(steps * ntensors + 0.5);
    tel.wait_avg_s = 0.0005 + 0.0001 * (r->rank % 7);
    if (r->rank == 0) {
        tel.wait_us = wait_us;
        tel.n_wait_us = nwaits;
        tel.wait_ops = wait_ops;
        tel.n_wait_ops = nwaits;
    }
    Kolo__StepSample st = KOLO__STEP_SAMPLE__INIT, *stp = &st;
    st.ts_ms = now_wall_ms() / 1000 * 1000;
    st.seconds = 1.0 / g.rate;
    st.count = (uint32_t)(steps > 1 ? steps : 1);
    Kolo__WorkerReportRequest req = KOLO__WORKER_REPORT_REQUEST__INIT;
    req.rounds = &tel;
    if (!g.no_step_times) {
        req.steps = &stp;
        req.n_steps = 1;
    }
    size_t len = kolo__worker_report_request__get_packed_size(&req);
    uint8_t *buf = malloc(len + 1);
    kolo__worker_report_request__pack(&req, buf);
    atomic_fetch_add(&g.reports_out, 1);
    atomic_fetch_add(&g.reports, 1);
    int rv = rpc_client_call_async(r->rep, "WorkerService.Report", buf, len, 10000, report_done, r);
    free(buf);
    if (rv) {
        atomic_fetch_sub(&g.reports_out, 1);
        fail("rank %d: cannot send a Report (%s)", r->rank, abi_errname(rv));
    }
}

/* rounds: the timed phase. The ranks' steps happen on the data plane; here
 * only the clock runs, and each rank reports at the period libkolo's
 * sender uses (worker/runtime/report_rate.h), spread over it as report.c starts
 * them. */
static void rounds_phase(void)
{
    double p0 = report_period_ms(0, g.nranks) / 1000.0;
    size_t nwaits = (size_t)(g.rate * p0 * g.rounds_per_step + 0.5);
    uint32_t *wait_us = calloc(nwaits ? nwaits : 1, sizeof(uint32_t));
    uint32_t *wait_ops = calloc(nwaits ? nwaits : 1, sizeof(uint32_t));
    double *due = calloc((size_t)g.nranks, sizeof(double));
    for (size_t i = 0; i < nwaits; i++) {
        wait_us[i] = 200 + (uint32_t)(i * 37 % 800);
        wait_ops[i] = (uint32_t)(ntensors / g.rounds_per_step);
    }
    double t0 = now_s(), end = t0 + g.steps / g.rate;
    for (int i = 0; i < g.nranks; i++)
        due[i] = t0 + report_period_ms(i, g.nranks) / 1000.0 * (i % 64) / 64.0;
    while (!g.failed) {
        double now = now_s();
        if (now >= end)
            break;
        for (int i = 0; i < g.nranks; i++) {
            if (now < due[i])
                continue;
            double period = report_period_ms(i, g.nranks) / 1000.0;
            report_send(&g.ranks[i], period, wait_us, wait_ops, nwaits);
            due[i] += period;
        }
        usleep(1000);
    }
    for (int i = 0; i < g.nranks; i++)
        g.ranks[i].step = g.steps + 1; /* the phase ended: the long-polls stop */
    free(due);
    free(wait_us);
    free(wait_ops);
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
        /* per-tensor: one tensor a call (all of step 0's at once, as the
         * first-time tensors are in libkolo's first coalesced call) */
        int lo = 0, hi = ntensors;
        if (g.mode == MODE_PER_TENSOR && r->step > 0) {
            lo = r->next;
            hi = r->next + 1;
        }
        for (int t = lo; t < hi; t++) {
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
    int rv = negotiate_call(r, &req, negotiate_done);
    free(reqs);
    free(ptrs);
    free(cached);
    free(shapes);
    if (rv)
        fail("rank %d: cannot send Negotiate (%s)", r->rank, abi_errname(rv));
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
                    "[--steps S] [--tensors FILE] [--coord-pid PID] "
                    "[--mode per-tensor|batched|rounds] [--rate R] [--rounds-per-step K] [--no-step-times]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *token_file = NULL, *tensor_file = "bench/resnet50_sizes.txt";
    int coord_pid = 0;
    g.nranks = 64;
    g.steps = 50;
    g.mode = MODE_ROUNDS;
    g.rate = 100;
    g.rounds_per_step = 10;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc && strcmp(argv[i], "--no-step-times") != 0)
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
        else if (strcmp(argv[i], "--mode") == 0) {
            const char *m = argv[++i];
            if (strcmp(m, "per-tensor") == 0)
                g.mode = MODE_PER_TENSOR;
            else if (strcmp(m, "batched") == 0)
                g.mode = MODE_BATCHED;
            else if (strcmp(m, "rounds") == 0)
                g.mode = MODE_ROUNDS;
            else
                usage();
        } else if (strcmp(argv[i], "--rate") == 0)
            g.rate = atof(argv[++i]);
        else if (strcmp(argv[i], "--rounds-per-step") == 0)
            g.rounds_per_step = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-step-times") == 0)
            g.no_step_times = 1;
        else
            usage();
    }
    if (!g.url || g.nranks < 1 || g.steps < 1 || g.rate <= 0 || g.rounds_per_step < 1)
        usage();
    /* two connections a rank (negotiation and reports), like libkolo */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
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
        if (rpc_client_open(&r->cli, &wc) ||
            (g.mode == MODE_ROUNDS && rpc_client_open(&r->rep, &wc))) {
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
    int reports = 0;
    if (!rc && !g.failed) {
        pthread_mutex_lock(&g.mu);
        g.step_target = g.steps;
        g.done_count = 0;
        pthread_mutex_unlock(&g.mu);
        if (g.mode == MODE_ROUNDS) {
            /* Steps 1..S on the data plane: the coordinator sees the
             * long-polls and the reports only. */
            atomic_store(&g.parked, g.nranks);
            for (int i = 0; i < g.nranks; i++)
                park_send(&g.ranks[i]);
            rounds_phase();
            calls2 -= g.nranks; /* the long-polls parked before the phase */
        } else {
            /* Steps 1..S: by cache id, no barrier between steps. */
            for (int i = 0; i < g.nranks; i++)
                negotiate_send(&g.ranks[i], true);
            rc = wait_ranks(600);
        }
        t2 = now_s();
        c2 = proc_cpu_s(coord_pid);
        s2 = self_cpu_s();
        for (int i = 0; i < g.nranks; i++)
            calls2 += g.ranks[i].calls;
        calls2 -= calls1;
        reports = atomic_load(&g.reports);
        for (int i = 0; i < 200 && atomic_load(&g.reports_out) > 0; i++)
            usleep(10000);
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
        static const char *const names[] = {"per-tensor", "batched", "rounds"};
        printf("{\"impl\":\"kolo\",\"kind\":\"coord_load\",\"mode\":\"%s\",\"ranks\":%d,"
               "\"tensors\":%d,\"steps\":%d,\"rendezvous_ms\":%.1f,\"first_step_ms\":%.2f,"
               "\"step_ms\":%.3f,\"steps_per_s\":%.1f,\"coord_cpu_ms_per_step\":%.3f,"
               "\"client_cpu_ms_per_step\":%.3f,\"negotiate_calls_per_step\":%.2f,"
               "\"report_calls_per_step\":%.2f,\"report_errors\":%d,"
               "\"first_step_coord_cpu_ms\":%.2f,\"all_cached\":%s}\n",
               names[g.mode], g.nranks, ntensors, g.steps, (t_rdv - t_open) * 1e3,
               (t1 - t0) * 1e3, dt * 1e3 / g.steps, g.steps / dt,
               coord_pid > 0 ? (c2 - c1) * 1e3 / g.steps : -1.0, (s2 - s1) * 1e3 / g.steps,
               (double)calls2 / g.steps, (double)reports / g.steps,
               atomic_load(&g.report_errors), (c1 - c0) * 1e3, cached_ok ? "true" : "false");
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
        if (g.ranks[i].rep)
            rpc_client_close(g.ranks[i].rep);
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
