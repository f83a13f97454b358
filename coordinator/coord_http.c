/*
 * coord_http.c - REST API, Prometheus metrics and static files over nng's
 * HTTP server.
 *
 * One handler takes the whole tree and routes by itself through one table
 * (`routes`: method, path pattern, admin flag, handler), so unknown paths
 * and wrong methods get kolo's JSON errors (404, 405 with Allow) instead
 * of nng's HTML, and a new route is one line plus its handler. The handler
 * runs on an nng thread and only posts the request to the main thread,
 * which builds the answer from the state it owns.
 *
 * Authentication: timings, states and events are open to every reader; a
 * job's argv, cwd and output need the token or the view key (a bearer
 * token, or the cookie the printed ?key= link leaves: http_reader_trusted).
 * Anything that changes state needs "Authorization: Bearer <token>"; with
 * no token configured those routes answer 403, so nothing can start a
 * command over HTTP without the token.
 *
 * Query parameters are integers, checked (query_param): a bad one answers
 * 400 naming it, since a typo silently read as the default would show the
 * user something other than what they asked for.
 */
#include "coord_api.h"
#include "coord_core.h"
#include "coord_hosts.h"
#include "coord_jobs.h"
#include "coord_negot.h"
#include "coord_stacks.h"
#include "coord_report.h"
#include "coord_snap.h"
#include "coord_timeline.h"
#include "coord_study.h"
#include "coord_writer.h"
#include "coord_static.h"

#include <ctype.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <nng/supplemental/http/http.h>

#include "creds.h"
#include "errors.h"
#include "hmac.h"
#include "json.h"
#include "log.h"
#include "util.h"

#define HTTP_MAX_BODY (1u << 20)
#define HTTP_MAX_ARGS 4096

struct http_req {
    const char *method;
    char path[512];
    char query[512];
    const char *body;
    size_t body_len;
    nng_http_req *req;
    bool viewer; /* it brought the view key (view_key_given), once per request */
};

struct http_out {
    int status;
    const char *content_type;
    struct buf body;
    char allow[32];    /* for 405: the methods the path takes */
    bool www_auth;     /* for 401 */
    bool set_cookie;   /* the request brought the view key as ?key=: keep it */
};

/* ---------------------------------------------------------------- helpers */

static void out_json_error(struct http_out *o, int status, const char *msg)
{
    struct jw w;
    buf_reset(&o->body);
    o->status = status;
    o->content_type = "application/json";
    jw_init(&w, &o->body);
    jw_obj_begin(&w);
    jw_kstr(&w, "error", msg);
    jw_kint(&w, "status", status);
    jw_obj_end(&w);
    buf_putc(&o->body, '\n');
}

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* url_decode copies in[0, len) to out (NUL-terminated, cut at size - 1)
 * with %XX decoded, and '+' as a space when plus is set (a query); false
 * when it had to cut. */
static bool url_decode(const char *in, size_t len, bool plus, char *out, size_t size)
{
    size_t o = 0, i = 0;
    for (; i < len && o + 1 < size; i++) {
        if (in[i] == '%' && i + 2 < len + 1 && hexval(in[i + 1]) >= 0 && hexval(in[i + 2]) >= 0) {
            out[o++] = (char)(hexval(in[i + 1]) * 16 + hexval(in[i + 2]));
            i += 2;
        } else {
            out[o++] = plus && in[i] == '+' ? ' ' : in[i];
        }
    }
    out[o] = '\0';
    return i >= len;
}

/* query_get finds key in "a=1&b=2" and URL-decodes its value. */
static bool query_get(const char *query, const char *key, char *out, size_t size)
{
    size_t klen = strlen(key);
    const char *p = query;
    while (p && *p) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            url_decode(p + klen + 1, len - klen - 1, true, out, size);
            return true;
        }
        p = amp ? amp + 1 : NULL;
    }
    return false;
}

bool coord_http_uint_param(const char *query, const char *key, uint64_t lo, uint64_t hi,
                           uint64_t *v, char *err, size_t errlen)
{
    char tmp[64];
    if (!query_get(query, key, tmp, sizeof(tmp)))
        return true;
    bool digits = tmp[0] != '\0' && strlen(tmp) <= 19;
    for (const char *p = tmp; digits && *p; p++)
        digits = isdigit((unsigned char)*p);
    unsigned long long x = digits ? strtoull(tmp, NULL, 10) : 0;
    if (digits && x >= lo && x <= hi) {
        *v = x;
        return true;
    }
    snprintf(err, errlen, "%s must be an integer from %llu to %llu, not '%.40s'", key,
             (unsigned long long)lo, (unsigned long long)hi, tmp);
    return false;
}

/* query_param is coord_http_uint_param answering 400 on a bad value. */
static bool query_param(const char *query, const char *key, uint64_t lo, uint64_t hi, uint64_t *v,
                        struct http_out *o)
{
    char msg[200];
    if (coord_http_uint_param(query, key, lo, hi, v, msg, sizeof(msg)))
        return true;
    buf_reset(&o->body);
    out_json_error(o, 400, msg);
    return false;
}

static bool parse_id(const char *s, uint64_t *id)
{
    char *end;
    if (!*s || !isdigit((unsigned char)*s))
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || v == 0)
        return false;
    *id = v;
    return true;
}

/* ---------------------------------------------------------------- renderers */

static void render_host(struct coord *c, struct jw *w, struct host *h)
{
    uint64_t now = now_mono_ms();
    jw_obj_begin(w);
    jw_kstr(w, "id", h->id);
    jw_kstr(w, "name", h->name);
    jw_kstr(w, "hostname", h->hostname);
    jw_kstr(w, "addr", h->addr);
    jw_kstr(w, "state", h->state != HOST_ALIVE ? "lost" : h->drained ? "drained" : "alive");
    jw_kint(w, "slots", h->slots);
    jw_kint(w, "slots_used", coord_host_slots_used(c, h));
    jw_kint(w, "cpus", h->cpus);
    jw_kint(w, "gpus", h->gpus);
    jw_kuint(w, "mem_bytes", h->mem_bytes);
    jw_kuint(w, "lease_age_ms", now - h->last_seen_mono);
    jw_kint(w, "lease_ms", c->cfg.lease_ms);
    jw_kuint(w, "registered_ms", h->registered_ms);
    jw_kuint(w, "last_seen_ms", h->last_seen_ms);
    jw_key(w, "running_ranks");
    jw_arr_begin(w);
    for (struct job *j = c->jobs; j; j = j->next) {
        if (j->state != JOB_RUNNING)
            continue;
        for (int r = 0; r < j->nranks; r++) {
            struct rank *rk = &j->ranks[r];
            if (rk->host != h || (rk->state != RANK_ASSIGNED && rk->state != RANK_RUNNING))
                continue;
            jw_obj_begin(w);
            jw_kuint(w, "job", j->id);
            jw_kint(w, "rank", rk->rank);
            jw_obj_end(w);
        }
    }
    jw_arr_end(w);
    jw_obj_end(w);
}

static int render_generation_cb(uint64_t generation, const char *cause, int size, uint64_t ts_ms,
                                const struct store_recovery *rec, void *arg)
{
    struct jw *w = arg;
    jw_obj_begin(w);
    jw_kuint(w, "generation", generation);
    jw_kint(w, "size", size);
    jw_kstr(w, "cause", cause ? cause : "");
    jw_kuint(w, "ts_ms", ts_ms);
    if (rec) { /* the recovery this generation began with, in s */
        jw_key(w, "recovery");
        jw_obj_begin(w);
        jw_kdouble(w, "total_s",
                   (double)((uint64_t)rec->told_ms + rec->formed_ms + rec->restored_ms +
                            rec->step_ms) / 1000.0);
        jw_kdouble(w, "told_s", rec->told_ms / 1000.0);
        jw_kdouble(w, "formed_s", rec->formed_ms / 1000.0);
        jw_kdouble(w, "restored_s", rec->restored_ms / 1000.0);
        jw_kdouble(w, "first_step_s", rec->step_ms / 1000.0);
        jw_obj_end(w);
    }
    jw_obj_end(w);
    return 0;
}

/* full: argv and cwd too (what the job runs); without, they are null and
 * "redacted" says why (http_reader_trusted). */
