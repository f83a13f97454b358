/*
 * link.c - the agent's connection to the coordinator, on two threads that
 * use the blocking RPC client (so nothing here ever runs on the loop).
 *
 * DESIGN. The link thread registers the host and then heartbeats in a
 * loop. A heartbeat is a long poll: the coordinator parks it until this
 * host's desired set changes or wait_ms passes, so a new worker set
 * arrives within one round trip while an idle host costs one call per
 * wait. The link thread has its own RPC client, which link_stop shuts
 * down, so a parked heartbeat ends at once when the agent stops while
 * the report thread can still flush on the other client.
 *
 * Failures are sorted in three kinds:
 *   - the session is unknown (ESTALE / ENOTFOUND: the coordinator
 *     restarted or expired our lease): register again at once, listing
 *     the workers still running so the coordinator can re-attach them, and
 *     ask for the desired set afresh (its versions began anew);
 *   - the coordinator refuses this agent (EAUTH / EVERSION, or EEXIST for
 *     a host id another live agent holds): an operator
 *     must act, so say so clearly once and retry slowly;
 *   - anything else (no connection, timeouts, a coordinator shutting
 *     down): retry with exponential backoff and jitter, probing with
 *     wait_ms = 0 so a coordinator that comes back is noticed fast.
 * Each kind is logged once when it starts and once when it ends.
 *
 * Partitions shorter than the lease (issue 28). The coordinator renews
 * the lease when a heartbeat arrives, so what a cut of length c costs is
 * the time between two arrivals plus the time the agent needs, once the
 * network is back, to get a heartbeat through. Two things bounded that
 * badly: a 1 s park, and a heartbeat caught in a cut waited 5 s on a
 * connection whose TCP retransmission backoff (0.2, 0.6, 1.4, 3 s ...)
 * could outlast the lease even after the network healed: 2 s of a 3 s
 * lease lost the host. Now, with L the lease the coordinator gave:
 *   - the park is at most L/10 (LINK_PARK_LEASE_DIV), so arrivals are at
 *     most P = L/10 + a round trip apart;
 *   - a parked heartbeat is abandoned L/8 (at least 250 ms) after its
 *     park should have ended; every retry goes out on a fresh connection
 *     (redial), never behind the old one's backoff, and is itself
 *     abandoned after R = L/16 (at least 250 ms: a connection, a request
 *     and its answer on a slow coordinator);
 *   - while the lease may still be alive, retries follow each other
 *     without backoff (at least LINK_BACKOFF_MIN_MS apart), so a retry
 *     dials within R of the heal.
 * The worst case is a cut that starts just after the last arrival (the
 * answer or the next request is lost): the host is kept while
 * P + c + R < L, for cuts c up to L - L/10 - max(L/16, 250 ms): 2.45 s
 * of a 3 s lease (0.82 L), so a 2 s cut has 0.45 s to spare, and 4.2 s
 * of the default 5 s. Past the lease the backoff grows to
 * LINK_BACKOFF_MAX_MS as before. The cost is heartbeats: about 10 per
 * lease per idle host (2 per second at the default 5 s lease).
 *
 * The report thread drains the outbound queue (outbox.c) with Report
 * calls: at most one per AGENT_REPORT_PACE_MS unless a full batch waits.
 * A batch is retried until the coordinator accepts it, under whatever
 * session is current, so events survive a coordinator restart. On stop it
 * keeps flushing for LINK_STOP_FLUSH_MS at most.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_int.h"
#include "errors.h"
#include "log.h"
#include "rpc.h"
#include "util.h"

#ifndef KOLO_VERSION
#define KOLO_VERSION "0"
#endif

#define LINK_PARK_MAX_MS         1000 /* heartbeat wait until the coordinator names one */
#define LINK_LEASE_DEFAULT_MS    5000 /* until the coordinator names its lease */
#define LINK_PARK_LEASE_DIV      10   /* park at most lease/10 */
#define LINK_SLACK_LEASE_DIV     8    /* abandon a parked heartbeat lease/8 after its park */
#define LINK_RETRY_LEASE_DIV     16   /* abandon a retry after lease/16 */
#define LINK_SLACK_MIN_MS        250
#define LINK_SLACK_MAX_MS        5000
#define LINK_REGISTER_TIMEOUT_MS 3000
#define LINK_BACKOFF_MIN_MS      100
#define LINK_BACKOFF_MAX_MS      5000
#define LINK_REFUSED_RETRY_MS    10000
#define LINK_REPORT_TIMEOUT_MS   5000
#define LINK_STOP_FLUSH_MS       2000

