/*
 * report.c - epoch and step reports for the coordinator's dashboard:
 * kolo_report_epoch, kolo_report_epoch_span, kolo_report_step, kolo_report_recovery.
 *
 * DESIGN
 *
 * Reporting must never slow training down or fail it. A report call only
 * takes the report lock and appends to a bounded queue; a sender thread,
 * started by the first report on a context, wakes every REPORT_PERIOD_MS,
 * takes the whole queue and sends it as one WorkerService.Report call over
 * a coordinator connection of its own (like snapshot.c: the background
 * thread and its negotiation connection are never involved). The call has
 * a deadline; while it runs, new reports queue up behind it.
 *
 * Step times are aggregated as they arrive: one (second, sum, count)
 * bucket per wall-clock second, so a rank sends at most one step row per
 * second however fast it steps, and the queue holds REPORT_MAX_STEPS
 * seconds. Epoch boundaries are kept one by one (REPORT_MAX_EPOCHS).
 *
 * Failures. A full queue drops the new report (KOLO_EBUSY to the caller,
 * counted). A batch the coordinator cannot be reached for is put back in
 * front of the queue, as far as it fits, and tried again next period; a
 * batch it refuses (stale generation, job ended, malformed) is dropped and
 * counted: a report is telemetry, not state.
 *
 * kolo_fini calls report_ctx_stop_begin, then report_ctx_stop: the sender
 * sends what is queued one last time (one call, at most REPORT_FINAL_MS)
 * and exits, so the end of the last epoch reaches the coordinator before
 * the process exits; kolo_fini's own goodbye goes meanwhile.
 */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock_offset.h"
#include "errors.h"
#include "json.h"
#include "log.h"
#include "mesh.h"
#include "report_rate.h"
#include "util.h"

#define REPORT_CALL_MS     2000
#define REPORT_FINAL_MS    2000
#define REPORT_MAX_EPOCHS  1024
#define REPORT_MAX_STEPS   4096
#define REPORT_MAX_METRICS 4096
#define REPORT_MAX_SECONDS 1e6
#define REPORT_MAX_WAITS   4096 /* rounds' wait samples per report */
#define REPORT_MAX_SPANS   16384 /* timeline spans queued (report_trace) */

struct epoch_rec {
    int64_t epoch;
    int phase;
    uint64_t ts_ms, start_ms;
    int64_t samples;
    char *metrics; /* NULL: none */
};

struct step_rec {
    uint64_t sec_ms; /* the second's start */
    double sum;
    uint32_t count;
};

/* Readiness rounds' telemetry of one report (proto RoundTelemetry). */
struct round_tel {
    uint64_t rounds, agreed;
    double wait_avg_s;
    uint32_t *wait_us, *wait_ops; /* REPORT_MAX_WAITS each */
    int nwaits;
};

/* The rounds' telemetry as they run: written without r->mu by the one
 * thread that holds the executor token (report_round, on the path of
 * every small op), read by the sender under r->mu (take). Totals only
 * grow; the sender sends what grew since its last look. Rank 0's waits
 * go through a ring: slots first, then head (release); the sender reads
 * up to head, then moves tail (release). A full ring drops the sample. */
struct round_live {
    _Atomic uint64_t rounds, agreed;
    _Atomic uint64_t wait_avg_bits; /* a double's bits */
    _Atomic uint32_t head, tail;
    uint32_t *wait_us, *wait_ops; /* REPORT_MAX_WAITS each */
    uint64_t sent_rounds, sent_agreed; /* the sender's, under r->mu */
};
/* the ring's indexes wrap at 2^32, a multiple of its size */
_Static_assert((REPORT_MAX_WAITS & (REPORT_MAX_WAITS - 1)) == 0, "ring size a power of 2");

