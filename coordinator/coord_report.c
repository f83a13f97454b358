/*
 * coord_report.c - training progress reported by the workers (issue 6):
 * WorkerService.Report, AdminService.GetEpochs, REST /epochs, /steps and
 * /ranks of a job, and their metrics.
 *
 * DESIGN
 *
 * Workers (worker/runtime/report.c) send epoch boundaries and step times in
 * batches, every ~500 ms per rank (less often in large jobs). A batch is
 * fenced like every worker request (coord_worker_fence: the job runs, the
 * caller's generation is the current one). Its epochs are written at
 * once, in one transaction: one row per (job, generation, rank, epoch).
 * Its step times (one row per rank and wall-clock second: the worker
 * already aggregates per second; a second split over two batches is merged
 * by the store into a weighted mean) wait in memory for the next group
 * commit: every STEPS_FLUSH_MS, before anything reads them, and at
 * shutdown, every rank's rows go in one transaction. A commit per report
 * cost ~90 us of coordinator CPU (1024 ranks: ~1.9 ms per 10 ms step); rows
 * are telemetry, so a crash loses at most a second of them. The step rows
 * of a job are capped at REPORT_STEPS_KEEP, the oldest going first,
 * checked every REPORT_PRUNE_EVERY new rows.
 *
 * Epoch summaries are derived when read, not stored: for each epoch the
 * rows of the newest generation that ran it (an elastic reset re-runs the
 * epoch) give wall time = the first rank's start to the last rank's end,
 * samples = their sum, samples/s = samples / wall time, metrics = rank 0's
 * (else the lowest rank's that has any) and the mean of every numeric
 * metric over the ranks. Times are the workers' wall clocks: hosts are
 * assumed to be NTP-synchronised.
 *
 * The last step time of every rank is also kept in memory (REST /ranks);
 * a restarted coordinator shows it again from the next report on.
 */
#include "coord_report.h"
#include "coord_elastic.h"
#include "coord_timeline.h"
#include "coord_core.h"
#include "coord_jobs.h"
#include "coord_negot.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "util.h"

#define REPORT_MAX_EPOCHS  1024 /* per batch */
#define REPORT_MAX_STEPS   4096 /* per batch */
#define REPORT_MAX_WAITS   4096 /* rounds' wait samples per batch */
#define REPORT_MAX_SPANS   16384 /* timeline spans per batch (worker/runtime/report.c) */
#define REPORT_MAX_METRICS 4096
#define REPORT_MAX_EPOCH   1000000000LL
#define REPORT_MAX_SAMPLES (1LL << 48) /* per rank and epoch: sums cannot overflow */
#define REPORT_STEPS_KEEP  100000      /* step rows per job */
#define REPORT_PRUNE_EVERY 1000
#define STEPS_FLUSH_MS     1000  /* group commit of step rows */
#define STEPS_PEND_MAX     65536 /* rows waiting; more commit at once */

/* A step row waiting for the group commit (the host id copied: the job
 * may be gone by then). */
struct step_pending {
    struct store_step row;
    char host_id[64];
};

struct report_job {
    struct report_job *next;
    uint64_t job_id;
    uint64_t rows_since_prune;
    struct report_rank *ranks;
    int nranks;
    /* /metrics' samples/s of the last complete epoch (NAN: none), derived
     * from the store at most every RATE_EVERY_MS and only when epochs were
     * reported since: a scrape must not read every epoch row every time */
    double rate;
    uint64_t rate_epochs, rate_ms;
};

#define RATE_EVERY_MS 10000

static struct report_job *rjob_get(struct coord *c, uint64_t job_id, bool create)
{
    for (struct report_job *r = c->report_jobs; r; r = r->next)
        if (r->job_id == job_id)
            return r;
    if (!create)
        return NULL;
    struct report_job *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->job_id = job_id;
    r->rate = NAN;
    r->next = c->report_jobs;
    c->report_jobs = r;
    return r;
}

static struct report_rank *rjob_rank(struct report_job *r, int rank)
{
    if (rank < 0 || rank >= COORD_MAX_NP)
        return NULL;
    if (rank >= r->nranks) {
        int n = rank + 1 < 8 ? 8 : rank + 1;
        struct report_rank *nr = realloc(r->ranks, (size_t)n * sizeof *nr);
        if (!nr)
            return NULL;
        for (int i = r->nranks; i < n; i++)
            nr[i] = (struct report_rank){0, 0, 0, -1};
        r->ranks = nr;
        r->nranks = n;
    }
    return &r->ranks[rank];
}

/* Prunes the jobs that gained REPORT_PRUNE_EVERY rows since their last
 * prune (after a commit: the rows are in the store). */
static void steps_prune(struct coord *c)
{
    for (struct report_job *rj = c->report_jobs; rj; rj = rj->next) {
        if (rj->rows_since_prune < REPORT_PRUNE_EVERY)
            continue;
        rj->rows_since_prune = 0;
        int deleted = 0;
        if (store_steps_prune(c->store, rj->job_id, REPORT_STEPS_KEEP, &deleted) != 0)
            coord_store_failed(c, "steps prune");
        c->m.report.step_rows_pruned += (uint64_t)deleted;
    }
}

void coord_report_flush(struct coord *c)
{
    c->steps_flushed_ms = now_mono_ms();
    size_t n = c->steps_npend;
    if (n == 0)
        return;
    struct store_step *rows = calloc(n, sizeof *rows);
    int err = rows ? store_begin(c->store) : KOLO_ENOMEM;
    for (size_t i = 0; i < n && !err; i++) {
        rows[i] = c->steps_pend[i].row;
        rows[i].host_id = c->steps_pend[i].host_id[0] ? c->steps_pend[i].host_id : NULL;
    }
    if (!err)
        err = store_steps_add(c->store, rows, n);
    if (!err)
        err = store_commit(c->store);
    else if (rows)
        store_rollback(c->store);
    free(rows);
    c->steps_npend = 0;
    c->m.report.step_flushes++;
    if (err) {
        c->m.report.step_rows_lost += n;
        coord_store_failed(c, "steps");
        LOGW("coord", "%zu step-time row(s) could not be stored: %s", n,
             store_last_error(c->store));
        return;
    }
    steps_prune(c);
}

void coord_report_cron(struct coord *c, uint64_t now)
{
    if (c->steps_npend && now - c->steps_flushed_ms >= STEPS_FLUSH_MS)
        coord_report_flush(c);
}

/* Queues a report's step rows for the group commit, one row per rank and
 * wall-clock second (false: out of memory). */