#define NO_GEN UINT64_MAX

/* Caller holds a->mu. Waits at most ms (spurious wake-ups included). */
static void wait_ms(struct agent *a, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&a->cond, &a->mu, &ts);
}

static bool stopping(struct agent *a)
{
    pthread_mutex_lock(&a->mu);
    bool s = a->link_stopping;
    pthread_mutex_unlock(&a->mu);
    return s;
}

/* link_sleep sleeps ms, or less if the link is stopped. */
static void link_sleep(struct agent *a, uint64_t ms)
{
    uint64_t until = now_mono_ms() + ms;
    pthread_mutex_lock(&a->mu);
    for (uint64_t now; !a->link_stopping && (now = now_mono_ms()) < until;)
        wait_ms(a, until - now);
    pthread_mutex_unlock(&a->mu);
}

/* jitter: a delay in [d/2, d], so agents that lost the coordinator together
 * do not come back in lockstep. */
static uint64_t jitter(uint64_t d)
{
    uint32_t r = 0;
    random_bytes(&r, sizeof(r));
    return d / 2 + (d / 2 ? r % (d / 2 + 1) : 0);
}

static bool session_unknown(int rc)
{
    return rc == KOLO_ESTALE || rc == KOLO_ENOTFOUND;
}

/* The coordinator will not take this agent until an operator acts: a wrong
 * token, another protocol version, or this host id in use by another live
 * agent (two agents sharing a state directory). */
static bool refused(int rc)
{
    return rc == KOLO_EAUTH || rc == KOLO_EVERSION || rc == KOLO_EEXIST;
}

/* ---------------------------------------------------------------- register */

static int do_register(struct agent *a, char *session, size_t slen, uint32_t *hb_ms,
                       uint32_t *lease_ms, char *err, size_t errlen)
{
    Kolo__RegisterRequest req = KOLO__REGISTER_REQUEST__INIT;
    Kolo__HostInventory inv = KOLO__HOST_INVENTORY__INIT;
    Kolo__RunningWorker *running = NULL, **ptrs = NULL;
    size_t n = 0;
    int rc;

    pthread_mutex_lock(&a->mu);
    if (a->n_running) {
        running = malloc(a->n_running * sizeof(*running));
        ptrs = malloc(a->n_running * sizeof(*ptrs));
        if (running && ptrs) {
            n = a->n_running;
            memcpy(running, a->running, n * sizeof(*running));
        }
    }
    pthread_mutex_unlock(&a->mu);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &running[i];

    inv.cpus = a->inv.cpus;
    inv.gpus = a->inv.gpus;
    inv.n_gpu_names = a->inv.n_gpu_names;
    inv.gpu_names = a->inv.gpu_names;
    inv.mem_bytes = a->inv.mem_bytes;
    req.host_id = a->host_id;
    req.hostname = a->hostname;
    req.name = a->name;
    req.addr = a->addr;
    req.slots = a->slots;
    req.inventory = &inv;
    req.n_running = n;
    req.running = ptrs;
    req.agent_version = KOLO_VERSION;
    req.agent_instance = a->instance;

    size_t len = kolo__register_request__get_packed_size(&req);
    uint8_t *data = malloc(len ? len : 1);
    void *rep = NULL;
    size_t rep_len = 0;
    if (!data) {
        rc = KOLO_ENOMEM;
        snprintf(err, errlen, "out of memory");
    } else {
        kolo__register_request__pack(&req, data);
        rc = rpc_client_call(a->hb_rpc, "AgentService.RegisterHost", data, len, &rep, &rep_len,
                             LINK_REGISTER_TIMEOUT_MS, err, errlen);
    }
    free(data);
    free(running);
    free(ptrs);
    if (rc)
        return rc;

    Kolo__RegisterReply *r =
        kolo__register_reply__unpack(NULL, rep_len, rep ? rep : (const uint8_t *)"");
    free(rep);
    if (!r || !r->session || !r->session[0] || strlen(r->session) >= slen) {
        if (r)
            kolo__register_reply__free_unpacked(r, NULL);
        snprintf(err, errlen, "malformed Register reply");
        return KOLO_EPROTO;
    }
    str_copy(session, r->session, slen);
    *hb_ms = r->heartbeat_ms ? r->heartbeat_ms : LINK_PARK_MAX_MS;
    *lease_ms = r->lease_ms ? r->lease_ms : LINK_LEASE_DEFAULT_MS;
    kolo__register_reply__free_unpacked(r, NULL);

    pthread_mutex_lock(&a->mu);
    str_copy(a->session, session, sizeof(a->session));
    a->session_gen++;
    a->stats.registrations++;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    return 0;
}

