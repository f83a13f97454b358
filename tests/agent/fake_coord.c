/*
 * fake_coord.c - see fake_coord.h. The RPC handler runs on nng's threads;
 * a tick thread answers parked heartbeats when their wait ends or the
 * desired set changes. Everything is under one mutex.
 */
#include "fake_coord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "rpc.h"
#include "util.h"

static void version_str(struct fake_coord *fc, char *out, size_t n)
{
    snprintf(out, n, "v%llu", (unsigned long long)fc->version);
}

static void reply_pb(struct rpc_call *call, const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    protobuf_c_message_pack(m, buf);
    rpc_call_reply(call, buf, len);
    free(buf);
}

/* Under mu: answer a heartbeat, with the desired set when the agent's
 * version is not the current one. */
static void answer_heartbeat(struct fake_coord *fc, struct rpc_call *call, const char *agent_ver)
{
    char ver[32];
    version_str(fc, ver, sizeof(ver));
    if (fc->desired_reply && (!agent_ver || strcmp(agent_ver, ver) != 0)) {
        rpc_call_reply(call, fc->desired_reply, fc->desired_len);
        return;
    }
    Kolo__HeartbeatReply rep = KOLO__HEARTBEAT_REPLY__INIT;
    rep.lease_ms = 10000;
    rep.desired_version = ver;
    reply_pb(call, &rep.base);
}

static void on_register(struct fake_coord *fc, struct rpc_call *call, const struct rpc_frame *f)
{
    Kolo__RegisterRequest *req = kolo__register_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        rpc_call_error(call, KOLO_EPROTO, "malformed RegisterRequest");
        return;
    }
    fc->registrations++;
    str_copy(fc->host_id, req->host_id, sizeof(fc->host_id));
    str_copy(fc->agent_instance, req->agent_instance, sizeof(fc->agent_instance));
    fc->slots = req->slots;
    fc->n_last_running = 0;
    for (size_t i = 0; i < req->n_running && i < 64; i++) {
        fc->last_running[i] = *req->running[i];
        fc->n_last_running++;
    }
    snprintf(fc->session, sizeof(fc->session), "s%d", ++fc->session_counter);
    fc->last_batch_seq = 0;
    Kolo__RegisterReply rep = KOLO__REGISTER_REPLY__INIT;
    rep.host_id = req->host_id;
    rep.session = fc->session;
    rep.lease_ms = 10000;
    rep.heartbeat_ms = fc->heartbeat_ms;
    reply_pb(call, &rep.base);
    kolo__register_request__free_unpacked(req, NULL);
}

static void on_heartbeat(struct fake_coord *fc, struct rpc_call *call, const struct rpc_frame *f)
{
    Kolo__HeartbeatRequest *req = kolo__heartbeat_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        rpc_call_error(call, KOLO_EPROTO, "malformed HeartbeatRequest");
        return;
    }
    fc->heartbeats++;
    if (fc->stale_heartbeats > 0) {
        fc->stale_heartbeats--;
        fc->session[0] = '\0';
    }
    if (!fc->session[0] || strcmp(req->session, fc->session) != 0) {
        rpc_call_error(call, KOLO_ESTALE, "unknown session '%s'", req->session);
    } else {
        char ver[32];
        version_str(fc, ver, sizeof(ver));
        if ((fc->desired_reply && strcmp(req->desired_version, ver) != 0) || req->wait_ms == 0 ||
            fc->n_parked == sizeof(fc->parked) / sizeof(fc->parked[0])) {
            answer_heartbeat(fc, call, req->desired_version);
        } else {
            fc->parked[fc->n_parked].call = call;
            fc->parked[fc->n_parked].deadline = now_mono_ms() + req->wait_ms;
            fc->n_parked++;
        }
    }
    kolo__heartbeat_request__free_unpacked(req, NULL);
}

static void record_event(struct fake_coord *fc, const Kolo__WorkerEvent *e)
{
    if (fc->n_events == fc->cap_events) {
        fc->cap_events = fc->cap_events ? fc->cap_events * 2 : 64;
        fc->events = realloc(fc->events, fc->cap_events * sizeof(*fc->events));
    }
    struct fake_event *r = &fc->events[fc->n_events++];
    memset(r, 0, sizeof(*r));
    r->job_id = e->job_id;
    r->generation = e->generation;
    r->rank = e->rank;
    r->kind = e->kind;
    r->pid = e->pid;
    r->exit_code = e->exit_code;
    r->term_signal = e->term_signal;
    str_copy(r->message, e->message ? e->message : "", sizeof(r->message));
    r->order = ++fc->order;
}