static bool steps_queue(struct coord *c, uint64_t job_id, int rank, const char *host_id,
                        Kolo__StepSample *const *steps, size_t n)
{
    if (c->steps_npend + n > STEPS_PEND_MAX)
        coord_report_flush(c);
    if (c->steps_npend + n > c->steps_cap) {
        size_t cap = c->steps_cap ? c->steps_cap : 256;
        while (cap < c->steps_npend + n)
            cap *= 2;
        struct step_pending *p = realloc(c->steps_pend, cap * sizeof *p);
        if (!p)
            return false;
        c->steps_pend = p;
        c->steps_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        struct step_pending *p = &c->steps_pend[c->steps_npend++];
        p->row = (struct store_step){.job_id = job_id,
                                     .rank = rank,
                                     .ts_ms = steps[i]->ts_ms / 1000 * 1000,
                                     .seconds = steps[i]->seconds,
                                     .n = steps[i]->count};
        str_copy(p->host_id, host_id ? host_id : "", sizeof p->host_id);
    }
    return true;
}

void coord_report_free(struct coord *c)
{
    free(c->steps_pend);
    c->steps_pend = NULL;
    c->steps_npend = c->steps_cap = 0;
    while (c->report_jobs) {
        struct report_job *r = c->report_jobs;
        c->report_jobs = r->next;
        free(r->ranks);
        free(r);
    }
}

/* ---------------------------------------------------------------- Report */

static void report_fail(struct coord *c, struct rpc_call *call, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void report_fail(struct coord *c, struct rpc_call *call, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->m.rpc_errors[M_WORKER_REPORT]++;
    c->m.report.refused++;
    LOGD("coord", "Report refused: %s", msg);
    rpc_call_error(call, code, "%s", msg);
}

/* check_report validates the whole batch before anything is stored. */
void coord_dp_rejected_add(struct coord *c, const char *reason, uint64_t n)
{
    struct coord_dp_rejected *d = c->m.dp_rejected;
    int i = 0;
    while (i < COORD_DP_REASONS && d[i].reason[0] && strcmp(d[i].reason, reason) != 0)
        i++;
    if (i == COORD_DP_REASONS)
        return; /* more reasons than any libkolo has: not counted */
    if (!d[i].reason[0])
        str_copy(d[i].reason, reason, sizeof d[i].reason);
    d[i].count += n;
}

static bool check_report(const Kolo__WorkerReportRequest *m, char *why, size_t whylen)
{
    if (m->n_epochs > REPORT_MAX_EPOCHS || m->n_steps > REPORT_MAX_STEPS) {
        snprintf(why, whylen,
                 "a report carries at most %d epochs and %d step rows, not %zu and %zu",
                 REPORT_MAX_EPOCHS, REPORT_MAX_STEPS, m->n_epochs, m->n_steps);
        return false;
    }
    for (size_t i = 0; i < m->n_epochs; i++) {
        const Kolo__EpochReport *e = m->epochs[i];
        if (e->epoch < 0 || e->epoch > REPORT_MAX_EPOCH || (e->phase != 0 && e->phase != 1) ||
            e->samples < 0 || e->samples > REPORT_MAX_SAMPLES || e->ts_ms == 0 ||
            e->ts_ms > INT64_MAX || e->start_ms > e->ts_ms) {
            snprintf(why, whylen,
                     "epoch report %zu is invalid (epoch %" PRId64 ", phase %d, samples %" PRId64
                     ", ts_ms %" PRIu64 ", start_ms %" PRIu64 ")",
                     i, e->epoch, e->phase, e->samples, e->ts_ms, e->start_ms);
            return false;
        }
        if (!json_object_ok(e->metrics_json, REPORT_MAX_METRICS, "metrics_json", why, whylen))
            return false;
    }
    if (m->n_spans > REPORT_MAX_SPANS) {
        snprintf(why, whylen, "a report carries at most %d timeline spans, not %zu",
                 REPORT_MAX_SPANS, m->n_spans);
        return false;
    }
    for (size_t i = 0; i < m->n_spans; i++) {
        const Kolo__TraceSpan *sp = m->spans[i];
        if (sp->n_shape > 64 || strlen(sp->name) > 1024) {
            snprintf(why, whylen, "timeline span %zu is invalid (%zu dimensions, a name of %zu "
                     "bytes)", i, sp->n_shape, strlen(sp->name));
            return false;
        }
    }
    const Kolo__RoundTelemetry *t = m->rounds;
    if (t && (t->n_wait_us != t->n_wait_ops || t->n_wait_us > REPORT_MAX_WAITS ||
              !(t->wait_avg_s >= 0 && t->wait_avg_s < 1e6))) {
        snprintf(why, whylen,
                 "round telemetry is invalid (%zu waits, %zu op counts, at most %d; average "
                 "wait %g s)",
                 t->n_wait_us, t->n_wait_ops, REPORT_MAX_WAITS, t->wait_avg_s);
        return false;
    }
    if (m->n_dataplane_rejected > COORD_DP_REASONS) {
        snprintf(why, whylen, "a report carries at most %d data-plane refusal reasons",
                 COORD_DP_REASONS);
        return false;
    }
    for (size_t i = 0; i < m->n_dataplane_rejected; i++) {
        const char *r = m->dataplane_rejected[i]->reason;
        size_t len = strlen(r);
        bool ok = len > 0 && len < sizeof(((struct coord_dp_rejected *)0)->reason);
        for (size_t k = 0; ok && k < len; k++)
            ok = (r[k] >= 'a' && r[k] <= 'z') || r[k] == '_';
        if (!ok) {
            snprintf(why, whylen, "data-plane refusal reason %zu is not a short [a-z_] name", i);
            return false;
        }
    }
    for (size_t i = 0; i < m->n_steps; i++) {
        const Kolo__StepSample *s = m->steps[i];
        if (!(s->seconds >= 0 && s->seconds < 1e6) || s->count == 0 || s->ts_ms > INT64_MAX) {
            snprintf(why, whylen, "step sample %zu is invalid (seconds %g, count %u)", i,
                     s->seconds, s->count);
            return false;
        }
    }
    return true;
}

/* Rank 0 of the generation that formed after a failure says how its
 * recovery went: with the coordinator's own part, one event the job's page
 * and kolo run show (issue 32: every lost second accounted for). The
 * rank's durations are on its clock, the coordinator's on its own: the
 * generation's forming is where the two meet. */
static void recovery_event(struct coord *c, struct job *j, const Kolo__RecoveryReport *r)
{
    struct elastic *el = j->el;
    if (!el || !el->rec_mono || el->rec_gen != j->generation)
        return;
    double formed = (double)el->rec_formed_ms / 1000.0; /* detected -> formed */
    double reform = (double)r->told_to_formed_ms / 1000.0;
    double told = formed > reform ? formed - reform : 0.0; /* detected -> told */
    double restore = (double)r->formed_to_restored_ms / 1000.0;
    double step = (double)r->restored_to_step_ms / 1000.0;
    coord_event(c, j->id, NULL, "job.recovered",
                "job %llu recovered in %.2f s from: %s. Survivors told %.2f s after the "
                "coordinator detected it, generation %llu formed %.2f s later, state restored "
                "in %.2f s, first step done %.2f s after that",
                (unsigned long long)j->id, told + reform + restore + step, el->rec_why, told,
                (unsigned long long)j->generation, reform, restore, step);
    /* and with the generation, for its page's membership history */
    struct store_recovery rec = {(uint32_t)(told * 1000.0 + 0.5), r->told_to_formed_ms,
                                 r->formed_to_restored_ms, r->restored_to_step_ms};
    if (store_generation_recovery(c->store, j->id, j->generation, &rec) != 0)
        c->m.store_errors++;
    el->rec_mono = el->rec_gen = el->rec_formed_ms = 0;
}

/* The report's epochs in one transaction (one fsync, all or nothing), as
 * rows of generation gen; false: the call was answered with the error. */
static bool epochs_store(struct coord *c, struct rpc_call *call, const struct job *j, uint64_t gen,
                         int rank, const Kolo__WorkerReportRequest *m)
{
    bool store = m->n_epochs != 0;
    int err = store ? store_begin(c->store) : 0;
    for (size_t i = 0; i < m->n_epochs && !err; i++) {
        const Kolo__EpochReport *e = m->epochs[i];
        struct store_epoch se = {.job_id = j->id,
                                 .generation = gen,
                                 .rank = rank,
                                 .epoch = e->epoch,
                                 .start_ms = e->phase == 0 ? e->ts_ms : e->start_ms,
                                 .end_ms = e->ts_ms,
                                 .samples = e->samples,
                                 .metrics_json = e->metrics_json[0] ? e->metrics_json : NULL};
        err = store_epoch_report(c->store, &se, e->phase);
    }
    if (store && !err)
        err = store_commit(c->store);
    else if (store)
        store_rollback(c->store);
    if (err) {
        coord_store_failed(c, "report");
        report_fail(c, call, KOLO_ESTORE, "the report could not be stored: %s",
                    store_last_error(c->store));
        return false;
    }
    c->m.report.epochs += m->n_epochs;
    return true;
}

/* A report from a rank of an earlier generation, sent as a reset closed
 * it (kolo_fini sends what is queued): its epochs are that generation's
 * work and are kept; the rest (step times, telemetry) describes a ring
 * that is gone. */
static void report_past(struct coord *c, struct rpc_call *call, struct job *j,
                        Kolo__WorkerReportRequest *m)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    if (epochs_store(c, call, j, f->generation, (int)f->rank, m)) {
        c->m.report.batches++;
        Kolo__WorkerReportReply rep = KOLO__WORKER_REPORT_REPLY__INIT;
        rep.accepted_epochs = (uint32_t)m->n_epochs;
        coord_send_pb(call, &rep.base);
    }
    kolo__worker_report_request__free_unpacked(m, NULL);
}