/* ---------------------------------------------------------------- heartbeat */

static int do_heartbeat(struct agent *a, const char *session, char *version, size_t vlen,
                        uint32_t wait, int timeout_ms, char *err, size_t errlen)
{
    Kolo__HeartbeatRequest req = KOLO__HEARTBEAT_REQUEST__INIT;
    req.session = (char *)session;
    req.desired_version = version;
    req.wait_ms = wait;
    /* workers stopped by a signal, for the coordinator's frozen rule */
    size_t nstopped = 0;
    Kolo__RunningWorker *stopped = agent_running_stopped(a, &nstopped);
    Kolo__RunningWorker **sp = nstopped ? calloc(nstopped, sizeof *sp) : NULL;
    for (size_t i = 0; sp && i < nstopped; i++)
        sp[i] = &stopped[i];
    req.stopped = sp;
    req.n_stopped = sp ? nstopped : 0;
    size_t len = kolo__heartbeat_request__get_packed_size(&req);
    uint8_t *data = malloc(len ? len : 1);
    if (data)
        kolo__heartbeat_request__pack(&req, data);
    free(sp);
    free(stopped);
    if (!data) {
        snprintf(err, errlen, "out of memory");
        return KOLO_ENOMEM;
    }
    void *rep = NULL;
    size_t rep_len = 0;
    int rc = rpc_client_call(a->hb_rpc, "AgentService.Heartbeat", data, len, &rep, &rep_len,
                             timeout_ms, err, errlen);
    free(data);
    if (rc)
        return rc;
    Kolo__HeartbeatReply *r =
        kolo__heartbeat_reply__unpack(NULL, rep_len, rep ? rep : (const uint8_t *)"");
    free(rep);
    if (!r) {
        snprintf(err, errlen, "malformed Heartbeat reply");
        return KOLO_EPROTO;
    }
    /* kolo stacks: asked once per seq (the coordinator repeats it until
     * the answer came); at most STACKS_WAIT_MS of this thread. Before the
     * desired set: a stop in the same reply waits for the stacks, which
     * the coordinator takes before it stops a job. */
    if (r->stacks_seq && r->stacks_seq != a->stacks_seen) {
        a->stacks_seen = r->stacks_seq;
        /* at most a quarter of the lease: the heartbeats wait meanwhile */
        uint32_t lease = r->lease_ms ? r->lease_ms : LINK_LEASE_DEFAULT_MS;
        uint32_t wait = lease / 4 < STACKS_WAIT_MS ? lease / 4 : STACKS_WAIT_MS;
        stacks_collect(a, session, r->stacks_job, r->stacks_seq, wait > 200 ? wait : 200);
    }
    if (!r->has_desired) {
        kolo__heartbeat_reply__free_unpacked(r, NULL);
    } else {
        LOGD("agent", "desired set version %s: %zu workers", r->desired_version, r->n_desired);
        str_copy(version, r->desired_version ? r->desired_version : "", vlen);
        agent_post_desired(a, r);
    }
    return 0;
}