struct report {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool running;
    bool stop;
    struct epoch_rec *epochs; /* queue, REPORT_MAX_EPOCHS */
    int nepochs;
    struct step_rec *steps; /* queue, REPORT_MAX_STEPS */
    int nsteps;
    uint64_t dropped;
    uint64_t last_end_ms;   /* the previous epoch end reported here, 0: none */
    int64_t started_epoch;  /* the last epoch with a phase 0 here, -1: none */
    struct round_live tel;
    uint32_t rec[3]; /* kolo_report_recovery's durations, while have_rec */
    bool have_rec;
    /* the timeline's spans (report_trace), sent once the clock is known */
    Kolo__TraceSpan *spans; /* REPORT_MAX_SPANS, allocated on first use */
    int nspans;
    uint64_t spans_dropped;
    bool clock_known; /* the sender got a clock sample (it owns r->clock) */
    /* report_flush_spans: asked counts the calls, flushed the ones the
     * sender has answered (spans sent, or given up on) */
    uint64_t flush_asked, flush_done;
    struct rpc_client *rpc; /* the sender's, opened on its first send */
    struct clock_offset clock; /* the coordinator's clock (sender only) */
};

/* ---------------------------------------------------------------- lifecycle */

static void *sender_main(void *arg);

/* report_get returns the context's report state, creating it and starting
 * the sender on first use; NULL (and *code) when that fails. */