static void rpc_report(struct coord *c, struct rpc_call *call)
{
    uint64_t received_us = now_mono_us();
    const struct rpc_frame *f = rpc_call_frame(call);
    bool past;
    struct job *j = coord_worker_fence_past(c, call, M_WORKER_REPORT, &past);
    if (!j) {
        c->m.report.refused++;
        return;
    }
    Kolo__WorkerReportRequest *m = kolo__worker_report_request__unpack(NULL, f->body_len, f->body);
    if (!m) {
        report_fail(c, call, KOLO_EPROTO, "malformed WorkerReportRequest");
        return;
    }
    char why[400];
    if (!check_report(m, why, sizeof why)) {
        report_fail(c, call, KOLO_EINVAL, "%s", why);
        kolo__worker_report_request__free_unpacked(m, NULL);
        return;
    }
    if (past) {
        report_past(c, call, j, m);
        return;
    }
    const char *host_id = j->ranks[f->rank].host_id[0] ? j->ranks[f->rank].host_id : NULL;
    /* Data-plane refusals: counters by reason (metrics), and an event, so
     * an operator sees someone knocking on a job's data ports. */
    if (m->n_dataplane_rejected) {
        char what[256];
        size_t used = 0;
        what[0] = '\0';
        for (size_t i = 0; i < m->n_dataplane_rejected; i++) {
            const Kolo__DataplaneRejections *d = m->dataplane_rejected[i];
            coord_dp_rejected_add(c, d->reason, d->count);
            int n = snprintf(what + used, sizeof what - used, "%s%s %" PRIu64, i ? ", " : "",
                             d->reason, d->count);
            if (n > 0 && (size_t)n < sizeof what - used)
                used += (size_t)n;
        }
        coord_event(c, j->id, host_id, "dataplane.refused",
                    "job %" PRIu64 " rank %d refused data-plane connections that did not prove "
                    "membership of the job (%s)",
                    j->id, (int)f->rank, what);
    }
    if (m->recovery && f->rank == 0)
        recovery_event(c, j, m->recovery);
    /* Rounds' telemetry: in memory only (the histogram, the lags). */
    if (m->rounds) {
        const Kolo__RoundTelemetry *t = m->rounds;
        if (f->rank == 0) { /* every rank runs the same rounds: count them once */
            c->m.rounds += t->rounds;
            c->m.round_ops += t->agreed;
        }
        for (size_t i = 0; i < t->n_wait_us; i++)
            coord_hist_observe_n(&c->m.negotiation_wait, (double)t->wait_us[i] / 1e6,
                                 t->wait_ops[i]);
        coord_negot_round_wait(j, (int)f->rank, t->wait_avg_s);
    }
    /* The timeline's spans, on the coordinator's clock (a rank sends them
     * only once it knows its offset). */
    coord_timeline_rank_dropped(j->tl, m->spans_dropped);
    if (m->n_spans && m->clock_known) {
        coord_timeline_spans(j->tl, (int)f->rank, j->nranks, m->spans, m->n_spans,
                             m->clock_offset_us);
        coord_timeline_spans(j->tl_draining, (int)f->rank, j->nranks, m->spans, m->n_spans,
                             m->clock_offset_us);
    }
    /* The epochs in one transaction (one fsync, all or nothing); the step
     * rows wait for the group commit. */
    if (!steps_queue(c, j->id, (int)f->rank, host_id, m->steps, m->n_steps)) {
        report_fail(c, call, KOLO_ENOMEM, "out of memory");
        kolo__worker_report_request__free_unpacked(m, NULL);
        return;
    }
    if (!epochs_store(c, call, j, j->generation, (int)f->rank, m)) {
        kolo__worker_report_request__free_unpacked(m, NULL);
        return;
    }
    c->m.report.batches++;
    c->m.report.step_rows += m->n_steps;
    struct report_job *rj = rjob_get(c, j->id, true);
    struct report_rank *rr = rj ? rjob_rank(rj, f->rank) : NULL;
    if (rr) {
        for (size_t i = 0; i < m->n_steps; i++) {
            if (m->steps[i]->ts_ms >= rr->step_ms) {
                rr->step_ms = m->steps[i]->ts_ms / 1000 * 1000;
                rr->step_s = m->steps[i]->seconds;
                rr->step_n = m->steps[i]->count;
            }
        }
        for (size_t i = 0; i < m->n_epochs; i++)
            if (m->epochs[i]->phase == 1 && m->epochs[i]->epoch > rr->epoch)
                rr->epoch = m->epochs[i]->epoch;
        if (m->time_split && m->time_split->wall_us &&
            m->time_split->wait_us + m->time_split->data_us <= m->time_split->wall_us &&
            m->time_split->overlap_us <= m->time_split->wall_us) {
            const Kolo__TimeSplit *t = m->time_split;
            rr->split_wall = rr->split_wall / 2 + (double)t->wall_us;
            rr->split_wait = rr->split_wait / 2 + (double)t->wait_us;
            rr->split_data = rr->split_data / 2 + (double)t->data_us;
            rr->split_overlap = rr->split_overlap / 2 + (double)t->overlap_us;
        }
        if (m->clock_known) {
            rr->clock_known = true;
            rr->clock_offset_us = m->clock_offset_us;
            rr->clock_rtt_us = m->clock_rtt_us;
        }
    }
    if (m->dropped > c->m.report.worker_dropped_max)
        c->m.report.worker_dropped_max = m->dropped;
    if (rj)
        rj->rows_since_prune += m->n_steps; /* pruned after the group commit */
    Kolo__WorkerReportReply rep = KOLO__WORKER_REPORT_REPLY__INIT;
    rep.accepted_epochs = (uint32_t)m->n_epochs;
    rep.accepted_steps = (uint32_t)m->n_steps;
    rep.received_us = received_us;
    rep.replied_us = now_mono_us();
    kolo__worker_report_request__free_unpacked(m, NULL);
    coord_send_pb(call, &rep.base);
}