/* The time a heartbeat may take beyond its park before it is abandoned:
 * lease/div within [250 ms, 5 s] (div: LINK_SLACK_LEASE_DIV for a parked
 * heartbeat, LINK_RETRY_LEASE_DIV for a retry). */
static int link_slack_ms(uint32_t lease_ms, uint32_t div)
{
    uint32_t s = lease_ms / div;
    return (int)(s < LINK_SLACK_MIN_MS   ? LINK_SLACK_MIN_MS
                 : s > LINK_SLACK_MAX_MS ? LINK_SLACK_MAX_MS
                                         : s);
}

/* link_redial replaces the heartbeat client by a fresh one, so the next
 * call does not queue behind a connection stuck in TCP's retransmission
 * backoff. The swap is made under a->mu, where link_stop reads the client
 * to shut it down; false when the link is stopping (nothing swapped). */
static bool link_redial(struct agent *a)
{
    struct rpc_client_config cc = {0};
    cc.url = a->url;
    cc.token = a->token;
    cc.identity = a->host_id;
    cc.tls = &a->tls;
    struct rpc_client *fresh = NULL;
    if (rpc_client_open(&fresh, &cc) != 0)
        return !stopping(a); /* keep the old client; the next failure tries again */
    pthread_mutex_lock(&a->mu);
    bool stop = a->link_stopping;
    struct rpc_client *old = stop ? fresh : a->hb_rpc;
    if (!stop)
        a->hb_rpc = fresh;
    pthread_mutex_unlock(&a->mu);
    rpc_client_close(old);
    return !stop;
}

static void *link_main(void *arg)
{
    thread_name("kolo-link");
    struct agent *a = arg;
    char session[128] = "", version[128] = "", err[1024];
    uint32_t hb_ms = LINK_PARK_MAX_MS, lease_ms = LINK_LEASE_DEFAULT_MS;
    uint64_t backoff = LINK_BACKOFF_MIN_MS;
    uint64_t renewed = 0; /* when a heartbeat last got through (0: never) */
    bool need_register = true, registered_once = false, probe = false;
    int fault = 0; /* the failure last logged: 0 none, -1 unreachable, else the code */

    while (!stopping(a)) {
        int rc;
        err[0] = '\0';
        uint64_t started = now_mono_ms();
        if (need_register) {
            rc = do_register(a, session, sizeof(session), &hb_ms, &lease_ms, err, sizeof(err));
            if (rc == 0) {
                if (registered_once)
                    LOGI("agent", "re-registered with coordinator %s (session %s)", a->url,
                         session);
                else
                    LOGI("agent", "registered with coordinator %s (session %s)", a->url, session);
                registered_once = true;
                need_register = probe = false;
                version[0] = '\0';
                backoff = LINK_BACKOFF_MIN_MS;
                renewed = now_mono_ms();
                fault = 0;
                continue;
            }
        } else {
            uint32_t wait = hb_ms, park_max = lease_ms / LINK_PARK_LEASE_DIV;
            if (wait > park_max)
                wait = park_max ? park_max : 1;
            if (probe)
                wait = 0;
            int timeout = (int)wait + link_slack_ms(lease_ms, probe ? LINK_RETRY_LEASE_DIV
                                                                    : LINK_SLACK_LEASE_DIV);
            rc =
                do_heartbeat(a, session, version, sizeof(version), wait, timeout, err, sizeof(err));
            if (rc == 0) {
                if (fault)
                    LOGI("agent", "coordinator %s reachable again", a->url);
                fault = 0;
                probe = false;
                backoff = LINK_BACKOFF_MIN_MS;
                renewed = now_mono_ms();
                continue;
            }
            if (session_unknown(rc)) {
                LOGW("agent",
                     "coordinator %s no longer knows this agent's session (%s); "
                     "registering again",
                     a->url, err);
                need_register = true;
                continue;
            }
        }
        pthread_mutex_lock(&a->mu);
        bool stopping = a->link_stopping;
        pthread_mutex_unlock(&a->mu);
        if (stopping)
            break; /* the failure is our own shutdown of the client */
        if (refused(rc)) {
            if (fault != rc)
                LOGE("agent", "coordinator %s refused this agent: %s (retrying every %d s)", a->url,
                     err, LINK_REFUSED_RETRY_MS / 1000);
            fault = rc;
            link_sleep(a, LINK_REFUSED_RETRY_MS);
            continue;
        }
        if (fault != -1)
            LOGW("agent", "coordinator %s unreachable (%s), retrying on a new connection", a->url,
                 err);
        fault = -1;
        probe = true;
        if (!link_redial(a))
            break;
        uint64_t now = now_mono_ms();
        if (!need_register && renewed && now - renewed < lease_ms) {
            /* The lease may still be alive: try again at once, on the new
             * connection, only keeping attempts LINK_BACKOFF_MIN_MS apart. */
            if (now - started < LINK_BACKOFF_MIN_MS)
                link_sleep(a, LINK_BACKOFF_MIN_MS - (now - started));
            continue;
        }
        link_sleep(a, jitter(backoff));
        backoff = backoff * 2 < LINK_BACKOFF_MAX_MS ? backoff * 2 : LINK_BACKOFF_MAX_MS;
    }
    return NULL;
}

