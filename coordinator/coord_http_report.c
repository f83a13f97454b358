/*
 * coord_http_report.c - REST /epochs, /steps and /ranks of a job (issue
 * 6) and /studies (issue 18): the training reports' queries
 * (coord_report.h, coord_study.h) rendered as JSON.
 */
#include "coord_api.h"
#include "coord_jobs.h"
#include "coord_hosts.h"
#include "coord_report.h"
#include "coord_study.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "json.h"

#define REPORT_MAX_BUCKETS 10000 /* per /steps answer */

static void render_metrics_text(struct jw *w, const char *text)
{
    if (!jw_json_text(w, text))
        jw_null(w);
}

/* render_mean writes the mean over the ranks of every numeric metric
 * (keys in the order the lowest rank that reported metrics gave them). */
static void render_mean(struct jw *w, const struct ep_rows *rs, const struct ep_sum *s)
{
    struct ep_metrics m;
    coord_report_metrics(rs, s, &m);
    jw_obj_begin(w);
    for (const struct json *e = m.n ? m.v[0]->child : NULL; e; e = e->next)
        if (e->type == JSON_NUMBER)
            jw_kdouble(w, e->key, coord_report_mean(&m, e->key));
    jw_obj_end(w);
    coord_report_metrics_free(&m);
}

static void jw_kdouble_or_null(struct jw *w, const char *key, double v)
{
    jw_key(w, key);
    if (isnan(v))
        jw_null(w);
    else
        jw_double(w, v);
}