/* ---------------------------------------------------------------- epoch summaries */

static int collect_row(const struct store_epoch *e, void *arg)
{
    struct ep_rows *rs = arg;
    if (array_room(&rs->v, rs->n, &rs->cap, sizeof *rs->v, 64) != 0) {
        rs->oom = true;
        return KOLO_ENOMEM;
    }
    struct ep_row *r = &rs->v[rs->n];
    *r =
        (struct ep_row){e->generation, e->rank, e->epoch, e->start_ms, e->end_ms, e->samples, NULL};
    if (e->metrics_json && !(r->metrics = strdup(e->metrics_json))) {
        rs->oom = true;
        return KOLO_ENOMEM;
    }
    rs->n++;
    return 0;
}

void coord_report_rows_free(struct ep_rows *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        free(rs->v[i].metrics);
    free(rs->v);
}

struct gen_size {
    uint64_t generation;
    int size;
    uint64_t ts_ms; /* when it formed */
};

struct gen_sizes {
    struct gen_size *v;
    size_t n, cap;
};

static int collect_gen(uint64_t generation, const char *cause, int size, uint64_t ts_ms,
                       const struct store_recovery *rec, void *arg)
{
    (void)cause;
    (void)rec;
    struct gen_sizes *gs = arg;
    if (array_room(&gs->v, gs->n, &gs->cap, sizeof *gs->v, 16) != 0)
        return KOLO_ENOMEM;
    gs->v[gs->n++] = (struct gen_size){generation, size, ts_ms};
    return 0;
}

static int gen_size_of(const struct job *j, const struct gen_sizes *gs, uint64_t generation)
{
    if (generation == j->generation)
        return j->nranks;
    for (size_t i = 0; i < gs->n; i++)
        if (gs->v[i].generation == generation)
            return gs->v[i].size;
    return j->np;
}

void coord_report_metrics(const struct ep_rows *rs, const struct ep_sum *s, struct ep_metrics *m)
{
    m->n = 0;
    m->v = calloc(s->count ? s->count : 1, sizeof *m->v);
    for (size_t x = s->first; m->v && x < s->first + s->count; x++) {
        const char *t = rs->v[x].metrics;
        char err[64];
        if (t && json_parse(t, strlen(t), &m->v[m->n], err, sizeof err) == 0)
            m->n++;
    }
}

void coord_report_metrics_free(struct ep_metrics *m)
{
    for (size_t i = 0; i < m->n; i++)
        json_free(m->v[i]);
    free(m->v);
    m->v = NULL;
    m->n = 0;
}

double coord_report_mean(const struct ep_metrics *m, const char *key)
{
    double sum = 0;
    int cnt = 0;
    for (size_t i = 0; i < m->n; i++) {
        const struct json *v = json_get(m->v[i], key);
        if (v && v->type == JSON_NUMBER && isfinite(v->num)) {
            sum += v->num;
            cnt++;
        }
    }
    return cnt ? sum / cnt : NAN;
}

int coord_report_epochs(struct coord *c, const struct job *j, struct ep_rows *rs,
                        struct ep_sum **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    int rc = store_epochs_each(c->store, j->id, collect_row, rs);
    if (rc)
        return rs->oom ? KOLO_ENOMEM : KOLO_ESTORE;
    struct gen_sizes gs = {0};
    if (store_generations_each(c->store, j->id, collect_gen, &gs) != 0) {
        free(gs.v);
        return KOLO_ESTORE;
    }
    struct ep_sum *sums = calloc(rs->n ? rs->n : 1, sizeof *sums);
    if (!sums) {
        free(gs.v);
        return KOLO_ENOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < rs->n;) {
        /* the epoch's rows: [i, k); the newest generation's: [g, k) */
        size_t k = i;
        while (k < rs->n && rs->v[k].epoch == rs->v[i].epoch)
            k++;
        size_t g = k - 1;
        while (g > i && rs->v[g - 1].generation == rs->v[k - 1].generation)
            g--;
        struct ep_sum *s = &sums[n++];
        s->epoch = rs->v[i].epoch;
        s->generation = rs->v[g].generation;
        s->first = g;
        s->count = k - g;
        s->expected = gen_size_of(j, &gs, s->generation);
        for (size_t x = g; x < k; x++) {
            const struct ep_row *r = &rs->v[x];
            if (r->start_ms && (!s->start_ms || r->start_ms < s->start_ms))
                s->start_ms = r->start_ms;
            if (r->end_ms) { /* 0: only its start (phase 0) was reported */
                if (r->end_ms > s->end_ms)
                    s->end_ms = r->end_ms;
                s->reported++;
                s->samples += r->samples;
                if (r->metrics && !s->metrics)
                    s->metrics = r->metrics; /* rows are in rank order */
            }
        }
        s->complete = s->reported >= s->expected;
        /* the resets that cut it: generations after the first formed
         * between the previous epoch's end and its own */
        uint64_t from = n > 1 ? sums[n - 2].end_ms : 0;
        for (size_t x = 0; x < gs.n && s->end_ms; x++)
            s->resets += gs.v[x].generation > 1 && gs.v[x].ts_ms > from &&
                         gs.v[x].ts_ms <= s->end_ms;
        if (s->start_ms && s->end_ms && s->end_ms >= s->start_ms) {
            s->wall_s = (double)(s->end_ms - s->start_ms) / 1000.0;
            s->samples_per_s = s->wall_s > 0 ? (double)s->samples / s->wall_s : NAN;
        } else {
            s->wall_s = NAN;
            s->samples_per_s = NAN;
        }
        i = k;
    }
    free(gs.v);
    *out = sums;
    *nout = n;
    return 0;
}