/* ---------------------------------------------------------------- report */

static void *report_main(void *arg)
{
    thread_name("kolo-agentrep");
    struct agent *a = arg;
    struct outbox_batch batch = {0};
    uint64_t next_send = 0, retry_at = 0, backoff = LINK_BACKOFF_MIN_MS;
    uint64_t stale_gen = NO_GEN; /* the session a Report was refused under */
    int fault = 0;
    char session[128], err[1024];

    pthread_mutex_lock(&a->mu);
    for (;;) {
        uint64_t now = now_mono_ms();
        bool stop = a->link_stopping;
        uint64_t left = stop && a->flush_deadline > now ? a->flush_deadline - now : 0;
        if (stop && ((!batch.head && outbox_empty(&a->outbox)) || left == 0))
            break;
        uint64_t idle = stop ? left : 1000;
        if (!batch.head) {
            if (outbox_empty(&a->outbox)) {
                wait_ms(a, idle);
                continue;
            }
            if (now < next_send && !stop && !outbox_full_batch(&a->outbox)) {
                wait_ms(a, next_send - now);
                continue;
            }
            outbox_take(&a->outbox, &batch);
        }
        bool new_session = stale_gen != NO_GEN && a->session_gen != stale_gen;
        if (!a->session[0] || (now < retry_at && !new_session)) {
            uint64_t d = a->session[0] ? retry_at - now : 100;
            wait_ms(a, d < idle ? d : idle);
            continue;
        }
        str_copy(session, a->session, sizeof(session));
        uint64_t gen = a->session_gen;
        int timeout = LINK_REPORT_TIMEOUT_MS;
        if (stop && left < (uint64_t)timeout)
            timeout = (int)left;
        pthread_mutex_unlock(&a->mu);

        uint8_t *req = NULL;
        size_t len = 0;
        void *rep = NULL;
        size_t rep_len = 0;
        err[0] = '\0';
        int rc = outbox_batch_pack(&batch, session, &req, &len);
        if (rc == 0)
            rc = rpc_client_call(a->rpc, "AgentService.Report", req, len, &rep, &rep_len, timeout,
                                 err, sizeof(err));
        free(req);
        free(rep);

        pthread_mutex_lock(&a->mu);
        now = now_mono_ms();
        if (rc == 0) {
            if (fault)
                LOGI("agent", "reporting to coordinator %s again", a->url);
            outbox_batch_free(&batch);
            a->stats.reports++;
            next_send = now + AGENT_REPORT_PACE_MS;
            retry_at = 0;
            backoff = LINK_BACKOFF_MIN_MS;
            stale_gen = NO_GEN;
            fault = 0;
            continue;
        }
        if (rc == KOLO_EINVAL || rc == KOLO_EPROTO || rc == KOLO_ETOOBIG) {
            /* The coordinator will never take this batch; retrying it
             * would block every later one. */
            LOGE("agent",
                 "coordinator %s rejected a report (%s); dropping %zu events and %zu "
                 "lines",
                 a->url, err, batch.n_events, batch.n_lines);
            outbox_batch_free(&batch);
            continue;
        }
        if (session_unknown(rc)) {
            /* The link thread registers again; resend under the new
             * session as soon as there is one, or after the backoff. */
            stale_gen = gen;
        } else {
            stale_gen = NO_GEN;
            if (fault != rc)
                LOGW("agent", "cannot report to coordinator %s (%s), retrying", a->url,
                     err[0] ? err : abi_strerror(rc));
            fault = rc;
        }
        retry_at = now + jitter(backoff);
        backoff = backoff * 2 < LINK_BACKOFF_MAX_MS ? backoff * 2 : LINK_BACKOFF_MAX_MS;
    }
    size_t ev = batch.n_events, ln = batch.n_lines;
    for (struct outbox_item *it = a->outbox.head; it; it = it->next) {
        if (it->is_event)
            ev++;
        else
            ln++;
    }
    pthread_mutex_unlock(&a->mu);
    if (ev || ln)
        LOGW("agent", "stopping with %zu events and %zu output lines not delivered", ev, ln);
    outbox_batch_free(&batch);
    return NULL;
}