static void render_job_summary(struct jw *w, struct job *j, bool full)
{
    jw_kuint(w, "id", j->id);
    jw_kstr(w, "name", j->name);
    jw_kstr(w, "state", coord_job_state_name(j->state));
    jw_kint(w, "np", j->np);
    if (j->state == JOB_SUCCEEDED || j->state == JOB_FAILED || j->state == JOB_STOPPED)
        jw_kint(w, "exit_code", j->exit_code);
    else {
        jw_key(w, "exit_code");
        jw_null(w);
    }
    jw_kstr(w, "reason", j->reason ? j->reason : "");
    jw_key(w, "argv");
    if (full) {
        jw_arr_begin(w);
        for (int i = 0; i < j->argc; i++)
            jw_str(w, j->argv[i]);
        jw_arr_end(w);
        jw_kstr(w, "cwd", j->cwd);
    } else {
        jw_null(w);
        jw_key(w, "cwd");
        jw_null(w);
        jw_kbool(w, "redacted", true);
    }
    jw_kstr(w, "hosts", j->hosts);
    /* labels for tools (kolo tune's study and trial); shown to every reader */
    jw_key(w, "metadata");
    jw_obj_begin(w);
    for (int i = 0; i < j->nmeta; i++) {
        const char *eq = strchr(j->meta[i], '=');
        char key[JOB_META_KEY_MAX + 1];
        if (!eq || (size_t)(eq - j->meta[i]) >= sizeof key)
            continue;
        memcpy(key, j->meta[i], (size_t)(eq - j->meta[i]));
        key[eq - j->meta[i]] = '\0';
        jw_kstr(w, key, eq + 1);
    }
    jw_obj_end(w);
    jw_kuint(w, "generation", j->generation);
    jw_kuint(w, "submitted_ms", j->submitted_ms);
    jw_kuint(w, "started_ms", j->started_ms);
    jw_kuint(w, "ended_ms", j->ended_ms);
    jw_kint(w, "ranks_alive", coord_job_ranks_alive(j));
    jw_kuint(w, "output_lines", j->out_stored);
    jw_kbool(w, "elastic", j->el != NULL);
    if (j->el) {
        jw_key(w, "elastic_state");
        jw_obj_begin(w);
        jw_kint(w, "size", j->nranks);
        jw_kint(w, "min_np", j->el->min_np);
        jw_kint(w, "max_np", j->el->max_np);
        jw_kint(w, "resets", j->el->resets);
        jw_kint(w, "reset_limit", j->el->reset_limit);
        jw_kbool(w, "waiting", j->el->waiting);
        jw_kuint(w, "hosts_updated_ms", j->el->update_ms);
        jw_kint(w, "spares_wanted", j->el->spares_want);
        jw_key(w, "spares");
        jw_arr_begin(w);
        for (int s = 0; s < j->nspares; s++) {
            const struct rank *sp = &j->spares[s];
            jw_obj_begin(w);
            jw_kuint(w, "worker_id", sp->wid);
            jw_kstr(w, "host", sp->host ? sp->host->name : sp->host_id);
            jw_kstr(w, "state", sp->state == RANK_RUNNING ? "waiting" : "starting");
            jw_kint(w, "pid", sp->pid);
            jw_obj_end(w);
        }
        jw_arr_end(w);
        jw_key(w, "excluded");
        jw_arr_begin(w);
        uint64_t now = now_mono_ms();
        for (const struct exclusion *x = j->el->excl; x; x = x->next) {
            if (!x->active)
                continue;
            jw_obj_begin(w);
            jw_kstr(w, "host", x->host_id);
            jw_kint(w, "count", x->count);
            if (x->until)
                jw_kuint(w, "remaining_ms", x->until > now ? x->until - now : 0);
            else
                jw_kstr(w, "remaining_ms", "forever");
            jw_obj_end(w);
        }
        jw_arr_end(w);
        jw_obj_end(w);
    }
}

struct event_ctx {
    struct jw *w;
    uint64_t job; /* 0: every job's */
    int limit;
};

static int render_event_cb(const struct store_event *ev, void *arg)
{
    struct jw *w = ((struct event_ctx *)arg)->w;
    jw_obj_begin(w);
    jw_kint(w, "id", ev->id);
    jw_kuint(w, "ts_ms", ev->ts_ms);
    if (ev->job_id)
        jw_kuint(w, "job", ev->job_id);
    if (ev->host_id)
        jw_kstr(w, "host", ev->host_id);
    jw_kstr(w, "kind", ev->kind);
    jw_kstr(w, "message", ev->message);
    jw_obj_end(w);
    return 0;
}

/* The newest events, rendered on the reader with the state lock
 * released (coord_read). */
static int read_events(struct store *st, void *arg)
{
    struct event_ctx *ec = arg;
    return store_events_each(st, ec->job, -1, ec->limit, render_event_cb, ec);
}

/* The newest events of a job other than its commits (one per
 * state.commit(), thousands in a long job), which would push its starts,
 * resets, drains and failures out of the newest 200. */
static int read_milestones(struct store *st, void *arg)
{
    struct event_ctx *ec = arg;
    return store_events_tail_except(st, ec->job, "snapshot.committed", ec->limit, render_event_cb,
                                    ec);
}