/* ---------------------------------------------------------------- GetEpochs */

static void rpc_get_epochs(struct coord *c, struct rpc_call *call)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__GetEpochsRequest *req = kolo__get_epochs_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_ADMIN_GET_EPOCHS]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed GetEpochsRequest");
        return;
    }
    struct job *j = coord_job_find(c, req->job_id);
    int64_t after = req->after_epoch;
    kolo__get_epochs_request__free_unpacked(req, NULL);
    if (!j) {
        c->m.rpc_errors[M_ADMIN_GET_EPOCHS]++;
        rpc_call_error(call, KOLO_ENOTFOUND, "no such job");
        return;
    }
    struct ep_rows rs = {0};
    struct ep_sum *sums = NULL;
    size_t n = 0;
    int rc = coord_report_epochs(c, j, &rs, &sums, &n);
    if (rc) {
        coord_report_rows_free(&rs);
        c->m.rpc_errors[M_ADMIN_GET_EPOCHS]++;
        rpc_call_error(call, rc, "cannot read the epochs: %s",
                       rc == KOLO_ENOMEM ? "out of memory" : store_last_error(c->store));
        return;
    }
    Kolo__EpochSummary *es = calloc(n ? n : 1, sizeof *es);
    Kolo__EpochSummary **ep = calloc(n ? n : 1, sizeof *ep);
    if (!es || !ep) {
        free(es);
        free(ep);
        free(sums);
        coord_report_rows_free(&rs);
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const struct ep_sum *s = &sums[i];
        if (s->epoch <= after)
            continue;
        kolo__epoch_summary__init(&es[k]);
        es[k].epoch = s->epoch;
        es[k].start_ms = s->start_ms;
        es[k].end_ms = s->end_ms;
        es[k].wall_s = isnan(s->wall_s) ? -1 : s->wall_s;
        es[k].samples = s->samples;
        es[k].samples_per_s = isnan(s->samples_per_s) ? -1 : s->samples_per_s;
        es[k].ranks_reported = s->reported;
        es[k].ranks_expected = s->expected;
        es[k].complete = s->complete;
        es[k].resets = s->resets;
        es[k].metrics_json = (char *)(s->metrics ? s->metrics : "");
        es[k].generation = s->generation;
        ep[k] = &es[k];
        k++;
    }
    Kolo__GetEpochsReply rep = KOLO__GET_EPOCHS_REPLY__INIT;
    rep.epochs = ep;
    rep.n_epochs = k;
    rep.job_done = j->state != JOB_RUNNING && j->state != JOB_PENDING;
    coord_send_pb(call, &rep.base);
    free(es);
    free(ep);
    free(sums);
    coord_report_rows_free(&rs);
}

/* A host costing the job too much, watched until the window passes. */
struct straggler_watch {
    char host_id[64];
    uint64_t since; /* monotonic ms it first cost >= STRAGGLER_COST */
    bool acted;     /* told (and excluded) once per spell */
    bool seen;      /* costly in this look */
};

static struct straggler_watch *watch_get(struct job *j, const char *host_id)
{
    for (int i = 0; i < j->nsw; i++)
        if (strcmp(j->sw[i].host_id, host_id) == 0)
            return &j->sw[i];
    struct straggler_watch *v = realloc(j->sw, (size_t)(j->nsw + 1) * sizeof *v);
    if (!v)
        return NULL;
    j->sw = v;
    struct straggler_watch *w = &j->sw[j->nsw++];
    memset(w, 0, sizeof *w);
    str_copy(w->host_id, host_id, sizeof w->host_id);
    return w;
}

static void straggler_act(struct coord *c, struct job *j, struct host *h, int rank,
                          const struct rank_cost *rc, uint64_t secs)
{
    char why[400];
    snprintf(why, sizeof why,
             "host %s's rank %d has cost job %llu %.0f %% of each step for %llu s (the others "
             "wait %.0f ms for it in a %.0f ms step)",
             h->name, rank, (unsigned long long)j->id, rc->cost * 100, (unsigned long long)secs,
             rc->lag_s * 1e3, rc->step_s * 1e3);
    if (j->straggler_exclude && coord_elastic_exclude_straggler(c, j, h, why)) {
        coord_event(c, j->id, h->id, "job.straggler",
                    "straggler: %s: excluded, job %llu leaves it at its next commit", why,
                    (unsigned long long)j->id);
        return;
    }
    coord_event(c, j->id, h->id, "job.straggler", "straggler: %s%s", why,
                j->straggler_exclude ? " (kept: without it the job would fall below --min-np)"
                : j->el ? " (--straggler-policy exclude would drain it from the job)"
                        : "");
}

void coord_report_straggler_cron(struct coord *c, struct job *j, uint64_t now)
{
    if (j->state != JOB_RUNNING || j->nranks < 2 || now - j->sw_checked < 1000)
        return;
    j->sw_checked = now;
    struct rank_cost *rc = calloc((size_t)j->nranks, sizeof *rc);
    if (!rc)
        return;
    coord_report_rank_costs(c, j, rc);
    for (int i = 0; i < j->nsw; i++)
        j->sw[i].seen = false;
    for (int r = 0; r < j->nranks; r++) {
        struct host *h = j->ranks[r].host;
        if (!h || !(rc[r].cost >= STRAGGLER_COST))
            continue;
        struct straggler_watch *w = watch_get(j, h->id);
        if (!w || w->seen)
            continue; /* the host's first costly rank speaks for it */
        w->seen = true;
        if (!w->since)
            w->since = now;
        if (!w->acted && now - w->since >= j->straggler_window_ms) {
            w->acted = true;
            straggler_act(c, j, h, r, &rc[r], (now - w->since) / 1000);
        }
    }
    for (int i = 0; i < j->nsw;) /* a host that keeps up again starts over */
        if (!j->sw[i].seen)
            j->sw[i] = j->sw[--j->nsw];
        else
            i++;
    free(rc);
}