/* ---------------------------------------------------------------- start, stop */

int link_start(struct agent *a, char *err, size_t errlen)
{
    struct rpc_client_config cc = {0};
    cc.url = a->url;
    cc.token = a->token;
    cc.identity = a->host_id;
    cc.tls = &a->tls;
    int rc = rpc_client_open(&a->rpc, &cc);
    if (rc == 0)
        rc = rpc_client_open(&a->hb_rpc, &cc);
    if (rc) {
        snprintf(err, errlen, "cannot open a connection to %s: %s", a->url, abi_strerror(rc));
        rpc_client_close(a->rpc);
        a->rpc = NULL;
        a->hb_rpc = NULL;
        return rc;
    }
    if ((rc = pthread_create(&a->link_thread, NULL, link_main, a)) != 0) {
        snprintf(err, errlen, "cannot start the link thread: %s", strerror(rc));
        return KOLO_ESYS;
    }
    a->link_running = true;
    if ((rc = pthread_create(&a->report_thread, NULL, report_main, a)) != 0) {
        snprintf(err, errlen, "cannot start the report thread: %s", strerror(rc));
        link_stop(a);
        return KOLO_ESYS;
    }
    a->report_running = true;
    return 0;
}

void link_stop(struct agent *a)
{
    pthread_mutex_lock(&a->mu);
    a->link_stopping = true;
    a->flush_deadline = now_mono_ms() + LINK_STOP_FLUSH_MS;
    struct rpc_client *hb = a->hb_rpc; /* link_redial swaps it under a->mu */
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    /* Ends a parked heartbeat now; the reporter's last calls end at the
     * flush deadline. */
    rpc_client_shutdown(hb);
    if (a->link_running)
        pthread_join(a->link_thread, NULL);
    if (a->report_running)
        pthread_join(a->report_thread, NULL);
    a->link_running = a->report_running = false;
}