static void render_job(struct coord *c, struct jw *w, struct job *j, bool full)
{
    jw_obj_begin(w);
    render_job_summary(w, j, full);
    jw_kbool(w, "timeline", coord_timeline_available(c, j));
    jw_key(w, "ranks");
    jw_arr_begin(w);
    for (int r = 0; r < j->nranks; r++) {
        struct rank *rk = &j->ranks[r];
        jw_obj_begin(w);
        jw_kint(w, "rank", rk->rank);
        jw_kuint(w, "worker_id", rk->wid);
        jw_kstr(w, "host", rk->host_id);
        jw_kstr(w, "host_name", rk->host ? rk->host->name : "");
        jw_kint(w, "local_rank", rk->local_rank);
        jw_kint(w, "local_size", rk->local_size);
        jw_kint(w, "cross_rank", rk->cross_rank);
        jw_kint(w, "cross_size", rk->cross_size);
        jw_kstr(w, "state", coord_rank_state_name(rk->state));
        if (rk->state == RANK_EXITED) {
            jw_kint(w, "exit_code", rk->exit_code);
            jw_kint(w, "signal", rk->term_signal);
        }
        if (rk->pid)
            jw_kint(w, "pid", rk->pid);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_key(w, "hosts_used");
    jw_arr_begin(w);
    for (struct host *h = c->hosts; h; h = h->next) {
        int n = 0;
        for (int r = 0; r < j->nranks; r++)
            n += j->ranks[r].host == h;
        if (!n)
            continue;
        jw_obj_begin(w);
        jw_kstr(w, "id", h->id);
        jw_kstr(w, "name", h->name);
        jw_kint(w, "ranks", n);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_key(w, "events");
    jw_arr_begin(w);
    struct event_ctx ec = {w, j->id, 200};
    if (coord_read(c, read_events, &ec) < 0)
        coord_store_failed(c, "events read");
    jw_arr_end(w);
    jw_key(w, "milestones");
    jw_arr_begin(w);
    if (coord_read(c, read_milestones, &ec) < 0)
        coord_store_failed(c, "events read");
    jw_arr_end(w);
    jw_obj_end(w);
}

struct output_ctx {
    struct jw *w;
    uint64_t last;
    uint64_t job;
    int limit;
};

static int render_output_cb(const struct store_output *o, void *arg)
{
    struct output_ctx *oc = arg;
    jw_obj_begin(oc->w);
    jw_kuint(oc->w, "seq", o->seq);
    jw_kint(oc->w, "rank", o->rank);
    jw_kstr(oc->w, "stream", o->stream == 2 ? "stderr" : "stdout");
    jw_kuint(oc->w, "ts_ms", o->ts_ms);
    jw_key(oc->w, "text");
    jw_strn(oc->w, o->text, o->text_len);
    jw_obj_end(oc->w);
    oc->last = o->seq;
    return 0;
}

static int read_output(struct store *st, void *arg)
{
    struct output_ctx *oc = arg;
    return store_output_each(st, oc->job, oc->last, oc->limit, render_output_cb, oc);
}

static void render_metrics(struct coord *c, struct buf *b)
{
    static const char *method_names[] = {
#define COORD_METHOD_NAME(id, name, who, handler) name,
        COORD_METHODS(COORD_METHOD_NAME)
#undef COORD_METHOD_NAME
    };
    int hosts[2] = {0, 0}, jobs[5] = {0};
    int64_t slots_total = 0, slots_used = 0;
    for (struct host *h = c->hosts; h; h = h->next) {
        hosts[h->state]++;
        if (h->state == HOST_ALIVE) {
            slots_total += h->slots;
            slots_used += coord_host_slots_used(c, h);
        }
    }
    for (struct job *j = c->jobs; j; j = j->next)
        jobs[j->state]++;
    struct rpc_server_stats st = {0};
    if (c->rpc) /* none in a view (coord_view_open) */
        rpc_server_get_stats(c->rpc, &st);

    buf_printf(b,
               "# HELP kolo_build_info Build information; the value is always 1.\n"
               "# TYPE kolo_build_info gauge\n"
               "kolo_build_info{version=\"%s\",protocol=\"%d\"} 1\n",
               KOLO_VERSION, KOLO_PROTO_VERSION);
    buf_printf(b,
               "# HELP kolo_uptime_seconds Seconds since this coordinator started.\n"
               "# TYPE kolo_uptime_seconds gauge\nkolo_uptime_seconds %.3f\n",
               (double)(now_wall_ms() - c->started_ms) / 1000.0);
    buf_printf(b,
               "# HELP kolo_hosts Hosts known to the coordinator, by state.\n"
               "# TYPE kolo_hosts gauge\nkolo_hosts{state=\"alive\"} %d\n"
               "kolo_hosts{state=\"lost\"} %d\n",
               hosts[HOST_ALIVE], hosts[HOST_LOST]);
    buf_printf(b,
               "# HELP kolo_slots Worker slots on live hosts.\n# TYPE kolo_slots gauge\n"
               "kolo_slots{state=\"total\"} %lld\nkolo_slots{state=\"used\"} %lld\n",
               (long long)slots_total, (long long)slots_used);
    buf_puts(b, "# HELP kolo_jobs Jobs by state.\n# TYPE kolo_jobs gauge\n");
    for (int s = 0; s < 5; s++)
        buf_printf(b, "kolo_jobs{state=\"%s\"} %d\n", coord_job_state_name((enum job_state)s),
                   jobs[s]);
    buf_puts(b, "# HELP kolo_rpc_requests_total RPC requests handled, by method.\n"
                "# TYPE kolo_rpc_requests_total counter\n");
    for (int m = 0; m < M_COUNT; m++)
        buf_printf(b, "kolo_rpc_requests_total{method=\"%s\"} %llu\n", method_names[m],
                   (unsigned long long)c->m.rpc_requests[m]);
    buf_puts(b, "# HELP kolo_rpc_errors_total RPC requests answered with an error, by method.\n"
                "# TYPE kolo_rpc_errors_total counter\n");
    for (int m = 0; m < M_COUNT; m++)
        buf_printf(b, "kolo_rpc_errors_total{method=\"%s\"} %llu\n", method_names[m],
                   (unsigned long long)c->m.rpc_errors[m]);
    buf_printf(b,
               "# HELP kolo_rpc_rejected_frames_total Frames refused before dispatch, by "
               "reason.\n# TYPE kolo_rpc_rejected_frames_total counter\n"
               "kolo_rpc_rejected_frames_total{reason=\"malformed\"} %llu\n"
               "kolo_rpc_rejected_frames_total{reason=\"too_big\"} %llu\n"
               "kolo_rpc_rejected_frames_total{reason=\"version\"} %llu\n"
               "kolo_rpc_rejected_frames_total{reason=\"auth\"} %llu\n"
               "kolo_rpc_rejected_frames_total{reason=\"busy\"} %llu\n"
               "# HELP kolo_rpc_connections_closed_total RPC connections the coordinator "
               "closed before they sent a valid request, by reason.\n"
               "# TYPE kolo_rpc_connections_closed_total counter\n"
               "kolo_rpc_connections_closed_total{reason=\"handshake_timeout\"} %llu\n"
               "kolo_rpc_connections_closed_total{reason=\"evicted\"} %llu\n",
               (unsigned long long)st.malformed, (unsigned long long)st.too_big,
               (unsigned long long)st.bad_version, (unsigned long long)st.auth_failed,
               (unsigned long long)st.busy_refused, (unsigned long long)st.conns_timed_out,
               (unsigned long long)st.conns_evicted);
    buf_printf(b,
               "# HELP kolo_auth_failures_total Requests refused for a missing or wrong "
               "token, by listener.\n# TYPE kolo_auth_failures_total counter\n"
               "kolo_auth_failures_total{listener=\"rpc\"} %llu\n"
               "kolo_auth_failures_total{listener=\"http\"} %llu\n",
               (unsigned long long)st.auth_failed, (unsigned long long)c->m.http_auth_failed);
    buf_printf(b,
               "# HELP kolo_agent_registrations_total Agent registrations, by result.\n"
               "# TYPE kolo_agent_registrations_total counter\n"
               "kolo_agent_registrations_total{result=\"new\"} %llu\n"
               "kolo_agent_registrations_total{result=\"reregister\"} %llu\n"
               "kolo_agent_registrations_total{result=\"restart\"} %llu\n"
               "kolo_agent_registrations_total{result=\"refused\"} %llu\n",
               (unsigned long long)c->m.registrations[0], (unsigned long long)c->m.registrations[1],
               (unsigned long long)c->m.registrations[2],
               (unsigned long long)c->m.registrations[3]);
    buf_printf(b,
               "# HELP kolo_heartbeats_rejected_total Heartbeats and reports from unknown or "
               "expired sessions.\n# TYPE kolo_heartbeats_rejected_total counter\n"
               "kolo_heartbeats_rejected_total %llu\n"
               "# HELP kolo_leases_expired_total Host leases that ran out.\n"
               "# TYPE kolo_leases_expired_total counter\nkolo_leases_expired_total %llu\n"
               "# HELP kolo_reports_duplicate_total Agent report batches received twice.\n"
               "# TYPE kolo_reports_duplicate_total counter\nkolo_reports_duplicate_total %llu\n"
               "# HELP kolo_worker_output_lines_total Worker output lines stored.\n"
               "# TYPE kolo_worker_output_lines_total counter\n"
               "kolo_worker_output_lines_total %llu\n"
               "# HELP kolo_stale_generation_rejects_total Worker requests refused for naming an "
               "old generation.\n# TYPE kolo_stale_generation_rejects_total counter\n"
               "kolo_stale_generation_rejects_total %llu\n"
               "# HELP kolo_store_errors_total SQLite operations that failed.\n"
               "# TYPE kolo_store_errors_total counter\nkolo_store_errors_total %llu\n"
               "# HELP kolo_output_writer_pending Agent reports whose output lines the output "
               "writer thread is storing or has queued.\n"
               "# TYPE kolo_output_writer_pending gauge\nkolo_output_writer_pending %zu\n",
               (unsigned long long)c->m.heartbeats_rejected,
               (unsigned long long)c->m.leases_expired, (unsigned long long)c->m.reports_duplicate,
               (unsigned long long)c->m.output_lines, (unsigned long long)c->m.stale_generation,
               (unsigned long long)c->m.store_errors,
               c->out_writer ? coord_writer_pending(c->out_writer) : (size_t)0);
    buf_printf(
        b,
        "# HELP kolo_http_requests_total HTTP requests, by response class.\n"
        "# TYPE kolo_http_requests_total counter\n"
        "kolo_http_requests_total{class=\"2xx\"} %llu\n"
        "kolo_http_requests_total{class=\"4xx\"} %llu\n"
        "kolo_http_requests_total{class=\"5xx\"} %llu\n",
        (unsigned long long)(c->m.http_requests - c->m.http_errors_4xx - c->m.http_errors_5xx),
        (unsigned long long)c->m.http_errors_4xx, (unsigned long long)c->m.http_errors_5xx);
    buf_printf(b,
               "# HELP kolo_http_connections HTTP connections open (sampled every second).\n"
               "# TYPE kolo_http_connections gauge\n"
               "kolo_http_connections %llu\n"
               "# HELP kolo_http_connections_closed_total HTTP connections the coordinator shut "
               "down: idle too long, over the per-address cap, over the total cap.\n"
               "# TYPE kolo_http_connections_closed_total counter\n"
               "kolo_http_connections_closed_total{reason=\"idle\"} %llu\n"
               "kolo_http_connections_closed_total{reason=\"per_source\"} %llu\n"
               "kolo_http_connections_closed_total{reason=\"total\"} %llu\n",
               (unsigned long long)c->m.http_conns,
               (unsigned long long)c->m.http_closed[HTTP_CLOSED_IDLE],
               (unsigned long long)c->m.http_closed[HTTP_CLOSED_PER_SOURCE],
               (unsigned long long)c->m.http_closed[HTTP_CLOSED_TOTAL]);
    int waiting = 0, members = 0;
    for (struct job *j = c->jobs; j; j = j->next) {
        if (j->state != JOB_RUNNING)
            continue;
        waiting += j->el && j->el->waiting;
        members += coord_job_ranks_alive(j);
    }
    buf_printf(b,
               "# HELP kolo_members Workers alive in the current generation of running jobs.\n"
               "# TYPE kolo_members gauge\nkolo_members %d\n"
               "# HELP kolo_membership_changes_total New generations of elastic jobs, by cause.\n"
               "# TYPE kolo_membership_changes_total counter\n"
               "kolo_membership_changes_total{cause=\"failure\"} %llu\n"
               "kolo_membership_changes_total{cause=\"host_lost\"} %llu\n"
               "kolo_membership_changes_total{cause=\"reset\"} %llu\n"
               "kolo_membership_changes_total{cause=\"capacity\"} %llu\n"
               "# HELP kolo_host_exclusions_total Hosts excluded from an elastic job after a "
               "failure.\n# TYPE kolo_host_exclusions_total counter\nkolo_host_exclusions_total %llu\n"
               "# HELP kolo_elastic_jobs_waiting Elastic jobs waiting for min-np slots.\n"
               "# TYPE kolo_elastic_jobs_waiting gauge\nkolo_elastic_jobs_waiting %d\n"
               "# HELP kolo_negotiation_resumes_total Generations whose negotiation was rebuilt "
               "after a coordinator restart.\n# TYPE kolo_negotiation_resumes_total counter\n"
               "kolo_negotiation_resumes_total %llu\n"
               "# HELP kolo_rpc_admin_refused_total Calls (of any kind) refused because they came "
               "from another user to a coordinator without a token.\n# TYPE "
               "kolo_rpc_admin_refused_total counter\nkolo_rpc_admin_refused_total %llu\n"
               "# HELP kolo_rpc_scope_refused_total Calls refused because they were made with "
               "a job's credential beyond that job's worker calls.\n# TYPE "
               "kolo_rpc_scope_refused_total counter\nkolo_rpc_scope_refused_total %llu\n"
               "# HELP kolo_negotiation_sessions_total Sessions started again in a generation "
               "(ranks that called init after a clean shutdown).\n# TYPE "
               "kolo_negotiation_sessions_total counter\nkolo_negotiation_sessions_total %llu\n"
               "# HELP kolo_negotiation_rounds_total Readiness rounds the ranks ran among "
               "themselves (reported by the ranks).\n# TYPE kolo_negotiation_rounds_total "
               "counter\nkolo_negotiation_rounds_total %llu\n"
               "# HELP kolo_negotiation_round_ops_total Operations agreed by readiness rounds, "
               "without a call to the coordinator.\n# TYPE kolo_negotiation_round_ops_total "
               "counter\nkolo_negotiation_round_ops_total %llu\n"
               "# HELP kolo_negotiation_log_ops_total Operations the coordinator negotiated "
               "(answered in a generation's log).\n# TYPE kolo_negotiation_log_ops_total "
               "counter\nkolo_negotiation_log_ops_total %llu\n"
               "# HELP kolo_negotiation_carried_ids_total Response-cache ids that new elastic "
               "generations started with, from the generation before.\n# TYPE "
               "kolo_negotiation_carried_ids_total counter\nkolo_negotiation_carried_ids_total "
               "%llu\n",
               members, (unsigned long long)c->m.resets_by_cause[CAUSE_FAILURE],
               (unsigned long long)c->m.resets_by_cause[CAUSE_HOST_LOST],
               (unsigned long long)c->m.resets_by_cause[CAUSE_RESET],
               (unsigned long long)c->m.resets_by_cause[CAUSE_CAPACITY],
               (unsigned long long)c->m.exclusions, waiting, (unsigned long long)c->m.resumes,
               (unsigned long long)c->m.admin_refused, (unsigned long long)c->m.scope_refused,
               (unsigned long long)c->m.sessions, (unsigned long long)c->m.rounds, (unsigned long long)c->m.round_ops,
               (unsigned long long)c->m.log_ops, (unsigned long long)c->m.carried_ids);
    buf_printf(b, "# HELP kolo_dataplane_rejected_total Data-plane connections the ranks refused "
               "(no proof of the generation's key, another generation, garbage, idle, ...), by "
               "reason.\n# TYPE kolo_dataplane_rejected_total counter\n");
    for (int i = 0; i < COORD_DP_REASONS && c->m.dp_rejected[i].reason[0]; i++)
        buf_printf(b, "kolo_dataplane_rejected_total{reason=\"%s\"} %llu\n",
                   c->m.dp_rejected[i].reason, (unsigned long long)c->m.dp_rejected[i].count);
    coord_hist_render(b, "kolo_negotiation_wait_seconds",
                      "Time from the first rank's request for a tensor to every rank's (the "
                      "slowest rank's lateness).",
                      &c->m.negotiation_wait);
    coord_hist_render(b, "kolo_reset_duration_seconds",
                      "Time from an elastic job's generation closing to every rank of the next "
                      "one joining.",
                      &c->m.reset_duration);
    int degraded = c->m.store_degraded ? 1 : 0;
    buf_printf(b,
               "# HELP kolo_store_degraded 1 while the state store refuses writes (a full or "
               "failing disk): what cannot be stored is refused, not acknowledged.\n"
               "# TYPE kolo_store_degraded gauge\nkolo_store_degraded %d\n"
               "# HELP kolo_degraded 1 while the coordinator cannot rely on its state store "
               "(the same as kolo_store_degraded).\n# TYPE kolo_degraded gauge\n"
               "kolo_degraded %d\n"
               "# HELP kolo_store_cache_bytes Heap SQLite's page cache and schema hold for the "
               "state store (grows with the database up to the cache's cap).\n"
               "# TYPE kolo_store_cache_bytes gauge\nkolo_store_cache_bytes %lld\n",
               degraded, degraded, store_cache_bytes(c->store));
    /* The allocator's view, to tell live memory from pages it holds on
     * to (the soak compares both with RSS). */
    struct mallinfo2 mi = mallinfo2();
    buf_printf(b,
               "# HELP kolo_heap_in_use_bytes Heap the coordinator's allocations hold now.\n"
               "# TYPE kolo_heap_in_use_bytes gauge\nkolo_heap_in_use_bytes %zu\n"
               "# HELP kolo_heap_free_bytes Freed heap the allocator keeps for reuse instead of "
               "returning it to the system.\n"
               "# TYPE kolo_heap_free_bytes gauge\nkolo_heap_free_bytes %zu\n",
               mi.uordblks + mi.hblkhd, mi.fordblks);
    coord_snap_render_metrics(c, b);
    coord_report_render_metrics(c, b); /* issue 6 */
}

/* ---------------------------------------------------------------- mutating routes */

/* Whether the request carries the cluster token as a bearer token. */
static bool bearer_ok(struct coord *c, struct http_req *r)
{
    const char *auth = nng_http_req_get_header(r->req, "Authorization");
    const char *prefix = "Bearer ";
    if (!c->token || !auth || strncmp(auth, prefix, strlen(prefix)) != 0)
        return false;
    const char *given = auth + strlen(prefix);
    uint8_t a[SHA256_LEN], b[SHA256_LEN];
    /* compare digests: constant time whatever the lengths */
    sha256(given, strlen(given), a);
    sha256(c->token, strlen(c->token), b);
    return ct_equal(a, b, SHA256_LEN);
}

const char *coord_dashboard_key(struct coord *c)
{
    if (!c->view_key[0])
        creds_view(c->token ? c->token : c->mesh_secret, c->view_key);
    return c->view_key;
}

static bool view_key_equal(struct coord *c, const char *given, size_t len)
{
    const char *key = coord_dashboard_key(c);
    return len == strlen(key) && ct_equal((const uint8_t *)given, (const uint8_t *)key, len);
}

/* The cookie that holds the view key in a browser: one per port, since
 * browsers share cookies between the ports of a host (every kolo run's
 * embedded coordinator has its own). */
static void view_cookie_name(const struct coord *c, char *out, size_t len)
{
    snprintf(out, len, "kolo_view_%d", c->http_port);
}

/* Whether the request brings the view key: as ?key= (the printed link),
 * as the cookie the dashboard got from that, or as a bearer token. */
static bool view_key_given(struct coord *c, struct http_req *r, bool *in_query)
{
    *in_query = false;
    for (const char *p = r->query; p && *p;) {
        size_t n = strcspn(p, "&");
        if (n > 4 && strncmp(p, "key=", 4) == 0 && view_key_equal(c, p + 4, n - 4))
            return *in_query = true;
        p += n + (p[n] == '&');
    }
    const char *auth = nng_http_req_get_header(r->req, "Authorization");
    if (auth && strncmp(auth, "Bearer ", 7) == 0 && view_key_equal(c, auth + 7, strlen(auth + 7)))
        return true;
    const char *cookies = nng_http_req_get_header(r->req, "Cookie");
    char name[40];
    view_cookie_name(c, name, sizeof name);
    size_t nlen = strlen(name);
    for (const char *p = cookies; p && *p;) {
        while (*p == ' ' || *p == ';')
            p++;
        size_t n = strcspn(p, ";");
        if (n > nlen + 1 && strncmp(p, name, nlen) == 0 && p[nlen] == '=' &&
            view_key_equal(c, p + nlen + 1, n - nlen - 1))
            return true;
        p += n;
    }
    return false;
}

/* What a job runs and prints (argv, cwd, output: a job may print
 * anything, secrets included) is for its owner: whoever holds the token
 * or the view key (issue 28: loopback is not a trust boundary, another
 * user of the host reaches it too). Timings, states and events stay open. */
static bool http_reader_trusted(struct coord *c, struct http_req *r)
{
    return r->viewer || bearer_ok(c, r);
}

static bool http_authorized(struct coord *c, struct http_req *r, struct http_out *o)
{
    if (!c->token) {
        out_json_error(o, 403,
                       "this route changes state and the coordinator has no cluster token; start "
                       "it with --token-file to enable it");
        return false;
    }
    bool ok = bearer_ok(c, r);
    if (!ok) {
        c->m.http_auth_failed++;
        out_json_error(o, 401, "missing or wrong 'Authorization: Bearer <token>'");
        o->www_auth = true;
    }
    return ok;
}

static const char *json_str_member(const struct json *obj, const char *key, bool *bad)
{
    const struct json *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL)
        return NULL;
    if (v->type != JSON_STRING) {
        *bad = true;
        return NULL;
    }
    return v->str;
}

/* The elastic fields of a submission: "elastic" (bool), "min_np",
 * "max_np", "reset_limit", "elastic_timeout_ms", "slots_per_host",
 * "blacklist_cooldown_range" ([lo, hi] seconds), "host_discovery_script".
 * Returns a problem text, or NULL. */
static const char *parse_elastic(const struct json *root, struct elastic_opts *eo)
{
    static const struct {
        const char *key;
        int64_t max;
    } ints[] = {{"min_np", 65536},       {"max_np", 65536},
                {"reset_limit", 1000000}, {"elastic_timeout_ms", 86400000LL * 30},
                {"slots_per_host", 65536}};
    int64_t v[5] = {0};
    for (int i = 0; i < 5; i++) {
        const struct json *x = json_get(root, ints[i].key);
        if (x && (!json_as_int(x, &v[i]) || v[i] < 0 || v[i] > ints[i].max))
            return "\"min_np\", \"max_np\", \"reset_limit\", \"elastic_timeout_ms\" and "
                   "\"slots_per_host\" must be non-negative integers in range";
    }
    const struct json *e = json_get(root, "elastic");
    if (e && e->type != JSON_BOOL)
        return "\"elastic\" must be true or false";
    const struct json *cr = json_get(root, "blacklist_cooldown_range");
    int64_t lo = 0, hi = 0;
    if (cr && (cr->type != JSON_ARRAY || cr->count != 2 || !json_as_int(json_at(cr, 0), &lo) ||
               !json_as_int(json_at(cr, 1), &hi) || lo < 0 || hi < 0 || lo > 3600 || hi > 3600))
        return "\"blacklist_cooldown_range\" must be [lo, hi] in seconds";
    const struct json *ds = json_get(root, "host_discovery_script");
    if (ds && ds->type != JSON_STRING)
        return "\"host_discovery_script\" must be a string";
    const struct json *sp = json_get(root, "straggler_policy");
    if (sp && sp->type != JSON_STRING)
        return "\"straggler_policy\" must be \"warn\" or \"exclude\"";
    const struct json *sw = json_get(root, "straggler_window_ms");
    int64_t window = 0;
    if (sw && (!json_as_int(sw, &window) || window < 1000 || window > 86400000LL))
        return "\"straggler_window_ms\" must be an integer from 1000 to 86400000";
    const struct json *spv = json_get(root, "spares");
    int64_t spares = 0;
    if (spv && (!json_as_int(spv, &spares) || spares < 0 || spares > 1024))
        return "\"spares\" must be an integer from 0 to 1024";
    eo->spares = (int)spares;
    eo->straggler_policy = sp ? sp->str : NULL;
    eo->straggler_window_ms = (uint32_t)window;
    eo->min_np = (int)v[0];
    eo->max_np = (int)v[1];
    eo->reset_limit = (int)v[2];
    eo->timeout_ms = (uint32_t)v[3];
    eo->slots_per_host = (int)v[4];
    eo->cooldown_lo_s = (uint32_t)lo;
    eo->cooldown_hi_s = (uint32_t)hi;
    eo->discovery = ds ? ds->str : NULL;
    /* Any elastic field makes the job elastic, as --min-np does for horovodrun. */
    eo->elastic = (e && e->b) || v[0] || v[1] || (ds && ds->str[0]);
    return NULL;
}

static void route_submit(struct coord *c, struct http_req *r, struct http_out *o)
{
    struct json *root = NULL;
    char err[512];
    if (json_parse(r->body, r->body_len, &root, err, sizeof(err)) != 0) {
        char msg[600];
        snprintf(msg, sizeof(msg), "malformed JSON: %s", err);
        out_json_error(o, 400, msg);
        return;
    }
    char **argv = NULL, **env = NULL, **meta = NULL;
    int argc = 0, nenv = 0, nmeta = 0;
    bool bad = false;
    const char *problem = NULL;
    if (root->type != JSON_OBJECT) {
        problem = "the body must be a JSON object";
        goto out;
    }
    const struct json *jargv = json_get(root, "argv");
    if (!jargv || jargv->type != JSON_ARRAY || jargv->count == 0 || jargv->count > HTTP_MAX_ARGS) {
        problem = "\"argv\" must be a non-empty array of strings";
        goto out;
    }
    argv = calloc(jargv->count + 1, sizeof(char *));
    for (const struct json *e = jargv->child; e && argv; e = e->next) {
        if (e->type != JSON_STRING || strlen(e->str) != e->str_len) {
            problem = "\"argv\" must be a non-empty array of strings";
            goto out;
        }
        argv[argc++] = e->str;
    }
    int64_t np = 0;
    const struct json *jnp = json_get(root, "np");
    if (!jnp || !json_as_int(jnp, &np) || np < 1 || np > COORD_MAX_NP) {
        problem = "\"np\" must be an integer between 1 and 65536";
        goto out;
    }
    const struct json *jenv = json_get(root, "env"), *jmeta = json_get(root, "metadata");
    const char *key;
    if (jenv && jenv->type != JSON_NULL && json_strings_kv(jenv, &env, &nenv, &key)) {
        problem = jenv->type != JSON_OBJECT ? "\"env\" must be an object of strings"
                                            : "\"env\" values must be strings";
        goto out;
    }
    if (jmeta && jmeta->type != JSON_NULL && json_strings_kv(jmeta, &meta, &nmeta, &key)) {
        problem = jmeta->type != JSON_OBJECT ? "\"metadata\" must be an object of strings"
                                             : "\"metadata\" values must be strings";
        goto out;
    }
    const char *cwd = json_str_member(root, "cwd", &bad);
    const char *hosts = json_str_member(root, "hosts", &bad);
    const char *name = json_str_member(root, "name", &bad);
    if (bad) {
        problem = "\"cwd\", \"hosts\" and \"name\" must be strings";
        goto out;
    }
    int64_t timeout_ms = 0;
    const struct json *jt = json_get(root, "start_timeout_ms");
    if (jt && (!json_as_int(jt, &timeout_ms) || timeout_ms < 0 || timeout_ms > 86400000LL * 30)) {
        problem = "\"start_timeout_ms\" must be a non-negative integer";
        goto out;
    }
    struct elastic_opts eo = {0};
    if ((problem = parse_elastic(root, &eo)) != NULL)
        goto out;
    uint64_t id = 0;
    struct job_request rq = {.argv = argv,
                             .argc = argc,
                             .env = env,
                             .nenv = nenv,
                             .cwd = cwd,
                             .np = (int)np,
                             .hosts = hosts,
                             .name = name,
                             .start_timeout_ms = (uint32_t)timeout_ms,
                             .eo = &eo,
                             .meta = meta,
                             .nmeta = nmeta};
    int rv = coord_job_submit(c, &rq, &id, err, sizeof(err));
    if (rv) {
        /* 507: the job could not be stored (a full disk), so it was not
         * accepted; try again once space is back */
        out_json_error(o, rv == KOLO_EINVAL ? 400 : rv == KOLO_ESTORE ? 507 : 500, err);
        goto out;
    }
    struct job *j = coord_job_find(c, id);
    struct jw w;
    o->status = 201;
    o->content_type = "application/json";
    jw_init(&w, &o->body);
    render_job(c, &w, j, true);
    buf_putc(&o->body, '\n');
out:
    if (problem)
        out_json_error(o, 400, problem);
    json_kv_free(env, nenv);
    json_kv_free(meta, nmeta);
    free(argv);
    json_free(root);
}

/* ---------------------------------------------------------------- static files */

/* The dashboard: from --dashboard-dir when one is given (to work on the
 * pages without rebuilding), else the copy compiled into the binary. */
static void route_static(struct coord *c, struct http_req *r, struct http_out *o)
{
    const char *rel = strcmp(r->path, "/") == 0 ? "/index.html" : r->path;
    if (strstr(rel, "..") || strchr(rel, '\\')) {
        out_json_error(o, 404, "no such route");
        return;
    }
    if (!c->dashboard_dir) {
        const struct static_file *f = static_file_find(rel);
        if (!f) {
            out_json_error(o, 404, "no such route");
            return;
        }
        o->status = 200;
        o->content_type = static_content_type(f->path);
        buf_append(&o->body, f->data, f->len);
        return;
    }
    char full[1024];
    snprintf(full, sizeof(full), "%s%s", c->dashboard_dir, rel);
    char *data = NULL;
    size_t len = 0;
    struct stat sb;
    if (stat(full, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        read_file_all(full, &data, &len, 16u << 20) != 0) {
        out_json_error(o, 404, "no such route");
        return;
    }
    o->status = 200;
    o->content_type = static_content_type(full);
    buf_append(&o->body, data, len);
    free(data);
}

/* ---------------------------------------------------------------- routes */

/*
 * A request on its way through the table: the route's captures are
 * resolved (the job or host they name, NULL if none) before its handler
 * runs. A handler answers into o; it returns true when it rendered a JSON
 * document into w, which then gets its closing newline.
 */
struct route_req {
    struct coord *c;
    struct http_req *r;
    struct http_out *o;
    struct jw w;
    struct job *job;   /* :job */
    struct host *host; /* :host */
    char study[STUDY_NAME_MAX + 1]; /* :study, URL-decoded */
};

static bool get_healthz(struct route_req *x)
{
    /* 503 while the store refuses writes: a readiness probe takes the
     * coordinator out until it stores again */
    struct coord *c = x->c;
    jw_obj_begin(&x->w);
    jw_kstr(&x->w, "status", c->m.store_degraded ? "degraded" : "ok");
    if (c->m.store_degraded) {
        x->o->status = 503;
        jw_kstr(&x->w, "reason", c->m.store_why);
    }
    jw_kstr(&x->w, "version", KOLO_VERSION);
    jw_kstr(&x->w, "instance", c->instance);
    jw_kuint(&x->w, "uptime_ms", now_wall_ms() - c->started_ms);
    jw_obj_end(&x->w);
    return true;
}

static bool get_metrics(struct route_req *x)
{
    x->o->content_type = "text/plain; version=0.0.4; charset=utf-8";
    render_metrics(x->c, &x->o->body);
    return false;
}

static bool get_hosts(struct route_req *x)
{
    jw_obj_begin(&x->w);
    jw_key(&x->w, "hosts");
    jw_arr_begin(&x->w);
    for (struct host *h = x->c->hosts; h; h = h->next)
        render_host(x->c, &x->w, h);
    jw_arr_end(&x->w);
    jw_obj_end(&x->w);
    return true;
}

static bool drain_host(struct route_req *x, bool drain)
{
    coord_host_drain(x->c, x->host, drain, false, "the REST API");
    render_host(x->c, &x->w, x->host);
    return true;
}

static bool post_host_drain(struct route_req *x)
{
    return drain_host(x, true);
}

static bool post_host_undrain(struct route_req *x)
{
    return drain_host(x, false);
}

/* The newest events (of one job, or of all when job is 0). */
static bool render_events(struct route_req *x, uint64_t job, uint64_t default_limit)
{
    uint64_t limit = default_limit;
    if (!query_param(x->r->query, "limit", 1, 10000, &limit, x->o))
        return false;
    jw_obj_begin(&x->w);
    jw_key(&x->w, "events");
    jw_arr_begin(&x->w);
    struct event_ctx ec = {&x->w, job, (int)limit};
    coord_read(x->c, read_events, &ec);
    jw_arr_end(&x->w);
    jw_obj_end(&x->w);
    return true;
}

static bool get_events(struct route_req *x)
{
    uint64_t job = 0;
    if (!query_param(x->r->query, "job", 1, INT64_MAX, &job, x->o))
        return false;
    if (job && !coord_job_find(x->c, job)) {
        out_json_error(x->o, 404, "no such job");
        return false;
    }
    return render_events(x, job, 100);
}

static bool get_jobs(struct route_req *x)
{
    jw_obj_begin(&x->w);
    jw_key(&x->w, "jobs");
    jw_arr_begin(&x->w);
    bool full = http_reader_trusted(x->c, x->r);
    for (struct job *j = x->c->jobs; j; j = j->next) {
        jw_obj_begin(&x->w);
        render_job_summary(&x->w, j, full);
        jw_obj_end(&x->w);
    }
    jw_arr_end(&x->w);
    jw_obj_end(&x->w);
    return true;
}

static bool post_jobs(struct route_req *x)
{
    route_submit(x->c, x->r, x->o);
    return false;
}

static bool get_job(struct route_req *x)
{
    render_job(x->c, &x->w, x->job, http_reader_trusted(x->c, x->r));
    return true;
}

#define STOP_REASON_MAX 512

/* POST /jobs/{id}/stop; an optional body {"reason": "..."} says why (kolo
 * tune's "pruned ..." marks a pruned trial). */
static bool post_job_stop(struct route_req *x)
{
    const char *reason = "stopped through the REST API";
    struct json *root = NULL;
    char err[128];
    if (x->r->body_len) {
        if (json_parse(x->r->body, x->r->body_len, &root, err, sizeof err) != 0 ||
            root->type != JSON_OBJECT) {
            json_free(root);
            out_json_error(x->o, 400, "the body must be a JSON object such as {\"reason\": \"...\"}");
            return false;
        }
        bool bad = false;
        const char *r = json_str_member(root, "reason", &bad);
        if (bad || (r && strlen(r) > STOP_REASON_MAX)) {
            json_free(root);
            snprintf(err, sizeof err, "\"reason\" must be a string of at most %d bytes",
                     STOP_REASON_MAX);
            out_json_error(x->o, 400, err);
            return false;
        }
        if (r && r[0])
            reason = r;
    }
    int rv = coord_job_stop(x->c, x->job, reason);
    json_free(root);
    if (rv == KOLO_ESTATE) {
        out_json_error(x->o, 409, "the job has already ended");
        return false;
    }
    render_job(x->c, &x->w, x->job, true);
    return true;
}

static bool get_job_output(struct route_req *x)
{
    if (!http_reader_trusted(x->c, x->r)) {
        out_json_error(x->o, 401, "a job's output is shown to its owner only: open the "
                                  "dashboard from the link kolo printed (it carries the "
                                  "key), or send 'Authorization: Bearer <token>'");
        x->o->www_auth = true;
        return false;
    }
    uint64_t after = 0, limit = 1000;
    if (!query_param(x->r->query, "after", 0, INT64_MAX, &after, x->o) ||
        !query_param(x->r->query, "limit", 1, 10000, &limit, x->o))
        return false;
    struct output_ctx oc = {&x->w, after, x->job->id, (int)limit};
    jw_obj_begin(&x->w);
    jw_key(&x->w, "lines");
    jw_arr_begin(&x->w);
    coord_read(x->c, read_output, &oc); /* the lock released: up to 10,000 lines */
    jw_arr_end(&x->w);
    jw_kuint(&x->w, "next", oc.last);
    jw_obj_end(&x->w);
    return true;
}

/* A rank's stacks show the user's code: like its output, its owner's. */
static bool stacks_reader(struct route_req *x)
{
    if (http_reader_trusted(x->c, x->r))
        return true;
    out_json_error(x->o, 401, "a job's stacks are shown to its owner only: open the dashboard "
                              "from the link kolo printed (it carries the key), or send "
                              "'Authorization: Bearer <token>'");
    x->o->www_auth = true;
    return false;
}

struct stacks_ctx {
    struct jw *w;
    uint64_t job;
    int limit, n;
};

static int read_stacks(struct store *st, void *arg)
{
    struct stacks_ctx *sc = arg;
    sc->n = coord_stacks_kept_json(st, sc->w, sc->job, sc->limit);
    return sc->n < 0 ? sc->n : 0;
}

/* The stacks kept with the job, newest first: taken before a stop, at a
 * stall, for a frozen rank, or on request (POST). */
static bool get_job_stacks(struct route_req *x)
{
    uint64_t limit = 4;
    if (!stacks_reader(x) || !query_param(x->r->query, "limit", 1, 8, &limit, x->o))
        return false;
    struct stacks_ctx sc = {&x->w, x->job->id, (int)limit, 0};
    jw_obj_begin(&x->w);
    jw_kbool(&x->w, "taking", x->job->stacks != NULL);
    jw_key(&x->w, "stacks");
    coord_read(x->c, read_stacks, &sc); /* the lock released */
    jw_obj_end(&x->w);
    return true;
}

/* Takes the running job's stacks now; they are kept with it and GET
 * shows them within a few seconds. */
static bool post_job_stacks(struct route_req *x)
{
    if (!stacks_reader(x))
        return false;
    if (x->job->state != JOB_RUNNING) {
        out_json_error(x->o, 409, "only a running job's ranks have stacks: GET shows the ones "
                                  "kept with it");
        return false;
    }
    coord_stacks_take(x->c, x->job, "on request (REST)");
    x->o->status = 202;
    jw_obj_begin(&x->w);
    jw_kbool(&x->w, "taking", x->job->stacks != NULL);
    jw_obj_end(&x->w);
    return true;
}

static bool get_job_stalls(struct route_req *x)
{
    uint64_t min_age = 1000;
    if (!query_param(x->r->query, "min_age_ms", 0, INT64_MAX, &min_age, x->o))
        return false;
    size_t n = coord_negot_stalls(x->job, min_age, NULL, 0);
    struct negot_stall *stalls = calloc(n ? n : 1, sizeof(*stalls));
    if (!stalls) {
        out_json_error(x->o, 500, "out of memory");
        return false;
    }
    n = coord_negot_stalls(x->job, min_age, stalls, n);
    jw_obj_begin(&x->w);
    jw_kuint(&x->w, "generation", x->job->generation);
    jw_key(&x->w, "stalls");
    jw_arr_begin(&x->w);
    for (size_t i = 0; i < n; i++) {
        jw_obj_begin(&x->w);
        jw_kstr(&x->w, "name", stalls[i].name);
        jw_kuint(&x->w, "waiting_ms", stalls[i].waiting_ms);
        jw_kint(&x->w, "submitted", stalls[i].submitted);
        jw_key(&x->w, "missing_ranks");
        jw_arr_begin(&x->w);
        for (int r = 0; r < stalls[i].size; r++)
            if (coord_negot_stall_missing(&stalls[i], r))
                jw_int(&x->w, r);
        jw_arr_end(&x->w);
        jw_obj_end(&x->w);
    }
    jw_arr_end(&x->w);
    jw_obj_end(&x->w);
    free(stalls);
    return true;
}

static bool get_job_generations(struct route_req *x)
{
    jw_obj_begin(&x->w);
    jw_kuint(&x->w, "current", x->job->generation);
    jw_key(&x->w, "generations");
    jw_arr_begin(&x->w);
    if (store_generations_each(x->c->store, x->job->id, render_generation_cb, &x->w) < 0) {
        out_json_error(x->o, 500, "cannot read the generations");
        return false;
    }
    jw_arr_end(&x->w);
    jw_obj_end(&x->w);
    return true;
}

/* older: the snapshot listed after s (the previous commit), or NULL. */
static void render_snapshot(struct jw *w, const struct store_snapshot *s,
                            const struct store_snapshot *older)
{
    jw_obj_begin(w);
    jw_kuint(w, "id", s->id);
    jw_kuint(w, "generation", s->generation);
    jw_kint(w, "rank", s->rank);
    jw_kuint(w, "bytes", s->total_bytes);
    jw_kuint(w, "chunks", s->nchunks);
    jw_kstr(w, "sha256", s->checksum);
    jw_kuint(w, "created_ms", s->created_ms);
    jw_kuint(w, "duration_ms", s->duration_ms);
    jw_key(w, "interval_ms");
    if (older && s->created_ms >= older->created_ms)
        jw_uint(w, s->created_ms - older->created_ms);
    else if (older) /* the wall clock went back */
        jw_int(w, -(int64_t)(older->created_ms - s->created_ms));
    else
        jw_null(w);
    jw_key(w, "meta");
    /* metadata is stored as text; REST returns it as JSON */
    if (!jw_json_text(w, s->meta_json))
        jw_str(w, s->meta_json);
    jw_obj_end(w);
}

static bool get_job_snapshots(struct route_req *x)
{
    struct snap_list l = {0};
    struct snap_upload_info up[SNAP_MAX_UPLOADS];
    coord_snap_list(x->c, x->job->id, &l); /* a failure lists what was read */
    size_t nup = coord_snap_uploads(x->c, x->job->id, up, SNAP_MAX_UPLOADS);
    struct jw *w = &x->w;
    jw_obj_begin(w);
    jw_kuint(w, "job", x->job->id);
    jw_kint(w, "keep", coord_snap_keep(x->c));
    jw_key(w, "snapshots");
    jw_arr_begin(w);
    for (size_t i = 0; i < l.n; i++)
        render_snapshot(w, &l.v[i], i + 1 < l.n ? &l.v[i + 1] : NULL);
    jw_arr_end(w);
    jw_key(w, "uploads");
    jw_arr_begin(w);
    for (size_t i = 0; i < nup; i++) {
        char id[17];
        snprintf(id, sizeof id, "%016" PRIx64, up[i].upload_id);
        jw_obj_begin(w);
        jw_kstr(w, "upload_id", id);
        jw_kint(w, "rank", up[i].rank);
        jw_kuint(w, "chunks_received", up[i].chunks_received);
        jw_kuint(w, "chunks", up[i].chunks);
        jw_kuint(w, "bytes_received", up[i].bytes_received);
        jw_kuint(w, "bytes", up[i].bytes);
        jw_kuint(w, "age_ms", up[i].age_ms);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
    coord_snap_list_free(&l);
    return true;
}

/* /epochs, /steps and /ranks: coord_report.c */
static bool get_job_report(struct route_req *x)
{
    char why[300];
    const char *sub = strrchr(x->r->path, '/');
    int status = coord_http_report(x->c, x->job, sub, x->r->query, &x->w, why, sizeof why);
    if (status != 200) {
        out_json_error(x->o, status, why);
        return false;
    }
    return true;
}

/* GET /studies (no :study captured) and /studies/{name} */
static bool get_study(struct route_req *x)
{
    char why[300];
    int status = coord_http_study(x->c, x->study[0] ? x->study : NULL, &x->w, why, sizeof why);
    if (status != 200) {
        out_json_error(x->o, status, why);
        return false;
    }
    return true;
}

static bool get_job_timeline(struct route_req *x)
{
    char why[700];
    int status = coord_timeline_serve(x->c, x->job, &x->o->body, why, sizeof why);
    if (status != 200)
        out_json_error(x->o, status, why);
    return false;
}

static bool get_job_events(struct route_req *x)
{
    return render_events(x, x->job->id, 1000);
}

/* Bits of route.flags. */
enum {
    ROUTE_ADMIN = 1, /* changes state: needs the token (http_authorized) */
};

/* Patterns are paths whose ":job" and ":host" segments capture an id. */
struct route {
    const char *method;
    const char *pattern;
    unsigned flags;
    bool (*handler)(struct route_req *x);
};

static const struct route routes[] = {
    {"GET", "/healthz", 0, get_healthz},
    {"GET", "/metrics", 0, get_metrics},
    {"GET", "/api/v1/hosts", 0, get_hosts},
    {"POST", "/api/v1/hosts/:host/drain", ROUTE_ADMIN, post_host_drain},
    {"POST", "/api/v1/hosts/:host/undrain", ROUTE_ADMIN, post_host_undrain},
    {"GET", "/api/v1/events", 0, get_events},
    {"GET", "/api/v1/jobs", 0, get_jobs},
    {"POST", "/api/v1/jobs", ROUTE_ADMIN, post_jobs},
    {"GET", "/api/v1/jobs/:job", 0, get_job},
    {"POST", "/api/v1/jobs/:job/stop", ROUTE_ADMIN, post_job_stop},
    {"GET", "/api/v1/jobs/:job/output", 0, get_job_output},
    {"GET", "/api/v1/jobs/:job/events", 0, get_job_events},
    {"GET", "/api/v1/jobs/:job/stalls", 0, get_job_stalls},
    {"GET", "/api/v1/jobs/:job/stacks", 0, get_job_stacks},
    {"POST", "/api/v1/jobs/:job/stacks", 0, post_job_stacks},
    {"GET", "/api/v1/jobs/:job/snapshots", 0, get_job_snapshots},
    {"GET", "/api/v1/jobs/:job/generations", 0, get_job_generations},
    {"GET", "/api/v1/jobs/:job/epochs", 0, get_job_report},
    {"GET", "/api/v1/jobs/:job/steps", 0, get_job_report},
    {"GET", "/api/v1/jobs/:job/ranks", 0, get_job_report},
    {"GET", "/api/v1/jobs/:job/timeline", 0, get_job_timeline},
    {"GET", "/api/v1/studies", 0, get_study},
    {"GET", "/api/v1/studies/:study", 0, get_study},
};

/* the longest capture: a study name, every byte %-encoded */
#define ROUTE_CAPTURE_MAX (3 * STUDY_NAME_MAX + 1)

/* Matches path against pattern; a ":name" segment matches one segment
 * (empty included: its lookup fails), copied into cap. */
static bool route_match(const char *pattern, const char *path, char *cap, size_t caplen)
{
    cap[0] = '\0';
    while (*pattern && *path) {
        if (*pattern == ':') {
            size_t n = strcspn(path, "/");
            pattern += strcspn(pattern, "/");
            if (n >= caplen)
                n = caplen - 1; /* too long for any id: its lookup fails */
            memcpy(cap, path, n);
            cap[n] = '\0';
            path += strcspn(path, "/");
            continue;
        }
        if (*pattern++ != *path++)
            return false;
    }
    return *pattern == '\0' && *path == '\0';
}

static bool method_matches(const char *route_method, const char *method)
{
    return strcmp(route_method, method) == 0 ||
           (strcmp(route_method, "GET") == 0 && strcmp(method, "HEAD") == 0);
}

/* Resolves the route's capture; false (with a 404 answered) when the job
 * or host it names does not exist. */
static bool route_resolve(struct route_req *x, const struct route *rt, const char *cap)
{
    if (strstr(rt->pattern, ":job")) {
        uint64_t id = 0;
        x->job = parse_id(cap, &id) ? coord_job_find(x->c, id) : NULL;
        if (!x->job) {
            out_json_error(x->o, 404, "no such job");
            return false;
        }
    } else if (strstr(rt->pattern, ":study")) {
        bool whole = url_decode(cap, strlen(cap), false, x->study, sizeof x->study);
        if (!whole || !x->study[0] || strlen(cap) >= ROUTE_CAPTURE_MAX - 1) {
            out_json_error(x->o, 404, "no such study");
            return false;
        }
    } else if (strstr(rt->pattern, ":host")) {
        x->host = cap[0] ? coord_host_named(x->c, cap) : NULL;
        if (!x->host) {
            out_json_error(x->o, 404, "no such host");
            return false;
        }
    }
    return true;
}

/* The route for r: a path in the table with another method answers 405
 * with the methods it takes; an unknown /api/ path 404; anything else is a
 * dashboard file. */
static void route(struct coord *c, struct http_req *r, struct http_out *o)
{
    o->status = 200;
    o->content_type = "application/json";
    char cap[ROUTE_CAPTURE_MAX], allow[64] = "";
    const struct route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !rt; i++) {
        if (!route_match(routes[i].pattern, r->path, cap, sizeof cap))
            continue;
        if (method_matches(routes[i].method, r->method))
            rt = &routes[i];
        else
            snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s",
                     allow[0] ? ", " : "", routes[i].method);
    }
    if (!rt && allow[0]) {
        out_json_error(o, 405, "method not allowed on this route");
        str_copy(o->allow, allow, sizeof o->allow);
        return;
    }
    if (!rt) {
        if (strncmp(r->path, "/api/", 5) == 0)
            out_json_error(o, 404, "no such route");
        else if (!method_matches("GET", r->method)) {
            out_json_error(o, 405, "method not allowed on this route");
            str_copy(o->allow, "GET", sizeof o->allow);
        } else
            route_static(c, r, o);
        return;
    }
    if ((rt->flags & ROUTE_ADMIN) && !http_authorized(c, r, o))
        return;
    struct route_req x = {.c = c, .r = r, .o = o};
    if (!route_resolve(&x, rt, cap))
        return;
    jw_init(&x.w, &o->body);
    if (rt->handler(&x))
        buf_putc(&o->body, '\n');
}

void coord_http_handle(struct coord *c, nng_aio *aio)
{
    nng_http_req *req = nng_aio_get_input(aio, 0);
    struct http_req r = {0};
    struct http_out o = {0};
    buf_init(&o.body);
    r.req = req;
    r.method = nng_http_req_get_method(req);
    const char *uri = nng_http_req_get_uri(req);
    const char *q = strchr(uri, '?');
    size_t plen = q ? (size_t)(q - uri) : strlen(uri);
    void *body;
    size_t blen;
    nng_http_req_get_data(req, &body, &blen);
    r.body = body ? body : "";
    r.body_len = blen;
    c->m.http_requests++;
    if (plen >= sizeof(r.path) || (q && strlen(q + 1) >= sizeof(r.query))) {
        out_json_error(&o, 414, "URI too long");
    } else {
        memcpy(r.path, uri, plen);
        r.path[plen] = '\0';
        if (q)
            str_copy(r.query, q + 1, sizeof(r.query));
        /* trailing slash tolerated on API routes */
        if (plen > 1 && r.path[plen - 1] == '/' && strncmp(r.path, "/api/", 5) == 0)
            r.path[plen - 1] = '\0';
        r.viewer = view_key_given(c, &r, &o.set_cookie);
        route(c, &r, &o);
    }
    if (o.status >= 500)
        c->m.http_errors_5xx++;
    else if (o.status >= 400)
        c->m.http_errors_4xx++;

    nng_http_res *res;
    if (o.body.oom || nng_http_res_alloc(&res) != 0) {
        buf_free(&o.body);
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    nng_http_res_set_status(res, (uint16_t)o.status);
    nng_http_res_set_header(res, "Content-Type", o.content_type ? o.content_type : "text/plain");
    nng_http_res_set_header(res, "Cache-Control", "no-store");
    nng_http_res_set_header(res, "X-Content-Type-Options", "nosniff");
    if (o.allow[0])
        nng_http_res_set_header(res, "Allow", o.allow);
    if (o.www_auth)
        nng_http_res_set_header(res, "WWW-Authenticate", "Bearer realm=\"kolo\"");
    if (o.set_cookie) {
        char name[40], cookie[160];
        view_cookie_name(c, name, sizeof name);
        snprintf(cookie, sizeof cookie, "%s=%s; Path=/; HttpOnly; SameSite=Strict%s", name,
                 coord_dashboard_key(c), tls_files_on(&c->tls) ? "; Secure" : "");
        nng_http_res_set_header(res, "Set-Cookie", cookie);
    }
    if (strcmp(r.method ? r.method : "", "HEAD") != 0)
        nng_http_res_copy_data(res, o.body.data ? o.body.data : "", o.body.len);
    buf_free(&o.body);
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static void http_cb(nng_aio *aio)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    struct coord *c = nng_http_handler_get_data(h);
    struct work *w = calloc(1, sizeof(*w));
    if (!w) {
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    w->kind = WORK_HTTP;
    w->aio = aio;
    coord_post(c, w);
}

int coord_http_start(struct coord *c, char *err, size_t errlen)
{
    char urltext[300];
    nng_url *url = NULL;
    nng_http_handler *h = NULL;
    int rv;
    nng_tls_config *tc = NULL;
    bool tls = tls_files_on(&c->tls);
    snprintf(urltext, sizeof(urltext), "%s://%s", tls ? "https" : "http", c->http_addr);
    if (tls && tls_config_new(&tc, TLS_HTTP_SERVER, &c->tls, NULL, err, errlen) != 0)
        return KOLO_EINVAL;
    if ((rv = nng_url_parse(&url, urltext)) != 0) {
        if (tc)
            nng_tls_config_free(tc);
        snprintf(err, errlen, "invalid HTTP address '%s' (want ADDR:PORT)", c->http_addr);
        return KOLO_EINVAL;
    }
    if ((rv = nng_http_server_hold(&c->http, url)) != 0 ||
        (rv = nng_http_handler_alloc(&h, "/", http_cb)) != 0) {
        snprintf(err, errlen, "cannot create the HTTP server on %s: %s", c->http_addr,
                 nng_strerror(rv));
        goto fail;
    }
    if (tc && (rv = nng_http_server_set_tls(c->http, tc)) != 0) {
        snprintf(err, errlen, "cannot serve HTTPS on %s: %s", c->http_addr, nng_strerror(rv));
        goto fail;
    }
    nng_http_handler_set_method(h, NULL);
    nng_http_handler_set_tree(h);
    nng_http_handler_collect_body(h, true, HTTP_MAX_BODY);
    nng_http_handler_set_data(h, c, NULL);
    if ((rv = nng_http_server_add_handler(c->http, h)) != 0) {
        nng_http_handler_free(h);
        snprintf(err, errlen, "cannot add the HTTP handler: %s", nng_strerror(rv));
        goto fail;
    }
    if ((rv = nng_http_server_start(c->http)) != 0) {
        snprintf(err, errlen, "cannot serve HTTP on %s: %s", c->http_addr, nng_strerror(rv));
        goto fail;
    }
    nng_sockaddr sa;
    int port = 0;
    if (nng_http_server_get_addr(c->http, &sa) == 0 && sa.s_family == NNG_AF_INET)
        port = ((sa.s_in.sa_port & 0xff) << 8) | (sa.s_in.sa_port >> 8);
    else if (nng_http_server_get_addr(c->http, &sa) == 0 && sa.s_family == NNG_AF_INET6)
        port = ((sa.s_in6.sa_port & 0xff) << 8) | (sa.s_in6.sa_port >> 8);
    snprintf(c->http_url, sizeof(c->http_url), "%s://%s:%d", tls ? "https" : "http",
             url->u_hostname, port);
    c->http_port = port;
    nng_url_free(url);
    if (tc)
        nng_tls_config_free(tc); /* the server holds its own reference */
    return 0;
fail:
    if (tc)
        nng_tls_config_free(tc);
    if (c->http) {
        nng_http_server_release(c->http);
        c->http = NULL;
    }
    nng_url_free(url);
    return KOLO_EIO;
}

/*
 * nng_http_server_stop closes every connection and then waits, without a
 * deadline, until nng's reaper thread has finished each; the handlers
 * themselves never keep an aio (coord_post answers at once, 503 once the
 * coordinator drains). nng 1.5's reaper can wait forever on an aio whose
 * task was prepared but never ran (nng issues 1236, 1598 and 1813, fixed
 * in 1.8), and one reaper stuck stops every later reap: a SIGTERM once
 * waited 50 minutes there. So the stop runs on a helper thread, waited
 * for at most HTTP_STOP_MS; past that the server and the helper are left
 * behind, logged, and the caller keeps what a late callback touches.
 */
struct http_stopper {
    nng_http_server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, abandoned;
};

static void *http_stop_main(void *arg)
{
    thread_name("kolo-http-stop");
    struct http_stopper *s = arg;
    nng_http_server_stop(s->srv);
    nng_http_server_release(s->srv);
    pthread_mutex_lock(&s->mu);
    s->done = true;
    bool abandoned = s->abandoned;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (abandoned) { /* nobody waits for it any more: the helper frees it */
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
    }
    return NULL;
}

void coord_http_stop(struct coord *c)
{
    if (!c->http)
        return;
    struct http_stopper *s = calloc(1, sizeof(*s));
    pthread_t t;
    if (s) {
        s->srv = c->http;
        pthread_mutex_init(&s->mu, NULL);
        cond_init_monotonic(&s->cv);
    }
    if (!s || pthread_create(&t, NULL, http_stop_main, s) != 0) {
        if (s) {
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->cv);
            free(s);
        }
        nng_http_server_stop(c->http); /* no thread to spare: unbounded */
        nng_http_server_release(c->http);
        c->http = NULL;
        return;
    }
    c->http = NULL;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += HTTP_STOP_MS / 1000;
    ts.tv_nsec += (HTTP_STOP_MS % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    while (!s->done && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
        ;
    bool done = s->done;
    s->abandoned = !done;
    pthread_mutex_unlock(&s->mu);
    if (done) {
        pthread_join(t, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return;
    }
    pthread_detach(t);
    c->http_left = true;
    LOGW("coord", "the HTTP server did not stop within %d ms (nng's reaper is stuck); it is "
         "left behind with the coordinator's lock", HTTP_STOP_MS);
}