/* kolo top: the ranks with what they cost the job. */
static void rpc_get_ranks(struct coord *c, struct rpc_call *call)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__GetRanksRequest *req = kolo__get_ranks_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_ADMIN_GET_RANKS]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed GetRanksRequest");
        return;
    }
    struct job *j = coord_job_find(c, req->job_id);
    kolo__get_ranks_request__free_unpacked(req, NULL);
    if (!j) {
        c->m.rpc_errors[M_ADMIN_GET_RANKS]++;
        rpc_call_error(call, KOLO_ENOTFOUND, "no such job");
        return;
    }
    int n = j->nranks;
    struct rank_cost *rc = calloc(n > 0 ? (size_t)n : 1, sizeof *rc);
    Kolo__RankView *views = calloc(n > 0 ? (size_t)n : 1, sizeof *views);
    Kolo__RankView **ptrs = calloc(n > 0 ? (size_t)n : 1, sizeof *ptrs);
    if (!rc || !views || !ptrs) {
        free(rc);
        free(views);
        free(ptrs);
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return;
    }
    double med = coord_report_rank_costs(c, j, rc);
    for (int r = 0; r < n; r++) {
        const struct rank *rk = &j->ranks[r];
        const struct report_rank *rr = coord_report_rank(c, j->id, r);
        Kolo__RankView *v = &views[r];
        kolo__rank_view__init(v);
        v->rank = r;
        v->host = (char *)(rk->host ? rk->host->name : rk->host_id);
        v->state = (char *)coord_rank_state_name(rk->state);
        v->pid = rk->pid;
        v->step_s = isfinite(rc[r].step_s) ? rc[r].step_s : -1;
        v->epoch = rr ? rr->epoch : -1;
        v->lag_s = isfinite(rc[r].lag_s) ? rc[r].lag_s : -1;
        v->straggler = rc[r].straggler;
        v->cost = isfinite(rc[r].cost) ? rc[r].cost : -1;
        struct time_shares ts;
        bool split = coord_report_time_shares(rr, &ts);
        v->compute = split ? ts.compute : -1;
        v->wait = split ? ts.wait : -1;
        v->data = split ? ts.data : -1;
        v->overlap = split ? ts.overlap : -1;
        ptrs[r] = v;
    }
    Kolo__GetRanksReply rep = KOLO__GET_RANKS_REPLY__INIT;
    rep.job_id = j->id;
    rep.generation = j->generation;
    rep.state = (char *)coord_job_state_name(j->state);
    rep.step_s = isfinite(med) ? med : -1;
    rep.ranks = ptrs;
    rep.n_ranks = (size_t)n;
    coord_send_pb(call, &rep.base);
    free(rc);
    free(views);
    free(ptrs);
}

void coord_rpc_report(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    if (m == M_WORKER_REPORT)
        rpc_report(c, call);
    else if (m == M_ADMIN_GET_RANKS)
        rpc_get_ranks(c, call);
    else
        rpc_get_epochs(c, call);
}

/* ---------------------------------------------------------------- queries */

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double coord_report_baseline(struct coord *c, const struct job *j, uint64_t *id)
{
    *id = 0;
    const struct job *best = NULL;
    for (const struct job *b = c->jobs; b; b = b->next) {
        if (b == j || b->np != 1 || b->el || b->argc != j->argc ||
            (b->state != JOB_SUCCEEDED && b->state != JOB_RUNNING))
            continue;
        bool same = true;
        for (int i = 0; i < b->argc && same; i++)
            same = strcmp(b->argv[i], j->argv[i]) == 0;
        if (same)
            best = b; /* jobs are in id order: the last match is the newest */
    }
    if (!best)
        return NAN;
    struct ep_rows rs = {0};
    struct ep_sum *sums = NULL;
    size_t n = 0;
    double rate = NAN;
    if (coord_report_epochs(c, best, &rs, &sums, &n) == 0 && n > 0) {
        double *v = calloc(n, sizeof(*v));
        size_t k = 0;
        for (size_t i = n > 1 ? 1 : 0; v && i < n; i++)
            if (sums[i].complete && isfinite(sums[i].samples_per_s))
                v[k++] = sums[i].samples_per_s;
        if (k) {
            qsort(v, k, sizeof(*v), cmp_dbl);
            rate = k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
            *id = best->id;
        }
        free(v);
    }
    free(sums);
    coord_report_rows_free(&rs);
    return rate;
}

/* ---- steps ---- */

static int collect_step(const struct store_step *s, void *arg)
{
    struct step_rows *sr = arg;
    if (array_room(&sr->v, sr->n, &sr->cap, sizeof *sr->v, 256) != 0) {
        sr->oom = true;
        return KOLO_ENOMEM;
    }
    struct step_row *r = &sr->v[sr->n++];
    str_copy(r->host, s->host_id ? s->host_id : "", sizeof r->host);
    r->bucket_ms = s->ts_ms / sr->bucket_ms * sr->bucket_ms;
    r->seconds = s->seconds;
    r->n = s->n;
    r->rank = s->rank;
    return 0;
}

static int step_cmp(const void *a, const void *b)
{
    const struct step_row *x = a, *y = b;
    int h = strcmp(x->host, y->host);
    if (h)
        return h;
    if (x->bucket_ms != y->bucket_ms)
        return x->bucket_ms < y->bucket_ms ? -1 : 1;
    return x->seconds < y->seconds ? -1 : x->seconds > y->seconds;
}

int coord_report_steps(struct coord *c, const struct job *j, uint64_t since_ms,
                       struct step_rows *sr)
{
    coord_report_flush(c); /* rows waiting for the group commit too */
    if (store_steps_each(c->store, j->id, since_ms, collect_step, sr) != 0)
        return sr->oom ? KOLO_ENOMEM : KOLO_ESTORE;
    if (sr->n)
        qsort(sr->v, sr->n, sizeof *sr->v, step_cmp);
    return 0;
}

/* ---- stragglers ----
 *
 * A rank is the straggler when the others keep waiting for it: its
 * requests come in at least STRAGGLER_MIN_S after the first rank's, on
 * average, at least STRAGGLER_RATIO times as late as the median of the
 * other ranks' lateness (coord_negot_lags), and at least STRAGGLER_NEAR of
 * the largest lateness: the job waits for its slowest ranks, not for one
 * that a busy CPU made 20 ms late beside a 120 ms straggler. */
#define STRAGGLER_MIN_S 0.02
#define STRAGGLER_RATIO 3.0
#define STRAGGLER_NEAR 0.5

void coord_straggler_flags(const double *lag, int n, bool *slow)
{
    for (int r = 0; r < n; r++)
        slow[r] = false;
    double *sorted = n >= 2 ? malloc((size_t)n * sizeof(*sorted)) : NULL;
    if (!sorted)
        return;
    memcpy(sorted, lag, (size_t)n * sizeof(*sorted));
    qsort(sorted, (size_t)n, sizeof(*sorted), cmp_dbl);
    double most = sorted[n - 1];
    int k = n - 1; /* the others */
    for (int r = 0; r < n; r++) {
        /* the others, sorted, are `sorted` without one copy of lag[r]:
         * their i-th is sorted[i] before that copy, sorted[i + 1] after */
        int pos = 0;
        for (int lo = 0, hi = n - 1; lo <= hi;) {
            int mid = (lo + hi) / 2;
            if (sorted[mid] < lag[r]) {
                lo = mid + 1;
            } else {
                pos = mid;
                hi = mid - 1;
            }
        }
        int a = k / 2 - (k % 2 == 0), b = k / 2;
        double med = (sorted[a < pos ? a : a + 1] + sorted[b < pos ? b : b + 1]) / 2;
        slow[r] = lag[r] >= STRAGGLER_MIN_S && lag[r] >= STRAGGLER_RATIO * med &&
                  lag[r] >= STRAGGLER_NEAR * most;
    }
    free(sorted);
}