static void record_line(struct fake_coord *fc, const Kolo__OutputLine *l)
{
    if (fc->n_lines == fc->cap_lines) {
        fc->cap_lines = fc->cap_lines ? fc->cap_lines * 2 : 256;
        fc->lines = realloc(fc->lines, fc->cap_lines * sizeof(*fc->lines));
    }
    struct fake_line *r = &fc->lines[fc->n_lines++];
    r->job_id = l->job_id;
    r->rank = l->rank;
    r->stream = l->stream;
    r->text = malloc(l->text.len + 1);
    if (l->text.len)
        memcpy(r->text, l->text.data, l->text.len);
    r->text[l->text.len] = '\0';
    r->order = ++fc->order;
}

static void on_report(struct fake_coord *fc, struct rpc_call *call, const struct rpc_frame *f)
{
    Kolo__ReportRequest *req = kolo__report_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        rpc_call_error(call, KOLO_EPROTO, "malformed ReportRequest");
        return;
    }
    if (!fc->session[0] || strcmp(req->session, fc->session) != 0) {
        rpc_call_error(call, KOLO_ESTALE, "unknown session '%s'", req->session);
    } else if (fc->fail_reports > 0) {
        fc->fail_reports--;
        rpc_call_error(call, KOLO_EIO, "injected report failure");
    } else {
        Kolo__ReportReply rep = KOLO__REPORT_REPLY__INIT;
        if (req->batch_seq && req->batch_seq <= fc->last_batch_seq) {
            fc->duplicate_batches++;
        } else {
            /* Lines first, like the coordinator. */
            for (size_t i = 0; i < req->n_lines; i++)
                record_line(fc, req->lines[i]);
            for (size_t i = 0; i < req->n_events; i++)
                record_event(fc, req->events[i]);
            fc->last_batch_seq = req->batch_seq;
            fc->reports++;
        }
        rep.accepted_events = (uint32_t)req->n_events;
        rep.accepted_lines = (uint32_t)req->n_lines;
        reply_pb(call, &rep.base);
    }
    kolo__report_request__free_unpacked(req, NULL);
}

static void handler(struct rpc_call *call, void *arg)
{
    struct fake_coord *fc = arg;
    const struct rpc_frame *f = rpc_call_frame(call);
    pthread_mutex_lock(&fc->mu);
    if (strcmp(f->method, "AgentService.RegisterHost") == 0)
        on_register(fc, call, f);
    else if (strcmp(f->method, "AgentService.Heartbeat") == 0)
        on_heartbeat(fc, call, f);
    else if (strcmp(f->method, "AgentService.Report") == 0)
        on_report(fc, call, f);
    else
        rpc_call_error(call, KOLO_ENOMETHOD, "no method %s", f->method);
    pthread_mutex_unlock(&fc->mu);
}

