/*
 * coord_core.c - the verbs every coordinator module uses (coord_core.h):
 * answering a call with a protobuf message, recording an event, noting a
 * store failure (and probing for the store's recovery), histograms.
 */
#include "coord_core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_jobs.h"
#include "errors.h"
#include "log.h"
#include "util.h"

/* The histogram bounds in seconds (Prometheus "le"). */
static const double hist_bounds[COORD_HIST_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                       1,    2.5,   5,    10,  30,   60};

void coord_hist_observe_n(struct coord_hist *h, double seconds, uint64_t n)
{
    int i = 0;
    while (i < COORD_HIST_BUCKETS && seconds > hist_bounds[i])
        i++;
    h->counts[i] += n;
    h->sum += seconds * (double)n;
}

void coord_hist_observe(struct coord_hist *h, double seconds)
{
    coord_hist_observe_n(h, seconds, 1);
}

void coord_hist_render(struct buf *b, const char *name, const char *help,
                       const struct coord_hist *h)
{
    buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < COORD_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, hist_bounds[i],
                   (unsigned long long)cum);
    }
    cum += h->counts[COORD_HIST_BUCKETS];
    buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
               (unsigned long long)cum, name, h->sum, name, (unsigned long long)cum);
}

void coord_store_failed(struct coord *c, const char *what)
{
    coord_store_failed_why(c, what, store_last_error(c->store));
}

void coord_store_failed_why(struct coord *c, const char *what, const char *why)
{
    c->m.store_errors++;
    c->m.last_store_error_ms = now_wall_ms();
    if (!c->m.store_degraded)
        LOGE("coord", "store: %s failed: %s; refusing what cannot be stored until writes "
             "succeed again", what, why);
    else
        LOGD("coord", "store: %s failed: %s", what, why);
    c->m.store_degraded = true;
    c->m.store_degraded_since = now_mono_ms();
    snprintf(c->m.store_why, sizeof c->m.store_why, "%s failed: %s", what, why);
}

/* While degraded, a small write every STORE_PROBE_MS tells when the disk
 * takes writes again (space freed, the disk back): then the coordinator
 * says so and stops refusing. */
#define STORE_PROBE_MS 2000
void coord_store_probe(struct coord *c, uint64_t now)
{
    if (!c->m.store_degraded || now - c->m.store_probed < STORE_PROBE_MS)
        return;
    c->m.store_probed = now;
    char value[32];
    snprintf(value, sizeof value, "%llu", (unsigned long long)now_wall_ms());
    if (store_meta_put(c->store, "write_probe", value) != 0)
        return;
    c->m.store_degraded = false;
    LOGI("coord", "store: writes succeed again after %llu ms",
         (unsigned long long)(now - c->m.store_degraded_since));
    coord_event(c, 0, NULL, "store.recovered", "the state store takes writes again (%s before)",
                c->m.store_why);
}

void coord_event(struct coord *c, uint64_t job_id, const char *host_id, const char *kind,
                 const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct store_event ev = {
        .ts_ms = now_wall_ms(), .job_id = job_id, .host_id = host_id, .kind = kind, .message = msg};
    LOGI("coord", "%s: %s", kind, msg);
    if (store_event_add(c->store, &ev) != 0) {
        coord_store_failed(c, "event");
        return;
    }
    struct job *j = job_id && coord_event_notice(kind) ? coord_job_find(c, job_id) : NULL;
    if (j) {
        j->last_notice = (uint64_t)ev.id;
        coord_job_output_added(c, j); /* its followers print it now */
    }
}

bool coord_event_notice(const char *kind)
{
    static const char *const kinds[] = {
        "op.stalled",      "op.stall_shutdown", "worker.failed",    "worker.frozen",
        "worker.spawn_failed", "worker.stopped", "job.generation", "job.waiting",     "job.hosts_updated",
        "host.excluded",   "host.readmitted",   "job.discovery_failed", "job.resumed",
        "job.resume_failed", "job.cache_reset", "dataplane.refused", "stacks.taken", "job.recovered", "job.straggler", "job.spares", "worker.spare_lost",
    };
    for (size_t i = 0; kind && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kind, kinds[i]) == 0)
            return true;
    return false;
}

int coord_send_pb(struct rpc_call *call, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return KOLO_ENOMEM;
    }
    protobuf_c_message_pack(msg, buf);
    rpc_call_reply(call, buf, len);
    free(buf);
    return 0;
}

int coord_reader_open(struct coord *c, char *err, size_t errlen)
{
    int rv = c->read_only ? store_open_readonly(&c->reader, c->db_path, err, errlen)
                          : store_open(&c->reader, c->db_path, err, errlen);
    if (rv == 0 && (rv = store_query_only(c->reader)) != 0) {
        snprintf(err, errlen, "%s", store_last_error(c->reader));
        store_close(c->reader);
        c->reader = NULL;
    }
    if (rv == 0)
        pthread_mutex_init(&c->reader_mu, NULL);
    return rv;
}

void coord_reader_close(struct coord *c)
{
    if (!c->reader)
        return;
    pthread_mutex_lock(&c->mtx);
    while (c->readers_out > 0)
        pthread_cond_wait(&c->cond, &c->mtx);
    pthread_mutex_unlock(&c->mtx);
    store_close(c->reader);
    c->reader = NULL;
    pthread_mutex_destroy(&c->reader_mu);
}

int coord_read(struct coord *c, int (*fn)(struct store *st, void *arg), void *arg)
{
    c->readers_out++;
    pthread_mutex_unlock(&c->mtx);
    pthread_mutex_lock(&c->reader_mu);
    int rv = fn(c->reader, arg);
    pthread_mutex_unlock(&c->reader_mu);
    pthread_mutex_lock(&c->mtx);
    if (--c->readers_out == 0)
        pthread_cond_broadcast(&c->cond);
    return rv;
}