bool coord_report_stragglers(const struct job *j, double *lag, bool *slow)
{
    int n = j->nranks > 0 ? coord_negot_lags(j, lag, j->nranks) : 0;
    for (int r = 0; r < j->nranks; r++)
        slow[r] = false;
    coord_straggler_flags(lag, n, slow);
    return n > 0;
}

const struct report_rank *coord_report_rank(struct coord *c, uint64_t job_id, int rank)
{
    struct report_job *rj = rjob_get(c, job_id, false);
    return rj && rank >= 0 && rank < rj->nranks ? &rj->ranks[rank] : NULL;
}

bool coord_report_time_shares(const struct report_rank *rr, struct time_shares *s)
{
    if (!rr || !(rr->split_wall > 0))
        return false;
    s->wait = rr->split_wait / rr->split_wall;
    s->data = rr->split_data / rr->split_wall;
    s->overlap = rr->split_overlap / rr->split_wall;
    s->compute = 1.0 - s->wait - s->data;
    if (s->compute < 0)
        s->compute = 0;
    return true;
}

/* The median of the n finite values of x (scratch: n doubles), the lower
 * of the middle two when they are even (lower); NAN none. */
static double median_finite(const double *x, int n, double *scratch, bool lower)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i]))
            scratch[k++] = x[i];
    if (!k)
        return NAN;
    qsort(scratch, (size_t)k, sizeof *scratch, cmp_dbl);
    return k % 2 ? scratch[k / 2]
           : lower ? scratch[k / 2 - 1]
                   : (scratch[k / 2 - 1] + scratch[k / 2]) / 2;
}

double coord_report_rank_costs(struct coord *c, const struct job *j, struct rank_cost *v)
{
    int n = j->nranks;
    double *lag = calloc(n > 0 ? (size_t)n : 1, sizeof *lag);
    double *step = calloc(n > 0 ? (size_t)n : 1, sizeof *step);
    double *scratch = calloc(n > 0 ? (size_t)n : 1, sizeof *scratch);
    bool *slow = calloc(n > 0 ? (size_t)n : 1, sizeof *slow);
    double med_step = NAN;
    if (lag && step && scratch && slow) {
        bool known = coord_report_stragglers(j, lag, slow);
        for (int r = 0; r < n; r++) {
            const struct report_rank *rr = coord_report_rank(c, j->id, r);
            step[r] = rr && rr->step_ms ? rr->step_s : NAN;
            if (!known)
                lag[r] = NAN;
        }
        med_step = median_finite(step, n, scratch, false);
        /* the lower median: of 2 ranks, the one that keeps up */
        double med_lag = median_finite(lag, n, scratch, true);
        for (int r = 0; r < n; r++) {
            double extra = lag[r] - med_lag;
            v[r] = (struct rank_cost){
                .step_s = step[r],
                .lag_s = lag[r],
                .cost = isfinite(extra) && med_step > 0 ? (extra > 0 ? extra : 0) / med_step : NAN,
                .straggler = known && slow[r],
            };
        }
    } else {
        for (int r = 0; r < n; r++)
            v[r] = (struct rank_cost){NAN, NAN, NAN, false};
    }
    free(lag);
    free(step);
    free(scratch);
    free(slow);
    return med_step;
}

/* ---------------------------------------------------------------- metrics */

/* label_value writes v as a Prometheus label value (", \ and newline
 * escaped). */
static void label_value(struct buf *b, const char *v)
{
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\')
            buf_putc(b, '\\');
        if (*p == '\n')
            buf_puts(b, "\\n");
        else
            buf_putc(b, *p);
    }
}

/* One sample of a running job's series: name{job_id="ID",job_name="NAME"}
 * v. Not "job": Prometheus gives its scrape job that label, and would
 * rename ours. */
static void job_sample(struct buf *b, const char *metric, const struct job *j, double v)
{
    buf_printf(b, "%s{job_id=\"%llu\",job_name=\"", metric, (unsigned long long)j->id);
    label_value(b, j->name ? j->name : "");
    buf_printf(b, "\"} %.6g\n", v);
}

/* kolo_job_time_share: the ranks' mean shares, one sample per part (none
 * before any rank reported its time). */
static void job_time_shares(struct coord *c, struct buf *b, const char *metric,
                            const struct job *j)
{
    double sum[3] = {0};
    int n = 0;
    for (int r = 0; r < j->nranks; r++) {
        struct time_shares ts;
        if (!coord_report_time_shares(coord_report_rank(c, j->id, r), &ts))
            continue;
        sum[0] += ts.compute;
        sum[1] += ts.wait;
        sum[2] += ts.data;
        n++;
    }
    static const char *const part[3] = {"compute", "wait", "data"};
    for (int k = 0; n && k < 3; k++) {
        buf_printf(b, "%s{job_id=\"%llu\",job_name=\"", metric, (unsigned long long)j->id);
        label_value(b, j->name ? j->name : "");
        buf_printf(b, "\",part=\"%s\"} %.6g\n", part[k], sum[k] / n);
    }
}

/*
 * Per running job, what a monitoring system alerts on (docs/observability.md,
 * deploy/prometheus/kolo-alerts.yml): its generation (resets), the
 * samples/s of its last complete epoch, its straggler (the rank the others
 * wait for longest, -1: none) and how long ago its ranks last stepped: the
 * newest step of any rank (the whole job stalled), the stalest rank's, and
 * how long an op has waited for ranks that never submitted it (one rank
 * frozen while the others wait in a collective). A job_id label per
 * job, no rank label: a series per rank of a 1,024-rank job is too many.
 */