static struct report *report_get(struct kolo_ctx *c, int *code)
{
    /* The fast path takes no context lock (the background thread holds
     * c->mu often): c->report is published once, with release order. */
    struct report *r = __atomic_load_n(&c->report, __ATOMIC_ACQUIRE);
    if (r) {
        *code = 0;
        return r;
    }
    pthread_mutex_lock(&c->mu);
    r = c->report;
    if (r || c->stopping) {
        pthread_mutex_unlock(&c->mu);
        *code = r ? 0 : KOLO_ESHUTDOWN;
        return r;
    }
    r = calloc(1, sizeof *r);
    if (r) {
        r->epochs = calloc(REPORT_MAX_EPOCHS, sizeof *r->epochs);
        r->steps = calloc(REPORT_MAX_STEPS, sizeof *r->steps);
        r->tel.wait_us = calloc(REPORT_MAX_WAITS, sizeof *r->tel.wait_us);
        r->tel.wait_ops = calloc(REPORT_MAX_WAITS, sizeof *r->tel.wait_ops);
    }
    if (!r || !r->epochs || !r->steps || !r->tel.wait_us || !r->tel.wait_ops) {
        if (r) {
            free(r->epochs);
            free(r->steps);
            free(r->tel.wait_us);
            free(r->tel.wait_ops);
        }
        free(r);
        pthread_mutex_unlock(&c->mu);
        *code = KOLO_ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    cond_init_monotonic(&r->cv);
    r->started_epoch = -1;
    /* Without a coordinator there is nobody to send to: reports are
     * accepted and dropped (solo programs need not check). */
    if (c->coord_url && pthread_create(&r->thread, NULL, sender_main, c) == 0)
        r->running = true;
    __atomic_store_n(&c->report, r, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&c->mu);
    *code = 0;
    return r;
}

int report_start(struct kolo_ctx *c)
{
    int code;
    return report_get(c, &code) ? 0 : code;
}

void report_round(struct kolo_ctx *c, uint32_t agreed, double wait_avg_s, uint64_t wait_us)
{
    struct report *r = __atomic_load_n(&c->report, __ATOMIC_ACQUIRE);
    if (!r)
        return;
    struct round_live *t = &r->tel;
    /* one writer: no read-modify-write instruction needed */
    atomic_store_explicit(&t->rounds, atomic_load_explicit(&t->rounds, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&t->agreed,
                          atomic_load_explicit(&t->agreed, memory_order_relaxed) + agreed,
                          memory_order_relaxed);
    uint64_t bits;
    memcpy(&bits, &wait_avg_s, sizeof bits);
    atomic_store_explicit(&t->wait_avg_bits, bits, memory_order_relaxed);
    /* every rank knows the same reduced wait: rank 0 speaks for them */
    if (c->rank != 0 || agreed == 0)
        return;
    uint32_t head = atomic_load_explicit(&t->head, memory_order_relaxed);
    if (head - atomic_load_explicit(&t->tail, memory_order_acquire) >= REPORT_MAX_WAITS)
        return;
    t->wait_us[head % REPORT_MAX_WAITS] = wait_us > UINT32_MAX ? UINT32_MAX : (uint32_t)wait_us;
    t->wait_ops[head % REPORT_MAX_WAITS] = agreed;
    atomic_store_explicit(&t->head, head + 1, memory_order_release);
}

void report_span_free(Kolo__TraceSpan *s)
{
    if (s->name != protobuf_c_empty_string)
        free(s->name);
    free(s->shape);
    s->name = (char *)protobuf_c_empty_string;
    s->shape = NULL;
    s->n_shape = 0;
}

bool report_span_fill(Kolo__TraceSpan *s, const char *name, const int64_t *shape, int ndim)
{
    kolo__trace_span__init(s);
    s->name = strdup(name);
    s->shape = malloc(((size_t)(ndim > 0 ? ndim : 0) + 1) * sizeof(int64_t));
    if (!s->name || !s->shape) {
        free(s->name);
        free(s->shape);
        kolo__trace_span__init(s);
        return false;
    }
    if (ndim > 0)
        memcpy(s->shape, shape, (size_t)ndim * sizeof(int64_t));
    s->n_shape = (size_t)(ndim > 0 ? ndim : 0);
    return true;
}

void report_trace(struct kolo_ctx *c, Kolo__TraceSpan *spans, size_t n)
{
    struct report *r = __atomic_load_n(&c->report, __ATOMIC_ACQUIRE);
    size_t i = 0;
    if (r) {
        pthread_mutex_lock(&r->mu);
        if (!r->spans)
            r->spans = calloc(REPORT_MAX_SPANS, sizeof *r->spans);
        for (; r->spans && i < n && r->nspans < REPORT_MAX_SPANS; i++)
            r->spans[r->nspans++] = spans[i]; /* the queue owns the copies now */
        r->spans_dropped += n - i;
        pthread_mutex_unlock(&r->mu);
    }
    for (; i < n; i++)
        report_span_free(&spans[i]);
}

void report_ctx_stop_begin(struct kolo_ctx *c)
{
    pthread_mutex_lock(&c->mu);
    struct report *r = c->report;
    pthread_mutex_unlock(&c->mu);
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

bool report_flush_spans(struct kolo_ctx *c, int timeout_ms)
{
    struct report *r = __atomic_load_n(&c->report, __ATOMIC_ACQUIRE);
    if (!r || !r->running)
        return true;
    struct timespec dl;
    mono_deadline(&dl, timeout_ms);
    pthread_mutex_lock(&r->mu);
    bool done = !r->nspans;
    if (!done) {
        uint64_t ticket = ++r->flush_asked;
        pthread_cond_broadcast(&r->cv);
        int rc = 0;
        while (r->flush_done < ticket && !r->stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&r->cv, &r->mu, &dl);
        done = r->flush_done >= ticket;
    }
    pthread_mutex_unlock(&r->mu);
    return done;
}

void report_ctx_stop(struct kolo_ctx *c)
{
    report_ctx_stop_begin(c);
    pthread_mutex_lock(&c->mu);
    struct report *r = c->report;
    pthread_mutex_unlock(&c->mu);
    if (r && r->running) {
        pthread_join(r->thread, NULL);
        r->running = false;
    }
}

void report_ctx_free(struct kolo_ctx *c)
{
    struct report *r = c->report;
    if (!r)
        return;
    if (r->running) { /* kolo_init failed half-way: stop it here */
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    for (int i = 0; i < r->nepochs; i++)
        free(r->epochs[i].metrics);
    free(r->epochs);
    free(r->steps);
    free(r->tel.wait_us);
    free(r->tel.wait_ops);
    for (int i = 0; i < r->nspans; i++)
        report_span_free(&r->spans[i]);
    free(r->spans);
    rpc_client_close(r->rpc);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    c->report = NULL;
}

/* ---------------------------------------------------------------- calls */

/* check_metrics accepts NULL, "" or a JSON object of bounded size. */
static int check_metrics(struct kolo_ctx *c, const char *metrics)
{
    if (!metrics || !metrics[0])
        return 0;
    size_t len = strlen(metrics);
    if (len > REPORT_MAX_METRICS) {
        ctx_set_error(c, "kolo_report_epoch: metrics_json of %zu bytes exceeds %d", len,
                      REPORT_MAX_METRICS);
        return KOLO_ETOOBIG;
    }
    struct json *root = NULL;
    char err[160];
    if (json_parse(metrics, len, &root, err, sizeof err) != 0) {
        ctx_set_error(c, "kolo_report_epoch: metrics_json is not JSON: %s", err);
        return KOLO_EINVAL;
    }
    bool object = root->type == JSON_OBJECT;
    json_free(root);
    if (!object) {
        ctx_set_error(c, "kolo_report_epoch: metrics_json must be a JSON object");
        return KOLO_EINVAL;
    }
    return 0;
}

/* epoch_push queues one boundary (start_ms only for phase 1). */
static int epoch_push(struct kolo_ctx *c, int64_t epoch, int phase, uint64_t ts_ms,
                      uint64_t start_ms, bool start_given, int64_t samples, const char *metrics)
{
    int code = check_metrics(c, metrics);
    if (code)
        return code;
    struct report *r = report_get(c, &code);
    if (!r)
        return code;
    char *copy = NULL;
    if (metrics && metrics[0] && !(copy = strdup(metrics)))
        return KOLO_ENOMEM;
    pthread_mutex_lock(&r->mu);
    if (r->nepochs >= REPORT_MAX_EPOCHS) {
        r->dropped++;
        pthread_mutex_unlock(&r->mu);
        free(copy);
        return KOLO_EBUSY;
    }
    if (phase == 1 && !start_given)
        start_ms = r->started_epoch == epoch ? 0 : r->last_end_ms;
    if (phase == 0)
        r->started_epoch = epoch;
    else
        r->last_end_ms = ts_ms;
    r->epochs[r->nepochs++] = (struct epoch_rec){
        .epoch = epoch,
        .phase = phase,
        .ts_ms = ts_ms,
        .start_ms = start_ms,
        .samples = samples,
        .metrics = copy,
    };
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int kolo_report_epoch(kolo_ctx *c, int64_t epoch, int phase, int64_t samples,
                      const char *metrics_json)
{
    if (!c)
        return KOLO_EINVAL;
    if (epoch < 0 || (phase != 0 && phase != 1) || samples < 0) {
        ctx_set_error(c, "kolo_report_epoch: epoch and samples must be >= 0 and phase 0 or 1");
        return KOLO_EINVAL;
    }
    return epoch_push(c, epoch, phase, now_wall_ms(), 0, false, samples,
                      phase == 1 ? metrics_json : NULL);
}

int kolo_report_epoch_span(kolo_ctx *c, int64_t epoch, uint64_t start_ms, uint64_t end_ms,
                           int64_t samples, const char *metrics_json)
{
    if (!c)
        return KOLO_EINVAL;
    if (epoch < 0 || samples < 0 || end_ms == 0 || (start_ms && start_ms > end_ms)) {
        ctx_set_error(c, "kolo_report_epoch_span: epoch and samples must be >= 0 and "
                         "0 < start_ms <= end_ms (or start_ms 0)");
        return KOLO_EINVAL;
    }
    return epoch_push(c, epoch, 1, end_ms, start_ms, true, samples, metrics_json);
}

int kolo_report_step(kolo_ctx *c, double seconds)
{
    if (!c)
        return KOLO_EINVAL;
    if (!(seconds >= 0) || !(seconds < REPORT_MAX_SECONDS)) {
        ctx_set_error(c, "kolo_report_step: seconds must be finite, >= 0 and < 1e6");
        return KOLO_EINVAL;
    }
    int code;
    struct report *r = report_get(c, &code);
    if (!r)
        return code;
    uint64_t sec = now_wall_ms() / 1000 * 1000;
    pthread_mutex_lock(&r->mu);
    struct step_rec *last = r->nsteps ? &r->steps[r->nsteps - 1] : NULL;
    if (last && last->sec_ms == sec) {
        last->sum += seconds;
        last->count++;
    } else if (r->nsteps >= REPORT_MAX_STEPS) {
        r->dropped++;
        code = KOLO_EBUSY;
    } else {
        r->steps[r->nsteps++] = (struct step_rec){sec, seconds, 1};
    }
    pthread_mutex_unlock(&r->mu);
    return code;
}

int kolo_report_recovery(kolo_ctx *c, uint32_t told_to_formed_ms, uint32_t formed_to_restored_ms,
                         uint32_t restored_to_step_ms)
{
    if (!c)
        return KOLO_EINVAL;
    int code;
    struct report *r = report_get(c, &code);
    if (!r)
        return code;
    pthread_mutex_lock(&r->mu);
    r->rec[0] = told_to_formed_ms;
    r->rec[1] = formed_to_restored_ms;
    r->rec[2] = restored_to_step_ms;
    r->have_rec = true;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

uint64_t kolo_report_dropped(const kolo_ctx *c)
{
    struct report *r = c ? __atomic_load_n(&c->report, __ATOMIC_ACQUIRE) : NULL;
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    uint64_t n = r->dropped;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---------------------------------------------------------------- sender */

/* A batch taken off the queue. */
struct batch {
    struct epoch_rec *epochs;
    int nepochs;
    struct step_rec *steps;
    int nsteps;
    struct round_tel tel; /* sent once, never put back: telemetry */
    Kolo__TraceSpan *spans; /* likewise */
    int nspans;
    uint64_t spans_dropped;
    uint64_t rejected[MESH_REJECT_N]; /* data-plane refusals (mesh.h) */
    bool any_rejected;
    uint32_t rec[3];
    bool have_rec;
    struct time_split_window split; /* where the time went, wall_us 0: unknown */
};

static void batch_free(struct batch *b)
{
    for (int i = 0; i < b->nepochs; i++)
        free(b->epochs[i].metrics);
    free(b->epochs);
    free(b->steps);
    free(b->tel.wait_us);
    free(b->tel.wait_ops);
    for (int i = 0; i < b->nspans; i++)
        report_span_free(&b->spans[i]);
    free(b->spans);
    memset(b, 0, sizeof *b);
}

/* take moves the queue and the time split's window into b (r->mu held). */
static bool take(struct report *r, struct batch *b, const struct time_split_window *split)
{
    memset(b, 0, sizeof *b);
    for (int k = 0; k < MESH_REJECT_N; k++)
        b->any_rejected |= (b->rejected[k] = mesh_rejections_take((enum mesh_reject)k)) != 0;
    b->split = *split;
    struct round_live *t = &r->tel;
    uint64_t rounds = atomic_load_explicit(&t->rounds, memory_order_relaxed);
    uint64_t agreed = atomic_load_explicit(&t->agreed, memory_order_relaxed);
    uint32_t tail = atomic_load_explicit(&t->tail, memory_order_relaxed);
    uint32_t nwaits = atomic_load_explicit(&t->head, memory_order_acquire) - tail;
    if (!r->nepochs && !r->nsteps && rounds == t->sent_rounds && !b->any_rejected &&
        !r->nspans && !r->have_rec && !split->wall_us)
        return false;
    size_t nw = nwaits ? nwaits : 1;
    b->epochs = malloc((size_t)(r->nepochs ? r->nepochs : 1) * sizeof *b->epochs);
    b->steps = malloc((size_t)(r->nsteps ? r->nsteps : 1) * sizeof *b->steps);
    b->tel.wait_us = malloc(nw * sizeof *b->tel.wait_us);
    b->tel.wait_ops = malloc(nw * sizeof *b->tel.wait_ops);
    if (!b->epochs || !b->steps || !b->tel.wait_us || !b->tel.wait_ops) {
        for (int k = 0; k < MESH_REJECT_N; k++)
            mesh_rejections_return((enum mesh_reject)k, b->rejected[k]);
        batch_free(b);
        return false; /* tried again next period */
    }
    b->tel.rounds = rounds - t->sent_rounds;
    b->tel.agreed = agreed - t->sent_agreed;
    t->sent_rounds = rounds;
    t->sent_agreed = agreed;
    uint64_t avg_bits = atomic_load_explicit(&t->wait_avg_bits, memory_order_relaxed);
    memcpy(&b->tel.wait_avg_s, &avg_bits, sizeof b->tel.wait_avg_s);
    b->tel.nwaits = (int)nwaits;
    for (uint32_t i = 0; i < nwaits; i++) {
        b->tel.wait_us[i] = t->wait_us[(tail + i) % REPORT_MAX_WAITS];
        b->tel.wait_ops[i] = t->wait_ops[(tail + i) % REPORT_MAX_WAITS];
    }
    atomic_store_explicit(&t->tail, tail + nwaits, memory_order_release);
    memcpy(b->epochs, r->epochs, (size_t)r->nepochs * sizeof *b->epochs);
    memcpy(b->steps, r->steps, (size_t)r->nsteps * sizeof *b->steps);
    b->nepochs = r->nepochs;
    b->nsteps = r->nsteps;
    r->nepochs = r->nsteps = 0;
    /* Spans go once the coordinator's clock is known: until then the
     * batch (any batch) brings the first sample. */
    if (r->clock_known && r->nspans) {
        b->spans = malloc((size_t)r->nspans * sizeof *b->spans);
        if (b->spans) { /* the batch owns the copies now */
            memcpy(b->spans, r->spans, (size_t)r->nspans * sizeof *b->spans);
            b->nspans = r->nspans;
            r->nspans = 0;
        }
    }
    b->spans_dropped = r->spans_dropped;
    memcpy(b->rec, r->rec, sizeof b->rec);
    b->have_rec = r->have_rec;
    r->have_rec = false;
    return true;
}

/* put_back returns an unsent batch to the front of the queue, as much of
 * it as fits (r->mu held); the rest is dropped and counted. */
static void put_back(struct report *r, struct batch *b)
{
    int ne = b->nepochs;
    if (ne > REPORT_MAX_EPOCHS - r->nepochs)
        ne = REPORT_MAX_EPOCHS - r->nepochs;
    memmove(r->epochs + ne, r->epochs, (size_t)r->nepochs * sizeof *r->epochs);
    memcpy(r->epochs, b->epochs, (size_t)ne * sizeof *r->epochs);
    r->nepochs += ne;
    for (int i = ne; i < b->nepochs; i++) {
        free(b->epochs[i].metrics);
        r->dropped++;
    }
    b->nepochs = 0; /* the queue owns the metrics now */
    int ns = b->nsteps;
    if (ns > REPORT_MAX_STEPS - r->nsteps)
        ns = REPORT_MAX_STEPS - r->nsteps;
    memmove(r->steps + ns, r->steps, (size_t)r->nsteps * sizeof *r->steps);
    memcpy(r->steps, b->steps, (size_t)ns * sizeof *r->steps);
    r->nsteps += ns;
    r->dropped += (uint64_t)(b->nsteps - ns);
    b->nsteps = 0;
    for (int k = 0; k < MESH_REJECT_N; k++)
        mesh_rejections_return((enum mesh_reject)k, b->rejected[k]);
    memset(b->rejected, 0, sizeof b->rejected);
    if (b->have_rec && !r->have_rec) {
        memcpy(r->rec, b->rec, sizeof r->rec);
        r->have_rec = true;
    }
    b->have_rec = false;
}

static bool transient(int code)
{
    /* ESTORE: the coordinator could not store it now (a full disk): the
     * report waits and goes again, as for an unreachable coordinator */
    return code == KOLO_ETIMEDOUT || code == KOLO_ECONNREFUSED || code == KOLO_EIO ||
           code == KOLO_ECLOSED || code == KOLO_EBUSY || code == KOLO_ESTORE;
}

/* send_batch sends b in one call; returns the call's result. */
static int send_batch(struct kolo_ctx *c, struct report *r, struct batch *b, int timeout_ms,
                      uint64_t dropped)
{
    char ident[64];
    struct rpc_client_config rc;
    pthread_mutex_lock(&c->mu);
    ctx_rpc_config(c, ident, sizeof ident, &rc);
    pthread_mutex_unlock(&c->mu);
    if (!r->rpc) {
        int code = rpc_client_open(&r->rpc, &rc);
        if (code)
            return code;
    } else {
        rpc_client_set_identity(r->rpc, ident, rc.job_id, rc.generation, rc.rank);
    }
    Kolo__EpochReport *eps = calloc((size_t)(b->nepochs ? b->nepochs : 1), sizeof *eps);
    Kolo__EpochReport **epp = calloc((size_t)(b->nepochs ? b->nepochs : 1), sizeof *epp);
    Kolo__StepSample *sts = calloc((size_t)(b->nsteps ? b->nsteps : 1), sizeof *sts);
    Kolo__StepSample **stp = calloc((size_t)(b->nsteps ? b->nsteps : 1), sizeof *stp);
    Kolo__TraceSpan **spp = NULL;
    int code = KOLO_ENOMEM;
    uint8_t *buf = NULL;
    if (!eps || !epp || !sts || !stp)
        goto out;
    for (int i = 0; i < b->nepochs; i++) {
        kolo__epoch_report__init(&eps[i]);
        eps[i].epoch = b->epochs[i].epoch;
        eps[i].phase = b->epochs[i].phase;
        eps[i].ts_ms = b->epochs[i].ts_ms;
        eps[i].start_ms = b->epochs[i].start_ms;
        eps[i].samples = b->epochs[i].samples;
        eps[i].metrics_json = b->epochs[i].metrics ? b->epochs[i].metrics : "";
        epp[i] = &eps[i];
    }
    for (int i = 0; i < b->nsteps; i++) {
        kolo__step_sample__init(&sts[i]);
        sts[i].ts_ms = b->steps[i].sec_ms;
        sts[i].seconds = b->steps[i].sum / b->steps[i].count;
        sts[i].count = b->steps[i].count;
        stp[i] = &sts[i];
    }
    Kolo__WorkerReportRequest req = KOLO__WORKER_REPORT_REQUEST__INIT;
    req.epochs = epp;
    req.n_epochs = (size_t)b->nepochs;
    req.steps = stp;
    req.n_steps = (size_t)b->nsteps;
    req.dropped = dropped;
    Kolo__RoundTelemetry tel = KOLO__ROUND_TELEMETRY__INIT;
    if (b->tel.rounds) {
        tel.rounds = b->tel.rounds;
        tel.agreed = b->tel.agreed;
        tel.wait_avg_s = b->tel.wait_avg_s;
        tel.wait_us = b->tel.wait_us;
        tel.n_wait_us = (size_t)b->tel.nwaits;
        tel.wait_ops = b->tel.wait_ops;
        tel.n_wait_ops = (size_t)b->tel.nwaits;
        req.rounds = &tel;
    }
    Kolo__DataplaneRejections rej[MESH_REJECT_N], *rejp[MESH_REJECT_N];
    for (int k = 0; k < MESH_REJECT_N; k++) {
        if (!b->rejected[k])
            continue;
        kolo__dataplane_rejections__init(&rej[req.n_dataplane_rejected]);
        rej[req.n_dataplane_rejected].reason = (char *)mesh_reject_name((enum mesh_reject)k);
        rej[req.n_dataplane_rejected].count = b->rejected[k];
        rejp[req.n_dataplane_rejected] = &rej[req.n_dataplane_rejected];
        req.n_dataplane_rejected++;
    }
    req.dataplane_rejected = rejp;
    req.clock_known = clock_offset_best(&r->clock, &req.clock_offset_us, &req.clock_rtt_us);
    spp = b->nspans ? calloc((size_t)b->nspans, sizeof *spp) : NULL;
    for (int i = 0; spp && i < b->nspans; i++)
        spp[i] = &b->spans[i];
    req.spans = spp;
    req.n_spans = spp ? (size_t)b->nspans : 0;
    req.spans_dropped = b->spans_dropped;
    Kolo__RecoveryReport rec = KOLO__RECOVERY_REPORT__INIT;
    Kolo__TimeSplit split = KOLO__TIME_SPLIT__INIT;
    if (b->split.wall_us) {
        split.wall_us = b->split.wall_us;
        split.wait_us = b->split.wait_us;
        split.data_us = b->split.data_us;
        split.overlap_us = b->split.overlap_us;
        req.time_split = &split;
    }
    if (b->have_rec) {
        rec.told_to_formed_ms = b->rec[0];
        rec.formed_to_restored_ms = b->rec[1];
        rec.restored_to_step_ms = b->rec[2];
        req.recovery = &rec;
    }
    size_t len = kolo__worker_report_request__get_packed_size(&req);
    if (!(buf = malloc(len ? len : 1)))
        goto out;
    kolo__worker_report_request__pack(&req, buf);
    void *rep = NULL;
    size_t rlen = 0;
    char err[512];
    uint64_t t0 = now_mono_us();
    code = rpc_client_call(r->rpc, "WorkerService.Report", buf, len, &rep, &rlen, timeout_ms, err,
                           sizeof err);
    uint64_t t3 = now_mono_us();
    Kolo__WorkerReportReply *reply = code ? NULL : kolo__worker_report_reply__unpack(NULL, rlen, rep);
    if (reply && reply->received_us &&
        clock_offset_add(&r->clock, t0, reply->received_us, reply->replied_us, t3)) {
        pthread_mutex_lock(&r->mu);
        r->clock_known = true;
        pthread_mutex_unlock(&r->mu);
    }
    if (reply)
        kolo__worker_report_reply__free_unpacked(reply, NULL);
    free(rep);
    if (code)
        LOGD("report", "Report (%d epochs, %d step rows) failed: %s", b->nepochs, b->nsteps, err);
out:
    free(spp);
    free(buf);
    free(eps);
    free(epp);
    free(sts);
    free(stp);
    return code;
}

/* wait_period sleeps REPORT_PERIOD_MS or until stopped or asked to
 * flush (r->mu held). */
static void wait_period(struct report *r)
{
    struct timespec ts;
    mono_deadline(&ts, REPORT_PERIOD_MS);
    while (!r->stop && r->flush_done == r->flush_asked &&
           pthread_cond_timedwait(&r->cv, &r->mu, &ts) == 0)
        ;
}

static void *sender_main(void *arg)
{
    thread_name("kolo-report");
    struct kolo_ctx *c = arg;
    pthread_mutex_lock(&c->mu);
    struct report *r = c->report;
    pthread_mutex_unlock(&c->mu);
    /* report_get sets c->report right after this thread starts, under
     * c->mu: the lock above waits for it. */
    pthread_mutex_lock(&r->mu);
    /* telemetry alone goes every `period` (report_rate.h); ranks start
     * spread over it, so a large job's reports do not come in a burst */
    int period = report_period_ms(c->rank, c->size);
    uint64_t next = now_mono_ms() + (uint64_t)period * (uint64_t)(c->rank % 64) / 64u;
    bool final_spans = false;
    for (;;) {
        /* an unanswered flush (one whose first batch only brought the
         * clock sample) does not wait: see wait_period */
        wait_period(r);
        bool last = r->stop;
        uint64_t flush = r->flush_asked;
        uint64_t now = now_mono_ms();
        if (!last && !r->nepochs && now < next && flush == r->flush_done)
            continue;
        next = now + (uint64_t)period;
        /* the split's window closes now (c->mu is taken before r->mu) */
        struct time_split_window split = {0};
        pthread_mutex_unlock(&r->mu);
        pthread_mutex_lock(&c->mu);
        if (c->telemetry) /* nothing measured yet: split stays zero */
            time_split_take(&c->split, now_mono_us(), &split);
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_lock(&r->mu);
        struct batch b;
        bool have = take(r, &b, &split);
        uint64_t dropped = r->dropped;
        pthread_mutex_unlock(&r->mu);
        int code = 0;
        if (have)
            code = send_batch(c, r, &b, last ? REPORT_FINAL_MS : REPORT_CALL_MS, dropped);
        pthread_mutex_lock(&r->mu);
        if (have && code) {
            if (transient(code) && !last) {
                put_back(r, &b);
            } else {
                r->dropped += (uint64_t)(b.nepochs + b.nsteps);
            }
        }
        batch_free(&b);
        /* a flush is answered once its spans went (or cannot go: no
         * clock after a try, or the coordinator refused them) */
        if (flush != r->flush_done && (!r->nspans || !r->clock_known || code)) {
            r->flush_done = flush;
            pthread_cond_broadcast(&r->cv);
        }
        /* the last batch may have brought the first clock sample: the
         * timeline's spans held back for it go in one more call */
        if (last && (final_spans || !r->nspans || !r->clock_known))
            break;
        final_spans = last;
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}