static void *tick_main(void *arg)
{
    struct fake_coord *fc = arg;
    for (;;) {
        pthread_mutex_lock(&fc->mu);
        if (fc->stop) {
            pthread_mutex_unlock(&fc->mu);
            return NULL;
        }
        uint64_t now = now_mono_ms();
        for (size_t i = 0; i < fc->n_parked;) {
            /* A parked call is answered when its wait ends; fake_set_desired
             * sets every deadline to 0 to answer at once. */
            if (now >= fc->parked[i].deadline) {
                answer_heartbeat(fc, fc->parked[i].call, NULL);
                fc->parked[i] = fc->parked[--fc->n_parked];
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&fc->mu);
        usleep(5000);
    }
}

int fake_open(struct fake_coord **out, const char *url, uint32_t heartbeat_ms)
{
    return fake_open_token(out, url, heartbeat_ms, NULL);
}

int fake_open_token(struct fake_coord **out, const char *url, uint32_t heartbeat_ms,
                    const char *token)
{
    struct fake_coord *fc = calloc(1, sizeof(*fc));
    pthread_mutex_init(&fc->mu, NULL);
    fc->heartbeat_ms = heartbeat_ms;
    struct rpc_server_config cfg = {0};
    cfg.url = url;
    cfg.token = token;
    cfg.contexts = 64;
    cfg.handler = handler;
    cfg.arg = fc;
    int rc = rpc_server_open(&fc->srv, &cfg);
    if (rc) {
        pthread_mutex_destroy(&fc->mu);
        free(fc);
        return rc;
    }
    pthread_create(&fc->tick, NULL, tick_main, fc);
    *out = fc;
    return 0;
}

const char *fake_url(struct fake_coord *fc)
{
    return rpc_server_url(fc->srv);
}

void fake_close(struct fake_coord *fc)
{
    if (!fc)
        return;
    pthread_mutex_lock(&fc->mu);
    fc->stop = true;
    for (size_t i = 0; i < fc->n_parked; i++)
        rpc_call_error(fc->parked[i].call, KOLO_ESHUTDOWN, "fake coordinator closing");
    fc->n_parked = 0;
    pthread_mutex_unlock(&fc->mu);
    pthread_join(fc->tick, NULL);
    rpc_server_close(fc->srv);
    for (size_t i = 0; i < fc->n_lines; i++)
        free(fc->lines[i].text);
    free(fc->lines);
    free(fc->events);
    free(fc->desired_reply);
    pthread_mutex_destroy(&fc->mu);
    free(fc);
}

void fake_set_desired(struct fake_coord *fc, Kolo__WorkerSpec **specs, size_t n)
{
    pthread_mutex_lock(&fc->mu);
    fc->version++;
    char ver[32];
    version_str(fc, ver, sizeof(ver));
    Kolo__HeartbeatReply rep = KOLO__HEARTBEAT_REPLY__INIT;
    rep.lease_ms = 10000;
    rep.desired_version = ver;
    rep.has_desired = 1;
    rep.n_desired = n;
    rep.desired = specs;
    rep.stop_grace_ms = fc->stop_grace_ms;
    free(fc->desired_reply);
    fc->desired_len = kolo__heartbeat_reply__get_packed_size(&rep);
    fc->desired_reply = malloc(fc->desired_len ? fc->desired_len : 1);
    kolo__heartbeat_reply__pack(&rep, fc->desired_reply);
    for (size_t i = 0; i < fc->n_parked; i++)
        fc->parked[i].deadline = 0;
    pthread_mutex_unlock(&fc->mu);
}

void fake_lock(struct fake_coord *fc)
{
    pthread_mutex_lock(&fc->mu);
}

void fake_unlock(struct fake_coord *fc)
{
    pthread_mutex_unlock(&fc->mu);
}

const struct fake_event *fake_find_event(struct fake_coord *fc, int kind, uint64_t job_id, int rank)
{
    for (size_t i = 0; i < fc->n_events; i++) {
        const struct fake_event *e = &fc->events[i];
        if (e->kind == kind && e->job_id == job_id && e->rank == rank)
            return e;
    }
    return NULL;
}

int fake_count_events(struct fake_coord *fc, int kind)
{
    int n = 0;
    pthread_mutex_lock(&fc->mu);
    for (size_t i = 0; i < fc->n_events; i++)
        n += fc->events[i].kind == kind;
    pthread_mutex_unlock(&fc->mu);
    return n;
}

bool fake_get_event(struct fake_coord *fc, int kind, uint64_t job_id, int rank,
                    struct fake_event *out)
{
    pthread_mutex_lock(&fc->mu);
    const struct fake_event *e = fake_find_event(fc, kind, job_id, rank);
    if (e && out)
        *out = *e;
    pthread_mutex_unlock(&fc->mu);
    return e != NULL;
}

int fake_registrations(struct fake_coord *fc)
{
    pthread_mutex_lock(&fc->mu);
    int n = fc->registrations;
    pthread_mutex_unlock(&fc->mu);
    return n;
}

Kolo__WorkerSpec *spec_sh(uint64_t job_id, uint64_t generation, int rank, int size,
                          const char *script)
{
    Kolo__WorkerSpec *s = calloc(1, sizeof(*s));
    Kolo__WorkerSpec init = KOLO__WORKER_SPEC__INIT;
    *s = init;
    s->job_id = job_id;
    s->generation = generation;
    s->rank = rank;
    s->size = size;
    s->local_rank = rank;
    s->local_size = size;
    s->cross_rank = 0;
    s->cross_size = 1;
    s->n_argv = 3;
    s->argv = calloc(3, sizeof(char *));
    s->argv[0] = strdup("sh");
    s->argv[1] = strdup("-c");
    s->argv[2] = strdup(script);
    return s;
}

void spec_free(Kolo__WorkerSpec *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_argv; i++)
        free(s->argv[i]);
    free(s->argv);
    for (size_t i = 0; i < s->n_env; i++)
        free(s->env[i]);
    free(s->env);
    if (s->cwd && s->cwd != protobuf_c_empty_string)
        free(s->cwd);
    free(s);
}