static int render_epochs(struct coord *c, struct job *j, struct jw *w, char *err, size_t errlen)
{
    struct ep_rows rs = {0};
    struct ep_sum *sums = NULL;
    size_t n = 0;
    int rc = coord_report_epochs(c, j, &rs, &sums, &n);
    if (rc) {
        snprintf(err, errlen, "cannot read the epochs: %s",
                 rc == KOLO_ENOMEM ? "out of memory" : store_last_error(c->store));
        coord_report_rows_free(&rs);
        return 500;
    }
    uint64_t base_id = 0;
    double base = coord_report_baseline(c, j, &base_id);
    jw_obj_begin(w);
    jw_kuint(w, "job", j->id);
    jw_kuint(w, "generation", j->generation);
    /* Scaling efficiency: samples/s over (workers x the one-worker rate of
     * the same command), when such a run exists. */
    jw_key(w, "baseline_job");
    if (base_id)
        jw_uint(w, base_id);
    else
        jw_null(w);
    jw_kdouble_or_null(w, "baseline_samples_per_s", base);
    jw_key(w, "epochs");
    jw_arr_begin(w);
    for (size_t i = 0; i < n; i++) {
        const struct ep_sum *s = &sums[i];
        jw_obj_begin(w);
        jw_kint(w, "epoch", s->epoch);
        jw_kuint(w, "generation", s->generation);
        jw_kuint(w, "start_ms", s->start_ms);
        jw_kuint(w, "end_ms", s->end_ms);
        jw_kdouble_or_null(w, "wall_s", s->wall_s);
        jw_kint(w, "samples", s->samples);
        jw_kdouble_or_null(w, "samples_per_s", s->samples_per_s);
        jw_kint(w, "ranks_reported", s->reported);
        jw_kint(w, "ranks_expected", s->expected);
        jw_kbool(w, "complete", s->complete);
        jw_kint(w, "resets", s->resets);
        jw_kdouble_or_null(w, "scaling_efficiency",
                           isfinite(base) && base > 0 && s->expected > 0
                               ? s->samples_per_s / (base * s->expected)
                               : NAN);
        jw_key(w, "metrics");
        render_metrics_text(w, s->metrics);
        jw_key(w, "metrics_mean");
        render_mean(w, &rs, s);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
    free(sums);
    coord_report_rows_free(&rs);
    return 200;
}

/* ---- /steps ---- */

static const char *host_name_of(struct coord *c, const char *host_id)
{
    struct host *h = host_id[0] ? coord_host_find(c, host_id) : NULL;
    return h ? h->name : host_id;
}

static int render_steps(struct coord *c, struct job *j, const char *query, struct jw *w, char *err,
                        size_t errlen)
{
    uint64_t bucket_s = 10, since_ms = 0;
    if (!coord_http_uint_param(query, "downsample", 1, 86400, &bucket_s, err, errlen) ||
        !coord_http_uint_param(query, "since_ms", 0, (uint64_t)INT64_MAX, &since_ms, err, errlen))
        return 400;
    struct step_rows sr = {.bucket_ms = bucket_s * 1000};
    int nr = j->nranks > 0 ? j->nranks : 1;
    double *lag = calloc((size_t)nr, sizeof(*lag));
    bool *slow = calloc((size_t)nr, sizeof(*slow));
    if (!lag || !slow) {
        free(lag);
        free(slow);
        snprintf(err, errlen, "out of memory");
        return 500;
    }
    bool known = coord_report_stragglers(j, lag, slow);
    int rc = coord_report_steps(c, j, since_ms, &sr);
    if (rc) {
        snprintf(err, errlen, "cannot read the step times: %s",
                 rc == KOLO_ENOMEM ? "out of memory" : store_last_error(c->store));
        free(sr.v);
        free(lag);
        free(slow);
        return 500;
    }
    jw_obj_begin(w);
    jw_kuint(w, "job", j->id);
    jw_kuint(w, "bucket_s", bucket_s);
    jw_key(w, "hosts");
    jw_arr_begin(w);
    size_t buckets = 0;
    for (size_t i = 0; i < sr.n;) {
        size_t hk = i;
        while (hk < sr.n && strcmp(sr.v[hk].host, sr.v[i].host) == 0)
            hk++;
        jw_obj_begin(w);
        jw_kstr(w, "host_id", sr.v[i].host);
        jw_kstr(w, "host", host_name_of(c, sr.v[i].host));
        /* the latest the others waited for this host's slowest rank, and
         * which of its ranks (if any) are stragglers right now */
        double hlag = NAN;
        bool any = false;
        for (int r = 0; known && r < j->nranks; r++)
            if (strcmp(j->ranks[r].host_id, sr.v[i].host) == 0) {
                if (isnan(hlag) || lag[r] > hlag)
                    hlag = lag[r];
                any = any || slow[r];
            }
        jw_kdouble_or_null(w, "lag_s", hlag);
        jw_kbool(w, "straggler", any);
        jw_key(w, "straggler_ranks");
        jw_arr_begin(w);
        for (int r = 0; any && r < j->nranks; r++)
            if (slow[r] && strcmp(j->ranks[r].host_id, sr.v[i].host) == 0)
                jw_int(w, r);
        jw_arr_end(w);
        jw_key(w, "buckets");
        jw_arr_begin(w);
        for (size_t b = i; b < hk;) {
            size_t bk = b;
            uint64_t steps = 0;
            double sum = 0, max = 0;
            while (bk < hk && sr.v[bk].bucket_ms == sr.v[b].bucket_ms) {
                steps += sr.v[bk].n;
                sum += sr.v[bk].seconds * sr.v[bk].n;
                if (sr.v[bk].seconds > max)
                    max = sr.v[bk].seconds;
                bk++;
            }
            /* p50: the weighted median of the per-second means (the rows
             * are sorted by seconds within the bucket) */
            double p50 = sr.v[b].seconds;
            uint64_t acc = 0;
            for (size_t x = b; x < bk; x++) {
                acc += sr.v[x].n;
                if (2 * acc >= steps) {
                    p50 = sr.v[x].seconds;
                    break;
                }
            }
            if (buckets++ < REPORT_MAX_BUCKETS) {
                jw_obj_begin(w);
                jw_kuint(w, "ts_ms", sr.v[b].bucket_ms);
                jw_kuint(w, "steps", steps);
                jw_kdouble(w, "mean_s", steps ? sum / (double)steps : 0);
                jw_kdouble(w, "p50_s", p50);
                jw_kdouble(w, "max_s", max);
                jw_obj_end(w);
            }
            b = bk;
        }
        jw_arr_end(w);
        jw_obj_end(w);
        i = hk;
    }
    jw_arr_end(w);
    jw_kbool(w, "truncated", buckets > REPORT_MAX_BUCKETS);
    jw_obj_end(w);
    free(sr.v);
    free(lag);
    free(slow);
    return 200;
}

/* ---- /ranks ---- */

static int render_ranks(struct coord *c, struct job *j, struct jw *w)
{
    struct rank_cost *rc = calloc(j->nranks > 0 ? (size_t)j->nranks : 1, sizeof *rc);
    if (!rc)
        return 500;
    double med = coord_report_rank_costs(c, j, rc);
    jw_obj_begin(w);
    jw_kuint(w, "job", j->id);
    jw_kuint(w, "generation", j->generation);
    jw_kdouble_or_null(w, "step_s", med);
    jw_key(w, "ranks");
    jw_arr_begin(w);
    for (int i = 0; i < j->nranks; i++) {
        const struct rank *r = &j->ranks[i];
        jw_obj_begin(w);
        jw_kint(w, "rank", r->rank);
        jw_kstr(w, "host_id", r->host_id);
        jw_kstr(w, "host", r->host ? r->host->name : r->host_id);
        jw_kstr(w, "state", coord_rank_state_name(r->state));
        jw_kint(w, "pid", r->pid);
        const struct report_rank *rr = coord_report_rank(c, j->id, r->rank);
        jw_key(w, "last_step_s");
        if (rr && rr->step_ms)
            jw_double(w, rr->step_s);
        else
            jw_null(w);
        jw_kuint(w, "last_step_ms", rr ? rr->step_ms : 0);
        jw_key(w, "last_epoch");
        if (rr && rr->epoch >= 0)
            jw_int(w, rr->epoch);
        else
            jw_null(w);
        jw_kdouble_or_null(w, "lag_s", rc[i].lag_s);
        jw_kbool(w, "straggler", rc[i].straggler);
        jw_kdouble_or_null(w, "cost", rc[i].cost);
        /* where its time goes: shares of its last seconds, and of its step */
        struct time_shares ts;
        bool split = coord_report_time_shares(rr, &ts);
        jw_key(w, "time");
        if (split) {
            double step = rr->step_ms ? rr->step_s : NAN;
            jw_obj_begin(w);
            jw_kdouble(w, "compute", ts.compute);
            jw_kdouble(w, "wait", ts.wait);
            jw_kdouble(w, "data", ts.data);
            jw_kdouble(w, "overlap", ts.overlap);
            jw_kdouble_or_null(w, "compute_s", ts.compute * step);
            jw_kdouble_or_null(w, "wait_s", ts.wait * step);
            jw_kdouble_or_null(w, "data_s", ts.data * step);
            jw_obj_end(w);
        } else {
            jw_null(w);
        }
        /* the coordinator's clock minus the rank's, and the round trip it
         * was measured over (its telemetry is placed with it) */
        bool clock = rr && rr->clock_known;
        jw_kdouble_or_null(w, "clock_offset_ms", clock ? (double)rr->clock_offset_us / 1e3 : NAN);
        jw_kdouble_or_null(w, "clock_rtt_ms", clock ? (double)rr->clock_rtt_us / 1e3 : NAN);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
    free(rc);
    return 200;
}

int coord_http_report(struct coord *c, struct job *j, const char *sub, const char *query,
                      struct jw *w, char *err, size_t errlen)
{
    if (strcmp(sub, "/epochs") == 0)
        return render_epochs(c, j, w, err, errlen);
    if (strcmp(sub, "/steps") == 0)
        return render_steps(c, j, query, w, err, errlen);
    if (strcmp(sub, "/ranks") == 0)
        return render_ranks(c, j, w);
    snprintf(err, errlen, "no such route");
    return 404;
}

/* ---- /studies ---- */

static void render_study_head(struct jw *w, const struct study *s)
{
    jw_kstr(w, "name", s->name);
    jw_kstr(w, "metric", s->metric);
    jw_kstr(w, "mode", s->maximize ? "max" : "min");
    jw_kuint(w, "trial_count", s->n);
    jw_key(w, "states");
    jw_obj_begin(w);
    for (int st = TRIAL_PENDING; st <= TRIAL_STOPPED; st++)
        jw_kint(w, coord_trial_state_name((enum trial_state)st), s->counts[st]);
    jw_obj_end(w);
    const struct study_trial *b = s->best >= 0 ? &s->trials[s->best] : NULL;
    jw_kdouble(w, "best_value", b ? b->value : NAN);
    jw_key(w, "best_trial");
    if (b && b->number >= 0)
        jw_int(w, b->number);
    else
        jw_null(w);
    jw_key(w, "best_job");
    if (b)
        jw_uint(w, b->job->id);
    else
        jw_null(w);
    jw_kuint(w, "first_ms", s->first_ms);
    jw_kuint(w, "last_ms", s->last_ms);
}

static void render_trial(struct jw *w, const struct study_trial *t)
{
    const struct job *j = t->job;
    jw_obj_begin(w);
    jw_key(w, "number");
    if (t->number >= 0)
        jw_int(w, t->number);
    else
        jw_null(w);
    jw_kuint(w, "job", j->id);
    jw_kstr(w, "job_name", j->name);
    jw_kstr(w, "state", coord_trial_state_name(t->state));
    jw_key(w, "params");
    if (!t->params || !jw_json_text(w, t->params))
        jw_null(w);
    jw_kint(w, "np", j->np);
    jw_kint(w, "workers", coord_job_ranks_alive(j));
    jw_kdouble(w, "value", t->value);
    jw_kdouble(w, "best", t->best);
    jw_kuint(w, "epochs", t->ncurve);
    jw_kuint(w, "submitted_ms", j->submitted_ms);
    jw_kuint(w, "started_ms", j->started_ms);
    jw_kuint(w, "ended_ms", j->ended_ms);
    jw_kstr(w, "reason", j->reason ? j->reason : "");
    jw_key(w, "curve");
    jw_arr_begin(w);
    for (size_t i = 0; i < t->ncurve; i++) {
        jw_obj_begin(w);
        jw_kint(w, "epoch", t->curve[i].epoch);
        jw_kdouble(w, "value", t->curve[i].value);
        jw_kuint(w, "end_ms", t->curve[i].end_ms);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
}

static int study_error(struct coord *c, int rc, const char *name, char *err, size_t errlen)
{
    if (rc == KOLO_ENOTFOUND) {
        snprintf(err, errlen, "no such study: no job is labelled kolo.study=%.128s", name);
        return 404;
    }
    snprintf(err, errlen, "cannot read the study: %s",
             rc == KOLO_ENOMEM ? "out of memory" : store_last_error(c->store));
    return 500;
}

int coord_http_study(struct coord *c, const char *name, struct jw *w, char *err, size_t errlen)
{
    struct study s;
    if (name) {
        int rc = coord_study_get(c, name, &s);
        if (rc) {
            coord_study_free(&s);
            return study_error(c, rc, name, err, errlen);
        }
        jw_obj_begin(w);
        render_study_head(w, &s);
        jw_key(w, "trials");
        jw_arr_begin(w);
        for (size_t i = 0; i < s.n; i++)
            render_trial(w, &s.trials[i]);
        jw_arr_end(w);
        jw_key(w, "best_so_far");
        jw_arr_begin(w);
        for (size_t i = 0; i < s.nbest; i++) {
            const struct study_trial *t = &s.trials[s.best_so_far[i].trial];
            jw_obj_begin(w);
            jw_kuint(w, "ts_ms", s.best_so_far[i].ts_ms);
            jw_kdouble(w, "value", s.best_so_far[i].value);
            jw_key(w, "trial");
            if (t->number >= 0)
                jw_int(w, t->number);
            else
                jw_null(w);
            jw_obj_end(w);
        }
        jw_arr_end(w);
        jw_obj_end(w);
        coord_study_free(&s);
        return 200;
    }
    const char **names = NULL;
    size_t n = 0;
    if (coord_study_names(c, &names, &n))
        return study_error(c, KOLO_ENOMEM, "", err, errlen);
    jw_obj_begin(w);
    jw_key(w, "studies");
    jw_arr_begin(w);
    int status = 200;
    for (size_t i = 0; i < n && status == 200; i++) {
        int rc = coord_study_get(c, names[i], &s);
        if (rc)
            status = study_error(c, rc, names[i], err, errlen);
        else {
            jw_obj_begin(w);
            render_study_head(w, &s);
            jw_obj_end(w);
        }
        coord_study_free(&s);
    }
    jw_arr_end(w);
    jw_obj_end(w);
    free(names);
    return status;
}