static void render_job_metrics(struct coord *c, struct buf *b)
{
    static const char *const help[][3] = {
        {"kolo_job_generation", "gauge", "The running job's generation (1 + its resets)."},
        {"kolo_job_samples_per_second", "gauge",
         "Samples per second of the running job's last complete epoch."},
        {"kolo_job_straggler_rank", "gauge",
         "The rank the others wait for longest, -1 when no rank is a straggler."},
        {"kolo_job_last_step_age_seconds", "gauge",
         "Seconds since any rank of the running job last reported a step."},
        {"kolo_job_stalest_rank_age_seconds", "gauge",
         "Seconds since the rank that stepped longest ago last reported a step."},
        {"kolo_job_stall_seconds", "gauge",
         "How long the running job's longest-waiting op has waited for ranks that did not "
         "submit it (0: none waits)."},
        {"kolo_job_time_share", "gauge",
         "Where the running job's time goes, the mean over its ranks of their last seconds' "
         "shares: part=compute, wait (for other ranks) or data (moving it); they add up to 1."},
    };
    for (size_t k = 0; k < sizeof help / sizeof help[0]; k++) {
        buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", help[k][0], help[k][2], help[k][0],
                   help[k][1]);
        uint64_t now = now_wall_ms();
        for (struct job *j = c->jobs; j; j = j->next) {
            if (j->state != JOB_RUNNING)
                continue;
            if (k == 0) {
                job_sample(b, help[k][0], j, (double)j->generation);
            } else if (k == 1) {
                struct report_job *rj = rjob_get(c, j->id, false);
                if (rj && rj->rate_epochs != c->m.report.epochs &&
                    now - rj->rate_ms >= RATE_EVERY_MS) {
                    struct ep_rows rs = {0};
                    struct ep_sum *sums = NULL;
                    size_t n = 0;
                    rj->rate = NAN;
                    if (coord_report_epochs(c, j, &rs, &sums, &n) == 0)
                        for (size_t i = 0; i < n; i++)
                            if (sums[i].complete && isfinite(sums[i].samples_per_s))
                                rj->rate = sums[i].samples_per_s;
                    free(sums);
                    coord_report_rows_free(&rs);
                    rj->rate_epochs = c->m.report.epochs;
                    rj->rate_ms = now;
                }
                if (rj && isfinite(rj->rate))
                    job_sample(b, help[k][0], j, rj->rate);
            } else if (k == 2 && j->nranks > 0) {
                double *lag = calloc((size_t)j->nranks, sizeof *lag);
                bool *slow = calloc((size_t)j->nranks, sizeof *slow);
                int worst = -1;
                if (lag && slow && coord_report_stragglers(j, lag, slow))
                    for (int r = 0; r < j->nranks; r++)
                        if (slow[r] && (worst < 0 || lag[r] > lag[worst]))
                            worst = r;
                free(lag);
                free(slow);
                job_sample(b, help[k][0], j, worst);
            } else if (k == 6) {
                job_time_shares(c, b, help[k][0], j);
            } else if (k == 5) {
                size_t n = coord_negot_stalls(j, 0, NULL, 0);
                struct negot_stall *st = n ? calloc(n, sizeof *st) : NULL;
                uint64_t longest = 0;
                n = st ? coord_negot_stalls(j, 0, st, n) : 0;
                for (size_t i = 0; i < n; i++)
                    longest = st[i].waiting_ms > longest ? st[i].waiting_ms : longest;
                free(st);
                job_sample(b, help[k][0], j, (double)longest / 1000.0);
            } else if (k >= 3) {
                uint64_t newest = 0, oldest = UINT64_MAX;
                for (int r = 0; r < j->nranks; r++) {
                    const struct report_rank *rr = coord_report_rank(c, j->id, r);
                    uint64_t at = rr ? rr->step_ms : 0;
                    newest = at > newest ? at : newest;
                    oldest = at < oldest ? at : oldest;
                }
                /* a rank that never stepped counts from the job's start */
                if (oldest == 0)
                    oldest = j->started_ms;
                uint64_t at = k == 3 ? newest : oldest;
                if (newest && at && at <= now)
                    job_sample(b, help[k][0], j, (double)(now - at) / 1000.0);
            }
        }
    }
}

void coord_report_render_metrics(struct coord *c, struct buf *b)
{
    const struct coord_report_metrics *m = &c->m.report;
    buf_printf(b,
               "# HELP kolo_reports_total Worker progress reports (batches) stored.\n"
               "# TYPE kolo_reports_total counter\nkolo_reports_total %llu\n"
               "# HELP kolo_report_epochs_total Epoch boundaries reported by workers.\n"
               "# TYPE kolo_report_epochs_total counter\nkolo_report_epochs_total %llu\n"
               "# HELP kolo_report_step_rows_total Per-second step-time rows reported.\n"
               "# TYPE kolo_report_step_rows_total counter\nkolo_report_step_rows_total %llu\n"
               "# HELP kolo_report_step_rows_pruned_total Step-time rows deleted by the per-job "
               "cap.\n# TYPE kolo_report_step_rows_pruned_total counter\n"
               "kolo_report_step_rows_pruned_total %llu\n"
               "# HELP kolo_reports_refused_total Reports refused (stale generation, job not "
               "running, malformed).\n# TYPE kolo_reports_refused_total counter\n"
               "kolo_reports_refused_total %llu\n"
               "# HELP kolo_report_worker_dropped_max The most reports one worker context said "
               "it dropped (its queue was full, or the coordinator unreachable).\n"
               "# TYPE kolo_report_worker_dropped_max gauge\nkolo_report_worker_dropped_max %llu\n"
               "# HELP kolo_report_step_flushes_total Group commits of step-time rows.\n"
               "# TYPE kolo_report_step_flushes_total counter\nkolo_report_step_flushes_total %llu\n"
               "# HELP kolo_report_step_rows_lost_total Step-time rows a failed group commit "
               "lost.\n# TYPE kolo_report_step_rows_lost_total counter\n"
               "kolo_report_step_rows_lost_total %llu\n",
               (unsigned long long)m->batches, (unsigned long long)m->epochs,
               (unsigned long long)m->step_rows, (unsigned long long)m->step_rows_pruned,
               (unsigned long long)m->refused, (unsigned long long)m->worker_dropped_max,
               (unsigned long long)m->step_flushes, (unsigned long long)m->step_rows_lost);

    /* Per host, the mean of its ranks' latest step times (reported in the
     * last minute, running jobs): where the straggler is. A host label,
     * not a rank label, keeps the series few. */
    buf_puts(b, "# HELP kolo_step_duration_seconds Mean of the latest step time of the ranks on "
                "a host (last minute, running jobs).\n# TYPE kolo_step_duration_seconds gauge\n");
    uint64_t now = now_wall_ms();
    for (struct host *h = c->hosts; h; h = h->next) {
        double sum = 0;
        int n = 0;
        for (struct report_job *rj = c->report_jobs; rj; rj = rj->next) {
            struct job *j = coord_job_find(c, rj->job_id);
            if (!j || j->state != JOB_RUNNING)
                continue;
            for (int r = 0; r < rj->nranks && r < j->nranks; r++) {
                const struct report_rank *rr = &rj->ranks[r];
                if (j->ranks[r].host == h && rr->step_ms && now - rr->step_ms < 60000) {
                    sum += rr->step_s;
                    n++;
                }
            }
        }
        if (!n)
            continue;
        buf_puts(b, "kolo_step_duration_seconds{host=\"");
        label_value(b, h->name);
        buf_printf(b, "\"} %.6f\n", sum / n);
    }
    render_job_metrics(c, b);
}
